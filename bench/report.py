"""Writing a benchmark's section into BENCHMARKS.md: each benchmark owns the section whose
title line it writes, and refreshing it leaves every other section as it was."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from importlib import metadata
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


def machine(packages: Sequence[str] = ("torch", "transformers")) -> str:
    """The machine a benchmark ran on: its usable cores, CPU model, Python and `packages`' versions."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown CPU",
    )
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in packages)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return f"nproc {cores}, {cpu}; Python {platform.python_version()}, {versions}"


def publish(section: str, ok: bool, write: bool = True) -> int:
    """Write `section` into BENCHMARKS.md (unless not `write`) and print it; the exit status: 0 if `ok`."""
    if write:
        write_section(section)
    print(section)
    return 0 if ok else 1
