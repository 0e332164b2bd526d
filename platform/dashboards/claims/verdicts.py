"""Claims tested against final values (pure functions, no Django): a typed statement about lines of
a comparison (a preset with its variant) at staleness settings, its verdict, and why.

A claim is one or more **parts** that must all hold at a setting, tested at each of its settings:

- `holds`      X at s is within δ of B, the reference: non-inferiority, D = X(s) − B ≥ −δ;
- `degrades`   X at s is more than δ below B: D < −δ;
- `beats`      X at s is better than Y at s by more than δ: D > δ;
- `equivalent` |X(s) − Y(s)| ≤ δ, two one-sided tests (TOST).

B is Y at s when the part names a Y, else X's own on-policy cell. D is paired by seed (a paired t
test over the seeds both cells have, from 2 pairs), else Welch's unpaired t (each side ≥ 2 seeds);
each test gives a one-sided p-value for the claim (support) and one against it (contradict). Over
the claim's tests (settings × parts) both are **Holm**-adjusted, so every per-setting verdict the
page shows keeps its family-wise error at α. A test supports when its adjusted support p ≤ α,
contradicts when its adjusted contradict p ≤ α, else cannot tell; where the seeds leave the
difference with no spread, the boundary case goes to the margin (a change of exactly δ is
within δ). The interval shown is the (1 − 2α) t-interval (90% at α = 0.05: the TOST's).

A setting supports when every part does and contradicts when one does. The claim's quantifier says
how settings combine: `every` (it holds at each), `some` (at one at least). Its verdict is one of
support, contradict, cannot tell yet (also while cells have runs but no value) and missing cells
(cells with no runs at all), with the seeds that would settle each undecided test.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

KINDS = ("holds", "degrades", "beats", "equivalent")
NEEDS_Y = ("beats", "equivalent")
QUANTIFIERS = ("every", "some")
SUPPORT, CONTRADICT, CANNOT_TELL, MISSING = "support", "contradict", "cannot tell yet", "missing cells"
VERDICTS = (SUPPORT, CONTRADICT, CANNOT_TELL, MISSING)
POWER = 0.8  # of the seeds-needed figure
MAX_SEEDS_NEEDED = 10_000
EXACT = 12  # decimals below which a difference is floating-point noise

Cell = tuple[str, str]  # (line, staleness label)
# What a test reports beyond its cells and verdict: None where it did not run (or, seeds_needed,
# where it was decided).
TEST_FIELDS = (
    "estimate",
    "lo",
    "hi",
    "n",
    "paired",
    "test",
    "p_support",
    "p_contradict",
    "p_support_holm",
    "p_contradict_holm",
    "seeds_needed",
    "seeds_threshold",
)


@dataclass(frozen=True)
class Part:
    kind: str
    x: str
    y: str = ""

    def reference(self, setting: str, on_policy: str) -> Cell:
        return (self.y, setting) if self.y else (self.x, on_policy)


@dataclass(frozen=True)
class Statement:
    parts: tuple[Part, ...]
    settings: tuple[str, ...]
    quantifier: str = "every"
    delta: float = 0.02
    alpha: float = 0.05


@dataclass(frozen=True)
class Data:
    """Final values per cell (seed → value), runs per cell (queued or running, all) and the cell
    label changes are taken from."""

    finals: Mapping[Cell, Mapping[int, float]]
    runs: Mapping[Cell, tuple[int, int]] = field(default_factory=dict)
    on_policy: str = "on-policy"
    digits: int = 3

    def has(self, cell: Cell) -> bool:
        return any(math.isfinite(v) for v in self.finals.get(cell, {}).values())


def describe(statement: Statement) -> str:
    """The statement in words."""
    at = ", ".join(statement.settings) or "(no setting)"
    d = f"δ = {statement.delta:g}"
    words = []
    for p in statement.parts:
        if p.kind == "holds":
            ref = f"{p.y} at the same setting" if p.y else "its on-policy value"
            words.append(f"{p.x} stays within {d} of {ref}")
        elif p.kind == "degrades":
            ref = f"{p.y} at the same setting" if p.y else "its on-policy value"
            words.append(f"{p.x} drops more than {d} below {ref}")
        elif p.kind == "beats":
            words.append(f"{p.x} beats {p.y} by more than {d}")
        else:
            words.append(f"{p.x} and {p.y} are within ±{d}")
    quantifier = (
        "at every one of" if statement.quantifier == "every" and len(statement.settings) > 1 else "at"
    )
    if statement.quantifier == "some" and len(statement.settings) > 1:
        quantifier = "at one at least of"
    return f"{'; '.join(words)} {quantifier} {at} (α = {statement.alpha:g})."


@dataclass(frozen=True)
class Sample:
    """D = A − B as a t statistic's ingredients: mean, standard error, degrees of freedom."""

    mean: float
    se: float
    df: float
    n: int  # seed pairs, or the smaller side when unpaired
    paired: bool
    sd: float  # of the differences (paired) or pooled per run (unpaired)


