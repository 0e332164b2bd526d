"""The reap pass: runs and rollout jobs whose worker stopped heartbeating are taken back from it.
Every worker runs `reap` every `LAB_REAP_INTERVAL_S` (`manage.py reap` once); what becomes of
each: `Run.reap` and `RolloutJob.reap` (docs/architecture.md, "A run's lifecycle", 5. Lost)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from experiments.models import RolloutJob, Run


class Reaped(NamedTuple):
    """What one pass took back, each as it is now (re-queued, lost, or cancelled)."""

    runs: list[Run]
    jobs: list[RolloutJob]

    def each(self) -> Iterator[tuple[str, Run | RolloutJob]]:
        """(what, row) of each: `run 7`, `rollout job 3 (run 7, …)`."""
        yield from ((f"run {run.pk}", run) for run in self.runs)
        yield from ((str(job), job) for job in self.jobs)


def reap() -> Reaped:
    """One pass over the runs, then the rollout jobs, whose heartbeat is older than
    `LAB_HEARTBEAT_TIMEOUT_S` (a run reaped with a cancel pending cancels its jobs first)."""
    return Reaped(Run.reap(), RolloutJob.reap())
