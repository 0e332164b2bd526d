"""The comparison as CSV files: the aggregated curves, and the summary table with throughput."""

from __future__ import annotations

import csv
import io
from typing import Any

from dashboards.comparison.compare import THROUGHPUT_COLUMNS


def curves_csv(payload: dict[str, Any]) -> str:
    """The aggregated curves as CSV: one row per group and grid point."""
    out = io.StringIO()
    writer = csv.writer(out)
    several = len(payload["experiments"]) > 1
    varied = _varied(payload)
    writer.writerow(
        [
            *(["experiment"] if several else []),
            "preset",
            *varied,
            "staleness",
            payload["x"],
            "mean",
            "lo",
            "hi",
            "n_seeds",
        ]
    )
    for g in payload["groups"]:
        lo, hi = g["lo"] or [None] * len(g["x"]), g["hi"] or [None] * len(g["x"])
        labels = [
            *([g["experiment"]] if several else []),
            g["preset"],
            *(g["variant"].get(name, "") for name in varied),
            g["staleness"],
        ]
        for row in zip(g["x"], g["mean"], lo, hi, g["n"], strict=True):
            writer.writerow([*labels, *("" if v is None else v for v in row)])
    return out.getvalue()


def _varied(payload: dict[str, Any]) -> list[str]:
    """The config fields the compared runs vary besides preset and staleness: a column each."""
    return [f["name"] for f in payload["fields"][2:]]


def summary_csv(payload: dict[str, Any]) -> str:
    """The summary table as CSV: one row per (preset, varied fields' values, staleness), the final value with its interval
    (`interval` says what `lo`, `hi` are: a 95% bootstrap CI, also in `ci_lo`/`ci_hi`, from
    `curves.MIN_CI_SEEDS` seeds, else the min–max), how many of its runs collapsed, and then the
    group's throughput (`throughput_n_seeds`: the ended runs its rates rest on, contended ones left out)."""
    out = io.StringIO()
    writer = csv.writer(out)
    several = len(payload["experiments"]) > 1
    varied = _varied(payload)
    head = [*(["experiment"] if several else []), "preset"]
    tail = [
        "staleness",
        "n_runs",
        "n_seeds",
        "value",
        "lo",
        "hi",
        "interval",
        "ci_lo",
        "ci_hi",
        "std",
        "n_collapsed",
    ]
    writer.writerow([*head, *varied, *tail, *THROUGHPUT_COLUMNS, "throughput_n_seeds"])
    for row, speed in zip(payload["summary"], payload["throughput"], strict=True):
        values = (
            [row[c] for c in head]
            + [row["variant"].get(name, "") for name in varied]
            + [row[c] for c in tail]
        )
        values += [speed[c] for c in (*THROUGHPUT_COLUMNS, "n_seeds")]
        writer.writerow(["" if v is None else v for v in values])
    return out.getvalue()
