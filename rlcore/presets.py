"""The algorithm presets (docs/algorithms.md §4) as plain data, importable without torch: each is
one frozen `AlgorithmSpec` of the loss family, and `resolve(name, overrides)` gives the spec a run
uses; `rlcore.algorithms` turns a spec into tensor functions."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

from pydantic import Field

Surrogate = Literal[
    "rec",
    "ppo",
    "gspo",
    "m2po",
    "cispo",
    "sapo",
    "gmpo",
    "topr",
    "dppo-tv",
    "trm",
    "dppo-kl",
    "ce-gppo",
    "dro",
    "bapo",
]
Correction = Literal["none", "decoupled", "tis", "mis", "icepop", "kpop"]
Anchor = Literal["behaviour", "proximal", "loglinear"]
Clip = Literal["none", "one-side", "two-side", "ring", "seq-one-side"]
Weight = Literal["none", "is", "seq-is", "advantage", "truncated-is"]
Reg = Literal["none", "k2", "forward-kl"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
Std = Literal["sample", "population"]

# (bound, test, how a message writes `value test bound`, and `bound … value` on the left of a range)
_BOUNDS = (
    ("gt", operator.gt, ">", "<"),
    ("ge", operator.ge, ">=", "<="),
    ("lt", operator.lt, "<", ">"),
    ("le", operator.le, "<=", ">="),
)


@dataclass(frozen=True)
class Knob:
    """Marks a field of `AlgorithmSpec` as a parameter a user may override on any preset, with the
    rule `check_param` holds it to: a bool is true or false, a `Literal` one of its values, a
    number lies within the bounds given here (or is None where the type allows it; `null` says so
    in the message). `why` follows the message. Pydantic does not read it, so the JSON schema (and the
    OpenAPI document) carry no bounds."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    null: str = ""
    why: str = ""

    def _bounds(self) -> list[tuple[float, Any, str, str]]:
        return [(bound, *how) for key, *how in _BOUNDS if (bound := getattr(self, key)) is not None]

    def holds(self, value: float) -> bool:
        return all(test(value, bound) for bound, test, _, _ in self._bounds())

    def rule(self, name: str) -> str:
        """The bounds as a message says them: `be > 0`, or `satisfy 0 < name <= 1`."""
        bounds = self._bounds()
        if len(bounds) == 1:
            bound, _, sign, _ = bounds[0]
            return f"be {sign} {bound}"
        (low, _, _, left), (high, _, sign, _) = bounds
        return f"satisfy {low} {left} {name} {sign} {high}"


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
        float,
        Field(title="Clip ε low", description="the clip window starts at ratio 1 − ε_low"),
        Knob(gt=0, le=1),
    ] = 0.2
    eps_high: Annotated[
        float, Field(title="Clip ε high", description="the clip window ends at ratio 1 + ε_high"), Knob(gt=0)
    ] = 0.2
    eps_low_prime: Annotated[
        float,
        Field(title="Ring ε′ low", description="ring clip: positive tokens below 1 − ε′_low count again"),
        Knob(gt=0, le=1),
    ] = 0.6
    eps_high_prime: Annotated[
        float,
        Field(title="Ring ε′ high", description="ring clip: negative tokens above 1 + ε′_high count again"),
        Knob(gt=0),
    ] = 2.0
    reg_coef: Annotated[
        float,
        Field(title="Regulariser weight c", description="weight of the k2 / forward-KL term"),
        Knob(ge=0),
    ] = 0.0
    temp: Annotated[
        float,
        Field(title="RED-Weight temperature T", description="responses are weighted by exp(A / T)"),
        Knob(gt=0, why=": RED-Weight divides the advantage by it"),
    ] = 1.0
    std_normalize: Annotated[
        bool,
        Field(title="Divide advantages by σ", description="divide each group's advantages by its σ"),
        Knob(),
    ] = False
    std: Annotated[
        Std,
        Field(title="σ estimator", description="sample (n − 1) or population (n)"),
        Knob(),
    ] = "sample"
    loss_agg: Annotated[
        LossAgg, Field(title="Loss aggregation", description="how token losses become one number"), Knob()
    ] = "token-mean"
    dual_clip: Annotated[
        float | None,
        Field(title="Dual clip c", description="PPO surrogates: cap the loss of negative tokens at −c·A"),
        Knob(gt=1, null=" or null to disable it"),
    ] = None
    anchor: Annotated[
        Anchor,
        Field(
            title="Anchor",
            description=(
                "the log-prob the ratio is taken against: behaviour (recorded at rollout), proximal "
                "(recomputed by the trainer under the weights at the start of the step) or loglinear "
                "(A-3PO: no proximal forward, p = μ + α·(π − μ) detached, α = (d − 1)/d for a lag of d ≥ 1 "
                "versions, else 0)"
            ),
        ),
        Knob(),
    ] = "behaviour"
    is_cap: Annotated[
        float,
        Field(
            title="Behaviour-weight cap C",
            description="decoupled PPO masks tokens whose q = π_prox/μ exceeds C; TIS truncates q at C (C ≥ 1)",
        ),
        Knob(ge=1, why=": C caps the behaviour weight q, which is 1 on-policy"),
    ] = 2.0
    is_low: Annotated[
        float,
        Field(
            title="MIS / IcePop lower bound",
            description="masked IS and IcePop keep tokens with is_low ≤ q ≤ is_high (0 < is_low ≤ 1)",
        ),
        Knob(gt=0, le=1),
    ] = 0.5
    is_high: Annotated[
        float,
        Field(
            title="MIS / IcePop upper bound",
            description="masked IS and IcePop keep tokens with is_low ≤ q ≤ is_high (is_high ≥ 1)",
        ),
        Knob(ge=1),
    ] = 5.0
    m2po_tau: Annotated[
        float,
        Field(
            title="M2PO second-moment budget τ",
            description="mask the largest (log ρ)² tokens of the whole batch until the mean of the rest is ≤ τ",
        ),
        Knob(gt=0),
    ] = 0.04
    m2po_quadrants: Annotated[
        bool,
        Field(
            title="M2PO: only tokens that moved with A",
            description="the paper's Algorithm 1: only (A > 0, ρ > 1) or (A < 0, ρ < 1) tokens may be masked",
        ),
        Knob(),
    ] = False
    sapo_tau_pos: Annotated[
        float,
        Field(title="SAPO τ for A > 0", description="temperature of the soft gate σ(τ(ρ − 1)) where A > 0"),
        Knob(gt=0),
    ] = 1.0
    sapo_tau_neg: Annotated[
        float,
        Field(title="SAPO τ for A ≤ 0", description="temperature of the soft gate σ(τ(ρ − 1)) where A ≤ 0"),
        Knob(gt=0),
    ] = 1.05
    dppo_delta: Annotated[
        float,
        Field(
            title="DPPO probability bound δ",
            description="mask a token whose probability moved more than δ with its advantage (0 < δ < 1)",
        ),
        Knob(gt=0, lt=1, why=": it bounds a change of probability"),
    ] = 0.2
    kpop_phi: Annotated[
        float,
        Field(
            title="KPop binary-KL bound φ",
            description=(
                "mask a token whose binary KL between its proximal and behaviour probabilities "
                "(either direction) exceeds φ"
            ),
        ),
        Knob(gt=0),
    ] = 2.0
    trm_delta: Annotated[
        float,
        Field(
            title="TRM sequence bound δ",
            description="drop a response whose largest per-token k3 between trainer and rollout exceeds δ",
        ),
        Knob(gt=0),
    ] = 0.1
    dppo_kl_delta: Annotated[
        float,
        Field(
            title="DPPO-KL binary-KL bound δ",
            description="mask a token whose binary KL between behaviour and current probabilities exceeds δ "
            "where it moved with its advantage",
        ),
        Knob(gt=0),
    ] = 0.05
    dppo_ratio_cap: Annotated[
        float,
        Field(
            title="DPPO-KL ratio cap C",
            description="DPPO-KL weights the gradient by the detached ratio truncated at C",
        ),
        Knob(ge=1, why=": C truncates the ratio, which is 1 on-policy"),
    ] = 1e4
    cegppo_beta_low: Annotated[
        float,
        Field(
            title="CE-GPPO β₁ (A < 0, ratio below 1 − ε_low)",
            description="the gradient kept by negative tokens clipped below: −β₁(1 − ε_low)·A",
        ),
        Knob(ge=0),
    ] = 0.5
    cegppo_beta_high: Annotated[
        float,
        Field(
            title="CE-GPPO β₂ (A > 0, ratio above 1 + ε_high)",
            description="the gradient kept by positive tokens clipped above: −β₂(1 + ε_high)·A",
        ),
        Knob(ge=0),
    ] = 1.0
    dro_beta: Annotated[
        float,
        Field(title="DRO β", description="DRO's penalty (β/2)·(π − anchor)²"),
        Knob(ge=0),
    ] = 0.05
    bapo_target: Annotated[
        float,
        Field(
            title="BAPO target ρ₀",
            description="widen the bounds until the positive over negative surrogate mass s reaches ρ₀",
        ),
        Knob(gt=0),
    ] = 0.5
    bapo_low_start: Annotated[
        float,
        Field(title="BAPO c_low start", description="the search starts the lower bound here"),
        Knob(gt=0, le=1),
    ] = 0.6
    bapo_low_end: Annotated[
        float,
        Field(title="BAPO c_low end", description="the lower bound rises at most to here"),
        Knob(gt=0, le=1),
    ] = 0.9
    bapo_low_step: Annotated[
        float,
        Field(title="BAPO c_low step", description="the lower bound rises by this much at a time"),
        Knob(ge=0.01, why=": the search tries each value in turn"),
    ] = 0.05
    bapo_high_start: Annotated[
        float,
        Field(title="BAPO c_high start", description="the search starts the upper bound here"),
        Knob(ge=1),
    ] = 1.2
    bapo_high_end: Annotated[
        float,
        Field(title="BAPO c_high end", description="the upper bound rises at most to here"),
        Knob(ge=1),
    ] = 3.0
    bapo_high_step: Annotated[
        float,
        Field(title="BAPO c_high step", description="the upper bound rises by this much at a time"),
        Knob(ge=0.01, why=": the search tries each value in turn"),
    ] = 0.1
    opsm_delta: Annotated[
        float | None,
        Field(
            title="OPSM threshold δ",
            description="drop a response with A < 0 whose mean (μ − π) exceeds δ; blank: off",
        ),
        Knob(gt=0, lt=1, null=", or be null to turn OPSM off"),
    ] = None

    def knobs(self) -> tuple[str, ...]:
        """The tunable parameters this member's loss reads (`READS`); overriding any other one
        changes nothing."""
        used = {"std_normalize", "loss_agg", "opsm_delta"}
        for part, reads in READS.items():
            used.update(reads.get(getattr(self, part), ()))
        if self.std_normalize:
            used.add("std")
        return tuple(name for name in TUNABLE if name in used)

    @property
    def reads_ratio(self) -> bool:
        """Whether the loss reads a ratio π/anchor (so its anchor matters): every surrogate but plain
        REC without a clip, an importance weight or the k2 term (REINFORCE, RED, AsymRE)."""
        return "anchor" in self.knobs()

    def params(self) -> dict[str, Any]:
        """The tunable parameters with their resolved values (what a run stores)."""
        return {name: getattr(self, name) for name in TUNABLE}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_CLIP = ("eps_low", "eps_high", "anchor")
