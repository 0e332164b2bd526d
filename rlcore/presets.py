"""The algorithm presets (docs/algorithms.md §4) as plain data, importable without torch: each is
one frozen `AlgorithmSpec` of the loss family, and `resolve(name, overrides)` gives the spec a run
uses; `rlcore.algorithms` turns a spec into tensor functions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Literal

from pydantic import Field

Surrogate = Literal["rec", "ppo", "gspo"]
Clip = Literal["none", "one-side", "two-side", "ring", "seq-one-side"]
Weight = Literal["none", "is", "seq-is", "advantage", "truncated-is"]
Reg = Literal["none", "k2", "forward-kl"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
STD_KINDS = ("sample", "population")

# The parameters a user may override on any preset (the structure fields are the preset itself).
TUNABLE = (
    "eps_low",
    "eps_high",
    "eps_low_prime",
    "eps_high_prime",
    "reg_coef",
    "temp",
    "std_normalize",
    "std",
    "loss_agg",
    "dual_clip",
)


@dataclass(frozen=True)
class AlgorithmSpec:
    """One member of the REC loss family (docs/algorithms.md §3), fully resolved."""

    surrogate: Surrogate = "rec"
    clip: Clip = "none"
    weight: Weight = "none"
    reg: Reg = "none"
    red_drop: bool = False
    eps_low: Annotated[
        float, Field(title="Clip ε low", description="the clip window starts at ratio 1 − ε_low")
    ] = 0.2
    eps_high: Annotated[
        float, Field(title="Clip ε high", description="the clip window ends at ratio 1 + ε_high")
    ] = 0.2
    eps_low_prime: Annotated[
        float,
        Field(title="Ring ε′ low", description="ring clip: positive tokens below 1 − ε′_low count again"),
    ] = 0.6
    eps_high_prime: Annotated[
        float,
        Field(title="Ring ε′ high", description="ring clip: negative tokens above 1 + ε′_high count again"),
    ] = 2.0
    reg_coef: Annotated[
        float, Field(title="Regulariser weight c", description="weight of the k2 / forward-KL term")
    ] = 0.0
    temp: Annotated[
        float, Field(title="RED-Weight temperature T", description="responses are weighted by exp(A / T)")
    ] = 1.0
    std_normalize: Annotated[
        bool, Field(title="Divide advantages by σ", description="divide each group's advantages by its σ")
    ] = False
    std: Annotated[
        Literal["sample", "population"],
        Field(title="σ estimator", description="sample (n − 1) or population (n)"),
    ] = "sample"
    loss_agg: Annotated[
        LossAgg, Field(title="Loss aggregation", description="how token losses become one number")
    ] = "token-mean"
    dual_clip: Annotated[
        float | None,
        Field(title="Dual clip c", description="PPO surrogates: cap the loss of negative tokens at −c·A"),
    ] = None

    def knobs(self) -> tuple[str, ...]:
        """The tunable parameters this member's loss reads; overriding any other one changes nothing."""
        used = {"std_normalize", "loss_agg"}
        if self.clip != "none" or self.surrogate != "rec":
            used |= {"eps_low", "eps_high"}
        if self.clip == "ring" or self.weight == "truncated-is":
            used |= {"eps_low_prime", "eps_high_prime"}
        if self.reg != "none":
            used.add("reg_coef")
        if self.weight == "advantage":
            used.add("temp")
        if self.std_normalize:
            used.add("std")
        if self.surrogate != "rec":
            used.add("dual_clip")
        return tuple(name for name in TUNABLE if name in used)

    def params(self) -> dict[str, Any]:
        """The tunable parameters with their resolved values (what a run stores)."""
        return {name: getattr(self, name) for name in TUNABLE}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_GSPO_EPS = {"eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}


@dataclass(frozen=True)
class Preset:
    """A named point of the family: its knobs, and one line saying what it is (shown on the form)."""

    description: str
    spec: AlgorithmSpec


PRESETS: dict[str, Preset] = {
    "reinforce": Preset("group-relative REINFORCE: plain policy gradient, no clipping", AlgorithmSpec()),
    "grpo": Preset(
        "GRPO: PPO-clip surrogate on the token ratio, advantages divided by the group's σ",
        AlgorithmSpec(surrogate="ppo", std_normalize=True),
    ),
    "rec-oneside-is": Preset(
        "REC one-side clip, gradient weighted by the importance ratio (same gradient as GRPO)",
        AlgorithmSpec(clip="one-side", weight="is"),
    ),
    "rec-oneside-nois": Preset(
        "REC one-side clip, no importance weight: the paper's headline", AlgorithmSpec(clip="one-side")
    ),
    "rec-oneside-nois-wide": Preset(
        "REC one-side clip with a wide window (ε 0.6, 2.0): the wider clip learns faster",
        AlgorithmSpec(clip="one-side", eps_low=0.6, eps_high=2.0),
    ),
    "rec-twoside-is": Preset(
        "REC two-side clip (drops tokens outside [1−ε, 1+ε]), importance-weighted",
        AlgorithmSpec(clip="two-side", weight="is"),
    ),
    "rec-twoside-nois": Preset(
        "REC two-side clip (drops tokens outside [1−ε, 1+ε]), no importance weight",
        AlgorithmSpec(clip="two-side"),
    ),
    "rec-ring-is": Preset(
        "REC ring clip: keeps the inner window and the far outer ring (ε′ 0.6, 2.0), importance-weighted",
        AlgorithmSpec(clip="ring", weight="is"),
    ),
    "rec-ring-nois": Preset(
        "REC ring clip: keeps the inner window and the far outer ring (ε′ 0.6, 2.0), no importance weight",
        AlgorithmSpec(clip="ring"),
    ),
    "opmd": Preset(
        "OPMD: no clipping, a k2 penalty (c 0.1) pulls toward the behaviour policy",
        AlgorithmSpec(reg="k2", reg_coef=0.1),
    ),
    "asymre": Preset(
        "AsymRE: no clipping, a forward-KL term (c 0.1) shifts the baseline",
        AlgorithmSpec(reg="forward-kl", reg_coef=0.1),
    ),
    "red-drop": Preset(
        "RED-Drop: REINFORCE after dropping surplus negative responses per group",
        AlgorithmSpec(red_drop=True),
    ),
    "red-weight": Preset(
        "RED-Weight: REINFORCE with each response weighted by exp(A / T), T 1.0",
        AlgorithmSpec(weight="advantage", temp=1.0),
    ),
    "gspo": Preset(
        "GSPO: PPO-clip on the sequence-level ratio (ε 3e-4, 4e-4), advantages divided by σ",
        AlgorithmSpec(surrogate="gspo", std_normalize=True, **_GSPO_EPS),
    ),
    "rec-gspo-nois": Preset(
        "REC one-side clip on the sequence-level ratio, no importance weight",
        AlgorithmSpec(clip="seq-one-side", **_GSPO_EPS),
    ),
    "rec-gspo-is": Preset(
        "REC one-side clip on the sequence-level ratio, weighted by the sequence ratio",
        AlgorithmSpec(clip="seq-one-side", weight="seq-is", **_GSPO_EPS),
    ),
}

_FIELD_TYPES = {f.name: f.type for f in fields(AlgorithmSpec)}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_sort_key(preset: str) -> tuple[int, str]:
    """Presets in the order above, then any others by name."""
    known = preset_names()
    return (known.index(preset), "") if preset in known else (len(known), preset)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number (got {value!r})")
    return float(value)


def check_param(name: str, value: Any) -> Any:
    """Coerce and validate one tunable parameter; raise ValueError naming it and the rule."""
    if name in ("eps_low", "eps_low_prime"):
        v = _number(name, value)
        if not 0 < v <= 1:
            raise ValueError(f"{name} must satisfy 0 < {name} <= 1 (got {value!r})")
        return v
    if name in ("eps_high", "eps_high_prime"):
        v = _number(name, value)
        if not v > 0:
            raise ValueError(f"{name} must be > 0 (got {value!r})")
        return v
    if name == "reg_coef":
        v = _number(name, value)
        if not v >= 0:
            raise ValueError(f"reg_coef must be >= 0 (got {value!r})")
        return v
    if name == "temp":
        v = _number(name, value)
        if not v > 0:
            raise ValueError(f"temp must be > 0 (got {value!r}): RED-Weight divides the advantage by it")
        return v
    if name == "std_normalize":
        if not isinstance(value, bool):
            raise ValueError(f"std_normalize must be true or false (got {value!r})")
        return value
    if name == "std":
        if value not in STD_KINDS:
            raise ValueError(f"std must be one of {', '.join(STD_KINDS)} (got {value!r})")
        return value
    if name == "loss_agg":
        if value not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGGS)} (got {value!r})")
        return value
    if name == "dual_clip":
        if value is None:
            return None
        v = _number(name, value)
        if not v > 1:
            raise ValueError(f"dual_clip must be > 1 or null to disable it (got {value!r})")
        return v
    raise ValueError(f"unknown algorithm parameter {name!r}; known: {', '.join(TUNABLE)}")


def resolve(name: str, overrides: dict[str, Any] | None = None) -> AlgorithmSpec:
    """The preset `name` with `overrides` applied; ValueError names the preset or parameter."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; known: {', '.join(PRESETS)}")
    checked = {key: check_param(key, value) for key, value in (overrides or {}).items()}
    return replace(PRESETS[name].spec, **checked)
