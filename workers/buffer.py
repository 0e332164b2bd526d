"""A run's buffer: the policy weights its trainer published and the batch files its rollout jobs
wrote, under `LAB_VAR_DIR/runs/<key>/buffer/`, each checked against the sha256 recorded for it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch

from experiments.models import PolicyVersion, RolloutJob, Run
from rlcore.weights import Published, WeightStore

# Weight files no job needs are deleted once they hold this much (the tiny model: every 16 steps).
PRUNE_SPARE_BYTES = 64 * 2**20


def weight_store(run: Run) -> WeightStore:
    return WeightStore(run.buffer_dir / "weights")


def batch_path(run: Run, step: int, part: int, attempt: int) -> Path:
    """One file per attempt: a late attempt never overwrites the bytes another one recorded."""
    return run.buffer_dir / "batches" / f"step-{step:06d}-part-{part:02d}-attempt-{attempt}.safetensors"


def newest_version(run: Run) -> PolicyVersion | None:
    return PolicyVersion.objects.filter(run=run).order_by("-version").first()


def weights_problem(run: Run, version: int) -> str:
    """Why the weights of `version` cannot be loaded ("" if they can): read and checked."""
    row = PolicyVersion.objects.filter(run=run, version=version).first()
    if row is None:
        return f"policy version {version} was never published"
    store = weight_store(run)
    try:
        store.load(version, row.sha256)
    except FileNotFoundError:
        return f"the weights of policy version {version} are missing ({store.path(version)})"
    except ValueError as exc:  # not the bytes recorded
        return str(exc)
    return ""


def batch_file_intact(job: RolloutJob) -> bool:
    """Whether a done batch job's file is there with the bytes recorded."""
    if job.status != RolloutJob.DONE or not job.path:
        return False
    try:
        return hashlib.sha256(Path(job.path).read_bytes()).hexdigest() == job.sha256
    except OSError:
        return False


def remove_batches(run: Run, upto: int) -> None:
    """Delete the batch files of steps up to `upto` (no resume goes back that far)."""
    for path in (
        RolloutJob.objects.filter(run=run, step__lte=upto).exclude(path="").values_list("path", flat=True)
    ):
        Path(path).unlink(missing_ok=True)


def clear_buffer(run: Run) -> None:
    """The run is over: its published weights and batch files go."""
    shutil.rmtree(run.buffer_dir, ignore_errors=True)


class Publisher:
    """The weights one trainer attempt publishes to its run's buffer: each version written once
    (an evaluation and the next step both publish it), and the files no job needs pruned. Only
    this trainer writes there, so the folder is listed once, when the attempt starts."""

    def __init__(self, run: Run):
        self.run = run
        self.store = weight_store(run)
        self.last: tuple[int, Published] | None = None  # the version written last
        self.on_disk = set(self.store.versions())
        self.seconds: list[float] = []
        self.size_bytes = 0

    def publish(self, version: int, policy: torch.nn.Module) -> Published:
        if self.last is None or self.last[0] != version:
            published = self.store.publish(version, policy.state_dict())
            self.on_disk.add(version)
            self.seconds.append(published.seconds)
            self.size_bytes += published.size_bytes
            self.last = (version, published)
        return self.last[1]

    def prune(self, keep: set[int | None]) -> None:
        """Delete the version files no unfinished job needs, except those in `keep`, the newest
        (async jobs not claimed yet take it) and the one published last, once the others hold
        `PRUNE_SPARE_BYTES` (at least two files): a small model's files go a dozen at a time,
        not with a query every step."""
        mine = self.last[0] if self.last is not None else None
        older = [v for v in self.on_disk if v not in (mine, max(self.on_disk, default=None), *keep)]
        file_bytes = self.size_bytes / max(1, len(self.seconds))
        if len(older) < 2 or len(older) * file_bytes < PRUNE_SPARE_BYTES:
            return
        needed = RolloutJob.objects.filter(run=self.run, status__in=RolloutJob.UNFINISHED, version__in=older)
        gone = set(older) - set(needed.values_list("version", flat=True))
        self.store.remove(gone)
        self.on_disk -= gone