_RING = ("eps_low_prime", "eps_high_prime")
_BAPO = (
    "bapo_target",
    "bapo_low_start",
    "bapo_low_end",
    "bapo_low_step",
    "bapo_high_start",
    "bapo_high_end",
    "bapo_high_step",
)
# The knobs each structure field's value reads, beyond std_normalize, loss_agg and opsm_delta
# (every member reads them) and std (read when std_normalize): `anchor` wherever a ratio is read.
READS: dict[str, dict[str, tuple[str, ...]]] = {
    "surrogate": {
        "ppo": (*_CLIP, "dual_clip"),
        "gspo": (*_CLIP, "dual_clip"),
        "m2po": ("anchor", "m2po_tau", "m2po_quadrants"),
        "cispo": _CLIP,
        "sapo": ("anchor", "sapo_tau_pos", "sapo_tau_neg"),
        "gmpo": _CLIP,
        "topr": ("anchor",),
        "dppo-tv": ("anchor", "dppo_delta"),
        "trm": (*_CLIP, "dual_clip", "trm_delta"),
        "dppo-kl": ("anchor", "dppo_kl_delta", "dppo_ratio_cap"),
        "ce-gppo": (*_CLIP, "cegppo_beta_low", "cegppo_beta_high"),
        "dro": ("anchor", "dro_beta"),
        "bapo": ("anchor", *_BAPO),
    },
    "correction": {
        "decoupled": ("is_cap",),
        "tis": ("is_cap",),
        "mis": ("is_low", "is_high"),
        "icepop": ("is_low", "is_high"),
        "kpop": ("kpop_phi",),
    },
    "clip": {"one-side": _CLIP, "two-side": _CLIP, "ring": (*_CLIP, *_RING), "seq-one-side": _CLIP},
    "weight": {
        "is": ("anchor",),
        "seq-is": ("anchor",),
        "advantage": ("temp",),
        "truncated-is": ("anchor", *_RING),
    },
    "reg": {"k2": ("anchor", "reg_coef"), "forward-kl": ("reg_coef",)},
}


