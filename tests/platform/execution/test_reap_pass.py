"""One reap pass for runs and rollout jobs (`experiments.reaping.reap`): what a worker's reaper
thread and `manage.py reap` both run, so the command takes back a lost rollout job as the workers
do, and nothing else calls `Run.reap` or `RolloutJob.reap`."""

from __future__ import annotations

import ast
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from support import REPO, TINY_CONFIG, purge_queue

from experiments import reaping
from experiments.models import RolloutJob, Run

pytestmark = pytest.mark.django_db


def stale(rows) -> None:
    rows.update(heartbeat=timezone.now() - timedelta(hours=1))


@pytest.fixture
def lost(make_run):
    """A running run and a running rollout job of another run, both with stale heartbeats, and a
    running job whose worker still beats (the queues are emptied of the new attempts' messages after)."""
    purge_queue("rollout")
    run = make_run("lost run")
    run.claim("w1:1", attempt=1)
    stale(Run.objects.filter(pk=run.pk))
    distributed = make_run("jobs", config={**TINY_CONFIG, "execution": {"mode": "distributed"}})
    job, alive = (
        RolloutJob.objects.create(
            run=distributed, step=1, part=part, groups_start=0, groups_stop=4, version=0
        )
        for part in (0, 1)
    )
    job.claim("r1:1", attempt=1)
    alive.claim("r2:1", attempt=1)
    stale(RolloutJob.objects.filter(pk=job.pk))
    yield run, job, alive
    for queue in ("cpu", "rollout"):
        purge_queue(queue)


def test_one_pass_takes_back_the_lost_runs_and_jobs(lost):
    run, job, alive = lost
    reaped = reaping.reap()
    assert ([r.pk for r in reaped.runs], [j.pk for j in reaped.jobs]) == ([run.pk], [job.pk])
    assert [what for what, _ in reaped.each()] == [f"run {run.pk}", str(job)]
    run.refresh_from_db(), job.refresh_from_db(), alive.refresh_from_db()
    assert (run.status, run.attempt, job.status, job.attempt) == (Run.QUEUED, 2, RolloutJob.QUEUED, 2)
    assert (alive.status, alive.attempt) == (RolloutJob.RUNNING, 1)
    assert reaping.reap() == ([], []), "a second pass finds nothing"


def test_manage_py_reap_takes_back_a_lost_rollout_job_too(lost, capsys):
    run, job, _ = lost
    call_command("reap")
    out = capsys.readouterr().out
    assert f"run {run.pk}: lost, now queued (attempt 2)" in out and "1 lost run(s)" in out
    assert f"{job}: lost, now queued (attempt 2)" in out and "1 lost rollout job(s)" in out
    job.refresh_from_db()
    assert (job.status, job.attempt, job.error) == (
        RolloutJob.QUEUED,
        2,
        "worker r1:1 stopped sending heartbeats",
    )


def test_only_the_reap_pass_calls_the_models_reap():
    callers = sorted(
        str(path.relative_to(REPO))
        for folder in ("platform", "workers")
        for path in (REPO / folder).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "reap"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("Run", "RolloutJob")
    )
    assert callers == ["platform/experiments/reaping.py", "platform/experiments/reaping.py"]
    tasks = ast.parse((REPO / "workers" / "tasks.py").read_text())
    (reaper,) = [n for n in ast.walk(tasks) if isinstance(n, ast.FunctionDef) and n.name == "reap_forever"]
    assert "reaping.reap" in ast.unparse(reaper), "the workers' periodic pass is the same one"
