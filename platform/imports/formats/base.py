"""What every reader of another tool's files produces, and the one error they raise.

A reader turns one file (or one exported folder) into a `ParsedRun`: the points exactly as the
source logged them, under the source's own metric names, with the source's own timestamps. Mapping
the names to the lab's (docs/algorithms.md §7) happens afterwards, in the open, so the user can see
and edit it at import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Point:
    """One logged value. `value` may be NaN or ±inf when the source logged it so; a value the
    source dropped is simply absent (a gap), never a zero. `time` is the source's own wall-clock
    time in Unix seconds, or None where the source kept none."""

    step: int
    name: str
    value: float
    time: float | None


@dataclass
class ParsedRun:
    """One run as another tool logged it.

    tool: the source's key ("prime-rl", "verl", "trl", "tensorboard", "mlflow", "wandb", "trackio").
    tool_version: the tool's version where the file says it, else None.
    original_run_id: the run's id in its own tool where known, else None.
    config: what the file says about the run's configuration (hyper-parameters, preset hints), as is.
    points: every point, in the source's metric names.
    """

    tool: str
    tool_version: str | None = None
    original_run_id: str | None = None
    config: dict = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)


class ImportFormatError(ValueError):
    """A file that cannot be read as its format: names the file, where in it (line, record or
    entry) and the rule broken."""

    def __init__(self, path: Path | str, where: str | None, rule: str):
        self.path = str(path)
        self.where = where
        self.rule = rule
        name = Path(self.path).name
        super().__init__(f"{name}, {where}: {rule}" if where else f"{name}: {rule}")
