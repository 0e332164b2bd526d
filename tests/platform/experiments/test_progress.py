"""Progress you can see: a run's phase, pace and ETA on its row, its page and in the API, the
sweep's progress, and the queues no live worker listens on (runs there say so, the sweep form
warns). One real worker trains; the worker heartbeat table is the one real workers write."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from support import TINY_CONFIG, queue_sweep, sweep_form, wait_for

from accounts.models import ApiToken
from execution.models import Worker
from experiments.models import Run
from experiments.progress import run_progress

pytestmark = pytest.mark.django_db(transaction=True)

RUN_TIMEOUT_S = 240


def api_run(client, token: str, run: Run) -> dict:
    response = client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    return response.json()


STEPS = 400


def test_a_running_run_shows_its_training_step_pace_and_eta_then_ends(start_worker, team, alice, client):
    # Long enough to be seen training: the pace is written with the heartbeat, every half second,
    # and a tiny step takes a few ms on a fast machine.
    config = {**TINY_CONFIG, "steps": STEPS, "eval_every": 0, "checkpoint_every": 0}
    experiment = queue_sweep(team, alice, "progress", config=config)
    run = experiment.runs.get()
    token = ApiToken.issue(alice)
    Worker.objects.all().delete()  # workers of earlier test modules, stopped less than a timeout ago
    waiting = api_run(client, token, run)["progress_report"]
    assert waiting["phase"] == "waiting" and waiting["queue_position"] == 1
    assert waiting["text"] == "waiting for a worker: next of its team's runs on queue cpu"
    assert waiting["no_worker"] == "no worker is listening on queue cpu"

    worker = start_worker()
    assert "cpu" in wait_for(Worker.live_queues, 60, "the worker's first heartbeat")
    assert Worker.objects.get(identity=worker.identity).queues == ["cpu"]

    seen = []

    def paced():
        out = api_run(client, token, run)
        report = out["progress_report"]
        seen.append((out["status"], report["text"]))
        assert out["status"] in (Run.QUEUED, Run.RUNNING), seen
        return report if report["phase"] == "training" and report["s_per_step"] else None

    report = wait_for(paced, RUN_TIMEOUT_S, "the run to train with a measured pace")
    step = int(
        re.fullmatch(rf"training step (\d+) of {STEPS} · \d+\.\d\d s/step · ETA .+", report["text"]).group(1)
    )
    # The pace appears once step 1 is logged, possibly before the trainer announces step 2.
    assert 1 <= step <= STEPS and report["steps"] == STEPS and report["no_worker"] == ""
    assert 0 < report["s_per_step"] < 30
    assert report["eta_s"] == pytest.approx(report["s_per_step"] * (STEPS - report["step"]))

    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.SUCCEEDED, RUN_TIMEOUT_S, "the run to succeed")
    done = api_run(client, token, run)
    assert done["progress_report"]["phase"] == "" and done["progress_report"]["text"] == ""
    assert done["progress"] == STEPS


def test_a_gpu_run_with_no_gpu_worker_says_so_on_its_row_its_page_and_in_the_api(team, alice, alice_client):
    gpu = {**TINY_CONFIG, "device": "cuda"}
    experiment = queue_sweep(team, alice, "gpu", config=gpu, seeds=[0, 1])
    run = experiment.runs.first()
    assert run.queue == "gpu"
    Worker.seen("elsewhere:1", ["cpu"])
    message = "no worker is listening on queue gpu"

    token = ApiToken.issue(alice)
    report = alice_client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()[
        "progress_report"
    ]
    assert report["phase"] == "waiting" and report["no_worker"] == message
    rows = alice_client.get(reverse("experiment-detail", args=[experiment.pk])).content.decode()
    assert rows.count(message) == 2
    assert "0 of 2 runs done · 0 of 12 steps" in re.sub(r"\s+", " ", rows)
    assert message in alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()

    Worker.seen("gpu-box:7", ["gpu"])
    assert (
        alice_client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()[
            "progress_report"
        ]["no_worker"]
        == ""
    )


def test_a_distributed_run_needs_its_rollout_queue_too(team, alice):
    distributed = {**TINY_CONFIG, "execution": {"mode": "distributed"}}
    experiment = queue_sweep(team, alice, "dist", config=distributed)
    Worker.seen("trainer:1", ["cpu"])
    run = experiment.runs.get()
    assert run.needed_queues == ["cpu", "rollout"]
    assert run_progress(run)["no_worker"] == "no worker is listening on queue rollout"


def test_the_sweep_form_warns_before_submitting_runs_no_worker_would_take(alice_client, team):
    Worker.seen("elsewhere:1", ["cpu"])
    tiny = TINY_CONFIG["model"]["tiny"]
    form = sweep_form(
        team,
        "on the gpu",
        fields={
            "task.name": "arithmetic",
            "steps": 6,
            "eval_every": 5,
            "eval_size": 20,
            "checkpoint_every": 2,
            "samples_per_step": 2,
            **{f"model.tiny.{k}": v for k, v in tiny.items()},
            **{f"rollout.{k}": v for k, v in TINY_CONFIG["rollout"].items()},
        },
    )
    warning = "no worker is listening on queue gpu: its runs will wait until one starts"
    preview = alice_client.post(reverse("submit-sweep"), {**form, "device": "cuda", "preview": "1"})
    assert preview.status_code == 200 and warning in preview.content.decode()
    assert Run.objects.count() == 0

    on_cpu = alice_client.post(reverse("submit-sweep"), {**form, "device": "cpu", "preview": "1"})
    assert on_cpu.status_code == 200 and "no worker is listening" not in on_cpu.content.decode()

    submitted = alice_client.post(reverse("submit-sweep"), {**form, "device": "cuda"}, follow=True)
    assert Run.objects.get().queue == "gpu" and warning in submitted.content.decode()


def test_a_retried_run_while_queued_shows_no_step_or_start_of_its_last_attempt(team, alice, client):
    run = queue_sweep(team, alice, "retried").runs.get()
    assert run.claim("gone:1", attempt=1)
    Run.objects.filter(pk=run.pk).update(progress=4, phase="training", phase_detail={"step": 4})
    assert run.fail("gone:1", "boom") and run.retry()
    run.refresh_from_db()
    assert (run.status, run.attempt, run.progress, run.started, run.phase) == (Run.QUEUED, 2, 0, None, "")
    shown = api_run(client, ApiToken.issue(alice), run)
    assert shown["progress_report"]["step"] == 0 and shown["started"] is None


def test_a_sweeps_eta_is_its_steps_left_and_those_ahead_at_its_measured_pace_over_live_workers(team, alice):
    """Two of four 6-step runs took 60 s each start to end (10 s a step, all included): the two left
    take 120 s on one worker; another experiment's running run with 4 steps left adds 40 s; two
    workers halve it. Mid-sweep, with no run training at this moment, it still has one."""
    from datetime import timedelta

    from django.utils import timezone

    from experiments.progress import sweep_progress

    experiment = queue_sweep(team, alice, "eta", seeds=(0, 1, 2, 3))
    now = timezone.now()
    for run in experiment.runs.order_by("pk")[:2]:
        Run.objects.filter(pk=run.pk).update(
            status=Run.SUCCEEDED,
            progress=6,
            started=now - timedelta(seconds=100),
            finished=now - timedelta(seconds=40),
        )
    Worker.seen("one:1:a", ["cpu"])
    assert sweep_progress(experiment)["eta_s"] == pytest.approx(120)
    other = queue_sweep(team, alice, "beside").runs.get()
    Run.objects.filter(pk=other.pk).update(status=Run.RUNNING, progress=2, started=now)
    assert sweep_progress(experiment)["eta_s"] == pytest.approx(160)
    Worker.seen("two:2:b", ["cpu", "rollout"])
    assert sweep_progress(experiment)["eta_s"] == pytest.approx(80)
    Worker.objects.all().delete()
    assert sweep_progress(experiment)["eta_s"] is None, "no live worker: no ETA"


def test_two_queued_runs_never_both_read_next_when_one_is_claimed_while_the_page_reads(team, alice):
    """A sweep's page reads its runs, then where the queued ones stand: a run a worker claims in
    between is no longer queued when the queue is read. It said "next" as well as the run now next."""
    from experiments.progress import QueueState

    first, second, third = queue_sweep(team, alice, "race", seeds=(0, 1, 2)).runs.order_by("id")
    assert first.claim("w:1", attempt=first.attempt)  # a worker takes it after the page read its runs
    first.status = Run.QUEUED  # the page's copy, read before the claim
    queues = QueueState.read(["cpu"])
    reports = [run_progress(run, {"cpu"}, queues) for run in (first, second, third)]
    nexts = [r for r in reports if "next of its team's runs" in r["text"]]
    assert len(nexts) == 1 and reports[1] is nexts[0]
    assert reports[0]["phase"] == "starting" and reports[0]["queue_position"] is None
    assert "a worker has just taken it" in reports[0]["text"]
    assert reports[2]["queue_position"] == 2