def sample(a: Mapping[int, float], b: Mapping[int, float]) -> Sample | None:
    """Paired by seed over the seeds both have (from 2), else Welch over each side's seeds (each ≥ 2);
    None when neither is possible."""
    fa = {s: v for s, v in a.items() if math.isfinite(v)}
    fb = {s: v for s, v in b.items() if math.isfinite(v)}
    shared = sorted(fa.keys() & fb.keys())
    if len(shared) >= 2:
        d = np.round(np.array([fa[s] - fb[s] for s in shared]), EXACT)
        sd = float(d.std(ddof=1))
        return Sample(float(d.mean()), sd / math.sqrt(len(d)), len(d) - 1, len(d), True, sd)
    if len(fa) >= 2 and len(fb) >= 2:
        xa, xb = np.array(list(fa.values())), np.array(list(fb.values()))
        va, vb = xa.var(ddof=1) / len(xa), xb.var(ddof=1) / len(xb)
        se = math.sqrt(va + vb)
        df = (
            (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
            if se > 0
            else len(xa) + len(xb) - 2
        )
        pooled = math.sqrt((xa.var(ddof=1) + xb.var(ddof=1)) / 2)
        mean = round(float(xa.mean() - xb.mean()), EXACT)
        return Sample(mean, se, df, min(len(xa), len(xb)), False, pooled)
    return None


def _p_above(s: Sample, threshold: float, inclusive: bool) -> float:
    """One-sided p-value against H1: D > threshold (D ≥ threshold when `inclusive`, which only
    matters with no spread)."""
    gap = round(s.mean - threshold, EXACT)
    if s.se == 0:
        return 0.0 if gap > 0 or (inclusive and gap == 0) else 1.0
    return float(sps.t.sf(gap / s.se, s.df))


def _p_below(s: Sample, threshold: float, inclusive: bool) -> float:
    gap = round(threshold - s.mean, EXACT)
    if s.se == 0:
        return 0.0 if gap > 0 or (inclusive and gap == 0) else 1.0
    return float(sps.t.sf(gap / s.se, s.df))


def p_values(kind: str, s: Sample, delta: float) -> tuple[float, float]:
    """(p for the claim, p against it) of one test."""
    if kind == "holds":
        return _p_above(s, -delta, True), _p_below(s, -delta, False)
    if kind == "degrades":
        return _p_below(s, -delta, False), _p_above(s, -delta, True)
    if kind == "beats":
        return _p_above(s, delta, False), _p_below(s, delta, True)
    if kind == "equivalent":
        tost = max(_p_above(s, -delta, True), _p_below(s, delta, True))
        outside = min(1.0, 2 * min(_p_below(s, -delta, False), _p_above(s, delta, False)))
        return tost, outside
    raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    adjusted, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def interval(s: Sample, alpha: float) -> tuple[float, float]:
    """The two-sided (1 − 2α) t-interval of D."""
    half = 0.0 if s.se == 0 else float(sps.t.ppf(1 - alpha, s.df)) * s.se
    return s.mean - half, s.mean + half


def _thresholds(kind: str, delta: float) -> tuple[float, ...]:
    return (-delta, delta) if kind == "equivalent" else ((delta,) if kind == "beats" else (-delta,))


def nearest_threshold(kind: str, mean: float, delta: float) -> float:
    """The line an undecided test's D must be told from (its seeds-needed figure aims at it): −δ
    (holds, degrades), +δ (beats), or the nearer of ±δ (equivalent). Not 0, which is what "cannot
    be told apart" asks: the same pair can need far more seeds here when D sits near ±δ."""
    return min(_thresholds(kind, delta), key=lambda t: abs(mean - t))


def seeds_needed(kind: str, s: Sample, delta: float, alpha: float) -> int | None:
    """Seeds per cell for a difference like this one (its mean and spread) to be decided at level
    `alpha` with power 0.8 by a one-sided t test against its nearest threshold; None when it sits
    on a threshold or has no spread to go on, and above `MAX_SEEDS_NEEDED`."""
    gap = abs(s.mean - nearest_threshold(kind, s.mean, delta))
    if gap == 0 or not math.isfinite(s.sd) or s.sd == 0:
        return None
    n = np.arange(2, MAX_SEEDS_NEEDED + 1)
    se = s.sd / np.sqrt(n) if s.paired else s.sd * np.sqrt(2 / n)
    enough = np.flatnonzero(gap / se >= _critical(alpha, s.paired))
    return int(n[enough[0]]) if len(enough) else None


@functools.lru_cache(maxsize=64)
def _critical(alpha: float, paired: bool) -> np.ndarray:
    """t quantiles at 1 − α plus at the power, for n = 2 … MAX_SEEDS_NEEDED seeds per cell (one
    vectorised call: the comparison page asks for them for every test of every claim)."""
    n = np.arange(2, MAX_SEEDS_NEEDED + 1)
    df = n - 1 if paired else 2 * n - 2
    return sps.t.ppf(1 - alpha, df) + sps.t.ppf(POWER, df)


def cells(statement: Statement, on_policy: str) -> list[Cell]:
    """Every cell the statement reads: each part's X and its reference at each setting."""
    out = [
        cell
        for setting in statement.settings
        for part in statement.parts
        for cell in ((part.x, setting), part.reference(setting, on_policy))
    ]
    return list(dict.fromkeys(out))


def _cell(cell: Cell) -> str:
    return f"{cell[0]} × {cell[1]}"


def evaluate(statement: Statement, data: Data) -> dict[str, Any]:
    """The claim's verdict with every test behind it (see the module docstring)."""
    delta, alpha, digits = statement.delta, statement.alpha, data.digits
    settings_out, tests = [], []
    missing, waiting = [], []
    for setting in statement.settings:
        parts_out = []
        for part in statement.parts:
            a, b = (part.x, setting), part.reference(setting, data.on_policy)
            row: dict[str, Any] = {
                "kind": part.kind,
                "a": _cell(a),
                "b": _cell(b),
                # what the page calls the difference: X's change from its reference setting, or X − Y
                "label": f"{part.x} − {part.y}" if part.y else f"{part.x} (from {data.on_policy})",
                "verdict": None,
                "reason": "",
                **dict.fromkeys(TEST_FIELDS),
            }
            lacking = [c for c in (a, b) if not data.has(c)]
            if lacking:
                absent = [_cell(c) for c in lacking if not data.runs.get(c, (0, 0))[1]]
                missing += absent
                waiting += [_cell(c) for c in lacking if data.runs.get(c, (0, 0))[1]]
                row["verdict"] = MISSING if absent else CANNOT_TELL
                row["reason"] = (
                    f"no runs of {', '.join(absent)}"
                    if absent
                    else f"waiting for the runs of {', '.join(_cell(c) for c in lacking)} to log a value"
                )
            else:
                s = sample(data.finals[a], data.finals[b])
                if s is None:
                    row.update(verdict=CANNOT_TELL, reason="one seed per cell: no interval", n=1)
                else:
                    lo, hi = interval(s, alpha)
                    p_for, p_against = p_values(part.kind, s, delta)
                    row.update(
                        estimate=round(s.mean, digits),
                        lo=round(lo, digits),
                        hi=round(hi, digits),
                        n=s.n,
                        paired=s.paired,
                        test="paired t" if s.paired else "Welch t (unpaired: too few seeds in common)",
                        p_support=p_for,
                        p_contradict=p_against,
                        _sample=s,
                    )
                    tests.append(row)
            parts_out.append(row)
        settings_out.append({"setting": setting, "parts": parts_out})
    support_adj = holm([t["p_support"] for t in tests])
    against_adj = holm([t["p_contradict"] for t in tests])
    for row, ps, pc in zip(tests, support_adj, against_adj, strict=True):
        s = row.pop("_sample")
        row.update(p_support_holm=ps, p_contradict_holm=pc)
        if ps <= alpha:
            row["verdict"] = SUPPORT
        elif pc <= alpha:
            row["verdict"] = CONTRADICT
        else:
            row["verdict"] = CANNOT_TELL
            row["seeds_needed"] = seeds_needed(row["kind"], s, delta, alpha / max(1, len(tests)))
            row["seeds_threshold"] = nearest_threshold(row["kind"], s.mean, delta)
        row["reason"] = _reason(row)
    for entry in settings_out:
        verdicts = [p["verdict"] for p in entry["parts"]]
        if CONTRADICT in verdicts:
            entry["verdict"] = CONTRADICT
        elif MISSING in verdicts:
            entry["verdict"] = MISSING
        elif all(v == SUPPORT for v in verdicts):
            entry["verdict"] = SUPPORT
        else:
            entry["verdict"] = CANNOT_TELL
    return {
        "statement": describe(statement),
        "verdict": _combine(statement.quantifier, [e["verdict"] for e in settings_out]),
        "by_setting": settings_out,
        "missing": list(dict.fromkeys(missing)),
        "waiting": list(dict.fromkeys(waiting)),
        "tests": len(tests),
        "holm": len(tests) > 1,
        "confidence": 1 - 2 * alpha,
    }


def _combine(quantifier: str, verdicts: list[str]) -> str:
    if not verdicts:
        return MISSING
    if quantifier == "some":
        if SUPPORT in verdicts:
            return SUPPORT
        if all(v == CONTRADICT for v in verdicts):
            return CONTRADICT
    else:
        if CONTRADICT in verdicts:
            return CONTRADICT
        if all(v == SUPPORT for v in verdicts):
            return SUPPORT
    return MISSING if MISSING in verdicts else CANNOT_TELL


RULES = {
    "holds": ("within δ (D ≥ −δ)", "more than δ below (D < −δ)"),
    "degrades": ("more than δ below (D < −δ)", "within δ (D ≥ −δ)"),
    "beats": ("ahead by more than δ (D > δ)", "not ahead by more than δ (D ≤ δ)"),
    "equivalent": ("within ±δ (both one-sided tests)", "outside ±δ"),
}


def _reason(row: dict[str, Any]) -> str:
    """What decided one test, naming the rule."""
    if row["verdict"] == SUPPORT:
        state = f"supports: {RULES[row['kind']][0]}"
    elif row["verdict"] == CONTRADICT:
        state = f"contradicts: {RULES[row['kind']][1]}"
    else:
        needed = row.get("seeds_needed")
        state = "cannot tell"
        if needed:
            state += (
                f" (about {needed} seeds per cell would settle it: D = {row['estimate']:+g} is to be told "
                f"from {row['seeds_threshold']:+g}, one-sided)"
            )
    return f"{row['label']}: {state}"


def measured(row: dict[str, Any], confidence: float, digits: int = 3) -> str:
    """`+0.075 [+0.041, +0.109] (90% paired t-interval, 3 seed pairs)` for a test, or why there is
    none."""
    if row.get("estimate") is None:
        return f"({row.get('reason', '')})"
    kind = "paired t-interval" if row["paired"] else "Welch t-interval"
    return (
        f"{row['estimate']:+.{digits}f} [{row['lo']:+.{digits}f}, {row['hi']:+.{digits}f}] "
        f"({confidence:.0%} {kind}, {row['n']} {'seed pairs' if row['paired'] else 'seeds'})"
    )
