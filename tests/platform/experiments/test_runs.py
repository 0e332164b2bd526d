"""Sweeps executed by a real worker process: the form-to-results story, and cancellation.

One worker serves the whole module; the test database, the broker (Redis or the
filesystem transport) and the worker are all real.
"""

from __future__ import annotations

import platform
import re

import pytest
from django.urls import reverse
from django.utils import timezone
from support import TINY_CONFIG, logged, queue_sweep, wait_for

from accounts.models import ApiToken
from experiments import packing, series
from experiments.models import Completion, MetricSummary, Run
from rlcore.sinks import EVAL_METRICS, STEP_METRICS

pytestmark = pytest.mark.django_db(transaction=True)

RUN_TIMEOUT_S = 240


def csrf_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def test_form_sweep_runs_to_completion_with_every_metric(worker, team, alice):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    login = browser.get(reverse("login"))
    browser.post(
        reverse("login"),
        {
            "username": "alice",
            "password": "alice-password-1",
            "csrfmiddlewaretoken": csrf_token(login.content.decode()),
        },
    )
    page = browser.get(reverse("submit-sweep"))
    assert page.status_code == 200
    tiny = TINY_CONFIG["model"]["tiny"]
    response = browser.post(
        reverse("submit-sweep"),
        {
            "csrfmiddlewaretoken": csrf_token(page.content.decode()),
            "name": "two presets × two staleness settings",
            "team": team.pk,
            "presets": ["reinforce", "grpo"],
            "on_policy": "on",
            "sync_offsets": "2",
            "seeds": "0",
            "task.name": "arithmetic",
            "device": "cpu",
            "steps": TINY_CONFIG["steps"],
            "eval_every": TINY_CONFIG["eval_every"],
            "eval_size": TINY_CONFIG["eval_size"],
            "checkpoint_every": TINY_CONFIG["checkpoint_every"],
            "samples_per_step": TINY_CONFIG["samples_per_step"],
            **{f"model.tiny.{k}": v for k, v in tiny.items()},
            **{f"rollout.{k}": v for k, v in TINY_CONFIG["rollout"].items()},
        },
    )
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    runs = Run.objects.filter(experiment__owner=alice)
    assert runs.count() == 4

    def all_done():
        statuses = set(runs.values_list("status", flat=True))
        assert not statuses & {Run.FAILED, Run.LOST, Run.CANCELLED}, list(runs.values("status", "error"))
        return statuses == {Run.SUCCEEDED}

    wait_for(all_done, RUN_TIMEOUT_S, "4 runs to succeed")
    steps = TINY_CONFIG["steps"]
    for run in runs:
        points = {(name, step) for name, step, _ in logged(run)}
        for name in STEP_METRICS:
            assert {(name, s) for s in range(1, steps + 1)} <= points, (run, name)
        for name in EVAL_METRICS:
            assert {(name, 0), (name, 5), (name, steps)} <= points, (run, name)
        assert run.progress == steps and run.summary["reward/mean"] is not None
        assert Completion.objects.filter(run=run, step=steps).count() == TINY_CONFIG["samples_per_step"]
        assert run.worker == worker.identity
    assert {(r.preset, r.staleness) for r in runs} == {
        (p, s) for p in ("reinforce", "grpo") for s in ("on-policy", "sync_offset=2")
    }

    experiment_page = browser.get(reverse("experiment-detail", args=[runs[0].experiment_id])).content.decode()
    assert (
        experiment_page.count('class="status-succeeded">succeeded<') == 4
        and 'data-active="false"' in experiment_page
    )


def test_cancelling_a_running_run_stops_it_within_one_step(worker, team, alice, client):
    long_run = {**TINY_CONFIG, "steps": 2000, "eval_every": 0}
    experiment = queue_sweep(team, alice, "long", config=long_run, presets=["reinforce"])
    run = experiment.runs.get()
    wait_for(
        lambda: MetricSummary.objects.filter(run=run, last_step__gte=2).exists(), RUN_TIMEOUT_S, "two steps"
    )

    token = ApiToken.issue(alice)
    response = client.post(f"/api/runs/{run.pk}/cancel", HTTP_AUTHORIZATION=f"Bearer {token}")
    cancel_visible = timezone.now()  # the request's transaction has committed by now
    assert response.status_code == 200 and response.json()["status"] == Run.RUNNING
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.CANCELLED, 60, "the run to be cancelled")

    run.refresh_from_db()
    kept = [
        (name, step, us)
        for name, (steps, _, times) in series.points_of(run.pk)
        for step, us in zip(steps.tolist(), times.tolist(), strict=True)
    ]
    steps_after_cancel = len({step for _, step, us in kept if us > packing.micros(cancel_visible)})
    assert steps_after_cancel <= 1, "the step in progress may finish; no further step may start"
    assert len([name for name, _, _ in kept if name == "reward/mean"]) >= 2
    assert run.progress < 2000 and run.finished is not None
    assert len({(name, step) for name, step, _ in kept}) == len(kept), "no step logged twice"


def test_the_stdlib_platform_module_works_in_the_app_and_the_worker(worker, client):
    assert client.get("/health").json()["system"] == platform.system()
    assert worker.system == platform.system()
    assert worker.identity.startswith(platform.node() + ":")
