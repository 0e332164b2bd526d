"""A claim as the API takes and answers it (`dashboards.claims.service`), and the paper's claims as
the comparison checks them (`dashboards.claims.templates`)."""

from __future__ import annotations

from typing import Any

from ninja import Field, Schema

from lab.schemas import NoNul


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


class ClaimPartIn(Schema):
    kind: NoNul = Field(description="holds, degrades, beats or equivalent")
    x: NoNul = Field(
        description="a line of the runs (preset, with its variant; with its experiment if several)"
    )
    y: NoNul = Field(
        "", description="another line; needed by beats and equivalent, else x on-policy is the reference"
    )


class ClaimIn(Schema):
    experiment: int | None = Field(None, description="the experiment whose runs it is tested on")
    runs: list[int] | None = Field(
        None, description="or a selection of runs of one team (instead of experiment)"
    )
    template: NoNul = Field("", description="a claim template's name (then leave parts and settings out)")
    variant: NoNul = Field("", description="with a template: the variant whose lines it names")
    title: NoNul = ""
    parts: list[ClaimPartIn] | None = Field(None, description="statements that must all hold at a setting")
    settings: list[NoNul] | None = Field(None, description="staleness settings it is tested at")
    quantifier: NoNul = Field("every", description="every: at each setting; some: at one at least")
    metric: NoNul = "eval/accuracy"
    rule: NoNul = Field("last", description="final value: last, mean_last_k, best or auc")
    k: int = 10
    delta: float = Field(0.02, description="δ, in the metric's units")
    alpha: float = Field(0.05, description="α of each one-sided test (the interval shown is 1 − 2α)")


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
