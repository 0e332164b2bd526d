"""The algorithm presets (docs/algorithms.md §4) as plain data, importable without torch: each is
one frozen `AlgorithmSpec` of the loss family, and `resolve(name, overrides)` gives the spec a run
uses; `rlcore.algorithms` turns a spec into tensor functions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Literal

from pydantic import Field

Surrogate = Literal["rec", "ppo", "gspo", "m2po", "cispo", "sapo", "gmpo", "topr", "dppo-tv"]
Correction = Literal["none", "decoupled", "tis", "mis"]
Anchor = Literal["behaviour", "proximal"]
Clip = Literal["none", "one-side", "two-side", "ring", "seq-one-side"]
Weight = Literal["none", "is", "seq-is", "advantage", "truncated-is"]
Reg = Literal["none", "k2", "forward-kl"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
STD_KINDS = ("sample", "population")
ANCHORS = ("behaviour", "proximal")

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
    "anchor",
    "is_cap",
    "is_low",
    "is_high",
    "m2po_tau",
    "m2po_quadrants",
    "sapo_tau_pos",
    "sapo_tau_neg",
    "dppo_delta",
    "opsm_delta",
)


@dataclass(frozen=True)
class AlgorithmSpec:
    """One member of the loss family (docs/algorithms.md §3 and §13), fully resolved: the
    structure fields (surrogate, clip, weight, reg, correction, red_drop) say which member it is,
    the rest are its knobs."""

    surrogate: Surrogate = "rec"
    correction: Correction = "none"
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
    anchor: Annotated[
        Anchor,
        Field(
            title="Anchor",
            description=(
                "the log-prob the ratio is taken against: behaviour (recorded at rollout) or proximal "
                "(recomputed by the trainer under the weights at the start of the step)"
            ),
        ),
    ] = "behaviour"
    is_cap: Annotated[
        float,
        Field(
            title="Behaviour-weight cap C",
            description="decoupled PPO masks tokens whose q = π_prox/μ exceeds C; TIS truncates q at C (C ≥ 1)",
        ),
    ] = 2.0
    is_low: Annotated[
        float,
        Field(
            title="MIS lower bound",
            description="masked IS keeps tokens with is_low ≤ q ≤ is_high (0 < is_low ≤ 1)",
        ),
    ] = 0.5
    is_high: Annotated[
        float,
        Field(
            title="MIS upper bound",
            description="masked IS keeps tokens with is_low ≤ q ≤ is_high (is_high ≥ 1)",
        ),
    ] = 5.0
    m2po_tau: Annotated[
        float,
        Field(
            title="M2PO second-moment budget τ",
            description="mask the largest (log ρ)² tokens of the whole batch until the mean of the rest is ≤ τ",
        ),
    ] = 0.04
    m2po_quadrants: Annotated[
        bool,
        Field(
            title="M2PO: only tokens that moved with A",
            description="the paper's Algorithm 1: only (A > 0, ρ > 1) or (A < 0, ρ < 1) tokens may be masked",
        ),
    ] = False
    sapo_tau_pos: Annotated[
        float,
        Field(title="SAPO τ for A > 0", description="temperature of the soft gate σ(τ(ρ − 1)) where A > 0"),
    ] = 1.0
    sapo_tau_neg: Annotated[
        float,
        Field(title="SAPO τ for A ≤ 0", description="temperature of the soft gate σ(τ(ρ − 1)) where A ≤ 0"),
    ] = 1.05
    dppo_delta: Annotated[
        float,
        Field(
            title="DPPO probability bound δ",
            description="mask a token whose probability moved more than δ with its advantage (0 < δ < 1)",
        ),
    ] = 0.2
    opsm_delta: Annotated[
        float | None,
        Field(
            title="OPSM threshold δ",
            description="drop a response with A < 0 whose mean (μ − π) exceeds δ; blank: off",
        ),
    ] = None

    def knobs(self) -> tuple[str, ...]:
        """The tunable parameters this member's loss reads; overriding any other one changes nothing."""
        used = {"std_normalize", "loss_agg", "opsm_delta"}
        if self.reads_ratio:
            used.add("anchor")
        if self.clip != "none" or self.surrogate in ("ppo", "gspo", "cispo", "gmpo"):
            used |= {"eps_low", "eps_high"}
        if self.correction in ("decoupled", "tis"):
            used.add("is_cap")
        if self.correction == "mis":
            used |= {"is_low", "is_high"}
        if self.surrogate == "m2po":
            used |= {"m2po_tau", "m2po_quadrants"}
        if self.surrogate == "sapo":
            used |= {"sapo_tau_pos", "sapo_tau_neg"}
        if self.surrogate == "dppo-tv":
            used.add("dppo_delta")
        if self.clip == "ring" or self.weight == "truncated-is":
            used |= {"eps_low_prime", "eps_high_prime"}
        if self.reg != "none":
            used.add("reg_coef")
        if self.weight == "advantage":
            used.add("temp")
        if self.std_normalize:
            used.add("std")
        if self.surrogate in ("ppo", "gspo"):
            used.add("dual_clip")
        return tuple(name for name in TUNABLE if name in used)

    @property
    def reads_ratio(self) -> bool:
        """Whether the loss reads a ratio π/anchor (so its anchor matters): every surrogate but plain
        REC without a clip, an importance weight or the k2 term (REINFORCE, RED, AsymRE)."""
        if self.surrogate != "rec":
            return True
        return self.clip != "none" or self.weight in ("is", "seq-is", "truncated-is") or self.reg == "k2"

    def params(self) -> dict[str, Any]:
        """The tunable parameters with their resolved values (what a run stores)."""
        return {name: getattr(self, name) for name in TUNABLE}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_GSPO_EPS = {"eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"}


