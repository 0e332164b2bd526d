"""The staleness answer: how much each line loses to staleness (drops from its own on-policy runs,
paired by seed; its tolerance and rank), which presets cannot be told apart (ties), and what the
data say about the paper's claims (`dashboards.claims.templates.findings`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dashboards.claims import templates, verdicts
from dashboards.comparison import curves


def staleness_answer(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    mean_lags: dict[str, float],
    delta: float,
    cell_runs: dict[tuple[int, str, str], tuple[int, int]] | None = None,
    configs: dict[tuple[int, str], str] | None = None,
) -> dict[str, Any]:
    """How much each line loses to staleness, and what the data say about the paper's claims.

    `drops`: per line and staleness cell (schedules and async cells alike), the final value minus
    the same line's on-policy final value (`baseline`: its cell, on-policy or on-policy
    (distributed), and its experiment: another compared one's when the line has none, `borrowed`),
    paired by seed, rounded as shown (`curves.decision_digits`: what every decision below
    compares with δ). `robustness`: per line, the mean and the worst drop over its staleness
    settings, its tolerance (the stalest setting up to which every drop's interval stays within δ
    below 0), its rank within its experiment by mean drop (lines missing a setting the experiment
    tested are not ranked), and `n_seeds` / `interval`: the fewest seed pairs those rest on and
    whether every one had a CI. `ties`: pairs of presets at one setting whose paired difference's
    interval contains 0, with the seeds per preset that would tell them apart. `findings`: per
    experiment, `templates.findings`; `cell_runs` (active, all runs per cell) makes them
    provisional while cells still run; `findings_left_out`: the templates whose presets the
    experiment's variant never ran.
    """
    digits = curves.decision_digits(delta)
    cell_runs = cell_runs or {}

    def change(a, b) -> curves.Difference:
        return curves.paired_difference(a, b).rounded(digits)

    own, finals = finals, dict(finals)
    borrowed = _borrow_baselines(finals, lines, staleness, configs or {})
    drops, robustness, ties, found, left_out = [], [], [], [], []
    for line in lines:
        cells = {
            s: finals[(line["experiment"], line["key"], s)]
            for s in staleness
            if (line["experiment"], line["key"], s) in finals
        }
        on_policy = templates.baseline(cells)
        if on_policy is None:
            continue
        baseline = {"staleness": on_policy, "experiment": borrowed.get((line["experiment"], line["key"]))}
        baseline["experiment"] = baseline["experiment"] or line["experiment"]
        tested = [on_policy] + [s for s in staleness if s in cells and s != on_policy]
        changes = {s: change(cells[s], cells[on_policy]) for s in tested[1:]}
        drops += [
            {**line, "staleness": s, "baseline": baseline, **curves.difference_fields(d)}
            for s, d in changes.items()
        ]
        means = [d.mean for d in changes.values() if math.isfinite(d.mean)]
        pairs = [d.n_pairs for d in changes.values()]
        robustness.append(
            {
                **line,
                "baseline": baseline,
                "settings": list(changes),
                "mean_drop": curves.scalar(round(float(np.mean(means)), digits)) if means else None,
                "worst_drop": curves.scalar(min(means)) if means else None,
                "tolerance": curves.tolerance(tested, changes, delta),
                "rank": None,
                "n_seeds": min(pairs) if pairs else 0,
                "interval": curves.interval_kind(min(pairs)) if pairs else None,
            }
        )
    for experiment in dict.fromkeys(line["experiment"] for line in lines):
        rows = [r for r in robustness if r["experiment"] == experiment]
        every = {s for r in rows for s in r["settings"]}
        ranked = [r for r in rows if set(r["settings"]) == every and every and r["mean_drop"] is not None]
        # Equal mean changes (as shown) share a rank, the next one skipping: 1, 1, 3.
        ordered = sorted(ranked, key=lambda r: -r["mean_drop"])
        for place, row in enumerate(ordered, start=1):
            tied = place > 1 and row["mean_drop"] == ordered[place - 2]["mean_drop"]
            row["rank"] = ordered[place - 2]["rank"] if tied else place
        # Ties and the paper's claims compare presets within one variant (the other axes held fixed).
        for variant in dict.fromkeys(
            line["variant_label"] for line in lines if line["experiment"] == experiment
        ):
            group = [
                line
                for line in lines
                if line["experiment"] == experiment and line["variant_label"] == variant
            ]
            keys = {line["key"]: line["preset"] for line in group}
            for setting in staleness:
                for i, a in enumerate(group):
                    for b in group[i + 1 :]:
                        ka, kb = (experiment, a["key"], setting), (experiment, b["key"], setting)
                        if ka not in own or kb not in own:
                            continue
                        d = change(own[kb], own[ka])
                        if d.n_pairs and d.contains_zero():
                            ties.append(
                                {
                                    "experiment": experiment,
                                    "variant": variant,
                                    "staleness": setting,
                                    "a": a["preset"],
                                    "b": b["preset"],
                                    **curves.difference_fields(d),
                                    "seeds_needed": curves.seeds_needed(d),
                                }
                            )
            cells = {(keys[k], s): v for (e, k, s), v in finals.items() if e == experiment and k in keys}
            runs = {(keys[k], s): n for (e, k, s), n in cell_runs.items() if e == experiment and k in keys}
            tested = [s for s in staleness if any(key[1] == s for key in cells | runs)]
            on_policy = templates.baseline({s for _, s in cells}) or templates.ON_POLICY
            evidence = verdicts.Data(cells, runs, on_policy, digits)
            checked, skipped = templates.findings(evidence, tested, mean_lags, delta, set(keys.values()))
            found += [{"experiment": experiment, "variant": variant, **f} for f in checked]
            left_out += [{"experiment": experiment, "variant": variant, **f} for f in skipped]
    return {
        "drops": drops,
        "robustness": robustness,
        "ties": ties,
        "findings": found,
        "findings_left_out": left_out,
        "borrowed": [
            {"experiment": e, "preset": k, "from_experiment": source} for (e, k), source in borrowed.items()
        ],
    }


def _borrow_baselines(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    configs: dict[tuple[int, str], str],
) -> dict[tuple[int, str], int]:
    """Lines of several compared experiments that have stale cells but no on-policy runs take those of
    the same line (preset and variant) from the first other experiment that has them and runs the same
    config apart from preset, staleness, execution and seed (`configs`: (experiment, line key) → that
    config, as text), paired by seed like their own: added to `finals` under the line's own
    experiment; returns (experiment, line key) → the lender."""
    borrowed = {}
    for line in lines:
        experiment, preset = line["experiment"], line["key"]
        own = [s for s in staleness if (experiment, preset, s) in finals]
        if not own or templates.baseline(own) is not None:
            continue
        for other in lines:
            if other["key"] != preset or other["experiment"] == experiment:
                continue
            if configs.get((other["experiment"], preset)) != configs.get((experiment, preset)):
                continue  # another task, model, budget or optimiser: no baseline for this line
            lent = templates.baseline([s for s in staleness if (other["experiment"], preset, s) in finals])
            if lent is not None and (other["experiment"], preset) not in borrowed:
                finals[(experiment, preset, lent)] = finals[(other["experiment"], preset, lent)]
                borrowed[(experiment, preset)] = other["experiment"]
                break
    return borrowed
