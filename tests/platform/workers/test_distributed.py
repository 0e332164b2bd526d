"""Distributed execution: one training worker, rollout jobs on two rollout workers, and every
metric equal to the simulated run of the same config and seed at every step; likewise a trainer
in two ranks (`execution.train_processes`) against one process, in distributed and async
execution."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load
from support import TINY_CONFIG, last_step, logged, queue_sweep, wait_for, wait_for_log
from worker_helpers import (
    RANKS_REL,
    TRAINING_CONFIG,
    UNCOMPARED,
    assert_curves_equal,
    assert_same_points,
    curves,
    wait_until_over,
)

from experiments.models import Checkpoint, PolicyVersion, RolloutJob, Run
from rlcore import checkpoints
from rlcore.staleness import behavior_version

pytestmark = pytest.mark.django_db(transaction=True)

STALENESS = [{"sync_offset": 2}, {"sync_interval": 3}]


def test_distributed_runs_log_the_simulated_curves_exactly(start_worker, team, alice):
    distributed_config = {**TRAINING_CONFIG, "execution": {"mode": "distributed", "rollout_workers": 2}}
    presets = ["grpo", "reinforce"]
    simulated = queue_sweep(
        team, alice, "simulated", config=TRAINING_CONFIG, presets=presets, staleness=STALENESS
    )
    distributed = queue_sweep(
        team, alice, "distributed", config=distributed_config, presets=presets, staleness=STALENESS
    )
    training_worker = start_worker()
    rollout_workers = [start_worker(queue="rollout"), start_worker(queue="rollout")]
    runs = list(Run.objects.filter(experiment__in=[simulated, distributed]))
    wait_until_over(runs, 300)

    steps = TRAINING_CONFIG["steps"]
    for run in distributed.runs.all():
        assert run.status == Run.SUCCEEDED, run.error
        twin = simulated.runs.get(
            preset=run.preset, staleness=run.staleness.removesuffix(" (distributed)"), seed=run.seed
        )
        assert twin.status == Run.SUCCEEDED, twin.error
        mine, reference = curves(run), curves(twin)
        assert_same_points(mine, reference, (run.preset, run.staleness))
        assert {step for _, step in mine} == set(range(steps + 1))

        jobs = list(RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH))
        assert sorted((j.step, j.part) for j in jobs) == [(t, p) for t in range(1, steps + 1) for p in (0, 1)]
        schedule = run.run_config().staleness
        for job in jobs:
            assert job.status == RolloutJob.DONE and job.attempt == 1
            assert job.version == behavior_version(job.step, schedule.sync_interval, schedule.sync_offset)
        # The evaluations (steps 5 and 6) ran on the rollout workers, one job each: the values
        # above are the trainer's evaluation exactly.
        evals = RolloutJob.objects.filter(run=run, kind=RolloutJob.EVAL)
        assert sorted(
            evals.values_list("step", "part", "version", "status", "groups_start", "groups_stop")
        ) == [
            (5, 0, 5, RolloutJob.DONE, 0, 8),
            (6, 0, 6, RolloutJob.DONE, 0, 8),
        ]
        published = set(PolicyVersion.objects.filter(run=run).values_list("version", flat=True))
        assert published == {j.version for j in jobs} | {5, 6}, "only versions some step or evaluation needs"
        wait_for(lambda run=run: not run.buffer_dir.exists(), 30, "the buffer to end with the run")
        assert run.summary["weights/publish_bytes"] > 0
        assert 0 <= run.summary["idle/trainer_frac"] <= 1

    jobs = RolloutJob.objects.filter(run__experiment=distributed)
    makers = {w.identity for w in rollout_workers}
    used = set(jobs.filter(kind=RolloutJob.BATCH).values_list("worker", flat=True))
    assert used <= makers, "only rollout workers generate"
    # The trainer makes an evaluation itself only while it waits for it at the end, if no rollout
    # worker took it first.
    assert set(jobs.filter(kind=RolloutJob.EVAL, step__lt=steps).values_list("worker", flat=True)) <= makers
    assert set(jobs.filter(kind=RolloutJob.EVAL).values_list("worker", flat=True)) <= makers | {
        training_worker.identity
    }


def test_mini_batches_and_a_bfloat16_rollout_run_distributed_as_simulated(start_worker, team, alice):
    """The other sources of off-policyness through real workers: 2 mini-batches per step (the
    proximal forward, a permutation per step) and a bfloat16 rollout engine (μ from the rollout
    worker's bfloat16 copy, re-scored there in float32): every metric equals the simulated run's."""
    config = {
        **TRAINING_CONFIG,
        "optimizer": {**TRAINING_CONFIG["optimizer"], "minibatches": 2},
        "rollout": {**TRAINING_CONFIG["rollout"], "dtype": "bfloat16"},
    }
    presets = ["decoupled-ppo", "grpo-tis"]
    simulated = queue_sweep(
        team, alice, "simulated", config=config, presets=presets, staleness=[{"sync_offset": 2}]
    )
    distributed = queue_sweep(
        team,
        alice,
        "distributed",
        config={**config, "execution": {"mode": "distributed", "rollout_workers": 2}},
        presets=presets,
        staleness=[{"sync_offset": 2}],
    )
    start_worker()
    start_worker(queue="rollout")
    start_worker(queue="rollout")
    wait_until_over(list(Run.objects.filter(experiment__in=[simulated, distributed])), 300)
    for run in distributed.runs.all():
        twin = simulated.runs.get(preset=run.preset, seed=run.seed)
        assert run.status == twin.status == Run.SUCCEEDED, (run.error, twin.error)
        mine, reference = curves(run), curves(twin)
        assert_same_points(mine, reference, run.preset)
        assert min(v for (name, _), v in mine.items() if name == "mismatch/abs_max") > 1e-3, (
            "bfloat16 differs"
        )
        assert all(v == 2 for (name, _), v in mine.items() if name == "optimizer_steps")


# The presets of docs/algorithms.md §16, each with what must act in its run for equal curves to
# say something (a mechanism that never fires compares zeros with zeros): the knobs that make it
# fire in 6 tiny steps (KPop's default φ 2.0 masks one token there at most), the metric that
# measures it and a value it must exceed at some step.
FIELD_PRESETS = {
    "icepop": ({}, "masked_tokens/mismatch", 0),
    "kpop": ({"kpop_phi": 0.5}, "masked_tokens/mismatch", 0),
    "trm": ({}, "masked_tokens/sequence", 0),
    "dppo-kl": ({}, "masked_tokens/staleness", 0),
    "ce-gppo": ({}, "masked_tokens/clip", 0),
    "dro": ({}, "kl/behavior_k3", 1e-3),  # no mask: its penalty (β/2)·(π − μ)² acts where π ≠ μ
    "bapo": ({}, "masked_tokens/clip", 0),
}
# TRAINING_CONFIG's groups of right and wrong answers (advantages not all 0) and its learning rate,
# which moves π well away from μ and the step-start weights within the 2 versions of staleness
# and the 2 mini-batches.
FIELD_CONFIG = {**TRAINING_CONFIG, "optimizer": {**TRAINING_CONFIG["optimizer"], "minibatches": 2}}


def test_the_fields_presets_run_distributed_as_simulated(start_worker, team, alice, tmp_path):
    """Each preset of docs/algorithms.md §16 with 2 mini-batches and a behaviour policy 2 versions
    old, its corrections, masks and BAPO's search acting: distributed on real rollout workers,
    every logged metric equals the simulated run's within 1e-5 at every step, and the policy of
    the last checkpoint is the simulated run's within 1e-6."""
    staleness = [{"sync_offset": 2}]
    pairs = {}
    for preset, (params, _, _) in FIELD_PRESETS.items():
        config = {**FIELD_CONFIG, "algorithm": {"params": params}}
        distributed = {**config, "execution": {"mode": "distributed", "rollout_workers": 2}}
        pairs[preset] = tuple(
            queue_sweep(
                team, alice, f"{preset} {mode}", config=c, presets=[preset], staleness=staleness
            ).runs.get()
            for mode, c in (("simulated", config), ("distributed", distributed))
        )
    runs = [run for pair in pairs.values() for run in pair]
    kept = WeightsKept(runs, tmp_path / "checkpoints", folder=lambda run: run.checkpoint_dir)
    start_worker()
    start_worker(queue="rollout")
    start_worker(queue="rollout")
    try:
        wait_until_over(runs, 300)
    finally:
        kept.stop()

    steps = FIELD_CONFIG["steps"]
    for preset, (twin, run) in pairs.items():
        run.refresh_from_db()
        twin.refresh_from_db()
        assert run.status == twin.status == Run.SUCCEEDED, (preset, run.error, twin.error)
        assert run.run_config().execution.mode == "distributed"
        mine, reference = curves(run), curves(twin)
        assert_same_points(mine, reference, preset)
        assert {step for _, step in mine} == set(range(steps + 1))
        unseen = {name for name, _, _ in logged(run)} - {name for name, _ in mine}
        assert all(name in UNCOMPARED or name.startswith("time/") for name in unseen), unseen

        def series(name, mine=mine):
            return [value for (n, step), value in sorted(mine.items()) if n == name]

        assert series("optimizer_steps") == [2] * steps
        assert any(s > 0 and g > 0 for s, g in zip(series("reward/std"), series("grad_norm"), strict=True))
        _, fired, floor = FIELD_PRESETS[preset]
        assert max(series(fired)) > floor, f"{preset}: {fired} is at most {floor} at every step"
        if preset == "bapo":
            assert any(
                low > 0.6 or high > 1.2
                for low, high in zip(series("bapo/c_low"), series("bapo/c_high"), strict=True)
            ), "BAPO's search never moved its bounds"
        assert set(
            RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH).values_list("status", flat=True)
        ) == {RolloutJob.DONE}

        final, reference_final = kept.policy_at(run, steps), kept.policy_at(twin, steps)
        assert set(final) == set(reference_final)
        assert max(float((final[k] - reference_final[k]).abs().max()) for k in final) <= 1e-6, preset


