"""The paper's claims (docs/algorithms.md §9–10) checked against one experiment's final values
(pure functions): each claim **supported**, **contradicted** or **cannot tell yet**, or naming the
cells it lacks, with the condition that decided it per setting and preset, and `provisional`
while its cells still have runs queued or running."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dashboards import curves
from rlcore.config import cell_label

ON_POLICY = "on-policy"
ON_POLICY_DISTRIBUTED = cell_label("distributed", ON_POLICY, None)
OFFLINE = "offline"
REINFORCE = "reinforce"
NOIS = "rec-oneside-nois"
WIDE = "rec-oneside-nois-wide"
CLIPPED = ("grpo", "rec-oneside-is", NOIS, WIDE)
# "Large" staleness for the wide-clip claim: offline, or a mean lag of at least this many steps
# (sync_interval=48 over 150 steps has 23.5; sync_offset=8 has 7.8).
LARGE_MEAN_LAG = 16
SUPPORT, CONTRADICT, CANNOT_TELL, MISSING = "support", "contradict", "cannot tell yet", "missing cells"

Cell = tuple[str, str]  # (preset, staleness label)
Finals = Mapping[Cell, Mapping[int, float]]


@dataclass(frozen=True)
class Evidence:
    """An experiment's final values, with what the claims need to read them."""

    finals: Finals
    delta: float
    digits: int = curves.SHOWN_DIGITS
    # cell → (runs still queued or running, runs in all): provisional verdicts say so
    runs: Mapping[Cell, tuple[int, int]] = field(default_factory=dict)
    # the cell the changes are taken from: on-policy, or, where the experiment ran no simulated
    # runs, on-policy (distributed), the same numbers
    on_policy: str = ON_POLICY

    def has(self, cell: Cell) -> bool:
        return bool(self.finals.get(cell))

    def change(self, a: Cell, b: Cell) -> curves.Difference:
        """`a − b` paired by seed, as shown: rounded to `digits`."""
        return curves.paired_difference(self.finals[a], self.finals[b]).rounded(self.digits)

    def number(self, value: float) -> str:
        return f"{value:+.{self.digits}f}"

    def describe(self, d: curves.Difference) -> str:
        """`+0.012 [-0.004, +0.030] (95% bootstrap CI, 6 seeds)`, the min–max below 5 seeds, or the
        one seed's value."""
        if d.n_pairs == 0:
            return "no seed in common"
        if d.interval is None:
            return f"{self.number(d.mean)} (1 seed, no interval)"
        bounds = f"[{self.number(d.lo)}, {self.number(d.hi)}]"
        if d.interval == curves.CI:
            return f"{self.number(d.mean)} {bounds} (95% bootstrap CI, {d.n_pairs} seeds)"
        return f"{self.number(d.mean)} {bounds} (min–max of {d.n_pairs} seeds; no CI below {curves.MIN_CI_SEEDS})"

    def within(self, d: curves.Difference) -> bool:
        return d.has_interval and -self.delta <= d.lo and d.hi <= self.delta

    def outside(self, d: curves.Difference) -> bool:
        return d.has_interval and (d.lo > self.delta or d.hi < -self.delta)

    def degrades(self, d: curves.Difference) -> bool:
        return d.has_interval and d.hi < -self.delta

    def holds(self, d: curves.Difference) -> bool:
        return curves.holds_within(d, self.delta)

    def drop_state(self, d: curves.Difference) -> str:
        """What a change from on-policy says, in words that name the rule."""
        if not d.has_interval:
            return "one seed, no interval: cannot tell"
        if self.degrades(d):
            return f"degrades (upper end below −δ = {-self.delta:g})"
        if self.holds(d):
            return f"holds (lower end at or above −δ = {-self.delta:g})"
        return f"cannot tell (the interval straddles −δ = {-self.delta:g})"

    def gap_state(self, d: curves.Difference) -> str:
        """What a difference between two presets says about ±δ."""
        if not d.has_interval:
            return "one seed, no interval: cannot tell"
        if self.within(d):
            return f"within ±δ = {self.delta:g}"
        if self.outside(d):
            return f"outside ±δ = {self.delta:g}"
        return f"cannot tell (the interval reaches past ±δ = {self.delta:g})"


def _finding(claim: str, verdict: str, text: str, reasons: list[str], missing=None) -> dict[str, Any]:
    return {"claim": claim, "verdict": verdict, "text": text, "reasons": reasons, "missing": missing or []}