def _knobs() -> dict[str, tuple[Any, Knob]]:
    """Each field marked `Knob`, in the class's order: (its type, its knob)."""
    hints = get_type_hints(AlgorithmSpec, include_extras=True)
    found = {}
    for field in fields(AlgorithmSpec):
        if get_origin(hints[field.name]) is Annotated:
            kind, *metadata = get_args(hints[field.name])
            for knob in metadata:
                if isinstance(knob, Knob):
                    found[field.name] = (kind, knob)
    return found


_KNOBS = _knobs()
# The parameters a user may override on any preset (the structure fields are the preset itself).
TUNABLE = tuple(_KNOBS)


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
    "icepop": Preset(
        "IcePop (arXiv 2510.18855; verl decoupled_token_icepop, AReaL's ratio rejection): PPO-clip on "
        "π/π_prox weighted by q = π_prox/μ, tokens with q outside [0.5, 5] masked (q-weighted as verl and "
        "AReaL; weight 1 is grpo-mis)",
        AlgorithmSpec(surrogate="ppo", correction="icepop", anchor="proximal", std_normalize=True),
        CORRECTIONS,
    ),
    "kpop": Preset(
        "KPop (ringtech.notion.site/kpop; AReaL's binary_kl rejection): PPO-clip on π/π_prox weighted by q, "
        "tokens whose binary KL between π_prox and μ (either way) exceeds 2.0 masked",
        AlgorithmSpec(surrogate="ppo", correction="kpop", anchor="proximal", std_normalize=True),
        CORRECTIONS,
    ),
    "trm": Preset(
        "Trust-region masking (arXiv 2512.23075; verl rollout_rs seq_max_k3): PPO-clip on π/π_prox, a "
        "response dropped when its largest k3(p − μ) exceeds 0.1, no IS weight (k3, not slime's k2)",
        AlgorithmSpec(surrogate="trm", anchor="proximal", std_normalize=True),
        CORRECTIONS,
    ),
    "dppo-kl": Preset(
        "DPPO binary-KL (arXiv 2602.04879; verl compute_policy_loss_dppo_kl, Stable-RL): −A·sg(min(ρ, 1e4))·π, "
        "tokens whose binary KL to μ exceeds 0.05 where they moved with A masked, no penalty (verl's form)",
        AlgorithmSpec(surrogate="dppo-kl"),
        FIELD,
    ),
    "ce-gppo": Preset(
        "CE-GPPO (arXiv 2509.20712; Kwai-Klear/CE-GPPO): PPO-clip whose clipped tokens keep a gradient "
        "β·(1 ± ε)·A, β₁ 0.5 below, β₂ 1.0 above (no dual clip or SFT term, as their scripts add)",
        AlgorithmSpec(surrogate="ce-gppo", std_normalize=True),
        FIELD,
    ),
    "dro": Preset(
        "DRO (verl compute_policy_loss_dro, after arXiv 2405.19107): −(A·π − (β/2)·(π − μ)²), β 0.05, "
        "anchored on μ as Tinker (verl takes π_old): opmd with c = β/2",
        AlgorithmSpec(surrogate="dro"),
        FIELD,
    ),
    "bapo": Preset(
        "BAPO (arXiv 2510.18927; WooooDyy/BAPO): PPO-clip with bounds [c_low, c_high] searched per mini-batch "
        "(c_low 0.6→0.9, c_high 1.2→3.0) until positive/negative surrogate mass ≥ 0.5 (the authors' search, "
        "per mini-batch not micro-batch, no dual clip)",
        AlgorithmSpec(surrogate="bapo", std_normalize=True),
        FIELD,
    ),
}


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


