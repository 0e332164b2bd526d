"""`RolloutJob` transitions: the lease idiom of runs (claimed once per attempt, a late message or a
late finish of an older attempt changes nothing), a job's own failures retried up to the attempt
limit and a lost worker re-queued up to its own limit (`LAB_MAX_JOB_LOSSES`), a job that cannot
succeed failed at once, and cancelling a run cancels its unfinished jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from support import TINY_CONFIG, purge_queue, queued_messages

from experiments.models import PolicyVersion, RolloutJob, Run
from workers.jobs import claim
from workers.rollout import generate
from workers.sink import NotOwner

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(make_run) -> Run:
    return make_run("jobs", config={**TINY_CONFIG, "execution": {"mode": "distributed"}})


@pytest.fixture
def job(run) -> RolloutJob:
    purge_queue("rollout")
    return RolloutJob.objects.create(run=run, step=1, groups_start=0, groups_stop=4, version=0)


def stale(job: RolloutJob) -> None:
    RolloutJob.objects.filter(pk=job.pk).update(heartbeat=timezone.now() - timedelta(hours=1))


def test_a_job_is_claimed_once_per_attempt(job):
    assert job.claim("r1:1", attempt=1)
    assert not RolloutJob.objects.get(pk=job.pk).claim("r2:2", attempt=1)
    assert generate(job.pk, 1, "r3:3").endswith("not queued any more, nothing to do")
    assert generate(job.pk + 1000, 1, "r3:3").endswith("nothing to do")
    job.refresh_from_db()
    assert (job.status, job.worker) == (RolloutJob.RUNNING, "r1:1")


def test_a_claimed_job_holds_its_run_so_no_query_waits_outside_the_outage_retry(
    job, django_assert_num_queries
):
    # What the worker reads after the claim must not query the database: only the claim itself
    # rides out an outage (`retry_db`); a lazy `job.run` there once cost a job an attempt.
    claimed = claim(job.pk, 1, "r1:1")
    again = claim(job.pk, 1, "r1:1")  # a retried claim whose UPDATE had committed: still ours
    with django_assert_num_queries(0):
        assert claimed.run.pk == again.run.pk == job.run_id
        assert claimed.run.run_config().execution.mode == "distributed"
    assert claim(job.pk, 1, "r2:2") is None


def test_a_reaped_job_is_requeued_and_the_old_attempt_cannot_finish_it(job):
    job.claim("r1:1", attempt=1)
    stale(job)
    assert [j.pk for j in RolloutJob.reap()] == [job.pk]
    job.refresh_from_db()
    assert (job.status, job.attempt, job.worker) == (RolloutJob.QUEUED, 2, "")
    assert job.error == "worker r1:1 stopped sending heartbeats"
    assert queued_messages("rollout") == 1, "the new attempt is sent again"
    assert not job.beat("r1:1", 1)
    assert not job.finish("r1:1", 1, 0, "/nowhere", "0" * 64)
    assert generate(job.pk, 1, "r1:1").endswith("nothing to do"), "a late message for attempt 1"
    job.refresh_from_db()
    assert (job.status, job.path) == (RolloutJob.QUEUED, "")


@override_settings(LAB_MAX_ATTEMPTS=2)
def test_failures_retry_until_the_attempts_run_out(job):
    job.claim("r1:1", attempt=1)
    assert job.fail("r1:1", 1, "RuntimeError: boom")
    job.refresh_from_db()
    assert (job.status, job.attempt, job.error) == (RolloutJob.QUEUED, 2, "RuntimeError: boom")
    job.claim("r2:2", attempt=2)
    job.fail("r2:2", 2, "RuntimeError: boom again")
    job.refresh_from_db()
    assert (job.status, job.attempt) == (RolloutJob.FAILED, 2)


@override_settings(LAB_MAX_ATTEMPTS=3, LAB_MAX_JOB_LOSSES=5)
def test_a_worker_lost_in_a_job_is_not_charged_as_the_jobs_failure(job):
    # Three workers killed in the same job (the probe's async run ended on attempt 1 this way).
    for attempt in (1, 2, 3, 4):
        job.claim(f"r{attempt}:1", attempt=attempt)
        stale(job)
        assert [j.pk for j in RolloutJob.reap()] == [job.pk]
        job.refresh_from_db()
        assert (job.status, job.attempt, job.losses) == (RolloutJob.QUEUED, attempt + 1, attempt)
    # Its own failures still have their LAB_MAX_ATTEMPTS: two more are retried, the third is final.
    for attempt in (5, 6, 7):
        job.claim("r9:1", attempt=attempt)
        job.fail("r9:1", attempt, "RuntimeError: boom")
        job.refresh_from_db()
    assert (job.status, job.attempt, job.failures) == (RolloutJob.FAILED, 7, 3)


@override_settings(LAB_MAX_JOB_LOSSES=2)
def test_a_job_that_keeps_losing_its_worker_is_lost_in_the_end(job):
    job.claim("r1:1", attempt=1)
    stale(job)
    RolloutJob.reap()
    job.claim("r2:1", attempt=2)
    stale(job)
    RolloutJob.reap()
    job.refresh_from_db()
    assert (job.status, job.attempt, job.losses) == (RolloutJob.LOST, 2, 1)
    assert (
        job.error == "worker r2:1 stopped sending heartbeats (2 workers lost in this job; LAB_MAX_JOB_LOSSES)"
    )


def test_a_failure_that_would_repeat_fails_the_job_at_once(job):
    job.claim("r1:1", attempt=1)
    assert job.fail("r1:1", 1, "memory: used 301 MiB > ceiling 300 MiB (LAB_RUN_MEMORY_MB)", final=True)
    job.refresh_from_db()
    assert (job.status, job.attempt) == (RolloutJob.FAILED, 1)


def test_weights_that_cannot_be_loaded_say_why_and_fail_the_job_for_good(run, job):
    from rlcore.weights import WeightStore
    from workers import jobs, rollout
    from workers.buffer import weight_store

    store: WeightStore = weight_store(run)
    published = store.publish(0, {"w": torch.ones(3)})
    PolicyVersion.objects.create(
        run=run, version=0, sha256=published.sha256, size_bytes=published.size_bytes, publish_s=0.0
    )
    assert rollout.load_into(run, job, rollout.Held(), lambda weights: None, "") == 0
    store.path(0).write_bytes(b"x" + store.path(0).read_bytes()[1:])
    with pytest.raises(jobs.CannotMake, match="weights of version 0 at .* do not match their sha256"):
        rollout.load_into(run, job, rollout.Held(), lambda weights: None, "")
    store.path(0).unlink()
    with pytest.raises(
        jobs.CannotMake, match="the weights of policy version 0 are missing from the run's buffer"
    ):
        rollout.load_into(run, job, rollout.Held(), lambda weights: None, "")
    job.claim("r1:1", attempt=1)
    made = jobs.make(job, "r1:1", lambda: rollout.load_into(run, job, rollout.Held(), lambda w: None, ""))
    job.refresh_from_db()
    assert made.endswith("failed") and (job.status, job.attempt) == (RolloutJob.FAILED, 1)
    assert job.error.startswith("the weights of policy version 0 are missing from the run's buffer (runs/")


def test_cancelling_a_run_cancels_its_unfinished_jobs(run, job):
    running = RolloutJob.objects.create(run=run, step=2, groups_start=0, groups_stop=4, version=1)
    running.claim("r1:1", attempt=1)
    done = RolloutJob.objects.create(run=run, step=3, groups_start=0, groups_stop=4, version=2)
    done.claim("r1:1", attempt=1)
    done.finish("r1:1", 1, 2, "/somewhere", "f" * 64)
    assert run.cancel()
    statuses = dict(RolloutJob.objects.filter(run=run).values_list("step", "status"))
    assert statuses == {1: RolloutJob.CANCELLED, 2: RolloutJob.CANCELLED, 3: RolloutJob.DONE}
    running.refresh_from_db()
    assert not running.finish("r1:1", 1, 1, "/late", "e" * 64), "a cancelled job's result is dropped"


def test_an_evaluations_parts_are_summed_handed_out_once_and_a_given_up_part_fails_the_wait(run):
    from rlcore.config import RunConfig
    from rlcore.evaluate import EvalSums
    from workers.source import DatabaseSource

    config = RunConfig.model_validate({**run.config, "execution": {"mode": "async", "max_staleness": 1}})
    source = DatabaseSource(run, config, should_stop=lambda: False)

    def part(step, index, status, sums=None):
        return RolloutJob.objects.create(
            run=run,
            kind=RolloutJob.EVAL,
            step=step,
            part=index,
            groups_start=0,
            groups_stop=1,
            version=step,
            status=status,
            result=sums and vars(sums),
        )

    part(5, 0, RolloutJob.DONE, EvalSums(n=2, correct=1, reward=1.5, k3=0.2, tokens=4))
    part(5, 1, RolloutJob.DONE, EvalSums(n=3, correct=3, reward=3.0, k3=0.6, tokens=4))
    waiting = part(6, 0, RolloutJob.RUNNING)
    assert source.evaluations(wait=False) == [
        (5, {"eval/accuracy": 4 / 5, "eval/reward": 4.5 / 5, "eval/kl_init": 0.8 / 8})
    ]
    assert source.evaluations(wait=False) == [], "each evaluation is handed out once"

    RolloutJob.objects.filter(pk=waiting.pk).update(status=RolloutJob.FAILED, error="out of memory")
    with pytest.raises(RuntimeError, match=r"eval of step 6, part 0\) failed: out of memory"):
        source.evaluations(wait=True)


@override_settings(LAB_MAX_ATTEMPTS=1)
def test_a_message_wakes_the_worker_which_makes_every_job_queued_on_its_queue_batches_first(run):
    purge_queue("rollout")

    def queued(kind: str, step: int, queue: str = "rollout") -> RolloutJob:
        # Version 7 is never published: each job fails at once, after this worker claimed it.
        return RolloutJob.objects.create(
            run=run, kind=kind, step=step, groups_start=0, groups_stop=4, version=7, queue=queue
        )

    evaluation = queued(RolloutJob.EVAL, 2)
    batches = [queued(RolloutJob.BATCH, 3), queued(RolloutJob.BATCH, 4)]
    elsewhere = queued(RolloutJob.BATCH, 5, queue="rollout-gpu")
    assert generate(evaluation.pk, 1, "r1:1").endswith("3 jobs of queue rollout made")
    made = sorted(RolloutJob.objects.filter(queue="rollout"), key=lambda j: j.started)
    assert [j.pk for j in made] == [batches[0].pk, batches[1].pk, evaluation.pk], (
        "batches first, oldest first"
    )
    assert {(j.worker, j.status) for j in made} == {("r1:1", RolloutJob.FAILED)}
    assert made[0].error == f"RuntimeError: policy version 7 of run {run.pk} was never published"
    elsewhere.refresh_from_db()
    assert elsewhere.status == RolloutJob.QUEUED, "another queue's job is another worker's"
    assert generate(batches[0].pk, 1, "r1:1").endswith("nothing to do"), "its own message finds it made"


def test_a_waiting_trainer_makes_its_evaluations_parts_itself_and_they_add_up_to_its_own(run):
    """With no rollout worker about, the trainer's wait for its evaluations makes every part
    itself, under the jobs' lease, with a copy of the evaluated weights (async)."""
    from rlcore.config import RunConfig
    from rlcore.trainer import local_source, prepare, run_step
    from workers.source import DatabaseSource

    purge_queue("rollout")
    config = RunConfig.model_validate(
        {**run.config, "execution": {"mode": "async"}, "optimizer": {"lr": 1e-3}}
    )
    learner = prepare(config, settings.LAB_CACHE_DIR)
    local = local_source(learner, settings.LAB_CACHE_DIR)
    for step in (1, 2):  # a policy that moved away from θ0
        run_step(learner, local, step)
    expected = learner.evaluator.evaluate(learner.policy, 2)
    assert run.claim("trainer:1", attempt=run.attempt)  # what a trainer writes needs the run
    source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    source.evaluate(2, learner.policy, learner.evaluator)
    run_step(learner, local, 3)  # the policy moves on; the copy keeps version 2
    [(step, metrics)] = source.evaluations(wait=True)
    assert step == 2 and metrics == pytest.approx(expected, rel=1e-5, abs=1e-9)
    parts = RolloutJob.objects.filter(run=run, kind=RolloutJob.EVAL)
    assert parts.count() == 3 and set(parts.values_list("status", "worker", "version")) == {
        (RolloutJob.DONE, "trainer:1", 2)
    }
    summary = source.summary()
    assert summary["evals/trainer_parts"] == 3
    # Left idle: the checks between parts; the parts themselves, and claiming them, are work.
    assert source.idle_s < 0.5 * source.evals.seconds
    assert summary["idle/rollout_frac"] == 1.0, "the trainer's parts are not rollout workers' work"
    purge_queue("rollout")