def kill_mid_job(workers, timeout_s: float = 120):
    """SIGKILL whichever of `workers` is first seen generating a rollout job (the broker decides
    who gets jobs); return (that job, the killed worker, the others)."""
    by_identity = {w.identity: w for w in workers}
    job = wait_for(
        lambda: RolloutJob.objects.filter(worker__in=by_identity, status=RolloutJob.RUNNING).first(),
        timeout_s,
        "a rollout worker to start a rollout job",
        interval_s=0.005,
    )
    victim = by_identity[job.worker]
    victim.kill()
    return job, victim, [w for w in workers if w is not victim]


def assert_one_point_per_name_and_step(run: Run) -> None:
    points = [(name, step) for name, step, _ in logged(run)]
    assert len(points) == len(set(points))


def test_killed_rollout_and_training_workers_lose_nothing_and_change_no_value(start_worker, team, alice):
    # Every worker is up before the runs are queued: a tiny run is over in seconds.
    rollout_workers = [start_worker(queue="rollout"), start_worker(queue="rollout")]
    first_trainer = start_worker()
    config = {**TRAINING_CONFIG, "steps": 60, "checkpoint_every": 4, "eval_every": 20}
    twin_experiment = queue_sweep(team, alice, "reference", config=config, staleness=[{"sync_offset": 2}])
    distributed = {**config, "execution": {"mode": "distributed"}}
    experiment = queue_sweep(team, alice, "crashes", config=distributed, staleness=[{"sync_offset": 2}])
    run, twin = experiment.runs.get(), twin_experiment.runs.get()
    killed_job, doomed, [survivor] = kill_mid_job(rollout_workers)
    wait_for(
        lambda: (last_step(run, "loss") or -1) >= 10,
        240,
        "10 steps of the distributed run",
    )
    first_trainer.kill()
    second_trainer = start_worker()
    wait_until_over([run, twin], 300)

    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.SUCCEEDED, 2), run.error
    wait_for_log(second_trainer, f"run {run.pk} attempt 2: succeeded")
    killed_job.refresh_from_db()
    assert killed_job.status == RolloutJob.DONE
    if killed_job.attempt == 1:  # it finished in the instant before the kill
        assert killed_job.worker == doomed.identity
    else:
        assert (killed_job.attempt, killed_job.worker) == (2, survivor.identity)
    assert not RolloutJob.objects.filter(run=run).exclude(status=RolloutJob.DONE).exists()
    assert_curves_equal(run, twin)
    assert_one_point_per_name_and_step(run)


