"""What the worker tests share besides fixtures: a config whose runs learn, comparing a run's
curves with its twin's (which must have learned), waiting for runs to end, damaging a file, and a
jsonl dataset under the test data root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from support import TEST_VAR, TINY_CONFIG, wait_for

from experiments import packing, series
from experiments.models import Run
from rlcore.sinks import ALL_METRICS, ASYNC_METRICS, STEP_METRICS

# Every metric a run and its twin log alike: all that a run may log (§7, BAPO's and M2PO's
# included) but wall-clock times and rates, and async execution's split of its staleness (when the
# batches happened to arrive).
UNCOMPARED = ("tokens_per_s", *ASYNC_METRICS)
COMPARED = [name for name in ALL_METRICS if not name.startswith("time/") and name not in UNCOMPARED]

# The config of runs whose curves are compared with another execution's: under TINY_CONFIG every
# group's rewards are alike (all 0), so every advantage is 0 and the weights move by weight decay
# alone, and equal curves would say nothing of the loss, the batches, the log-probs or the
# staleness labels. Sums of 0..3 and a warm start of up to 400 steps to the tiny model's calibrated
# accuracy give groups of right and wrong answers; a learning rate of 1e-2 moves π well away from
# θ0 within a few steps. θ0 is warm-started once (seconds) into the test cache (LAB_CACHE_DIR under
# var/test, kept between sessions) and shared by every run of this model, task and length. Its 16
# problems hold out 8: the evaluation is all of them.
TRAINING_CONFIG = {
    **TINY_CONFIG,
    "task": {"name": "arithmetic", "min_operand": 0, "max_operand": 3},
    "model": {"tiny": {**TINY_CONFIG["model"]["tiny"], "warmstart_max_steps": 400}},
    "optimizer": {"lr": 1e-2},
    "eval_size": 8,
}


def curves(run: Run) -> dict[tuple[str, int], float]:
    """(name, step) → value of every compared metric `run` logged, ∞ and NaN as stored (BAPO's s
    is ∞ at a step without a negative token)."""
    return {
        (name, step): value
        for name, (steps, values, _) in series.points_of(run.pk)
        if name in COMPARED
        for step, value in zip(steps.tolist(), values.tolist(), strict=True)
    }


def assert_trained(points: dict, label: object = None) -> None:
    """A run's `curves` are of a run that learned: at some step its rewards differed within a group
    (reward/std > 0, so some advantage was not 0) and its gradient was not 0."""
    std, norm = (
        {step: v for (n, step), v in points.items() if n == name} for name in ("reward/std", "grad_norm")
    )
    assert std, (label, "no reward/std logged")
    assert any(value > 0 and norm.get(step, 0) > 0 for step, value in std.items()), (
        label,
        "no step with reward/std > 0 and grad_norm > 0: equal curves would prove nothing",
        sorted(std.items()),
        sorted(norm.items()),
    )


# How far a run in trainer ranks (`execution.train_processes`) may drift from its one-process twin,
# relative to each value, besides 1e-5 absolute: the ranks forward halves of the batch and sum
# gradients across processes, so their float32 sums are added in another order, and a run that
# learns carries those rounding differences on (at lr 1e-2 and a lag of 2, about 5e-6 of each
# value by step 6, where is_ratio/p99 is near 5: 1.6e-5 absolute). Runs of one process in two
# executions do the same arithmetic and are held to 1e-5 absolute alone.
RANKS_REL = 1e-5


def assert_same_points(mine: dict, reference: dict, label: object = None, rel: float = 0.0) -> None:
    """Two runs' `curves`: the same (name, step) points, each value within 1e-5 (or `rel` of the
    value, where that is wider), of runs that learned (`assert_trained`)."""
    assert set(mine) == set(reference), label
    assert_trained(reference, label)
    for key, value in reference.items():
        assert mine[key] == pytest.approx(value, abs=1e-5, rel=rel, nan_ok=True), (
            label,
            key,
            mine[key],
            value,
        )


def assert_curves_equal(run: Run, twin: Run, rel: float = 0.0) -> None:
    assert_same_points(curves(run), curves(twin), rel=rel)


def wait_until_over(runs, timeout_s: float) -> None:
    ids = [run.pk for run in runs]
    wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE).exists(),
        timeout_s,
        f"runs {ids} to end",
        interval_s=0.5,
    )


def damage(path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def write_dataset(name: str, answer_of=lambda a: 2 * a) -> Path:
    """A GSM8k-style jsonl file under the test data root: "What is a+a?" with `answer_of(a)`."""
    path = TEST_VAR / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)  # a fresh checkout, the test run alone
    lines = [
        {"question": f"What is {a}+{a}?", "answer": f"{a}+{a}={2 * a} #### {answer_of(a)}"}
        for a in range(1, 41)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def jsonl_config(path: Path, **changes) -> dict:
    return {
        **TINY_CONFIG,
        "task": {"name": "jsonl", "path": str(path), "held_out": 8},
        "eval_size": 8,
        **changes,
    }


def reap_lost(run: Run, capsys, worker: str) -> None:
    """`manage.py reap` until it re-queues `run`, whose `worker` died: attempt 2, saying why."""

    def reaped():
        call_command("reap")
        return "lost, now queued (attempt 2)" in capsys.readouterr().out

    wait_for(reaped, 30, "the reaper to notice the missing heartbeats", interval_s=1)
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.QUEUED, 2)
    assert run.error == f"worker {worker} stopped sending heartbeats"


def assert_resumed_once(run: Run, steps: int) -> None:
    """`run`'s points of its two attempts: every step metric at steps 1..`steps` exactly once, and
    step 1's from attempt 1 (resumed from a checkpoint, not restarted)."""
    points = [
        (name, step, us)
        for name, (taken, _, times) in series.points_of(run.pk)
        for step, us in zip(taken.tolist(), times.tolist(), strict=True)
    ]
    assert len({(name, step) for name, step, _ in points}) == len(points), "one point per (name, step)"
    for name in STEP_METRICS:
        assert sorted(step for n, step, _ in points if n == name) == list(range(1, steps + 1)), name
    (loss_1,) = [us for name, step, us in points if (name, step) == ("loss", 1)]
    assert packing.wall_time(loss_1) < run.started