def test_the_trainer_is_idle_only_while_its_batch_is_not_ready(run):
    """`idle/trainer_frac` is the time the trainer is blocked on a batch that is not there yet:
    publishing its weights and reading a batch made before it asked cost no idle time; a batch
    made while it waits costs the wait."""
    import time

    from rlcore.config import RunConfig
    from rlcore.trainer import prepare
    from workers.rollout import execute
    from workers.source import STOP_CHECK_S, DatabaseSource

    purge_queue("rollout")
    config = RunConfig.model_validate({**run.config, "execution": {"mode": "async", "max_staleness": 1}})
    Run.objects.filter(pk=run.pk).update(config=config.model_dump(mode="json"))
    run.refresh_from_db()
    learner = prepare(config, settings.LAB_CACHE_DIR)
    jobs = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH).order_by("step")
    made_meanwhile = []

    def should_stop() -> bool:  # asked after STOP_CHECK_S of waiting: step 2's batch is made then
        made_meanwhile.append(execute(jobs[1].pk, 1, "r1:1"))
        return False

    assert run.claim("trainer:1", attempt=run.attempt)  # what a trainer writes needs the run
    source = DatabaseSource(run, config, should_stop=should_stop, worker="trainer:1")
    source.publish(0, learner.policy)  # admits steps 1 and 2
    assert execute(jobs[0].pk, 1, "r1:1").endswith("done with version 0")
    source.take(1)
    time.sleep(0.2)  # the update
    assert source.summary()["idle/trainer_frac"] == 0.0, (
        "the batch was there: publishing and reading are work"
    )
    assert source.idle_s == 0.0
    started = time.perf_counter()
    source.take(2)
    waited = time.perf_counter() - started
    assert len(made_meanwhile) == 1 and made_meanwhile[0].endswith("done with version 0")
    # Idle from the first check that found no batch (a few ms in) to the batch: over STOP_CHECK_S.
    assert 0.9 * STOP_CHECK_S <= source.idle_s <= waited
    assert 0.0 < source.summary()["idle/trainer_frac"] < 1.0
    purge_queue("rollout")


