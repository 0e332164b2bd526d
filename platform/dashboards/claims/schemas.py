"""A claim as the API and the comparison page's form take it (`ClaimIn`: every field's rules, and
the words a bad value is answered with) and answer it (`dashboards.claims.service`), and the paper's
claims as the comparison checks them (`dashboards.claims.templates`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import AfterValidator, ValidationInfo, field_validator

from dashboards.claims import verdicts
from dashboards.comparison import curves, query
from lab.schemas import NoNul, Worded, rule_error

MAX_PARTS = 20
MAX_SETTINGS = 20
MAX_ALPHA = 0.25


class ClaimTestOut(Schema):
    kind: str = Field(description="holds, degrades, beats or equivalent")
    a: str = Field(description="the cell tested: line × staleness")
    b: str = Field(description="the cell it is compared with: y at the same setting, or x on-policy")
    label: str
    verdict: str = Field(description="support, contradict, cannot tell yet or missing cells")
    reason: str = Field(description="what decided it, naming the rule")
    estimate: float | None = Field(
        None, description="D = a − b: mean over seed pairs (or of each side, unpaired)"
    )
    lo: float | None = Field(None, description="lower end of the (1 − 2α) t-interval of D")
    hi: float | None = None
    n: int | None = Field(None, description="seed pairs (paired) or the smaller side's seeds")
    paired: bool | None = None
    test: str | None = Field(None, description="paired t, or Welch t when fewer than 2 seeds are shared")
    p_support: float | None = Field(None, description="one-sided p-value for the claim")
    p_contradict: float | None = Field(None, description="one-sided p-value against it")
    p_support_holm: float | None = Field(None, description="p_support, Holm-adjusted over the claim's tests")
    p_contradict_holm: float | None = None
    seeds_needed: int | None = Field(
        None, description="seeds per cell that would settle an undecided test (power 0.8); null: cannot say"
    )
    seeds_threshold: float | None = Field(
        None,
        description="the line seeds_needed aims to tell D from (−δ, +δ or the nearer of ±δ; not 0, as the "
        "comparison's 'cannot be told apart' asks)",
    )


class ClaimSettingOut(Schema):
    setting: str
    verdict: str
    parts: list[ClaimTestOut]


class FindingOut(Schema):
    experiment: int
    template: str = Field(description="the claim template it was checked as")
    by_setting: list[ClaimSettingOut] = Field(description="every test behind the verdict, per setting")
    variant: str = Field(description='the variant the claim was checked within ("" if the sweep has none)')
    claim: str
    verdict: str = Field(description="support, contradict, cannot tell yet or missing cells")
    text: str
    reasons: list[str] = Field(description="per setting and preset, the condition that decided the verdict")
    missing: list[str]
    provisional: bool = Field(description="some runs of the claim's cells are still queued or running")
    runs_active: int
    runs: int = Field(description="runs of the claim's cells, those that ended early left out")


class FindingLeftOutOut(Schema):
    experiment: int
    variant: str = Field(description='the variant it was left out of ("" if the sweep has none)')
    template: str = Field(description="the claim template left out")
    claim: str
    absent: list[str] = Field(description="the presets it names that the sweep never ran")


@dataclass(frozen=True)
class Against:
    """What a claim is checked against, its runs (`ClaimIn.model_validate(…, context={"against": …})`):
    their lines, their staleness settings, and their on-policy setting (None: they have none).
    Without it (the API's first look at a body) only what needs no runs is checked."""

    lines: list[str]
    settings: list[str]
    on_policy: str | None


def _against(info: ValidationInfo) -> Against | None:
    return (info.context or {}).get("against")


class ClaimPartIn(Schema):
    kind: Annotated[Literal[verdicts.KINDS], query.one_of("kind", verdicts.KINDS, NoNul)] = Field(
        description="holds, degrades, beats or equivalent"
    )
    x: NoNul = Field(
        description="a line of the runs (preset, with its variant; with its experiment if several)"
    )
    y: NoNul = Field(
        "",
        description="another line; needed by beats and equivalent, else x on-policy is the reference",
        validate_default=True,
    )

    @field_validator("x", "y")
    @classmethod
    def _a_line(cls, line: str, info: ValidationInfo) -> str:
        against = _against(info)
        if against is not None and (line or info.field_name == "x") and line not in against.lines:
            raise rule_error(
                f"{info.field_name} must be one of these runs' lines: {', '.join(against.lines)} (got {line!r})"
            )
        return line

    @field_validator("y")
    @classmethod
    def _another_line(cls, y: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind in verdicts.NEEDS_Y and not y:
            raise rule_error(f"a {kind} claim compares x with another line y")
        if y == info.data.get("x"):
            raise rule_error("y must be another line than x")
        against = _against(info)
        if not y and against is not None and against.on_policy is None:
            raise rule_error("these runs have no on-policy cell to take the change from: name a line y")
        return y


def _given_or_templated(value: list | None, info: ValidationInfo) -> list | None:
    """Parts and settings are left out only when a template gives them."""
    if value is None and not info.data.get("template"):
        raise ValueError("left out")
    return value


def _distinct(settings: list[str] | None) -> list[str] | None:
    if settings is not None and len(set(settings)) != len(settings):
        raise ValueError("repeated")
    return settings


def _a_setting(setting: str, info: ValidationInfo) -> str:
    against = _against(info)
    if against is not None and setting not in against.settings:
        raise rule_error(
            f"settings must be staleness settings of these runs: {', '.join(against.settings)} (got {setting!r})"
        )
    return setting


class ClaimIn(Schema):
    # A claim to state, each field with its rules: the API and the comparison page's form take it so.
    runs: list[int] | None = Field(
        None, description="or a selection of runs of one team (instead of experiment)"
    )
    experiment: int | None = Field(
        None, description="the experiment whose runs it is tested on", validate_default=True
    )
    template: NoNul = Field("", description="a claim template's name (then leave parts and settings out)")
    variant: NoNul = Field("", description="with a template: the variant whose lines it names")
    parts: Annotated[
        list[ClaimPartIn] | None,
        Field(min_length=1, max_length=MAX_PARTS),
        AfterValidator(_given_or_templated),
        Worded(lambda _: f"parts must be a list of 1 to {MAX_PARTS} statements {{kind, x, y}}"),
    ] = Field(None, description="statements that must all hold at a setting", validate_default=True)
    settings: Annotated[
        list[Annotated[NoNul, AfterValidator(_a_setting)]] | None,
        Field(min_length=1, max_length=MAX_SETTINGS),
        AfterValidator(_distinct),
        AfterValidator(_given_or_templated),
        Worded(lambda _: f"settings must be 1 to {MAX_SETTINGS} distinct staleness settings"),
    ] = Field(None, description="staleness settings it is tested at", validate_default=True)
    quantifier: Annotated[
        Literal[verdicts.QUANTIFIERS],
        Worded(lambda quantifier: f"quantifier must be every or some (got {quantifier!r})", NoNul),
    ] = Field("every", description="every: at each setting; some: at one at least")
    metric: Annotated[query.Metric, Worded(query.metric_words, NoNul)] = "eval/accuracy"
    k: Annotated[query.K, Worded(query.k_words)] = 10
    delta: Annotated[query.Delta, Worded(query.delta_words)] = Field(
        0.02, description="δ, in the metric's units"
    )
    rule: Annotated[query.Rule, query.one_of("rule", curves.RULES, NoNul)] = Field(
        "last", description="final value: last, mean_last_k, best or auc"
    )
    alpha: Annotated[
        float,
        Field(ge=1e-6, le=MAX_ALPHA),
        Worded(
            lambda alpha: f"alpha must be a number above 0 and at most {MAX_ALPHA} (0.05: 5%) (got {alpha!r})"
        ),
    ] = Field(0.05, description="α of each one-sided test (the interval shown is 1 − 2α)")
    title: Annotated[
        NoNul, Field(max_length=300), Worded(lambda _: "title must be text of at most 300 characters", NoNul)
    ] = ""

    @field_validator("experiment")
    @classmethod
    def _one_target(cls, experiment: int | None, info: ValidationInfo) -> int | None:
        if "runs" in info.data and (experiment is None) == (info.data["runs"] is None):
            raise rule_error("name an experiment or a selection of runs (one of them)")
        return experiment


class ClaimOut(Schema):
    id: int
    experiment: int | None
    runs: list[int]
    title: str
    template: str
    parts: list[ClaimPartIn]
    settings: list[str]
    quantifier: str
    metric: str
    rule: str
    k: int
    delta: float
    alpha: float
    author: str
    stated: str = Field(description="when it was stated (ISO 8601)")
    pre_registered: bool = Field(description="stated before any run of its cells had finished")
    statement: str = Field(description="the claim in words")
    verdict: str = Field(description="support, contradict, cannot tell yet or missing cells")
    by_setting: list[ClaimSettingOut]
    missing: list[str] = Field(description="cells with no runs at all (a run that ended early is none)")
    waiting: list[str] = Field(description="cells whose runs have not logged a value yet")
    tests: int
    holm: bool = Field(description="whether p-values were Holm-adjusted (more than one test)")
    confidence: float = Field(description="of the intervals shown: 1 − 2α")
    provisional: bool
    runs_active: int
    runs_total: int = Field(description="runs of the claim's cells, those that ended early left out")
    runs_ended_early: int = Field(
        description="runs of the claim's cells that failed, were cancelled or were lost before their last "
        "step (Run.ended_early): no finished seed, left out of its tests"
    )
    on_policy: str
    digits: int


class ClaimTemplateOut(Schema):
    name: str
    title: str
    quantifier: str
    settings: dict[str, Any] = Field(description="the rule that picks its settings")
    parts: list[dict[str, Any]]
    delta: float | None = Field(None, description="its own δ, else the one asked for")


class ClaimsOut(Schema):
    claims: list[ClaimOut] = Field(description="newest first, at most 200")


class ClaimTemplatesOut(Schema):
    templates: list[ClaimTemplateOut]


class WithdrawnOut(Schema):
    claim: int = Field(description="the claim withdrawn")
