"""Readers of other tools' run files, one module per tool, and the default mapping of each tool's
metric names to the lab's (docs/algorithms.md §7; docs/imports.md lists them).

`read(tool, path)` checks the size cap (`MAX_BYTES`) and returns the whole run or raises
`ImportFormatError`; never a part. `map_points` renames the points with a mapping the user may
have edited: a name it does not map keeps its own name under `imported/`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from . import mlflow, prime_rl, tensorboard, trackio, trl, verl, wandb
from .base import ImportFormatError, ParsedRun, Point
from .common import MAX_BYTES

_MODULES = (prime_rl, verl, trl, tensorboard, mlflow, wandb, trackio)
READERS: dict[str, Callable[[Path, int], ParsedRun]] = {module.TOOL: module.read for module in _MODULES}
TOOLS = tuple(READERS)
DEFAULT_MAPPINGS: dict[str, dict[str, str]] = {module.TOOL: dict(module.MAPPING) for module in _MODULES}
UNMAPPED_PREFIX = "imported/"

__all__ = [
    "DEFAULT_MAPPINGS",
    "MAX_BYTES",
    "TOOLS",
    "ImportFormatError",
    "ParsedRun",
    "Point",
    "map_points",
    "read",
]


def read(tool: str, path: Path | str, max_bytes: int = MAX_BYTES, run: str | None = None) -> ParsedRun:
    """The run in path as `tool` wrote it (a file, or a folder for the tools that export one).
    `run` names the run to read in a file that holds several (a Trackio project)."""
    path = Path(path)
    if tool not in READERS:
        raise ImportFormatError(path, None, f"unknown tool {tool!r}; one of {', '.join(TOOLS)}")
    if run is not None:
        if tool != trackio.TOOL:
            raise ImportFormatError(path, None, f"a {tool} file holds one run; no run name is taken")
        return trackio.read(path, max_bytes, run=run)
    return READERS[tool](path, max_bytes)


def map_points(points: Iterable[Point], mapping: dict[str, str]) -> list[Point]:
    """The points under the lab's names: `mapping[name]` where the mapping has the name, else
    `imported/<name>`. Two source names mapped onto one lab name at the same step is an error (the
    lab keeps one value per name and step), named with both sources."""
    mapped: list[Point] = []
    source_of: dict[tuple[int, str], str] = {}
    for point in points:
        name = mapping.get(point.name) or f"{UNMAPPED_PREFIX}{point.name}"
        other = source_of.setdefault((point.step, name), point.name)
        if other != point.name:
            raise ValueError(
                f"{other!r} and {point.name!r} both map to {name!r} at step {point.step}; map one elsewhere"
            )
        mapped.append(Point(point.step, name, point.value, point.time))
    return mapped
