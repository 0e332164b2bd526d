"""The sweep's other axes in the comparison (`Run.variant`: config fields varied besides preset,
staleness and seed): which fields the compared runs vary, the lines they make (a preset and its
variant), the values the page can facet and colour by, and `contrasts`: each varied field's values
against its first, paired by seed within every other field (experiment, preset, staleness and the
rest of the variant)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dashboards.comparison import curves
from experiments.models import Experiment, Run
from experiments.text import field_names, variant_label


def varied_fields(runs: list[Run]) -> list[str]:
    """The variant fields of the compared runs, in the order their sweeps list them."""
    return list(dict.fromkeys(name for run in runs for name in run.variant))


def lines(
    runs: list[Run],
    experiments: list[Experiment],
    presets: list[str],
    label: Callable[[str, Experiment], str],
) -> list[dict[str, Any]]:
    """One line per experiment, preset and variant: presets in `presets` order, variants in their
    sweep's order (runs come in grid order)."""
    first: dict[tuple[int, str], Run] = {}
    for run in runs:
        first.setdefault((run.experiment_id, run.line), run)
    out = []
    for experiment in experiments:
        for preset in presets:
            for (e, key), run in first.items():
                if e == experiment.pk and run.preset == preset:
                    out.append(
                        {
                            "line": label(key, experiment),
                            "key": key,
                            "preset": preset,
                            "variant": run.variant,
                            "variant_label": run.variant_label,
                            "experiment": experiment.pk,
                        }
                    )
    return out


def field_values(
    fields: list[str], runs: list[Run], presets: list[str], staleness: list[str]
) -> list[dict[str, Any]]:
    """What the page can facet, colour and pair by: preset, staleness, and each varied field, with
    the values the compared runs have, in order."""
    names = field_names(fields)
    out = [
        {"name": "preset", "label": "preset", "values": presets},
        {"name": "staleness", "label": "staleness", "values": staleness},
    ]
    for name in fields:
        values = list(dict.fromkeys(_key(run.variant[name]) for run in runs if name in run.variant))
        out.append({"name": name, "label": names[name], "values": [_value(v) for v in values]})
    return out


def _key(value: Any) -> tuple[str, Any]:
    """A value as a dict key that keeps 1, 1.0 and True apart."""
    return (type(value).__name__, value)


def _value(key: tuple[str, Any]) -> Any:
    return key[1]


def contrasts(
    finals: dict[tuple[int, str, str], dict[int, float]],
    all_lines: list[dict[str, Any]],
    staleness: list[str],
    fields: list[str],
    delta: float,
    cell_runs: dict[tuple[int, str, str], tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Per varied field, per value besides its first in the experiment (`reference`), per cell that
    differs from a reference cell in that field only: the final value's change, paired by seed and rounded as the
    drops are (`curves.decision_digits`), with its interval and `state`: higher or lower (the
    interval excludes 0), within δ (the interval lies within ±δ), or cannot tell (so too below
    `curves.MIN_CI_SEEDS` pairs, whose min–max is no CI); marked provisional
    while runs of either cell are still queued or running (`cell_runs`: (active, all) per cell)."""
    cell_runs = cell_runs or {}
    digits = curves.decision_digits(delta)
    names = field_names(fields)
    rows = []
    for name in fields:
        # Each experiment's first value of the field is its reference (its sweep lists it first).
        references: dict[int, tuple[str, Any]] = {}
        for line in all_lines:
            if name in line["variant"]:
                references.setdefault(line["experiment"], _key(line["variant"][name]))
        for line in all_lines:
            reference = references.get(line["experiment"])
            if name not in line["variant"] or _key(line["variant"][name]) != reference:
                continue
            rest = {k: v for k, v in line["variant"].items() if k != name}
            for other in all_lines:
                if (
                    other is line
                    or other["experiment"] != line["experiment"]
                    or other["preset"] != line["preset"]
                ):
                    continue
                if (
                    name not in other["variant"]
                    or {k: v for k, v in other["variant"].items() if k != name} != rest
                ):
                    continue
                for setting in staleness:
                    a = finals.get((line["experiment"], other["key"], setting))
                    b = finals.get((line["experiment"], line["key"], setting))
                    if not a or not b:
                        continue
                    d = curves.paired_difference(a, b).rounded(digits)
                    if not d.n_pairs:
                        continue
                    rows.append(
                        {
                            "field": name,
                            "label": names[name],
                            "field_value": other["variant"][name],
                            "reference": _value(reference),
                            "experiment": line["experiment"],
                            "preset": line["preset"],
                            "others": variant_label(rest),
                            "staleness": setting,
                            "state": _state(d, delta)
                            + (
                                " (provisional: runs still going)"
                                if cell_runs.get((line["experiment"], other["key"], setting), (0, 0))[0]
                                or cell_runs.get((line["experiment"], line["key"], setting), (0, 0))[0]
                                else ""
                            ),
                            **curves.difference_fields(d),
                        }
                    )
    return rows


def _state(d: curves.Difference, delta: float) -> str:
    """Decided from a bootstrap CI only: below `curves.MIN_CI_SEEDS` pairs the min–max of 3 pairs
    shares a sign by chance one time in four, so it tells nothing, as the rest of the page says."""
    if d.interval != curves.CI:
        pairs = "one seed pair" if d.n_pairs == 1 else f"{d.n_pairs} seed pairs"
        return f"cannot tell ({pairs}: no CI below {curves.MIN_CI_SEEDS})"
    if d.lo > 0:
        return "higher"
    if d.hi < 0:
        return "lower"
    if -delta <= d.lo and d.hi <= delta:
        return "within δ"
    return "cannot tell"