def test_a_trainer_leaves_an_older_evaluation_to_the_rollout_workers_once_its_policy_moved_on(run):
    """Distributed: the trainer keeps no copy of evaluated weights, so it may make an eval part
    only while its own policy still holds that version; after the next update the part is a
    rollout worker's, made from the published weights."""
    from rlcore.config import RunConfig
    from rlcore.trainer import local_source, prepare, run_step, train_step
    from workers.rollout import execute
    from workers.source import DatabaseSource

    purge_queue("rollout")
    # A strong weight decay: every update moves the policy, even where no response is rewarded.
    optimizer = {"lr": 0.05, "weight_decay": 1.0}
    config = RunConfig.model_validate(
        {**run.config, "execution": {"mode": "distributed"}, "optimizer": optimizer}
    )
    learner = prepare(config, settings.LAB_CACHE_DIR)
    run_step(learner, local_source(learner, settings.LAB_CACHE_DIR), 1)  # the policy is version 1
    assert run.claim("trainer:1", attempt=run.attempt)  # what a trainer writes needs the run
    source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    expected = {1: learner.evaluator.evaluate(learner.policy, 1)}
    source.evaluate(1, learner.policy, learner.evaluator)
    source.publish(1, learner.policy)  # step 2 trains on version 1
    [batch_job] = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, step=2)
    assert execute(batch_job.pk, 1, "r1:1").endswith("done with version 1")
    train_step(learner, source.take(2), 2)  # the policy is version 2 now
    expected[2] = learner.evaluator.evaluate(learner.policy, 2)
    source.evaluate(2, learner.policy, learner.evaluator)
    older = RolloutJob.objects.get(run=run, kind=RolloutJob.EVAL, step=1)
    assert older.status == RolloutJob.QUEUED, "not made with version 2's weights"
    assert execute(older.pk, 1, "r1:1").endswith("done with version 1")
    done = dict(source.evaluations(wait=True))  # the trainer makes version 2's part itself
    assert done.keys() == {1, 2} and expected[1]["eval/kl_init"] != pytest.approx(expected[2]["eval/kl_init"])
    for step in (1, 2):
        assert done[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-9), step
    workers = dict(RolloutJob.objects.filter(run=run, kind=RolloutJob.EVAL).values_list("step", "worker"))
    assert workers == {1: "r1:1", 2: "trainer:1"}
    purge_queue("rollout")


