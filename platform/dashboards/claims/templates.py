"""The paper's claims (docs/algorithms.md §9–10) as claim templates (`dashboards.claims.verdicts`), checked
against one experiment's final values within one variant: each **supported**, **contradicted**,
**cannot tell yet** or naming the cells it lacks, with the test that decided it per setting and
preset, and `provisional` while its cells still have runs queued or running.

A template is data: its parts name presets (a part may stand for each of a list of presets the
experiment ran on-policy), its settings are chosen by a rule (`on-policy`, `stale`: every tested
setting but on-policy, `large`: offline or a mean lag of at least `min_mean_lag` steps), and it
may fix its own δ. `instantiate` turns one into a `verdicts.Statement` for an experiment's cells."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dashboards.claims import verdicts
from rlcore.config import cell_label

ON_POLICY = "on-policy"
ON_POLICY_DISTRIBUTED = cell_label("distributed", ON_POLICY, None)
OFFLINE = "offline"
SUPPORT, CONTRADICT, CANNOT_TELL, MISSING = (
    verdicts.SUPPORT,
    verdicts.CONTRADICT,
    verdicts.CANNOT_TELL,
    verdicts.MISSING,
)

CLIPPED = ["grpo", "rec-oneside-is", "rec-oneside-nois", "rec-oneside-nois-wide"]
PAPER_TEMPLATES: tuple[dict[str, Any], ...] = (
    {
        "name": "on-policy-coincide",
        "title": "On-policy, reinforce, rec-oneside-nois and rec-oneside-nois-wide coincide (ρ ≡ 1).",
        "settings": {"rule": "on-policy"},
        "quantifier": "every",
        "parts": [
            {"kind": "equivalent", "x": "rec-oneside-nois", "y": "reinforce"},
            {"kind": "equivalent", "x": "rec-oneside-nois-wide", "y": "reinforce"},
        ],
    },
    {
        "name": "reinforce-degrades",
        "title": "Under staleness reinforce degrades while the clipped presets hold.",
        "settings": {"rule": "stale"},
        "quantifier": "some",
        "parts": [
            {"kind": "degrades", "x": "reinforce"},
            {"kind": "holds", "each_of": CLIPPED, "as": "a clipped preset"},
        ],
    },
    {
        "name": "wide-clip-faster",
        "title": (
            "At large staleness (or offline) the wider clip (rec-oneside-nois-wide) learns faster than "
            "rec-oneside-nois."
        ),
        "settings": {"rule": "large", "min_mean_lag": 16, "as": "offline or a mean lag ≥ 16 steps"},
        "quantifier": "every",
        "delta": 0.0,
        "parts": [{"kind": "beats", "x": "rec-oneside-nois-wide", "y": "rec-oneside-nois"}],
    },
)


def baseline(labels: Collection[str]) -> str | None:
    """The cell of `labels` that changes are taken from: on-policy, else on-policy run
    distributed (the same numbers); None when neither is there."""
    return next((label for label in (ON_POLICY, ON_POLICY_DISTRIBUTED) if label in labels), None)


def template_settings(
    template: Mapping[str, Any], tested: Sequence[str], on_policy: str, mean_lags: Mapping[str, float]
) -> list[str]:
    rule = template["settings"]
    if rule["rule"] == "on-policy":
        return [on_policy]
    if rule["rule"] == "stale":
        return [s for s in tested if s != on_policy]
    if rule["rule"] == "large":
        return [s for s in tested if s == OFFLINE or mean_lags.get(s, 0) >= rule["min_mean_lag"]]
    raise ValueError(f"unknown settings rule {rule['rule']!r}")


def instantiate(
    template: Mapping[str, Any],
    data: verdicts.Data,
    tested: Sequence[str],
    mean_lags: Mapping[str, float],
    delta: float,
) -> tuple[verdicts.Statement, list[str]]:
    """The template's statement for these cells, and what it cannot be stated without (a list of
    presets none of which was run on-policy; a rule no tested setting meets)."""
    parts, lacking = [], []
    for part in template["parts"]:
        if "each_of" in part:
            ran = [
                p
                for p in part["each_of"]
                if data.has((p, data.on_policy)) or data.runs.get((p, data.on_policy))
            ]
            if not ran:
                lacking.append(f"{part['as']} ({', '.join(part['each_of'])}) × {data.on_policy}")
            parts += [verdicts.Part(part["kind"], p) for p in ran]
        else:
            parts.append(verdicts.Part(part["kind"], part["x"], part.get("y", "")))
    settings = template_settings(template, tested, data.on_policy, mean_lags)
    if not settings:
        what = template["settings"].get("as", "a staleness setting besides on-policy")
        names = sorted({p.x for p in parts} | {p.y for p in parts if p.y})
        lacking.append(f"{' and '.join(names)} at {what}")
    statement = verdicts.Statement(
        tuple(parts), tuple(settings), template["quantifier"], template.get("delta", delta)
    )
    return statement, lacking


def finding(template: Mapping[str, Any], result: dict[str, Any], data: verdicts.Data) -> dict[str, Any]:
    """A claim's result in the findings panel's words: `claim`, `verdict`, `text` (the numbers),
    `reasons` (the decisive condition per setting and preset), `missing` cells."""
    parts, reasons = [], []
    for entry in result["by_setting"]:
        rows = entry["parts"]
        numbers = ", ".join(
            f"{r['label']} {verdicts.measured(r, result['confidence'], data.digits)}" for r in rows
        )
        parts.append(f"at {entry['setting']}: {numbers}")
        decided = "; ".join(r["reason"] for r in rows)
        reasons.append(f"at {entry['setting']}: {entry['verdict']} ({decided}; δ = {result['delta']:g})")
    text = "; ".join(parts) + f"; δ = {result['delta']:g}." if parts else ""
    return {
        "claim": template["title"],
        "template": template["name"],
        "verdict": result["verdict"],
        "text": text,
        "reasons": reasons,
        "missing": result["missing"],
        "by_setting": result["by_setting"],
    }


def absent(template: Mapping[str, Any], presets: Collection[str]) -> list[str]:
    """What of the template's presets the sweep never ran: a preset it names, or every one of a
    part's `each_of` (one of them is enough)."""
    missing: list[str] = []
    for part in template["parts"]:
        if "each_of" in part:
            if not any(p in presets for p in part["each_of"]):
                missing.append(f"{part['as']} ({', '.join(part['each_of'])})")
        else:
            missing += [
                p for p in (part["x"], part.get("y", "")) if p and p not in presets and p not in missing
            ]
    return missing


