"""`execution.train_processes` is bounded at submission, in the API and the form alike, naming the
field: at most `LAB_MAX_TRAIN_PROCESSES` and no more than the cores (or GPUs) some live worker of
the run's queue reports, in every execution mode; nothing is queued."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TINY_CONFIG

from execution.models import Worker
from experiments.models import Run
from rlcore.launch import usable_cores
from workers.tasks import device_counts

pytestmark = pytest.mark.django_db

FIELD = "config.execution.train_processes"


def submit(client, token, processes, mode: str = "simulated", axes=None):
    execution = {"mode": mode} if axes else {"mode": mode, "train_processes": processes}
    body = {
        "name": "ranks",
        "team": "team-a",
        "config": {**TINY_CONFIG, "execution": execution},
        "presets": ["grpo"],
        **({"axes": axes} if axes else {}),
    }
    return client.post(
        "/api/sweeps", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def refusal(response) -> tuple[str, str]:
    assert response.status_code == 422, response.content
    [error] = response.json()["detail"]
    return error["field"], error["msg"]


def test_a_worker_reports_its_cores_and_gpus():
    assert device_counts() == (usable_cores(), 0)  # this machine has no GPU


def test_more_processes_than_any_live_worker_of_the_queue_has_cores_is_refused(client, token, team):
    before = Run.objects.count()
    # Nothing is known while no worker of the queue has reported: the run waits for one.
    assert submit(client, token, 4).status_code == 201
    Worker.seen("small:1", ["cpu"], [], cores=2, gpus=0)
    Worker.seen("elsewhere:2", ["gpu"], [], cores=64, gpus=8)  # another queue's: not counted
    field, message = refusal(submit(client, token, 4))
    assert field == FIELD
    assert "execution.train_processes = 4: no live worker on queue cpu has that many cores" in message
    assert "the most any has is 2" in message
    field, message = refusal(submit(client, token, 4, mode="async"))  # its trainer's queue counts too
    assert field == FIELD and "no live worker on queue cpu has that many cores" in message
    assert Run.objects.count() == before + 1
    assert submit(client, token, 2).status_code == 201
    Worker.seen("big:3", ["cpu"], [], cores=4, gpus=0)
    assert submit(client, token, 4).status_code == 201


def test_a_run_on_cuda_counts_the_workers_gpus(client, token, team):
    Worker.seen("gpu-box:1", ["gpu"], [], cores=32, gpus=1)
    body = {**TINY_CONFIG, "device": "cuda", "execution": {"train_processes": 2}}
    response = client.post(
        "/api/sweeps",
        {"name": "ranks", "team": "team-a", "config": body, "presets": ["grpo"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    field, message = refusal(response)
    assert field == FIELD and "has that many GPUs" in message and "the most any has is 1" in message


def test_above_the_cap_is_refused_in_every_mode(client, token, team, settings):
    settings.LAB_MAX_TRAIN_PROCESSES = 2
    before = Run.objects.count()
    for mode in ("simulated", "distributed", "async"):
        field, message = refusal(submit(client, token, 3, mode=mode))
        assert field == FIELD
        assert "at most 2 trainer processes per run (LAB_MAX_TRAIN_PROCESSES)" in message
    field, message = refusal(submit(client, token, 0))
    assert field == FIELD and "greater than or equal to 1" in message
    field, message = refusal(submit(client, token, None, axes={"execution.train_processes": [1, 3]}))
    assert field == "axes.execution.train_processes"
    assert "at most 2 trainer processes" in message
    assert Run.objects.count() == before
    for mode in ("simulated", "distributed", "async"):
        assert submit(client, token, 2, mode=mode).status_code == 201, mode
    assert Run.objects.count() == before + 3


def test_the_form_names_the_field(alice_client, team):
    Worker.seen("small:1", ["cpu"], [], cores=2, gpus=0)
    form = {
        "name": "ranks by form",
        "team": team.pk,
        "presets": ["grpo"],
        "on_policy": "on",
        "seeds": "0",
        "rollout.prompts_per_step": "4",
        "execution.train_processes": "4",
        "steps": "3",
    }
    before = Run.objects.count()
    response = alice_client.post(reverse("submit-sweep"), form)
    assert response.status_code == 422
    assert "no live worker on queue cpu has that many cores" in response.content.decode()
    assert Run.objects.count() == before
    response = alice_client.post(reverse("submit-sweep"), {**form, "execution.train_processes": "2"})
    assert response.status_code == 302
    assert Run.objects.count() == before + 1
