"""Alerts end to end through a real Celery worker: the worker trains a run, its end is stored as
events once the run's transition commits, and the worker's alert thread delivers them to a real
HTTP receiver on 127.0.0.1, retrying after a 500 with the same event id, once per success."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from support import queue_sweep, wait_for, wait_for_log

from alerts import emit
from alerts.models import RUN_SUCCEEDED, SWEEP_FINISHED, Delivery, Target
from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)  # the worker reads the test database

ALERTS_ENV = {"LAB_ALERTS_ALLOW_PRIVATE": "1", "LAB_ALERTS_BACKOFF_S": "0.2", "LAB_ALERTS_INTERVAL_S": "0.2"}


def test_a_worker_delivers_its_runs_alerts_retrying_after_a_500(start_worker, team, alice, receiver):
    receiver.statuses = [500, 200]
    hook = Target.objects.create(
        team=team, kind=Target.WEBHOOK, url=receiver.url, events=[RUN_SUCCEEDED, SWEEP_FINISHED]
    )
    run = queue_sweep(team, alice, "alerted").runs.get()
    start_worker(ALERTS_ENV)
    wait_for(
        lambda: Run.objects.filter(pk=run.pk).exclude(status__in=Run.ACTIVE).exists(), 240, "the run to end"
    )
    assert Run.objects.get(pk=run.pk).status == Run.SUCCEEDED
    wait_for(
        lambda: Delivery.objects.filter(status=Delivery.DELIVERED).count() == 2,
        30,
        "both events delivered",
    )
    received = [json.loads(r.body)["kind"] for r in receiver.requests]
    # The run's event, stored first, was tried first and answered 500: it alone went twice.
    assert received[0] == RUN_SUCCEEDED and sorted(received) == [RUN_SUCCEEDED, RUN_SUCCEEDED, SWEEP_FINISHED]
    assert len(set(receiver.ids())) == 2 and len(receiver.requests) == 3
    for request in receiver.requests:
        expected = hmac.new(hook.secret.encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers["X-Lab-Signature"] == f"sha256={expected}"
    retried = Delivery.objects.get(attempts=2)
    assert list(retried.tries.order_by("number").values_list("status_code", "outcome")) == [
        (500, "retrying"),
        (200, Delivery.DELIVERED),
    ]
    body = json.loads(next(r.body for r in receiver.requests if json.loads(r.body)["kind"] == RUN_SUCCEEDED))
    assert body["data"]["run"] == run.pk and body["data"]["status"] == "succeeded"


def test_a_worker_told_not_to_deliver_alerts_leaves_them_to_the_others(start_worker, team, receiver):
    Target.objects.create(team=team, kind=Target.SLACK, url=receiver.url, events=[RUN_SUCCEEDED])
    worker = start_worker({**ALERTS_ENV, "LAB_ALERTS_DELIVER": "0"})
    emit.emit(team.pk, RUN_SUCCEEDED, "k", "run 1 succeeded", {})
    wait_for_log(worker, "delivers no team alerts (LAB_ALERTS_DELIVER=0)")
    time.sleep(1)  # five of a delivering worker's passes
    assert receiver.requests == [] and Delivery.objects.get().status == Delivery.PENDING
    start_worker(ALERTS_ENV)
    wait_for(lambda: receiver.requests, 30, "another worker to deliver it")