def test_auto_theta0_logprobs_come_with_a_batch_only_when_no_other_job_waits_for_the_worker(run):
    """`execution.init_logprobs: auto`: a rollout worker spends θ0's forward pass on a batch only
    when nothing else is queued for it; otherwise the batch goes without and the trainer computes
    them in its update."""
    from pathlib import Path

    from rlcore.batch import Batch
    from rlcore.config import RunConfig
    from rlcore.trainer import prepare
    from workers.rollout import execute
    from workers.source import DatabaseSource

    purge_queue("rollout")
    execution = {"mode": "async", "max_staleness": 1, "init_logprobs": "auto"}
    config = RunConfig.model_validate({**run.config, "execution": execution})
    Run.objects.filter(pk=run.pk).update(config=config.model_dump(mode="json"))
    run.refresh_from_db()
    learner = prepare(config, settings.LAB_CACHE_DIR)
    assert run.claim("trainer:1", attempt=run.attempt)  # what a trainer writes needs the run
    source = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    source.publish(0, learner.policy)  # admits steps 1 and 2
    first, second = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH).order_by("step")
    assert execute(first.pk, 1, "r1:1").endswith("done with version 0")
    assert execute(second.pk, 1, "r1:1").endswith("done with version 0")
    first.refresh_from_db()
    second.refresh_from_db()
    behind, alone = (Batch.load(Path(j.path), j.sha256) for j in (first, second))
    assert behind.init_logp is None, "step 2's job was queued behind it: the trainer computes them"
    assert alone.init_logp is not None, "nothing waited: the rollout worker computed them"
    purge_queue("rollout")