def _needs(evidence: Evidence, claim: str, cells: Sequence[Cell], what: str = "") -> dict[str, Any] | None:
    """The finding for cells without a final value: waited for while their runs are queued or
    running (`cannot tell yet`), missing when the experiment has no such runs; None if all have one."""
    lacking = [cell for cell in cells if not evidence.has(cell)]
    if not lacking:
        return None
    names = [f"{preset} × {setting}" for preset, setting in lacking]
    absent = [name for name, cell in zip(names, lacking, strict=True) if not evidence.runs.get(cell)]
    if absent:
        text = f"Needs {what or ', '.join(absent)}."
        return _finding(claim, MISSING, text, [f"no runs of {name}" for name in absent], absent)
    waiting = [f"waiting for the runs of {name} to log a value" for name in names]
    return _finding(claim, CANNOT_TELL, f"Waiting for {', '.join(names)}.", waiting)


def on_policy_coincide(evidence: Evidence) -> dict[str, Any]:
    claim = f"On-policy, {REINFORCE}, {NOIS} and {WIDE} coincide (ρ ≡ 1)."
    cells = [(p, evidence.on_policy) for p in (REINFORCE, NOIS, WIDE)]
    if (needed := _needs(evidence, claim, cells)) is not None:
        return needed
    diffs = {
        p: evidence.change((p, evidence.on_policy), (REINFORCE, evidence.on_policy)) for p in (NOIS, WIDE)
    }
    if all(evidence.within(d) for d in diffs.values()):
        verdict = SUPPORT
    elif any(evidence.outside(d) for d in diffs.values()):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    reasons = [f"{p} − {REINFORCE}: {evidence.gap_state(d)}" for p, d in diffs.items()]
    measured = "; ".join(f"{p} − {REINFORCE}: {evidence.describe(d)}" for p, d in diffs.items())
    return _finding(claim, verdict, f"On-policy, {measured}; δ = {evidence.delta:g}.", reasons)


def reinforce_degrades(evidence: Evidence, settings: Sequence[str]) -> dict[str, Any]:
    claim = f"Under staleness {REINFORCE} degrades while the clipped presets hold."
    clipped = [p for p in CLIPPED if evidence.has((p, evidence.on_policy))]
    stale = [
        s
        for s in settings
        if s != evidence.on_policy
        and evidence.has((REINFORCE, s))
        and any(evidence.has((p, s)) for p in clipped)
    ]
    if not evidence.has((REINFORCE, evidence.on_policy)) or not clipped or not stale:
        what = []
        if not evidence.has((REINFORCE, evidence.on_policy)):
            what.append(f"{REINFORCE} × {evidence.on_policy}")
        if not clipped:
            what.append(f"a clipped preset ({', '.join(CLIPPED)}) × {evidence.on_policy}")
        if not stale:
            what.append(
                f"{REINFORCE} and a clipped preset at one staleness setting besides {evidence.on_policy}"
            )
        pending = [
            cell
            for cell in [
                (REINFORCE, evidence.on_policy),
                *((p, s) for p in (REINFORCE, *CLIPPED) for s in settings),
            ]
            if not evidence.has(cell) and evidence.runs.get(cell)
        ]
        if pending:
            return _needs(evidence, claim, pending)
        return _finding(claim, MISSING, f"Needs {'; '.join(what)}.", [f"no runs of {w}" for w in what], what)
    parts, reasons, supported, contradicted = [], [], [], []
    for s in stale:
        drop_r = evidence.change((REINFORCE, s), (REINFORCE, evidence.on_policy))
        drops = {p: evidence.change((p, s), (p, evidence.on_policy)) for p in clipped if evidence.has((p, s))}
        if evidence.degrades(drop_r) and all(evidence.holds(d) for d in drops.values()):
            supported.append(s)
            decided = f"supports: {REINFORCE} degrades and every clipped preset holds"
        # Against the claim: reinforce holds, or every clipped preset degrades along with it.
        elif evidence.holds(drop_r) or (
            evidence.degrades(drop_r) and all(evidence.degrades(d) for d in drops.values())
        ):
            contradicted.append(s)
            decided = (
                f"contradicts: {REINFORCE} holds"
                if evidence.holds(drop_r)
                else f"contradicts: {REINFORCE} and every clipped preset degrade"
            )
        else:
            decided = "cannot tell"
        states = "; ".join(
            [f"{REINFORCE} {evidence.drop_state(drop_r)}"]
            + [f"{p} {evidence.drop_state(d)}" for p, d in drops.items()]
        )
        reasons.append(f"at {s}: {decided} ({states})")
        clipped_text = ", ".join(f"{p} {evidence.describe(d)}" for p, d in drops.items())
        parts.append(f"at {s}: {REINFORCE} {evidence.describe(drop_r)}, {clipped_text}")
    if supported:
        verdict = SUPPORT
    elif len(contradicted) == len(stale):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    text = f"Change from on-policy {'; '.join(parts)}; δ = {evidence.delta:g}."
    return _finding(claim, verdict, text, reasons)


