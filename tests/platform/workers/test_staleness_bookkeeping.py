"""Staleness bookkeeping, against the three bugs AReaL found in its own (docs/architecture.md,
"Staleness bookkeeping"): a batch is labelled with the version whose weights generated it, read
once when its rollout job loads them; after a resume, async admission counts from the resumed
version; admission counts a step's prompt groups once, however many rollout workers share it.

Each test runs the real admission, rollout-job and trainer-source code in this process on the
database (no worker processes), and its docstring says how the broken bookkeeping it catches was
tried: the test failed on it and passes on the code."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from django.conf import settings
from django.utils import timezone
from support import purge_queue

from experiments.models import RolloutJob, Run
from rlcore.batch import Batch
from rlcore.config import RunConfig
from rlcore.produce import Producer, make_engine
from rlcore.trainer import prepare
from workers import rollout
from workers.jobs import claim
from workers.rollout import execute
from workers.source import DatabaseSource

pytestmark = pytest.mark.django_db(transaction=True)


def configured(run: Run, **sections) -> RunConfig:
    """`run` with `sections` over `TINY_CONFIG`, stored where its rollout jobs read it."""
    config = RunConfig.model_validate({**run.config, **sections})
    Run.objects.filter(pk=run.pk).update(config=config.model_dump(mode="json"))
    run.refresh_from_db()
    return config


def moved(policy: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Other weights of the same model: a later policy version."""
    other = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return other


def generated_by(learner, weights: torch.nn.Module, step: int, groups: range) -> Batch:
    """Step `step`'s batch of `groups` as `weights` generate it (a batch is a pure function of the
    config, the step and the weights)."""
    engine = make_engine(learner.config, learner.lm, settings.LAB_CACHE_DIR, learner.task)
    engine.load_snapshot(weights.state_dict())
    return Producer(learner.config, learner.task, learner.lm, engine).batch(step, -1, groups)


def same_responses(a: Batch, b: Batch) -> bool:
    return torch.equal(a.rollout.response_ids, b.rollout.response_ids) and torch.allclose(
        a.rollout.logp, b.rollout.logp, atol=1e-5
    )


def made(job: RolloutJob) -> Batch:
    job.refresh_from_db()
    return Batch.load(Path(job.path), job.sha256)


def batch_steps(run: Run) -> list[int]:
    return list(
        RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, part=0)
        .order_by("step")
        .values_list("step", flat=True)
    )


def test_an_async_batch_is_labelled_with_the_version_it_loaded_though_a_newer_one_is_published_meanwhile(
    run,
):
    """The version is pinned when the rollout job reads the weights (`workers.rollout.load_into`)
    and passed on, never read again: the trainer publishes version 1 while the job generates with
    version 0, and the batch says 0, is row for row what version 0's weights generate, and only
    its `ready_versions` (the in-flight split) see version 1.

    The bug it catches (AReaL PR #1569, the version read twice): labelling the batch with the
    newest version read again when it is stored, `version = newest_published(run, version)` after
    `producer.batch(...)` in `workers.rollout._make_here`. Tried: the job reports "done with
    version 1" and the test fails."""
    purge_queue("rollout")
    config = configured(run, execution={"mode": "async", "max_staleness": 1})
    learner = prepare(config, settings.LAB_CACHE_DIR)
    later = moved(learner.policy, seed=1)
    assert run.claim("trainer:1", attempt=run.attempt)  # what a trainer writes needs the run
    source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    source.publish(0, learner.policy)  # admits steps 1 and 2
    [job] = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, step=1)

    loaded = rollout.producer_for(run)
    generate = loaded.producer.batch

    def trainer_moves_on_meanwhile(*args, **kwargs) -> Batch:
        source.publish(1, later)  # after the job loaded version 0, before its batch is stored
        return generate(*args, **kwargs)

    loaded.producer.batch = trainer_moves_on_meanwhile
    try:
        assert execute(job.pk, 1, "r1:1").endswith("done with version 0")
    finally:
        rollout._producers.pop(run.pk, None)
    batch = made(job)
    assert job.version == batch.version == 0
    assert batch.versions().tolist() == [0] * len(batch.problems)
    assert batch.ready_versions.tolist() == [1] * len(batch.problems), "the newest when it was ready"
    groups = range(job.groups_start, job.groups_stop)
    assert same_responses(batch, generated_by(learner, learner.policy, 1, groups))
    assert not same_responses(batch, generated_by(learner, later, 1, groups)), "the versions differ"
    purge_queue("rollout")


