"""The comparison query, one for the dashboard page and the API: which metric, on which x axis,
which band, which final-value rule, the δ that counts, and which runs; every error names its
parameter (`QueryError`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.db.models import QuerySet
from django.http import QueryDict
from ninja import Field, Schema

from dashboards.comparison import curves
from experiments.models import Run
from lab.errors import FieldError

MAX_K = 100_000


MAX_DELTA = 1e6


MAX_SELECTED_RUNS = 500


class QueryError(FieldError):
    """A comparison query parameter that breaks a rule; `param` is its name."""

    @property
    def param(self) -> str:
        return self.field


def _choice(params: QueryDict, name: str, choices: tuple[str, ...], default: str) -> str:
    value = params.get(name, default)
    if value not in choices:
        raise QueryError(name, f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


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
        metric = params.get("metric", cls.metric)
        if not 0 < len(metric) <= 100 or "\x00" in metric:
            raise QueryError(
                "metric", f"metric must be a metric name of 1 to 100 characters (got {metric!r})"
            )
        k_text = params.get("k", str(cls.k))
        if not k_text.isdigit() or not 1 <= int(k_text) <= MAX_K:
            raise QueryError("k", f"k must be a whole number from 1 to {MAX_K} (got {k_text!r})")
        delta_text = params.get("delta", str(cls.delta))
        try:
            delta = float(delta_text)
        except ValueError:
            delta = math.nan
        if not 0 <= delta <= MAX_DELTA:
            raise QueryError(
                "delta",
                f"delta must be a number from 0 to {MAX_DELTA:g}, the change in the metric that counts "
                f"(0.02 is 2 points of accuracy) (got {delta_text!r})",
            )
        contended = params.get("contended", "0")
        if contended not in ("0", "1"):
            raise QueryError(
                "contended",
                f"contended must be 0 (leave contended runs out of throughput) or 1 (got {contended!r})",
            )
        return cls(
            contended=contended == "1",
            metric=metric,
            x=_choice(params, "x", curves.X_AXES, cls.x),
            band=_choice(params, "band", curves.BANDS, cls.band),
            rule=_choice(params, "rule", curves.RULES, cls.rule),
            k=int(k_text),
            delta=delta,
        )


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


class ComparisonParams(Schema):
    """The dashboard's query (documented here; `ComparisonQuery.parse` validates it, as for the page)."""

    metric: str = ComparisonQuery.metric
    x: str = Field(ComparisonQuery.x, description=f"one of {', '.join(curves.X_AXES)}")
    band: str = Field(ComparisonQuery.band, description=f"one of {', '.join(curves.BANDS)}")
    rule: str = Field(ComparisonQuery.rule, description=f"final value: one of {', '.join(curves.RULES)}")
    k: str = Field(str(ComparisonQuery.k), description="the k of mean_last_k")
    delta: str = Field(
        str(ComparisonQuery.delta),
        description="δ: the change of the final value that counts, for the staleness tolerance and the findings "
        "(in the metric's units: 0.02 is 2 points of accuracy)",
    )
    contended: str = Field(
        "0",
        description="1: count runs that ran contended (other processes busy on their machine) in the "
        "throughput and the speed-ups; 0 (default): leave them out",
    )