def wide_clip_faster(
    evidence: Evidence, settings: Sequence[str], mean_lags: Mapping[str, float]
) -> dict[str, Any]:
    claim = f"At large staleness (or offline) the wider clip ({WIDE}) learns faster than {NOIS}."
    large = [s for s in settings if s == OFFLINE or mean_lags.get(s, 0) >= LARGE_MEAN_LAG]
    cells = [s for s in large if evidence.has((NOIS, s)) and evidence.has((WIDE, s))]
    if not cells:
        pending = [
            (p, s)
            for s in large
            for p in (NOIS, WIDE)
            if not evidence.has((p, s)) and evidence.runs.get((p, s))
        ]
        if pending:
            return _needs(evidence, claim, pending)
        what = (
            f"{NOIS} and {WIDE} at offline or at a mean lag ≥ {LARGE_MEAN_LAG} steps (e.g. sync_interval=48)"
        )
        return _finding(claim, MISSING, f"Needs {what}.", [f"no runs of {what}"], [what])
    diffs = {s: evidence.change((WIDE, s), (NOIS, s)) for s in cells}
    ahead = [s for s, d in diffs.items() if d.has_interval and d.lo > 0]
    behind = [s for s, d in diffs.items() if d.has_interval and d.hi < 0]
    if ahead and not behind:
        verdict = SUPPORT
    elif (behind and not ahead) or all(evidence.within(d) for d in diffs.values()):
        verdict = CONTRADICT
    else:
        verdict = CANNOT_TELL
    reasons = []
    for s, d in diffs.items():
        if s in ahead:
            state = "ahead (lower end above 0)"
        elif s in behind:
            state = "behind (upper end below 0)"
        else:
            state = evidence.gap_state(d) + (", and the interval contains 0" if d.contains_zero() else "")
        reasons.append(f"at {s}: {WIDE} − {NOIS} {state}")
    measured = "; ".join(f"at {s}: {evidence.describe(d)}" for s, d in diffs.items())
    return _finding(claim, verdict, f"{WIDE} − {NOIS} {measured}; δ = {evidence.delta:g}.", reasons)


CLAIM_CELLS = {
    0: lambda settings, lags, on_policy: [(p, on_policy) for p in (REINFORCE, NOIS, WIDE)],
    1: lambda settings, lags, on_policy: [(p, s) for p in (REINFORCE, *CLIPPED) for s in settings],
    2: lambda settings, lags, on_policy: [
        (p, s) for s in settings if s == OFFLINE or lags.get(s, 0) >= LARGE_MEAN_LAG for p in (NOIS, WIDE)
    ],
}


def findings(
    evidence: Evidence, settings: Sequence[str], mean_lags: Mapping[str, float]
) -> list[dict[str, Any]]:
    """One finding per claim: `claim`, `verdict` (support, contradict, cannot tell yet, missing
    cells), `text` with the numbers, `reasons` (the condition that decided it, per setting and
    preset), `missing` cells, and `provisional` with `runs_active` / `runs` of the claim's cells
    when some of them are still queued or running. `settings` start with on-policy if tested."""
    out = [
        on_policy_coincide(evidence),
        reinforce_degrades(evidence, settings),
        wide_clip_faster(evidence, settings, mean_lags),
    ]
    for index, found in enumerate(out):
        cells = set(CLAIM_CELLS[index](settings, mean_lags, evidence.on_policy))
        active = sum(evidence.runs.get(cell, (0, 0))[0] for cell in cells)
        total = sum(evidence.runs.get(cell, (0, 0))[1] for cell in cells)
        found.update(provisional=active > 0, runs_active=active, runs=total)
        if active:
            found["text"] = (
                f"Provisional: {active} of these cells' {total} runs are still queued or running. {found['text']}"
            )
    return out


def baseline(labels: Collection[str]) -> str | None:
    """The cell of `labels` that changes are taken from: on-policy, else on-policy run
    distributed (the same numbers); None when neither is there."""
    return next((label for label in (ON_POLICY, ON_POLICY_DISTRIBUTED) if label in labels), None)
