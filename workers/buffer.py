"""A run's buffer: the policy weights its trainer published and the batch files its rollout jobs
wrote, under `LAB_VAR_DIR/runs/<key>/buffer/`, each checked against the sha256 recorded for it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from experiments.models import PolicyVersion, RolloutJob, Run
from rlcore.weights import WeightStore


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