@dataclass(frozen=True)
class Preset:
    """A named point of the family: its knobs, one line saying what it is and where it comes
    from, and the group the form lists it under."""

    description: str
    spec: AlgorithmSpec
    family: str = "The paper's family (REC, RED, OPMD, AsymRE)"


GRPO_FAMILY = "GRPO and GSPO"
CORRECTIONS = "Behaviour corrections (proximal anchor)"
FIELD = "The field's staleness-robust losses"


PRESETS: dict[str, Preset] = {
    "reinforce": Preset("group-relative REINFORCE: plain policy gradient, no clipping", AlgorithmSpec()),
    "grpo": Preset(
        "GRPO: PPO-clip surrogate on the token ratio, advantages divided by the group's σ",
        AlgorithmSpec(surrogate="ppo", std_normalize=True),
        GRPO_FAMILY,
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
        GRPO_FAMILY,
    ),
    "rec-gspo-nois": Preset(
        "REC one-side clip on the sequence-level ratio, no importance weight",
        AlgorithmSpec(clip="seq-one-side", **_GSPO_EPS),
    ),
    "rec-gspo-is": Preset(
        "REC one-side clip on the sequence-level ratio, weighted by the sequence ratio",
        AlgorithmSpec(clip="seq-one-side", weight="seq-is", **_GSPO_EPS),
    ),
    "decoupled-ppo": Preset(
        "Decoupled PPO (AReaL, arXiv 2505.24298): PPO-clip on π/π_prox, weighted by q = π_prox/μ, tokens "
        "with q > 5 masked (AReaL's paper form, not its newer default that drops q)",
        AlgorithmSpec(
            surrogate="ppo", correction="decoupled", anchor="proximal", std_normalize=True, is_cap=5.0
        ),
        CORRECTIONS,
    ),
    "grpo-tis": Preset(
        "GRPO with truncated IS (Yao et al. 2025; verl, slime): PPO-clip on π/π_prox times min(q, 2), "
        "token level",
        AlgorithmSpec(surrogate="ppo", correction="tis", anchor="proximal", std_normalize=True, is_cap=2.0),
        CORRECTIONS,
    ),
    "grpo-mis": Preset(
        "GRPO with masked IS (verl rollout correction, OpenRLHF): PPO-clip on π/π_prox, tokens with q "
        "outside [0.5, 5] masked, token level",
        AlgorithmSpec(surrogate="ppo", correction="mis", anchor="proximal", std_normalize=True),
        CORRECTIONS,
    ),
    "m2po": Preset(
        "M2PO (arXiv 2510.01161), AReaL's form: no clip, the largest (log ρ)² tokens of the whole batch "
        "masked until their mean is ≤ 0.04 (m2po_quadrants: the paper's Algorithm 1)",
        AlgorithmSpec(surrogate="m2po", std_normalize=True),
        FIELD,
    ),
    "cispo": Preset(
        "CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the detached clipped ratio "
        "[0, 1.28], clipped tokens keep a gradient (Trinity's bounds; TRL's differ)",
        AlgorithmSpec(surrogate="cispo", std_normalize=True, eps_low=1.0, eps_high=0.28),
        FIELD,
    ),
    "sapo": Preset(
        "SAPO (Qwen, arXiv 2511.20347): a soft sigmoid gate on the ratio, τ 1.0 / 1.05 (verl, AReaL and "
        "TRL's form; Trinity's gradient differs)",
        AlgorithmSpec(surrogate="sapo", std_normalize=True, loss_agg="seq-mean-token-mean"),
        FIELD,
    ),
    "gmpo": Preset(
        "GMPO (arXiv 2507.20673): the geometric mean of the sequence's token ratios, log-ratios clipped "
        "to ±0.4 (verl's geo_mean)",
        AlgorithmSpec(
            surrogate="gmpo", std_normalize=True, eps_low=0.4, eps_high=0.4, loss_agg="seq-mean-token-mean"
        ),
        FIELD,
    ),
    "topr": Preset(
        "TOPR (arXiv 2503.14286): REINFORCE, negative-advantage tokens weighted by min(ρ, 1), per token "
        "(Trinity's form; the paper's ratio is per trajectory)",
        AlgorithmSpec(surrogate="topr"),
        FIELD,
    ),
    "dppo-tv": Preset(
        "DPPO binary-TV with a k2 term (prime-rl's default loss, arXiv 2602.04879): IS-weighted REINFORCE, "
        "tokens whose probability moved > 0.2 with A masked, + 1e-3·(log ρ)²",
        AlgorithmSpec(surrogate="dppo-tv", reg="k2", reg_coef=1e-3),
        FIELD,
    ),
}

