"""Writing a benchmark's section into BENCHMARKS.md: each benchmark owns the section whose
title line it writes, and refreshing it leaves every other section as it was."""

from __future__ import annotations

from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
HEADER = "# Benchmarks\n\nMeasured numbers, one section per benchmark under `bench/`; `make bench` refreshes them.\n"


def write_section(section: str, report: Path = REPORT) -> None:
    """Replace the section titled like `section`'s first line (or append it)."""
    text = report.read_text() if report.exists() else HEADER
    lines = text.splitlines(keepends=True)
    title = section.splitlines()[0]
    start = next((i for i, line in enumerate(lines) if line.rstrip() == title), None)
    if start is None:
        report.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    report.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))
