"""Checkpoints: everything a resumed run needs, as tensors and plain data loaded with
`weights_only=True`. Each file's sha256 goes to a `Ledger` (the platform's database, or
`checkpoints.json` beside the files); the newest `keep` stay, and one that fails its check is
renamed `….rejected` and passed over. A run of several trainer processes writes sharded
checkpoints instead (`rlcore.distributed`): `step-000025.dcp` folders, hashed as one."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

GLOB = "step-*.pt"
SHARDED_GLOB = "step-*.dcp"
KEEP = 2
REJECTED_SUFFIX = ".rejected"


class CheckpointError(ValueError):
    """A checkpoint cannot be restored; the message says which and why."""


class Ledger(Protocol):
    """Where the sha256 of each checkpoint is kept, out of reach of whoever can write the files."""

    def record(self, step: int, sha256: str, size_bytes: int) -> None:
        """The checkpoint of `step` was written with these bytes."""

    def sha256(self, step: int) -> str | None:
        """The recorded sha256 of the checkpoint of `step`, or None if none was recorded."""


class FileLedger:
    """`checkpoints.json` in the checkpoint folder: {step: sha256} (the command line's ledger)."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / "checkpoints.json"

    def _read(self) -> dict[str, str]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def record(self, step: int, sha256: str, size_bytes: int) -> None:
        entries = self._read()
        entries[str(step)] = sha256
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, sort_keys=True))
        tmp.replace(self.path)

    def sha256(self, step: int) -> str | None:
        return self._read().get(str(step))


def path_of(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}.pt"


def existing(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in `directory`, newest first."""
    found = []
    for path in Path(directory).glob(GLOB):
        try:
            found.append((int(path.stem.removeprefix("step-")), path))
        except ValueError:
            continue
    return sorted(found, reverse=True)


def sharded_path_of(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}.dcp"


def existing_sharded(directory: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the sharded checkpoints in `directory`, newest first."""
    found = []
    for path in Path(directory).glob(SHARDED_GLOB):
        try:
            found.append((int(path.stem.removeprefix("step-")), path))
        except ValueError:
            continue
    return sorted(found, reverse=True)


def remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def commit_sharded(building: Path, target: Path, step: int, ledger: Ledger, keep: int = KEEP) -> None:
    """A sharded checkpoint written in full to `building`: record its sha256, give it its name
    (`target`), then delete all but the newest `keep` sharded checkpoints."""
    try:
        sha256, size = file_sha256(building)
        ledger.record(step, sha256, size)
        remove_tree(target)
        building.replace(target)
    finally:
        remove_tree(building)
    for _, old in existing_sharded(target.parent)[max(1, keep) :]:
        remove_tree(old)


def file_sha256(path: Path) -> tuple[str, int]:
    """(sha256, size) of a file's bytes, or of a folder's files: each one's relative name and
    bytes, in name order."""
    if Path(path).is_dir():
        return _folder_sha256(Path(path))
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _folder_sha256(folder: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(2**20):
                digest.update(chunk)
                size += len(chunk)
    return digest.hexdigest(), size


def save(directory: Path, step: int, state: dict[str, Any], ledger: Ledger, keep: int = KEEP) -> Path:
    """Write `state` as the checkpoint of `step` atomically, record its sha256, then delete all
    but the newest `keep` checkpoints. The sha256 is recorded before the file takes its name: a
    ledger that refuses (the run is no longer this process's) leaves the folder as it was."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = path_of(directory, step)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, tmp)
        sha256, size = file_sha256(tmp)
        ledger.record(step, sha256, size)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    for _, old in existing(directory)[max(1, keep) :]:
        old.unlink(missing_ok=True)
    return target


def problem(path: Path, step: int, ledger: Ledger) -> str:
    """Why the checkpoint at `path` must not be restored ("" if its bytes are the recorded ones)."""
    expected = ledger.sha256(step)
    if expected is None:
        return f"{path.name} has no recorded sha256 (written by an older version, or not by this run)"
    actual, _ = file_sha256(path)
    if actual != expected:
        return f"{path.name} does not match the sha256 recorded when it was written (damaged or altered)"
    return ""


def reject(path: Path) -> None:
    """Set a checkpoint that failed its check aside, where no resume looks."""
    path.replace(path.with_name(path.name + REJECTED_SUFFIX))


def trusted(found: list[tuple[int, Path]], ledger: Ledger, rejected: list[str]) -> Iterator[tuple[int, Path]]:
    """`found`'s checkpoints, in order, whose bytes are the recorded ones; each other one is set
    aside (`reject`) as it is met, its `problem` added to `rejected`."""
    for step, path in found:
        if why := problem(path, step, ledger):
            reject(path)
            rejected.append(why)
            continue
        yield step, path


def load(path: Path, device: torch.device) -> dict[str, Any]:
    """The state in a verified checkpoint: tensors and plain data only, no code is unpickled."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # an unpicklable object, a truncated zip: either way not ours to run
        raise CheckpointError(
            f"{path.name} cannot be read as a checkpoint: {type(exc).__name__}: {exc}"
        ) from exc
