"""The paper's qualitative claims (ALGORITHMS.md §9–10), checked against one experiment's final values.

Pure functions, no Django. `findings` takes the final value of every run as
`{(preset, staleness label): {seed: value}}` with the experiment's staleness settings in order
from on-policy to the stalest, and says for each claim whether the data **support** it,
**contradict** it or **cannot tell yet**, in one sentence with the measured numbers and their 95%
bootstrap CIs, or which cells the claim needs that the experiment lacks. Differences are paired by
seed (`curves.paired_difference`); δ is the change that counts (in the metric's units).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments import curves

ON_POLICY = "on-policy"
OFFLINE = "offline"
REINFORCE = "reinforce"
NOIS = "rec-oneside-nois"
WIDE = "rec-oneside-nois-wide"
CLIPPED = ("grpo", "rec-oneside-is", NOIS, WIDE)
# "Large" staleness for the wide-clip claim: offline, or a mean lag of at least this many steps
# (sync_interval=48 over 150 steps has 23.5; sync_offset=8 has 7.8).
LARGE_MEAN_LAG = 16
SUPPORT, CONTRADICT, CANNOT_TELL, MISSING = "support", "contradict", "cannot tell yet", "missing cells"

Finals = Mapping[tuple[str, str], Mapping[int, float]]


def describe(d: curves.Difference) -> str:
    """`+0.012 [-0.004, +0.030] (95% bootstrap CI, 3 seeds)`, or the one-seed value without a CI."""
    if d.n_pairs == 0:
        return "no seed in common"
    if not d.has_ci:
        return f"{d.mean:+.3f} (1 seed, no CI)"
    return f"{d.mean:+.3f} [{d.ci_lo:+.3f}, {d.ci_hi:+.3f}] (95% bootstrap CI, {d.n_pairs} seeds)"


def _missing(finals: Finals, cells: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{preset} × {setting}" for preset, setting in cells if not finals.get((preset, setting))]


def _within(d: curves.Difference, delta: float) -> bool:
    return d.has_ci and -delta <= d.ci_lo and d.ci_hi <= delta


def _outside(d: curves.Difference, delta: float) -> bool:
    return d.has_ci and (d.ci_lo > delta or d.ci_hi < -delta)


def _degrades(d: curves.Difference, delta: float) -> bool:
    return d.has_ci and d.ci_hi < -delta


def on_policy_coincide(finals: Finals, delta: float) -> dict[str, Any]:
    claim = f"On-policy, {REINFORCE}, {NOIS} and {WIDE} coincide (ρ ≡ 1)."
    missing = _missing(finals, [(p, ON_POLICY) for p in (REINFORCE, NOIS, WIDE)])
    if missing:
        return {
            "claim": claim,
            "verdict": MISSING,
            "text": f"Needs {', '.join(missing)}.",
            "missing": missing,
        }
    base = finals[(REINFORCE, ON_POLICY)]
    diffs = {p: curves.paired_difference(finals[(p, ON_POLICY)], base) for p in (NOIS, WIDE)}
    if all(_within(d, delta) for d in diffs.values()):
        verdict = SUPPORT
    elif any(_outside(d, delta) for d in diffs.values()):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    measured = "; ".join(f"{p} − {REINFORCE}: {describe(d)}" for p, d in diffs.items())
    return {
        "claim": claim,
        "verdict": verdict,
        "text": f"On-policy, {measured}; δ = {delta:g}.",
        "missing": [],
    }


def reinforce_degrades(finals: Finals, settings: Sequence[str], delta: float) -> dict[str, Any]:
    claim = f"Under staleness {REINFORCE} degrades while the clipped presets hold."
    clipped = [p for p in CLIPPED if finals.get((p, ON_POLICY))]
    stale = [
        s
        for s in settings
        if s != ON_POLICY and finals.get((REINFORCE, s)) and any(finals.get((p, s)) for p in clipped)
    ]
    if not finals.get((REINFORCE, ON_POLICY)) or not clipped or not stale:
        missing = _missing(finals, [(REINFORCE, ON_POLICY)])
        if not clipped:
            missing.append(f"a clipped preset ({', '.join(CLIPPED)}) × {ON_POLICY}")
        if not stale:
            missing.append(f"{REINFORCE} and a clipped preset at one staleness setting besides {ON_POLICY}")
        return {
            "claim": claim,
            "verdict": MISSING,
            "text": f"Needs {'; '.join(missing)}.",
            "missing": missing,
        }
    parts, supported, contradicted = [], [], []
    for s in stale:
        drop_r = curves.paired_difference(finals[(REINFORCE, s)], finals[(REINFORCE, ON_POLICY)])
        drops = {
            p: curves.paired_difference(finals[(p, s)], finals[(p, ON_POLICY)])
            for p in clipped
            if finals.get((p, s))
        }
        if _degrades(drop_r, delta) and all(curves.holds_within(d, delta) for d in drops.values()):
            supported.append(s)
        # Against the claim: reinforce holds, or every clipped preset degrades along with it.
        if curves.holds_within(drop_r, delta) or (
            _degrades(drop_r, delta) and all(_degrades(d, delta) for d in drops.values())
        ):
            contradicted.append(s)
        clipped_text = ", ".join(f"{p} {describe(d)}" for p, d in drops.items())
        parts.append(f"at {s}: {REINFORCE} {describe(drop_r)}, {clipped_text}")
    if supported:
        verdict = SUPPORT
    elif len(contradicted) == len(stale):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    text = f"Change from on-policy {'; '.join(parts)}; δ = {delta:g}."
    return {"claim": claim, "verdict": verdict, "text": text, "missing": []}


def wide_clip_faster(
    finals: Finals, settings: Sequence[str], mean_lags: Mapping[str, float], delta: float
) -> dict[str, Any]:
    claim = f"At large staleness (or offline) the wider clip ({WIDE}) learns faster than {NOIS}."
    large = [s for s in settings if s == OFFLINE or mean_lags.get(s, 0) >= LARGE_MEAN_LAG]
    cells = [s for s in large if finals.get((NOIS, s)) and finals.get((WIDE, s))]
    if not cells:
        missing = [
            f"{NOIS} and {WIDE} at offline or at a mean lag ≥ {LARGE_MEAN_LAG} steps (e.g. sync_interval=48)"
        ]
        return {"claim": claim, "verdict": MISSING, "text": f"Needs {missing[0]}.", "missing": missing}
    diffs = {s: curves.paired_difference(finals[(WIDE, s)], finals[(NOIS, s)]) for s in cells}
    ahead = [s for s, d in diffs.items() if d.has_ci and d.ci_lo > 0]
    behind = [s for s, d in diffs.items() if d.has_ci and d.ci_hi < 0]
    if ahead and not behind:
        verdict = SUPPORT
    elif (behind and not ahead) or all(_within(d, delta) for d in diffs.values()):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    measured = "; ".join(f"at {s}: {describe(d)}" for s, d in diffs.items())
    return {
        "claim": claim,
        "verdict": verdict,
        "text": f"{WIDE} − {NOIS} {measured}; δ = {delta:g}.",
        "missing": [],
    }


def findings(
    finals: Finals, settings: Sequence[str], mean_lags: Mapping[str, float], delta: float
) -> list[dict[str, Any]]:
    """One finding per claim: `claim`, `verdict` (support, contradict, cannot tell yet, missing
    cells), `text` with the numbers, `missing` cells. `settings` start with on-policy if tested."""
    return [
        on_policy_coincide(finals, delta),
        reinforce_degrades(finals, settings, delta),
        wide_clip_faster(finals, settings, mean_lags, delta),
    ]