def test_async_runs_stay_within_max_staleness_and_survive_a_killed_rollout_worker(start_worker, team, alice):
    config = {
        **TINY_CONFIG,
        "steps": 16,
        "checkpoint_every": 4,
        "eval_every": 8,
        "execution": {"mode": "async", "max_staleness": 2},
    }
    rollout_workers = [start_worker(queue="rollout"), start_worker(queue="rollout")]
    start_worker()
    experiment = queue_sweep(team, alice, "async", config=config, presets=["grpo", "reinforce"])
    killed_job, doomed, [survivor] = kill_mid_job(rollout_workers)
    runs = list(experiment.runs.all())
    assert {r.staleness for r in runs} == {"async ≤ 2"}
    wait_until_over(runs, 300)

    for run in runs:
        run.refresh_from_db()
        assert run.status == Run.SUCCEEDED, run.error
        lags = {step: value for _, step, value in logged(run, "staleness/max")}
        assert sorted(lags) == list(range(1, 17))
        assert max(lags.values()) <= 2, "no batch older than max_staleness versions"
        assert lags[1] == 0, "step 1 can only train on θ0's batch"
        for step, lag in lags.items():
            job = RolloutJob.objects.get(run=run, kind=RolloutJob.BATCH, step=step)
            assert lag == step - 1 - job.version, "the logged staleness is the measured one"
        # Evaluations of steps 8 and 16 in parts of half a batch (8 of the 20 held-out problems).
        evals = RolloutJob.objects.filter(run=run, kind=RolloutJob.EVAL)
        assert sorted(evals.values_list("step", "groups_start", "groups_stop", "version")) == [
            (step, lo, hi, step) for step in (8, 16) for lo, hi in ((0, 7), (7, 13), (13, 20))
        ]
        assert not evals.exclude(status=RolloutJob.DONE).exists()
        accuracy = {step: value for _, step, value in logged(run, "eval/accuracy")}
        assert sorted(accuracy) == [0, 8, 16]
        assert run.summary["eval/accuracy"] == accuracy[16], "the summary has the last evaluation"
        assert_one_point_per_name_and_step(run)
    killed_job.refresh_from_db()
    assert killed_job.status == RolloutJob.DONE
    assert killed_job.worker in (doomed.identity, survivor.identity)


