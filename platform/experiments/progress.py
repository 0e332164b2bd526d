"""What a run or a sweep is doing now, in words, for their rows, their pages and the API: waiting
for a worker (and where it stands in its queue), preparing, training with a pace and an ETA, …"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from execution.models import Worker
from experiments.models import Experiment, Run
from experiments.templatetags.units import seconds


@dataclass(frozen=True)
class QueueState:
    """Where queued runs stand, read once for a page (two queries, not one per run): each queued
    run's place among its team's queued runs of its queue, in the order a worker takes them (first
    in, first out within a team; teams take turns, `Run.claim_next`), and per queue the running
    runs of each team."""

    place: dict[int, int]  # a queued run → its place among its team's queued runs of its queue (1: next)
    running: dict[str, dict[int, int]]

    @classmethod
    def read(cls, queues: Iterable[str]) -> QueueState:
        queues = list(queues)
        place: dict[int, int] = {}
        running: dict[str, dict[int, int]] = {}
        if queues:
            lines: dict[tuple[int, str], int] = {}
            rows = Run.objects.filter(status=Run.QUEUED, queue__in=queues).order_by("id")
            for pk, team, queue in rows.values_list("pk", "experiment__team", "queue"):
                lines[(team, queue)] = place[pk] = lines.get((team, queue), 0) + 1
            counts = (
                Run.objects.filter(status=Run.RUNNING, queue__in=queues)
                .values_list("queue", "experiment__team")
                .annotate(n=Count("id"))
                .order_by()
            )
            for queue, team, n in counts:
                running.setdefault(queue, {})[team] = n
        return cls(place, running)

    def waiting(self, run: Run, team: int) -> tuple[int, str]:
        """(its place among its team's queued runs of its queue, 1 = next; what it waits for), for
        a run queued when this state was read."""
        place = self.place[run.pk]
        ahead = place - 1
        parts = [
            f"next of its team's runs on queue {run.queue}"
            if ahead == 0
            else f"{ahead} of its team's runs ahead of it on queue {run.queue}"
        ]
        running = self.running.get(run.queue, {})
        mine, others = running.get(team, 0), sum(n for t, n in running.items() if t != team)
        cap = settings.LAB_TEAM_MAX_RUNNING
        if cap and mine >= cap:
            parts.append(
                f"its team is at its limit of {cap} running run{'s' if cap != 1 else ''} (LAB_TEAM_MAX_RUNNING)"
            )
        elif others:
            parts.append(
                f"the workers of queue {run.queue} are running {others} run{'s' if others != 1 else ''} of "
                "other teams: teams take turns (fair share), so its team's next run starts when one ends"
            )
        return place, " · ".join(parts)


def run_progress(
    run: Run, live_queues: set[str] | None = None, queues: QueueState | None = None
) -> dict[str, Any]:
    """What the run is doing now, for its row, its page and the API.

    `phase` is "waiting" (queued), "starting" (claimed, nothing reported yet), one of
    `rlcore.sinks.PHASES`, or "" once the run is over. `text` says it in words: while it waits,
    its place among its team's queued runs (`queue_position`, 1 = next) and what holds it up
    (another team's runs on the workers, its team's running cap); `no_worker` names a queue
    the run needs that no live worker listens on. While training, `s_per_step` is measured
    over the steps this attempt has done and `eta_s` extrapolates it to the last step.
    `live_queues` (from `Worker.live_queues()`) and `queues` (`QueueState.read`) save queries
    per run in a table.
    """
    detail = run.phase_detail
    report: dict[str, Any] = {
        "phase": "",
        "text": "",
        "step": run.progress,
        "steps": run.steps,
        "s_per_step": None,
        "eta_s": None,
        "warm_start": None,
        "no_worker": "",
        "queue_position": None,
    }
    if not run.is_active:
        return report
    if live_queues is None:
        live_queues = Worker.live_queues()
    dead = [queue for queue in run.needed_queues if queue not in live_queues]
    if dead:
        report["no_worker"] = f"no worker is listening on queue {' or '.join(dead)}"
    if run.status == Run.QUEUED:
        if queues is None:
            queues = QueueState.read([run.queue])
        if run.pk not in queues.place:
            # Claimed (or cancelled) since the caller read the run: it is not next any more.
            report.update(phase="starting", text="starting: a worker has just taken it")
            return report
        team = run.experiment.team_id
        place, waiting = queues.waiting(run, team)
        report["queue_position"] = place
        text = f"waiting for a worker: {waiting}"
        if run.dispatched_at is None:
            text += " (the message broker could not be reached: it is sent as soon as the broker is back)"
        report.update(phase="waiting", text=text)
        return report
    report["phase"] = run.phase or "starting"
    timing = detail.get("timing")
    if timing and timing["to_step"] > timing["from_step"]:
        s_per_step = (timing["to"] - timing["from"]) / (timing["to_step"] - timing["from_step"])
        report["s_per_step"] = s_per_step
        report["eta_s"] = s_per_step * max(0, run.steps - run.progress)
    if run.phase == "preparing":
        report["text"] = "preparing the model"
    elif run.phase == "warm_start":
        report["warm_start"] = {k: detail.get(k) for k in ("step", "max_steps", "accuracy")}
        report["text"] = (
            f"preparing the model (first run only): warm start step {detail.get('step')} of at most "
            f"{detail.get('max_steps')}, held-out accuracy {detail.get('accuracy', 0):.2f} so far"
        )
    elif run.phase == "training":
        report["text"] = f"training step {detail.get('step')} of {run.steps}"
        if report["s_per_step"] is not None:
            report["text"] += f" · {report['s_per_step']:.2f} s/step · ETA {seconds(report['eta_s'])}"
    elif run.phase == "evaluating":
        report["text"] = f"evaluating at step {detail.get('step')}"
    elif run.phase == "checkpointing":
        report["text"] = f"saving a checkpoint at step {detail.get('step')}"
    else:
        report["text"] = "starting"
    return report


def wall_s_per_step(runs: list[Run], rows: list[tuple[Run, dict[str, Any]]]) -> float | None:
    """What one worker takes per step of these runs, all included (start, warm start, evaluations,
    checkpoints, storing): over the runs that succeeded, their wall-clock over their steps; before
    any has, over the running ones' time since they started (their step pace when that is all)."""
    done = [r for r in runs if r.status == Run.SUCCEEDED and r.started and r.finished and r.steps]
    if done:
        return sum((r.finished - r.started).total_seconds() for r in done) / sum(r.steps for r in done)
    now = timezone.now()
    going = [r for r in runs if r.status == Run.RUNNING and r.started and r.progress > 0]
    if going:
        return sum((now - r.started).total_seconds() for r in going) / sum(r.progress for r in going)
    paces = [report["s_per_step"] for _, report in rows if report["s_per_step"] is not None]
    return sum(paces) / len(paces) if paces else None


def steps_ahead(experiment: Experiment, queue: str) -> int:
    """Steps other runs of `queue` have left that its workers take before or beside this
    experiment's last queued run: running runs of other experiments, and their queued runs older
    than that last one (first in, first out; teams taking turns makes this an estimate)."""
    last = (
        experiment.runs.filter(status=Run.QUEUED, queue=queue)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    others = Run.objects.filter(queue=queue).exclude(experiment=experiment)
    ahead = others.filter(status=Run.RUNNING)
    if last is not None:
        ahead = ahead | others.filter(status=Run.QUEUED, id__lt=last)
    return sum(max(0, run.steps - run.progress) for run in ahead.only("config", "progress"))


def sweep_progress(experiment: Experiment) -> dict[str, Any]:
    """The sweep's progress: each run with its `run_progress`, runs and steps done, and an ETA: the
    steps left of its active runs, plus those other runs of its queue go before or beside them, at
    the wall-clock per step its runs have taken (`wall_s_per_step`), shared among the live workers
    of its queue. Its start, end and pace are its own runs' (an imported run's times are when its
    tool logged it, maybe long before), or the imported runs' when it holds no others."""
    runs = list(experiment.runs.select_related("imported"))
    live = Worker.live_queues()
    queues = QueueState.read({run.queue for run in runs if run.status == Run.QUEUED})
    rows = [(run, run_progress(run, live, queues)) for run in runs]
    steps_left = sum(max(0, run.steps - run.progress) for run in runs if run.is_active)
    eta_s = None
    timed = [run for run in runs if not run.is_imported] or runs
    pace = wall_s_per_step(timed, [row for row in rows if row[0] in timed]) if steps_left else None
    if pace is not None:
        queue = next(run.queue for run in runs if run.is_active)
        workers = Worker.live_count(queue)
        if workers:
            eta_s = (steps_left + steps_ahead(experiment, queue)) * pace / workers
    started = [run.started for run in timed if run.started is not None]
    finished = [run.finished for run in timed if run.finished is not None]
    over = not any(run.is_active for run in runs)
    end = max(finished) if over and finished else timezone.now()
    return {
        "rows": rows,
        "started": min(started, default=None),
        "finished": max(finished) if over and finished else None,
        "duration_s": (end - min(started)).total_seconds() if started else None,
        "runs": len(runs),
        "runs_done": sum(not run.is_active for run in runs),
        "steps": sum(run.steps for run in runs),
        "steps_done": sum(min(run.progress, run.steps) for run in runs),
        "eta_s": eta_s if steps_left else None,
    }