# (mode, its sections, the step of the job whose worker dies, the version its re-made attempt uses)
REMADE = {
    "distributed": ({"execution": {"mode": "distributed"}, "staleness": {"sync_offset": 1}}, 3, 1),
    "async": ({"execution": {"mode": "async", "max_staleness": 1}}, 2, 2),
}


@pytest.mark.parametrize("mode", REMADE)
def test_a_job_remade_after_its_worker_died_is_made_and_labelled_with_the_version_it_reads(run, mode):
    """A batch job's worker dies mid-job, the trainer publishes a newer version meanwhile, the
    reaper re-queues the job and another worker makes it. Distributed (`sync_offset: 1`): step 3
    trains on version 1, so the new attempt loads version 1 again although version 2 is out.
    Async: the new attempt reads the newest version itself, 2, not what was newest when the dead
    attempt was claimed (1). Either way the batch is labelled with the version it loaded and is
    row for row what that version's weights generate.

    The bug it catches (a token labelled with a version that did not generate it): a re-made job
    that loads the newest weights but keeps the label in its row, i.e. `load_into` reading
    `newest_version(run)` whatever `job.version` says and `_make_here` labelling with
    `job.version`; in async with the row's version written at the first claim (`claim` setting
    it to the newest then) and kept by the reaper's re-queue. Tried: the distributed batch says
    1 with version 2's responses, the async one says 1 with version 2's responses, and the test
    fails in both modes."""
    purge_queue("rollout")
    sections, step, version = REMADE[mode]
    config = configured(run, **sections)
    learner = prepare(config, settings.LAB_CACHE_DIR)
    versions = [learner.policy, moved(learner.policy, seed=1), moved(learner.policy, seed=2)]
    assert run.claim("trainer:1", attempt=run.attempt)
    source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    source.publish(0, versions[0])
    source.publish(1, versions[1])
    [job] = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, step=step)
    assert claim(job.pk, 1, "r1:1") is not None  # its worker dies: no heartbeat from now on
    RolloutJob.objects.filter(pk=job.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    source.publish(2, versions[2])  # the trainer moves on while nobody makes the job
    assert [j.pk for j in RolloutJob.reap()] == [job.pk]
    assert execute(job.pk, 2, "r2:2").endswith(f"done with version {version}")
    batch = made(job)
    assert (job.attempt, job.version, batch.version) == (2, version, version)
    assert batch.versions().tolist() == [version] * len(batch.problems)
    groups = range(job.groups_start, job.groups_stop)
    assert same_responses(batch, generated_by(learner, versions[version], step, groups))
    for other in {0, 1, 2} - {version}:
        assert not same_responses(batch, generated_by(learner, versions[other], step, groups)), other
    purge_queue("rollout")


def test_after_a_resume_async_admission_counts_from_the_resumed_version_not_a_burst(run):
    """Async, `max_staleness: 1`: the first attempt publishes versions 0 to 2, so steps 1 to 4
    have jobs. It dies; the next attempt resumes from the checkpoint of step 1 and publishes
    version 1: no step is admitted beyond what version 1 admits (step 3, made already), and each
    later version admits one step more, just as in the first attempt.

    The bug it catches (AReaL PR #1345, capacity `(η + recovered_version + 1)·B` after a
    recovery): admission counting the steps this attempt created, which start at 0 again after
    the resume, i.e. in `Admitted.steps_to_create`
    `admissible = created_upto + version + 1 + max_staleness - created_by_this_attempt`, equal to
    the code's bound in a first attempt. Tried: the resumed attempt's version 1 admits steps 5
    and 6 at once and the test fails."""
    purge_queue("rollout")
    config = configured(run, execution={"mode": "async", "max_staleness": 1})
    learner = prepare(config, settings.LAB_CACHE_DIR)
    assert run.claim("trainer:1", attempt=run.attempt)
    first = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    for version in range(3):
        first.publish(version, learner.policy)
        assert batch_steps(run) == list(range(1, version + 3)), version
    # The first trainer dies; the next attempt resumes from its checkpoint of step 1.
    assert run.mark_lost(timezone.now() + timedelta(seconds=1)) and run.retry(within_cap=False)
    assert run.claim("trainer:2", attempt=run.attempt)
    resumed = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:2")
    resumed.load_state({"checkpoint_step": 1})
    resumed.resume(1)
    resumed.publish(1, learner.policy)
    assert batch_steps(run) == [1, 2, 3, 4], "version 1 admits up to step 3: nothing new"
    resumed.publish(2, learner.policy)
    assert batch_steps(run) == [1, 2, 3, 4]
    resumed.publish(3, learner.policy)
    assert batch_steps(run) == [1, 2, 3, 4, 5], "version 3 admits step 5, and only it"
    purge_queue("rollout")


@pytest.mark.parametrize("mode", ["distributed", "async"])
def test_admission_counts_a_steps_prompt_groups_once_across_rollout_workers(make_run, mode):
    """With 1 or 3 rollout workers, publishing a version admits the same steps, and each step's
    jobs split its `prompts_per_step` groups between the workers: every group in exactly one
    job, so the batches hold as many rows and the bound holds as many steps either way.

    The bug it catches (AReaL PR #1471, capacity scaled per data-parallel worker, so counted
    twice): admission that gives each rollout worker the bound, i.e. `max_staleness` multiplied
    by `execution.rollout_workers` in `Admitted.steps_to_create`, or a step's jobs each given the
    whole step (`group_slices` returning `range(groups)` for every part). Tried both: with 3
    workers the async run admits steps 1 to 4 (not 1 to 2) at version 0, resp. each step holds
    every group three times, and the test fails."""
    purge_queue("rollout")
    admitted = {}
    for workers in (1, 3):
        run = make_run(f"workers-{workers}")
        config = configured(
            run,
            execution={
                "mode": mode,
                "rollout_workers": workers,
                **({"max_staleness": 1} if mode == "async" else {}),
            },
        )
        learner = prepare(config, settings.LAB_CACHE_DIR)
        assert run.claim("trainer:1", attempt=run.attempt)
        source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
        source.publish(0, learner.policy)
        jobs = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH)
        by_step: dict[int, list[int]] = {}
        for job in jobs:
            by_step.setdefault(job.step, []).extend(range(job.groups_start, job.groups_stop))
        assert {len(parts) for parts in by_step.values()} == {config.rollout.prompts_per_step}
        for step, groups in by_step.items():
            assert sorted(groups) == list(range(config.rollout.prompts_per_step)), step
            assert jobs.filter(step=step).count() == workers
        admitted[workers] = sorted(by_step)
    assert admitted[1] == admitted[3] == ([1, 2] if mode == "async" else [1])
    purge_queue("rollout")