_FIELD_TYPES = {f.name: f.type for f in fields(AlgorithmSpec)}


def preset_names() -> list[str]:
    return list(PRESETS)


def families() -> dict[str, list[str]]:
    """The presets grouped by family, in the order above (the form lists them so)."""
    out: dict[str, list[str]] = {}
    for name, preset in PRESETS.items():
        out.setdefault(preset.family, []).append(name)
    return out


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
    if name == "anchor":
        if value not in ANCHORS:
            raise ValueError(f"anchor must be one of {', '.join(ANCHORS)} (got {value!r})")
        return value
    if name == "is_cap":
        v = _number(name, value)
        if not v >= 1:
            raise ValueError(
                f"is_cap must be >= 1 (got {value!r}): C caps the behaviour weight q, which is 1 on-policy"
            )
        return v
    if name == "is_low":
        v = _number(name, value)
        if not 0 < v <= 1:
            raise ValueError(f"is_low must satisfy 0 < is_low <= 1 (got {value!r})")
        return v
    if name == "is_high":
        v = _number(name, value)
        if not v >= 1:
            raise ValueError(f"is_high must be >= 1 (got {value!r})")
        return v
    if name in ("m2po_tau", "sapo_tau_pos", "sapo_tau_neg"):
        v = _number(name, value)
        if not v > 0:
            raise ValueError(f"{name} must be > 0 (got {value!r})")
        return v
    if name == "m2po_quadrants":
        if not isinstance(value, bool):
            raise ValueError(f"m2po_quadrants must be true or false (got {value!r})")
        return value
    if name == "dppo_delta":
        v = _number(name, value)
        if not 0 < v < 1:
            raise ValueError(
                f"dppo_delta must satisfy 0 < dppo_delta < 1 (got {value!r}): it bounds a change of probability"
            )
        return v
    if name == "opsm_delta":
        if value is None:
            return None
        v = _number(name, value)
        if not 0 < v < 1:
            raise ValueError(
                f"opsm_delta must satisfy 0 < opsm_delta < 1, or be null to turn OPSM off (got {value!r})"
            )
        return v
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
