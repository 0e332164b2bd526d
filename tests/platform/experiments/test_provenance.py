"""Provenance on every run, from a real worker: θ0's hash, versions, device and host on the run,
its page and the API; the experiment pins the first run's θ0, and a worker that loads other θ0
bytes refuses the run with both hashes named and logs nothing. The experiment pins its dataset
files' sha256 the same way (a later run, or attempt, that finds other bytes is refused, naming the
file and both hashes), and a run keeps every attempt's provenance."""

from __future__ import annotations

import io
import json

import pytest
import torch
from django.core.management import call_command
from django.urls import reverse
from support import TEST_VAR, TINY_CONFIG, queue_sweep, wait_for

from experiments.models import DatasetMismatch, Experiment, MetricChunk, MetricSummary, Run, Theta0Mismatch
from rlcore.tasks import dataset_sha256s, file_sha256

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


def write_lines(path, answer: int | None = None) -> str:
    """GSM8k-style lines ("What is a+a?"), every answer `answer` if given; the file's sha256."""
    lines = [
        {"question": f"What is {a}+{a}?", "answer": f"#### {2 * a if answer is None else answer}"}
        for a in range(30)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)  # a fresh checkout, the test run alone
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return file_sha256(path)


def test_an_experiment_pins_its_dataset_files_and_refuses_other_bytes(team, alice):
    train, held_out = TEST_VAR / "data" / "pin-train.jsonl", TEST_VAR / "data" / "pin-eval.jsonl"
    train_sha, eval_sha = write_lines(train), write_lines(held_out)
    task = {"name": "jsonl", "path": str(train), "eval_path": str(held_out)}
    experiment = queue_sweep(team, alice, "pinned", config={**TINY_CONFIG, "task": task}, seeds=[0, 1])
    first, second = experiment.runs.all()
    record = {"theta0_sha256": "a" * 64, "dataset_sha256": train_sha, "eval_dataset_sha256": eval_sha}
    assert first.claim("w1:1", attempt=1)
    first.check_datasets(dataset_sha256s(first.run_config().task))
    experiment.refresh_from_db()
    assert experiment.dataset_hashes == {}, "nothing is pinned before a run has read the files"
    first.record_provenance("w1:1", record)
    experiment.refresh_from_db()
    assert experiment.dataset_hashes == {str(train): train_sha, str(held_out): eval_sha}
    assert experiment.theta0_sha256 == "a" * 64

    edited = write_lines(held_out, answer=0)
    assert second.claim("w2:1", attempt=1)
    with pytest.raises(DatasetMismatch) as refused:
        second.check_datasets(dataset_sha256s(second.run_config().task))
    assert str(refused.value).startswith(
        f"dataset {held_out} has changed since this experiment's runs read it: they read sha256 {eval_sha}, "
        f"this worker found {edited}."
    )
    with pytest.raises(DatasetMismatch, match=edited):
        second.record_provenance("w2:1", {**record, "eval_dataset_sha256": edited})
    with pytest.raises(Theta0Mismatch):  # the datasets agree, θ0 does not
        second.record_provenance("w2:1", {**record, "theta0_sha256": "b" * 64})
    second.refresh_from_db()
    experiment.refresh_from_db()
    assert (second.provenance, second.provenance_history) == ({}, []), "a refused attempt stores nothing"
    assert experiment.dataset_hashes == {str(train): train_sha, str(held_out): eval_sha}
    assert experiment.theta0_sha256 == "a" * 64


def test_each_attempt_keeps_its_provenance_on_the_run_its_page_and_the_api(team, alice, client, token):
    run = queue_sweep(team, alice, "attempts").runs.get()
    first = {"theta0_sha256": "a" * 64, "host": "node-1", "torch_threads": 1}
    second = {**first, "host": "node-2"}
    assert run.claim("w1:1", attempt=1)
    run.record_provenance("w1:1", first)
    run.record_provenance("w1:1", first)  # a call retried after a database outage: still one entry
    assert run.fail("w1:1", "the worker went away") and run.retry()
    run.record_provenance("w1:1", second)  # no longer that worker's: nothing stored
    assert run.claim("w2:1", attempt=2)
    run.record_provenance("w2:1", second)
    run.refresh_from_db()
    assert run.provenance == second
    assert run.provenance_history == [
        {"attempt": 1, "provenance": first},
        {"attempt": 2, "provenance": second},
    ]
    assert run.provenance_changes == [{"attempt": 1, "changed": {"host": "node-1"}}]

    client.force_login(alice)
    page = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'id="provenance-history"' in page and "node-1" in page and "node-2" in page
    detail = client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert detail["provenance"] == second
    assert detail["provenance_history"] == run.provenance_history
