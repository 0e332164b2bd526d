"""Provenance on every run, from a real worker: θ0's hash, versions, device and host on the run,
its page and the API; the experiment pins the first run's θ0, and a worker that loads other θ0
bytes refuses the run with both hashes named and logs nothing."""

from __future__ import annotations

import io

import pytest
import torch
from django.core.management import call_command
from django.urls import reverse
from support import queue_sweep, wait_for

from experiments.models import Experiment, MetricChunk, MetricSummary, Run

pytestmark = pytest.mark.django_db(transaction=True)


def ended(run: Run) -> Run:
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, 240, f"run {run.pk} to end")
    run.refresh_from_db()
    return run


def test_runs_record_provenance_and_an_experiment_never_mixes_theta0(start_worker, team, alice, client):
    experiment = queue_sweep(team, alice, "provenance")
    worker = start_worker()
    run = ended(experiment.runs.get())
    assert run.status == Run.SUCCEEDED, run.error
    record = run.provenance
    assert len(record["theta0_sha256"]) == 64
    assert record["torch"] == torch.__version__ and record["device"] == "cpu"
    assert record["torch_threads"] == 1, "the test workers train with one thread"
    assert record["host"] == worker.identity.split(":")[0]
    experiment.refresh_from_db()
    assert experiment.theta0_sha256 == record["theta0_sha256"], "the first run pins the experiment's θ0"

    client.force_login(alice)
    page = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert record["theta0_sha256"] in page
    out = io.StringIO()
    call_command("create_token", "alice", stdout=out)
    detail = client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip()}").json()
    assert detail["provenance"] == record

    # Another run of the experiment on a worker whose θ0 bytes differ (here: a pin from elsewhere).
    other = "0" * 64
    Experiment.objects.filter(pk=experiment.pk).update(theta0_sha256=other)
    second = Run.create_for(experiment, run.run_config().model_copy(update={"seed": 1}))
    second.enqueue()
    second = ended(second)
    assert second.status == Run.FAILED
    assert record["theta0_sha256"] in second.error and other in second.error
    assert not MetricChunk.objects.filter(run=second).exists(), "a refused run logs nothing"
    assert not MetricSummary.objects.filter(run=second).exists()
    assert second.provenance == {}