def findings(
    data: verdicts.Data,
    tested: Sequence[str],
    mean_lags: Mapping[str, float],
    delta: float,
    presets: Collection[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One finding per paper template whose presets the sweep ran (`presets`; see `finding`), plus
    `provisional` with `runs_active` / `runs` of the claim's cells when some of them are still queued
    or running; and the templates left out, each with the presets it lacks (`absent`): a sweep of
    other presets is not "missing cells" of the paper's. `tested` starts with on-policy if tested."""
    out, left_out = [], []
    for template in PAPER_TEMPLATES:
        if lacks := absent(template, presets):
            left_out.append({"template": template["name"], "claim": template["title"], "absent": lacks})
            continue
        statement, lacking = instantiate(template, data, tested, mean_lags, delta)
        result = verdicts.evaluate(statement, data) | {"delta": statement.delta}
        found = finding(template, result, data)
        if lacking:
            found.update(verdict=MISSING, missing=found["missing"] + lacking)
            found["text"] = f"Needs {'; '.join(lacking)}."
        elif result["verdict"] in (MISSING, CANNOT_TELL) and not result["tests"]:
            found["text"] = (
                f"Needs {', '.join(result['missing'])}."
                if result["missing"]
                else f"Waiting for {', '.join(result['waiting'])}."
            )
        cells = verdicts.cells(statement, data.on_policy)
        active = sum(data.runs.get(cell, (0, 0))[0] for cell in cells)
        total = sum(data.runs.get(cell, (0, 0))[1] for cell in cells)
        found.update(provisional=active > 0, runs_active=active, runs=total)
        if active:
            found["text"] = (
                f"Provisional: {active} of these cells' {total} runs are still queued or running. {found['text']}"
            )
        out.append(found)
    return out, left_out