def test_an_async_run_splits_its_staleness_and_measures_its_bfloat16_mismatch(start_worker, team, alice):
    """Async with a bfloat16 rollout engine: every step logs the mismatch its rollout worker
    measured, and the lag split into versions published while the batch was generated and while it
    waited; the two add up to the lag, and the split matches the jobs' own versions."""
    config = {
        **TINY_CONFIG,
        "steps": 8,
        "rollout": {**TINY_CONFIG["rollout"], "dtype": "bfloat16"},
        "execution": {"mode": "async", "max_staleness": 2},
    }
    start_worker(queue="rollout")
    start_worker()
    experiment = queue_sweep(team, alice, "async split", config=config, presets=["grpo-tis"])
    run = experiment.runs.get()
    wait_until_over([run], 300)
    run.refresh_from_db()
    assert run.status == Run.SUCCEEDED, run.error

    def series(name):
        return {step: value for _, step, value in logged(run, name)}

    flight, queue, lag = series("staleness/in_flight"), series("staleness/in_queue"), series("staleness/mean")
    assert sorted(flight) == sorted(queue) == list(range(1, 9))
    for step in range(1, 9):
        assert flight[step] >= 0 and queue[step] >= 0
        assert flight[step] + queue[step] == pytest.approx(lag[step]), step
    assert flight[1] == queue[1] == 0, "step 1 trains on θ0's batch, made before anything was published"
    assert sorted(series("mismatch/abs_max")) == list(range(1, 9))
    assert min(series("mismatch/abs_max").values()) > 1e-3


class WeightsKept:
    """Hard links to every file the trainers of `runs` write under `folder(run)` (by default the
    weights they publish, in their buffer), made as they appear (a run's buffer goes once it ends,
    a succeeded run's checkpoints too): `into/<run id>/v000006.safetensors` and so on."""

    def __init__(self, runs: list[Run], into: Path, folder=lambda run: run.buffer_dir / "weights"):
        self.folders = {run.pk: folder(run) for run in runs}
        self.into, self.over = into, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.over.is_set():
            for pk, folder in self.folders.items():
                with contextlib.suppress(OSError):  # not there yet, or gone with its run
                    for name in os.listdir(folder):
                        kept = self.into / str(pk) / name
                        if not name.startswith(".") and not kept.exists():
                            kept.parent.mkdir(parents=True, exist_ok=True)
                            os.link(folder / name, kept)
            time.sleep(0.005)

    def stop(self) -> None:
        self.over.set()
        self.thread.join()

    def last(self, run: Run) -> dict[str, torch.Tensor]:
        """The tensors of `run`'s last published version, checked against its recorded sha256."""
        version = PolicyVersion.objects.filter(run=run).order_by("-version").first()
        data = (self.into / str(run.pk) / f"v{version.version:06d}.safetensors").read_bytes()
        assert hashlib.sha256(data).hexdigest() == version.sha256
        return load(data)

    def policy_at(self, run: Run, step: int) -> dict[str, torch.Tensor]:
        """The policy weights in `run`'s checkpoint of `step` (kept with `folder` its checkpoint
        folder), checked against the sha256 its ledger recorded."""
        path = checkpoints.path_of(self.into / str(run.pk), step)
        assert path.exists(), f"run {run.pk}'s checkpoint of step {step} was not seen before it went"
        recorded = Checkpoint.objects.get(run=run, step=step).sha256
        assert checkpoints.file_sha256(path)[0] == recorded
        return checkpoints.load(path, torch.device("cpu"))["policy"]