def _unknown(name: str) -> str:
    return f"unknown algorithm parameter {name!r}; known: {', '.join(TUNABLE)}"


def check_param(name: str, value: Any) -> Any:
    """Coerce and validate one tunable parameter by its field's `Knob`; raise ValueError naming it
    and the rule."""
    if name not in _KNOBS:
        raise ValueError(_unknown(name))
    kind, knob = _KNOBS[name]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false (got {value!r})")
        return value
    if get_origin(kind) is Literal:
        if value not in get_args(kind):
            raise ValueError(f"{name} must be one of {', '.join(get_args(kind))} (got {value!r})")
        return value
    if value is None and type(None) in get_args(kind):
        return None
    number = _number(name, value)
    if not knob.holds(number):
        raise ValueError(f"{name} must {knob.rule(name)}{knob.null} (got {value!r}){knob.why}")
    return number


def resolve(name: str, overrides: dict[str, Any] | None = None) -> AlgorithmSpec:
    """The preset `name` with `overrides` applied; ValueError names the preset or parameter."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; known: {', '.join(PRESETS)}")
    checked = {key: check_param(key, value) for key, value in (overrides or {}).items()}
    return replace(PRESETS[name].spec, **checked)


@dataclass(frozen=True)
class KnobCheck:
    """What `check_knobs` found of the parameters set for several presets at once (a sweep's): the
    overrides and the varied values each knob's rule refuses, and the knobs a preset's loss does
    not read (setting or varying one there leaves its runs alike)."""

    refused: dict[str, str]  # an override → why (check_param's message)
    unknown: dict[str, str]  # a varied name that is no knob → why
    refused_values: dict[str, list[tuple[Any, str]]]  # a varied knob → (value, why) per value refused
    # Each valid override and each varied knob → the presets (known ones, each once, in the order
    # given) whose loss, with the valid overrides applied, does not read it.
    ignored: dict[str, list[str]]


def check_knobs(presets: list[str], overrides: dict[str, Any], varied: dict[str, list[Any]]) -> KnobCheck:
    """Hold `overrides` (knob → value, applied to every preset) and each value of the `varied` knobs
    to their rules, and find which of `presets` would ignore each knob (`AlgorithmSpec.knobs`, on
    the preset with the valid overrides applied). Unknown preset names are left out."""
    refused, valid = {}, {}
    for name, value in overrides.items():
        try:
            valid[name] = check_param(name, value)
        except ValueError as exc:
            refused[name] = str(exc)
    unknown = {name: _unknown(name) for name in varied if name not in _KNOBS}
    refused_values: dict[str, list[tuple[Any, str]]] = {}
    for name, values in varied.items():
        if name in unknown:
            continue
        for value in values:
            try:
                check_param(name, value)
            except ValueError as exc:
                refused_values.setdefault(name, []).append((value, str(exc)))
    specs = [(preset, resolve(preset, valid)) for preset in dict.fromkeys(presets) if preset in PRESETS]
    ignored = {
        name: [preset for preset, spec in specs if name not in spec.knobs()]
        for name in [*valid, *(name for name in varied if name not in unknown)]
    }
    return KnobCheck(refused, unknown, refused_values, ignored)