def test_a_trainer_finds_the_rows_another_attempt_wrote_meanwhile_and_writes_none_twice(run):
    """A trainer inserts the rows newer than any that existed when its attempt started without
    reading first; if another attempt of the run (a worker thought lost) wrote them meanwhile,
    the publish is made again the careful way: no error, no second row, no second message."""
    from experiments.models import PolicyVersion
    from rlcore.config import RunConfig
    from rlcore.trainer import prepare
    from workers.source import DatabaseSource

    purge_queue("rollout")
    config = RunConfig.model_validate({**run.config, "execution": {"mode": "async", "max_staleness": 1}})
    learner = prepare(config, settings.LAB_CACHE_DIR)
    late = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:1")
    other = DatabaseSource(run, config, should_stop=lambda: False, worker="trainer:2")
    assert run.claim("trainer:2", attempt=run.attempt)
    other.publish(0, learner.policy)  # version 0 and the jobs of steps 1 and 2
    other.evaluate(0, learner.policy, learner.evaluator)
    # trainer:2 stalls, is reaped, and trainer:1 takes the run's next attempt.
    assert run.mark_lost(timezone.now() + timedelta(seconds=1)) and run.retry(within_cap=False)
    assert run.claim("trainer:1", attempt=run.attempt)
    late.publish(0, learner.policy)
    late.evaluate(0, learner.policy, learner.evaluator)
    assert PolicyVersion.objects.filter(run=run).count() == 1
    batches = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH)
    assert sorted(batches.values_list("step", flat=True)) == [1, 2]
    evals = RolloutJob.objects.filter(run=run, kind=RolloutJob.EVAL).count()
    assert evals == len(late.eval_slices)
    assert queued_messages("rollout") == 2 + evals, "one message a job"
    late.publish(1, learner.policy)  # newer than anything: inserted straight away
    assert sorted(batches.values_list("step", flat=True)) == [1, 2, 3]
    # The stalled trainer wakes up: it publishes and records nothing more.
    with pytest.raises(NotOwner, match="no longer executed by trainer:2"):
        other.publish(2, learner.policy)
    assert sorted(PolicyVersion.objects.filter(run=run).values_list("version", flat=True)) == [0, 1]
    assert sorted(batches.values_list("step", flat=True)) == [1, 2, 3]
    purge_queue("rollout")