def test_two_trainer_ranks_with_rollout_workers_train_the_one_process_run(
    start_worker, team, alice, tmp_path
):
    """`execution.train_processes: 2` outside simulated execution: rank 0 holds the run's batch
    source. Distributed, with a real rollout worker, on a run that learns: every metric of the
    one-process run within 1e-5 or RANKS_REL of its value at every step, and the last published
    weights within 1e-5 (the ranks' float32 sums in another order). Async in 2 ranks: its
    staleness bound and bookkeeping hold, and its execution report reaches the summary. A
    distributed run in 2 ranks cancelled while rank 0 waits on its batches ends cancelled."""
    distributed = {**TRAINING_CONFIG, "execution": {"mode": "distributed"}}
    ranks = {"mode": "distributed", "train_processes": 2}
    offset = [{"sync_offset": 2}]
    one = queue_sweep(team, alice, "one trainer", config=distributed, staleness=offset).runs.get()
    two = queue_sweep(
        team, alice, "two ranks", config={**distributed, "execution": ranks}, staleness=offset
    ).runs.get()
    async_config = {**TINY_CONFIG, "execution": {"mode": "async", "max_staleness": 2, "train_processes": 2}}
    in_async = queue_sweep(team, alice, "async ranks", config=async_config).runs.get()
    long = {**distributed, "execution": ranks, "steps": 400, "eval_every": 400, "checkpoint_every": 50}
    cancelled = queue_sweep(team, alice, "cancelled ranks", config=long, staleness=offset).runs.get()
    kept = WeightsKept([one, two], tmp_path / "weights")
    start_worker()
    rollout_worker = start_worker(queue="rollout")
    try:
        wait_until_over([one, two, in_async], 300)
    finally:
        kept.stop()
    for run in (one, two, in_async):
        run.refresh_from_db()
        assert run.status == Run.SUCCEEDED, run.error
        assert run.summary["weights/publish_bytes"] > 0, "the source's report is in the summary"
        jobs = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH)
        assert set(jobs.values_list("worker", flat=True)) == {rollout_worker.identity}
        assert_one_point_per_name_and_step(run)
    assert_curves_equal(two, one, rel=RANKS_REL)
    mine, reference = kept.last(two), kept.last(one)
    assert set(mine) == set(reference)
    # Within the ranks' float32 drift (RANKS_REL): 1.4e-6 after 6 steps that learn at lr 1e-2.
    assert max(float((mine[k] - reference[k]).abs().max()) for k in reference) <= 1e-5
    record = two.provenance
    assert (record["train_processes"], record["backend"], record["threads_per_rank"]) == (2, "gloo", 1)
    assert in_async.provenance["train_processes"] == 2

    lags = {step: value for _, step, value in logged(in_async, "staleness/max")}
    assert sorted(lags) == list(range(1, TINY_CONFIG["steps"] + 1))
    assert lags[1] == 0 and max(lags.values()) <= 2
    for step, lag in lags.items():
        job = RolloutJob.objects.get(run=in_async, kind=RolloutJob.BATCH, step=step)
        assert lag == step - 1 - job.version, "the logged staleness is the measured one"
    flight, queue = (
        {step: value for _, step, value in logged(in_async, name)}
        for name in ("staleness/in_flight", "staleness/in_queue")
    )
    for step, lag in lags.items():
        assert flight[step] + queue[step] == pytest.approx(lag), step
    assert sorted(step for _, step, _ in logged(in_async, "eval/accuracy")) == [0, 5, 6]

    wait_for(lambda: (last_step(cancelled, "loss") or 0) >= 2, 120, "two steps of the run to cancel")
    cancelled.cancel()
    wait_until_over([cancelled], 60)
    cancelled.refresh_from_db()
    assert cancelled.status == Run.CANCELLED, cancelled.error
    assert 2 <= cancelled.summary["steps"] < long["steps"]
