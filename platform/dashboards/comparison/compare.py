"""The comparison: one metric of the chosen runs, aggregated per (experiment, line, staleness)
group into curves with bands, final values and throughput across seeds, and the staleness answer
(each line's drop from its own on-policy runs, tolerance, ties, findings). A line is a preset and
its values of the sweep's other axes (`Run.variant`); `variants.contrasts` pairs the cells that
differ in one varied field only. The payload is a table of named panels (`panels.PANELS`), each
computed only when asked for. How it is computed: docs/architecture.md, "The comparison
dashboard"."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db.models import QuerySet

from dashboards.comparison import panels, throughput
from dashboards.comparison.grouping import Layout
from dashboards.comparison.query import ComparisonQuery
from dashboards.comparison.reads import Finals
from experiments.models import Run
from rlcore.sinks import ALL_METRICS

METRICS = ALL_METRICS


THROUGHPUT_COLUMNS = tuple(
    f"{name}{part}" for name in throughput.RATES for part in ("", "_lo", "_hi", "_interval")
)


ALL_PANELS = tuple(panels.PANELS)


# What a report's table block freezes: every panel but the curves.
TABLE_PANELS = tuple(name for name in ALL_PANELS if name != "curves")


def compare(
    runs: QuerySet[Run], query: ComparisonQuery, asked: Collection[str] = ALL_PANELS
) -> dict[str, Any]:
    """The comparison payload of `runs` (see the module docstring).

    A line is a preset within one experiment: runs of different experiments are never averaged
    together as seeds, since their configs may differ in more than preset and staleness.
    Archived runs are left out. Final values come from the summaries where the query allows
    (`final_values`), else from the points. The points and the summaries are two reads: a run
    that logs in between shows its new point in its final value and not yet in its curve, until
    the next call (its state, the kept answer's key, changed with that point).

    `asked` names the panels computed (`panels.PANELS`, all by default), merged in their order.
    """
    layout = Layout.of(runs)
    finals = Finals.read(layout, query)
    payload: dict[str, Any] = {}
    for name, panel in panels.PANELS.items():
        if name in asked:
            payload |= panel(layout, finals, query)
    return payload


def summary_table(runs: QuerySet[Run], query: ComparisonQuery) -> dict[str, Any]:
    """The summary table alone, as `compare` gives it (`summary`, `throughput`, with the
    `experiments` and varied `fields` its CSV names): per cell the final value ± interval and the
    throughput. The final values come from the summaries (`stored_finals`) and the points are
    read only when the query needs them."""
    layout = Layout.of(runs)
    finals = Finals.read(layout, query, points=False)
    return {
        "experiments": panels.experiments(layout),
        "fields": layout.field_values(),
        **panels.summary(layout, finals, query),
        "throughput": panels.throughput_panel(layout, finals, query)["throughput"],
    }
