"""Runs that cannot be stored, or whose task died after claiming them, end `failed` with the
reason and never loop: a dataset line with a NUL is refused (file:line) with the run failing on
its first attempt while the worker goes on with the next; model output with a NUL is stored
(PostgreSQL refuses NUL in text: it becomes U+FFFD); a run left `running` by an execution of the
worker that ended without finishing it is failed saying so, not executed again by the next
message; errors show paths inside `LAB_VAR_DIR` relative to it."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.db import DataError, connection
from support import TEST_VAR, TINY_CONFIG, queue_sweep, wait_for

from experiments.models import Completion, Run
from experiments.text import public_error
from rlcore.sinks import Sample
from workers.sink import DatabaseSink, StoringFailed
from workers.tasks import LEFT_RUNNING


def ended(run: Run, timeout_s: float = 240) -> Run:
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s, f"run {run.pk} to end")
    run.refresh_from_db()
    return run


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_a_dataset_line_fails_the_run_once_and_the_worker_runs_the_next(worker, team, alice):
    data = TEST_VAR / "data" / "nul.jsonl"
    lines = [
        {"question": f"What is {a}+{a}?", "answer": f"{a}+{a}={2 * a} #### {2 * a}"} for a in range(1, 20)
    ]
    lines[6]["question"] = "What is 12\u0000+34?"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = {
        **TINY_CONFIG,
        "steps": 2,
        "eval_size": 4,
        "task": {"name": "jsonl", "path": str(data), "held_out": 4},
    }
    poisoned = queue_sweep(team, alice, "nul", config=config).runs.get()
    after = queue_sweep(team, alice, "after").runs.get()

    poisoned, after = ended(poisoned), ended(after)
    assert (poisoned.status, poisoned.attempt) == (Run.FAILED, 1), poisoned.error
    assert poisoned.error == (
        "DatasetError: data/nul.jsonl:7: field 'question' contains a NUL character (\\u0000), which the "
        "lab's database cannot store; remove it"
    ), "file:line, relative to LAB_VAR_DIR"
    assert after.status == Run.SUCCEEDED, after.error
    assert worker.log().count(f"run {poisoned.pk} attempt 1: claimed") == 1, "executed once"


@pytest.mark.django_db(transaction=True)
def test_a_run_left_running_by_the_worker_is_failed_not_executed_again(worker, team, alice):
    left = queue_sweep(team, alice, "left").runs.get()
    # As an execution of this worker that raised after claiming it left it (a task that died).
    assert left.claim(worker.identity, attempt=1)
    queued = queue_sweep(team, alice, "next").runs.get()

    queued = ended(queued)
    left.refresh_from_db()
    assert queued.status == Run.SUCCEEDED, queued.error
    assert (left.status, left.attempt, left.error) == (Run.FAILED, 1, LEFT_RUNNING)
    assert f"run {left.pk} attempt 1: claimed" not in worker.log(), "never executed again"


@pytest.mark.django_db(transaction=True)
def test_model_output_with_a_nul_is_stored(team, alice):
    run = queue_sweep(team, alice, "nul out").runs.get()
    run.claim("w1:1", attempt=1)
    sink = DatabaseSink(run, "w1:1")
    sink.sample(1, [Sample("12+34=", "4\x006", 0.0)])
    sink.log(1, {"loss": 0.5})
    sink.close()
    assert list(Completion.objects.filter(run=run).values_list("completion", flat=True)) == ["4\ufffd6"]
    assert not sink.should_stop()


def test_errors_show_paths_inside_the_var_folder_relative_to_it():
    absolute = f"{settings.VAR_DIR}/runs/abc/buffer/weights/v000019.safetensors"
    assert public_error(f"weights at {absolute} do not match") == (
        "weights at runs/abc/buffer/weights/v000019.safetensors do not match"
    )
    assert public_error("a\x00b") == "a\ufffdb"


@pytest.mark.django_db
def test_a_failed_runs_error_is_stored_without_server_paths(team, alice):
    run = queue_sweep(team, alice, "paths").runs.get()
    run.claim("w1:1", attempt=1)
    run.fail("w1:1", f"FileNotFoundError: {settings.VAR_DIR}/runs/{run.key}/buffer/batches/x: missing")
    run.refresh_from_db()
    assert run.error == f"FileNotFoundError: runs/{run.key}/buffer/batches/x: missing"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite stores a metric name of any length: nothing is refused"
)
def test_a_flush_the_database_refuses_stops_the_run_with_the_reason(team, alice):
    run = queue_sweep(team, alice, "refused").runs.get()
    run.claim("w1:1", attempt=1)
    sink = DatabaseSink(run, "w1:1")
    sink.log(1, {"x" * 101: 0.5})  # longer than a metric name may be: the flush is refused, every time

    def refused() -> bool:
        try:
            sink.should_stop()
        except StoringFailed as exc:
            return "the database refused the run's metrics" in str(exc)
        return False

    wait_for(refused, 30, "the sink to give up on a flush the database refuses")
    with pytest.raises(DataError):  # closing tries once more, and the worker fails the run with that
        sink.close()
