"""The algorithm presets of ALGORITHMS.md §4 as plain data, importable without torch.

Every preset is one point in the same family of losses: a frozen `AlgorithmSpec` whose
fields are the knobs (surrogate form, clip mask, token weight, regulariser, aggregation,
advantage normalisation, RED-Drop). `resolve(name, overrides)` returns the spec a run uses;
the web tier validates through it without importing torch, and `rlcore.algorithms`
turns a spec into tensor functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

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
    """One member of the REC loss family (ALGORITHMS.md §3), fully resolved."""

    surrogate: Surrogate = "rec"
    clip: Clip = "none"
    weight: Weight = "none"
    reg: Reg = "none"
    red_drop: bool = False
    eps_low: float = 0.2
    eps_high: float = 0.2
    eps_low_prime: float = 0.6
    eps_high_prime: float = 2.0
    reg_coef: float = 0.0
    temp: float = 1.0
    std_normalize: bool = False
    std: Literal["sample", "population"] = "sample"
    loss_agg: LossAgg = "token-mean"
    dual_clip: float | None = None

    def params(self) -> dict[str, Any]:
        """The tunable parameters with their resolved values (what a run stores)."""
        return {name: getattr(self, name) for name in TUNABLE}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_GSPO_EPS = {"eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}

PRESETS: dict[str, AlgorithmSpec] = {
    "reinforce": AlgorithmSpec(),
    "grpo": AlgorithmSpec(surrogate="ppo", std_normalize=True),
    "rec-oneside-is": AlgorithmSpec(clip="one-side", weight="is"),
    "rec-oneside-nois": AlgorithmSpec(clip="one-side"),
    "rec-oneside-nois-wide": AlgorithmSpec(clip="one-side", eps_low=0.6, eps_high=2.0),
    "rec-twoside-is": AlgorithmSpec(clip="two-side", weight="is"),
    "rec-twoside-nois": AlgorithmSpec(clip="two-side"),
    "rec-ring-is": AlgorithmSpec(clip="ring", weight="is"),
    "rec-ring-nois": AlgorithmSpec(clip="ring"),
    "opmd": AlgorithmSpec(reg="k2", reg_coef=0.1),
    "asymre": AlgorithmSpec(reg="forward-kl", reg_coef=0.1),
    "red-drop": AlgorithmSpec(red_drop=True),
    "red-weight": AlgorithmSpec(weight="advantage", temp=1.0),
    "gspo": AlgorithmSpec(surrogate="gspo", std_normalize=True, **_GSPO_EPS),
    "rec-gspo-nois": AlgorithmSpec(clip="seq-one-side", **_GSPO_EPS),
    "rec-gspo-is": AlgorithmSpec(clip="seq-one-side", weight="seq-is", **_GSPO_EPS),
}

_FIELD_TYPES = {f.name: f.type for f in fields(AlgorithmSpec)}


def preset_names() -> list[str]:
    return list(PRESETS)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number (got {value!r})")
    return float(value)


def _check_param(name: str, value: Any) -> Any:
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
    checked = {key: _check_param(key, value) for key, value in (overrides or {}).items()}
    return replace(PRESETS[name], **checked)
