"""The database decides, the broker only delivers: work queued while the broker is down is stored,
the answer says so, and the dispatcher sends what may be missing once the broker is back (and
only that), within each team's running cap."""

from __future__ import annotations

import copy
import os
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from support import TINY_CONFIG, free_port, purge_queue, queue_sweep, queued_messages, sweep_form, use_broker

from accounts.models import ApiToken, Membership, Team
from experiments import dispatch
from experiments.models import RolloutJob, Run

pytestmark = pytest.mark.django_db(transaction=True)  # sending happens once a transaction commits

BROKER_DOWN = "cannot be reached right now"


@pytest.fixture(autouse=True)
def empty_queues():
    for queue in ("cpu", "rollout"):
        purge_queue(queue)
    yield
    for queue in ("cpu", "rollout"):
        purge_queue(queue)


def unreachable():
    """Point this process's broker at a loopback port nothing listens on."""
    if not os.environ.get("REDIS_URL"):
        pytest.skip("the tests run with the filesystem broker (no REDIS_URL), which cannot be down")
    return use_broker(f"redis://127.0.0.1:{free_port()}/0")


@pytest.fixture
def broker_down():
    with unreachable():
        yield


def submit(team, user, name: str, runs: int = 1):
    return queue_sweep(team, user, name, seeds=list(range(runs)))


def age(queryset) -> None:
    """As if the messages were sent long ago (longer than LAB_DISPATCH_GRACE_S)."""
    queryset.update(dispatched_at=timezone.now() - timedelta(hours=1))


def test_a_sweep_submitted_while_the_broker_is_down_is_queued_and_the_answer_says_so(
    client, alice, broker_down
):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    body = {"name": "outage", "team": "team-a", "config": copy.deepcopy(TINY_CONFIG), "presets": ["grpo"]}
    response = client.post("/api/sweeps", {**body, "seeds": [0, 1]}, content_type="application/json", **auth)
    assert response.status_code == 201, response.content
    assert response.json()["message"].startswith("2 runs queued; the message broker cannot be reached")
    runs = Run.objects.filter(pk__in=response.json()["runs"])
    assert [(run.status, run.dispatched_at) for run in runs] == [(Run.QUEUED, None)] * 2
    detail = client.get(f"/api/runs/{runs[0].pk}", **auth).json()
    assert detail["dispatched_at"] is None
    assert "broker could not be reached" in detail["progress_report"]["text"]


def test_the_form_and_retry_work_while_the_broker_is_down(alice_client, team, alice, broker_down):
    data = sweep_form(
        team,
        "outage",
        fields={
            "task.name": "arithmetic",
            "steps": "6",
        },
    )
    response = alice_client.post(reverse("submit-sweep"), data, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert "Queued 1 run." in shown and any(BROKER_DOWN in m for m in shown), shown
    run = Run.objects.get()
    assert run.dispatched_at is None and "broker could not be reached" in response.content.decode()

    run.claim("w1:1", attempt=1)
    run.fail("w1:1", "RuntimeError: boom")
    response = alice_client.post(reverse("run-retry", args=[run.pk]), follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert f"Run {run.pk} queued again as attempt 2." in shown and any(BROKER_DOWN in m for m in shown)
    run.refresh_from_db()
    assert (run.status, run.attempt, run.dispatched_at) == (Run.QUEUED, 2, None)


def test_the_dispatcher_sends_what_was_not_sent_once_the_broker_is_back(team, alice):
    with unreachable():
        experiment = submit(team, alice, "outage", runs=3)
        with pytest.raises(Exception):  # noqa: B017 - the broker's own connection error
            dispatch.dispatch()
    assert experiment.runs.filter(dispatched_at=None).count() == 3 and queued_messages() == 0
    sent = dispatch.dispatch()
    assert len(sent) == 3 and queued_messages() == 3
    assert experiment.runs.filter(dispatched_at=None).count() == 0
    assert dispatch.dispatch() == [], "nothing twice"


def test_messages_lost_by_the_broker_are_sent_again_and_only_those(team, alice):
    experiment = submit(team, alice, "restart", runs=3)
    assert queued_messages() == 3
    age(experiment.runs)
    assert dispatch.dispatch() == [], "every queued run has its message"
    purge_queue()  # a broker restart without persistence
    assert len(dispatch.dispatch()) == 3 and queued_messages() == 3
    assert dispatch.dispatch() == []

    # A worker took one message and claimed a run; then the broker lost the other two.
    assert Run.claim_next("cpu", "w1:1") is not None
    purge_queue()
    age(experiment.runs)
    assert len(dispatch.dispatch()) == 2, "one per queued run, none for the running one"


def test_two_dispatchers_do_not_send_the_same_message_twice(team, alice):
    experiment = submit(team, alice, "two dispatchers", runs=2)
    purge_queue()
    age(experiment.runs)
    seen_by_the_second = dispatch._runs_missing("cpu", dispatch.Q(dispatched_at__lt=timezone.now()), 0)
    assert len(seen_by_the_second) == 2
    assert len(dispatch.dispatch()) == 2
    assert dispatch._resend(Run, seen_by_the_second, "cpu", timezone.now()) == []
    assert queued_messages() == 2


@override_settings(LAB_TEAM_MAX_RUNNING=1)
def test_the_dispatcher_sends_only_what_the_teams_running_caps_let_start(team, alice, django_user_model):
    busy = submit(team, alice, "busy", runs=3)
    bob = django_user_model.objects.create_user("bob", password="bob-password-1")
    other = Team.objects.create(name="team-b")
    Membership.objects.create(team=other, user=bob, is_admin=True)
    waiting = submit(other, bob, "waiting", runs=2)
    assert Run.claim_next("cpu", "w1:1").experiment == busy
    purge_queue()  # the messages were lost
    age(Run.objects.all())
    # Team A runs its one allowed run; team B may start one (its own cap), so one message.
    assert dispatch.dispatch() == [f"Run {waiting.runs.first().pk} attempt 1 to queue cpu"]


def test_rollout_jobs_whose_send_failed_or_was_lost_are_sent_again(team, alice):
    config = {**TINY_CONFIG, "execution": {"mode": "distributed"}}
    run = queue_sweep(team, alice, "jobs", config=config).runs.get()
    failed = RolloutJob.objects.create(
        run=run, step=1, groups_start=0, groups_stop=4, version=0, dispatched_at=None
    )
    fine = RolloutJob.objects.create(run=run, step=2, groups_start=0, groups_stop=4, version=0)
    assert RolloutJob.send(fine.pk, 1, "rollout")
    age(RolloutJob.objects.filter(pk=fine.pk))
    assert dispatch.dispatch() == [f"RolloutJob {failed.pk} attempt 1 to queue rollout"]
    assert queued_messages("rollout") == 2
    age(RolloutJob.objects.all())
    assert dispatch.dispatch() == [], "each has its message"
    purge_queue("rollout")
    assert len(dispatch.dispatch()) == 2 and queued_messages("rollout") == 2


def test_manage_py_reap_dispatches_and_says_when_the_broker_is_down(team, alice, capsys):
    experiment = submit(team, alice, "by hand", runs=1)
    purge_queue()  # its message was lost
    age(experiment.runs)
    with unreachable():
        call_command("reap")
    assert "could not reach the message broker" in capsys.readouterr().err
    call_command("reap")
    assert "1 message(s) re-sent" in capsys.readouterr().out and queued_messages() == 1