def test_after_a_resume_an_async_batch_is_made_from_the_resumed_attempts_weights(run):
    """Async: the first attempt publishes versions 0 to 2 and dies before any batch is made; the
    next attempt resumes from the checkpoint of step 1 (version 1) and republishes version 1 with
    bytes of its own (another machine). The batch of step 2 it then waits for is made with those
    weights and labelled 1: the dead attempt's version 2 is a future this run never reached, and
    a label 2 on the batch of step 2 would be a staleness of −1.

    The bug it catches (a batch labelled with a version that did not generate it, after a
    resume): the newest version row read as it stood when the attempt died. Tried (the code
    before `DatabaseSource.resume` dropped the dead attempt's newer versions): step 2's batch came
    out labelled 2, made with the dead attempt's weights, and the test fails."""
    purge_queue("rollout")
    config = configured(run, execution={"mode": "async", "max_staleness": 1})
    learner = prepare(config, settings.LAB_CACHE_DIR)
    dead = [learner.policy, moved(learner.policy, seed=1), moved(learner.policy, seed=2)]
    assert run.claim("trainer:1", attempt=run.attempt)
    first = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    for version, weights in enumerate(dead):
        first.publish(version, weights)
    assert run.mark_lost(timezone.now() + timedelta(seconds=1)) and run.retry(within_cap=False)
    assert run.claim("trainer:2", attempt=run.attempt)
    resumed = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:2")
    resumed.load_state({"checkpoint_step": 1})
    resumed.resume(1)
    republished = moved(learner.policy, seed=3)
    resumed.publish(1, republished)
    [job] = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, step=2)
    assert execute(job.pk, job.attempt, "r1:1").endswith("done with version 1")
    batch = made(job)
    assert job.version == batch.version == 1
    groups = range(job.groups_start, job.groups_stop)
    assert same_responses(batch, generated_by(learner, republished, 2, groups))
    taken = resumed.take(2)
    assert taken.versions().max().item() <= 1, "no batch is newer than the policy that trains on it"
    purge_queue("rollout")
