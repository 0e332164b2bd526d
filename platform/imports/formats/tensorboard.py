"""TensorBoard event files: one `events.out.tfevents.*` file, or a log folder holding them. Every
scalar is read (`simple_value`, and the one-number tensors of the "scalars" plugin), with its
step and wall time; histograms, images and text are passed over. In a folder, the files of a
sub-folder (torch's `add_scalars`, or one folder per part of a run) have their tags prefixed with
its path, and files are read in name order, which is the order written."""

from __future__ import annotations

from pathlib import Path

from .. import tfevents
from . import common, trl, verl
from .base import ImportFormatError, ParsedRun, Point

TOOL = "tensorboard"

# TensorBoard keeps the names its writer gave, most often verl's (`trainer.logger=[tensorboard]`)
# or the HF Trainer's (`report_to="tensorboard"`, its names rewritten as `train/x`, `eval/x`).
MAPPING = {**verl.MAPPING, **trl.rewritten(trl.MAPPING)}


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    if not path.exists():
        raise ImportFormatError(path, None, "no such file or folder")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and "tfevents" in p.name)
        if not files:
            raise ImportFormatError(
                path, None, "no TensorBoard event files (events.out.tfevents.*) in the folder"
            )
    common.check_size(path, files, max_bytes)
    points = []
    for file in files:
        prefix = "" if file.parent == path or file == path else f"{file.parent.relative_to(path).as_posix()}/"
        try:
            points.extend(
                Point(s.step, f"{prefix}{s.tag}", s.value, s.wall_time)
                for s in tfevents.read_events(file.read_bytes())
            )
        except tfevents.EventFileError as error:
            raise ImportFormatError(file, error.where, error.rule) from None
    return ParsedRun(tool=TOOL, points=common.unique(path, points))
