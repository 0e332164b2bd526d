"""The comparison query, one for the dashboard page and the API: which metric, on which x axis,
which band, which final-value rule, the δ that counts, and which runs. `ComparisonParams` declares
each parameter once (its kind, bounds and default, and the words a bad value is answered with):
the API validates the query with it, the pages with `ComparisonQuery.parse`, a `QueryError` naming
the parameter. A claim's metric, rule, k and δ take the same rules (`Metric`, `Rule`, `K`, `Delta`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from django.db.models import QuerySet
from django.http import QueryDict
from ninja import Field, Schema
from pydantic import BeforeValidator, StringConstraints, ValidationError

from dashboards.comparison import curves
from experiments.models import Run
from lab.errors import FieldError
from lab.schemas import Worded

MAX_K = 100_000


MAX_DELTA = 1e6


MAX_SELECTED_RUNS = 500


class QueryError(FieldError):
    """A comparison query parameter that breaks a rule; `param` is its name."""

    @property
    def param(self) -> str:
        return self.field


Metric = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[^\x00]*$")]
K = Annotated[int, Field(ge=1, le=MAX_K)]
Delta = Annotated[float, Field(ge=0, le=MAX_DELTA)]
Rule = Literal[curves.RULES]


def metric_words(metric: str) -> str:
    return f"metric must be a metric name of 1 to 100 characters (got {metric!r})"


def k_words(k: int | str) -> str:
    return f"k must be a whole number from 1 to {MAX_K} (got {str(k)!r})"


def delta_words(delta: float | str) -> str:
    return (
        f"delta must be a number from 0 to {MAX_DELTA:g}, the change in the metric that counts "
        f"(0.02 is 2 points of accuracy) (got {str(delta)!r})"
    )


def one_of(name: str, choices: tuple[str, ...], reads_as: Any = str) -> Worded:
    """A choice's words (for the text a query gives, unless `reads_as` says otherwise)."""
    return Worded(lambda value: f"{name} must be one of {', '.join(choices)} (got {value!r})", reads_as)


@dataclass(frozen=True)
class ComparisonQuery:
    metric: str = "eval/accuracy"
    x: str = "step"
    band: str = "std"
    rule: str = "last"
    k: int = 10
    delta: float = 0.02
    contended: bool = False

    @classmethod
    def parse(cls, params: QueryDict) -> ComparisonQuery:
        """The query a page's query string asks (of a repeated parameter, the last value), as
        `ComparisonParams` reads it; a QueryError naming the first parameter it refuses."""
        given = {name: params[name] for name in ComparisonParams.model_fields if name in params}
        try:
            return ComparisonParams.model_validate(given).query()
        except ValidationError as exc:
            raise QueryError.first_of(exc) from exc


def _whole(text: str) -> int:
    """k as a query writes it: digits only, not "+5", " 5" or "5.0"."""
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def _zero_or_one(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


class ComparisonParams(Schema):
    """The dashboard's query (documented here; `ComparisonQuery.parse` validates it, as for the page)."""

    # Each parameter with its rules (the API validates it so too), documented as the text it is.

    metric: Annotated[Metric, Worded(metric_words, str)] = ComparisonQuery.metric
    x: Annotated[Literal[curves.X_AXES], one_of("x", curves.X_AXES)] = Field(
        ComparisonQuery.x, description=f"one of {', '.join(curves.X_AXES)}"
    )
    band: Annotated[Literal[curves.BANDS], one_of("band", curves.BANDS)] = Field(
        ComparisonQuery.band, description=f"one of {', '.join(curves.BANDS)}"
    )
    rule: Annotated[Rule, one_of("rule", curves.RULES)] = Field(
        ComparisonQuery.rule, description=f"final value: one of {', '.join(curves.RULES)}"
    )
    k: Annotated[K, BeforeValidator(_whole), Worded(k_words, str)] = Field(
        str(ComparisonQuery.k), description="the k of mean_last_k", validate_default=True
    )
    delta: Annotated[Delta, BeforeValidator(float), Worded(delta_words, str)] = Field(
        str(ComparisonQuery.delta),
        description="δ: the change of the final value that counts, for the staleness tolerance and the findings "
        "(in the metric's units: 0.02 is 2 points of accuracy)",
        validate_default=True,
    )
    contended: Annotated[
        bool,
        BeforeValidator(_zero_or_one),
        Worded(
            lambda text: f"contended must be 0 (leave contended runs out of throughput) or 1 (got {text!r})",
            str,
        ),
    ] = Field(
        "0",
        description="1: count runs that ran contended (other processes busy on their machine) in the "
        "throughput and the speed-ups; 0 (default): leave them out",
        validate_default=True,
    )

    def query(self) -> ComparisonQuery:
        return ComparisonQuery(**self.model_dump())


def parse_run_ids(params: QueryDict) -> list[int]:
    """The hand-picked runs of `?runs=1,2&runs=3`: distinct ids in the order given."""
    texts = [t.strip() for value in params.getlist("runs") for t in value.split(",") if t.strip()]
    bad = [t for t in texts if not t.isdigit() or len(t) > 18]
    if bad:
        raise QueryError("runs", f"runs must be run ids (whole numbers) separated by commas (got {bad[0]!r})")
    ids = list(dict.fromkeys(int(t) for t in texts))
    if not 1 <= len(ids) <= MAX_SELECTED_RUNS:
        raise QueryError("runs", f"runs must name 1 to {MAX_SELECTED_RUNS} runs (got {len(ids)})")
    return ids


def selected_runs(visible: QuerySet[Run], ids: list[int]) -> QuerySet[Run]:
    """The runs `ids` among `visible`; a QueryError naming the ids that are not there."""
    found = set(visible.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise QueryError("runs", f"no run {', '.join(missing[:10])} in your teams")
    return visible.filter(pk__in=ids)
