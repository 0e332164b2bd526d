"""A rollout precision (`rollout.dtype`) no live worker of the generating queue can run is refused
at submission, in the API and the form, naming the field; the workers say what their device runs."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TINY_CONFIG, sweep_form

from execution.models import Worker
from experiments.models import Run
from workers.tasks import device_precisions

pytestmark = pytest.mark.django_db


def submit(client, token, dtype: str, mode: str = "simulated"):
    config = {
        **TINY_CONFIG,
        "rollout": {**TINY_CONFIG["rollout"], "dtype": dtype},
        "execution": {"mode": mode},
    }
    body = {"name": "precision", "team": "team-a", "config": config, "presets": ["grpo-tis"]}
    return client.post(
        "/api/sweeps", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def test_this_machines_cpu_runs_both_lower_precisions():
    assert device_precisions() == ["bfloat16", "float16"]


def test_a_precision_no_live_worker_runs_is_refused_naming_the_field(client, token, team):
    Worker.seen("old-gpu:1", ["cpu"], ["float16"])
    before = Run.objects.count()
    refused = submit(client, token, "bfloat16")
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert error["field"] == "config.rollout.dtype"
    assert "no live worker on queue cpu can generate in bfloat16: their devices run float16" in error["msg"]
    assert Run.objects.count() == before
    assert submit(client, token, "float16").status_code == 201
    # Distributed: the rollout queue's workers generate, and none listens there yet: nothing is known.
    assert submit(client, token, "bfloat16", mode="distributed").status_code == 201
    Worker.seen("new-gpu:2", ["cpu"], ["bfloat16", "float16"])
    assert submit(client, token, "bfloat16").status_code == 201


def test_the_form_names_the_precision_no_worker_runs(alice_client, team):
    Worker.seen("old-gpu:1", ["cpu"], ["float16"])
    form = sweep_form(
        team,
        "precision by form",
        presets=["grpo-tis"],
        fields={
            "rollout.dtype": "bfloat16",
            "steps": "3",
        },
    )
    response = alice_client.post(reverse("submit-sweep"), form)
    assert response.status_code == 422
    assert "no live worker on queue cpu can generate in bfloat16" in response.content.decode()
