"""Delivering alerts to a real HTTP receiver on 127.0.0.1 and through Django's email backend:
signed generic bodies, Slack-compatible bodies, retries after a 500 with backoff, giving up
after LAB_ALERTS_MAX_ATTEMPTS tries, one delivery per success, and loopback refused unless the
operator allows private addresses."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from alerts import emit
from alerts.deliver import deliver_due, prune
from alerts.models import RUN_FAILED, RUN_SUCCEEDED, SWEEP_FINISHED, Delivery, DeliveryAttempt, Event, Target


def target(team, kind=Target.WEBHOOK, url="", email="", events=(RUN_FAILED,)) -> Target:
    return Target.objects.create(team=team, kind=kind, url=url, email=email, events=list(events))


def deliver_until_settled(timeout_s: float = 10) -> None:
    """Call the delivery pass, as a worker's alert thread does, until nothing is pending."""
    deadline = time.monotonic() + timeout_s
    while Delivery.objects.filter(status=Delivery.PENDING).exists():
        assert time.monotonic() < deadline, "deliveries still pending"
        deliver_due()
        time.sleep(0.02)


def test_a_generic_webhook_is_signed_and_names_its_event(team, receiver, loopback_allowed):
    hook = target(team, url=receiver.url)
    assert len(hook.secret) == 64, "a generic webhook gets a secret of its own"
    event = emit.emit(team.pk, RUN_FAILED, "run 1 attempt 1 failed", "run 1 failed: boom", {"run": 1})
    assert deliver_due() == 1
    (got,) = receiver.requests
    expected = hmac.new(hook.secret.encode(), got.body, hashlib.sha256).hexdigest()
    assert got.headers["X-Lab-Signature"] == f"sha256={expected}"
    assert got.headers["X-Lab-Event-Id"] == str(event.id) and got.headers["X-Lab-Event"] == RUN_FAILED
    body = json.loads(got.body)
    assert (body["id"], body["kind"], body["team"], body["data"]) == (
        str(event.id),
        RUN_FAILED,
        "team-a",
        {"run": 1},
    )
    assert got.path == "/hook"
    wrong = hmac.new(b"another secret", got.body, hashlib.sha256).hexdigest()
    assert got.headers["X-Lab-Signature"] != f"sha256={wrong}"
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (Delivery.DELIVERED, 1)


def test_a_slack_webhook_gets_text_and_no_signature(team, receiver, loopback_allowed):
    target(team, kind=Target.SLACK, url=receiver.url)
    emit.emit(team.pk, RUN_FAILED, "k", "run 7 failed: out of memory", {"run": 7})
    deliver_due()
    (got,) = receiver.requests
    assert json.loads(got.body) == {"text": "run 7 failed: out of memory"}
    assert "X-Lab-Signature" not in got.headers and got.headers["X-Lab-Event-Id"]


def test_a_slack_message_links_the_page_when_the_links_are_absolute(team, receiver, loopback_allowed):
    target(team, kind=Target.SLACK, url=receiver.url)
    emit.emit(team.pk, RUN_FAILED, "a", "run 7 failed", {"url": "/runs/7/"})
    emit.emit(team.pk, RUN_FAILED, "b", "run 8 failed", {"url": "https://lab.example.org/runs/8/"})
    deliver_until_settled()
    texts = sorted(json.loads(r.body)["text"] for r in receiver.requests)
    assert texts == ["run 7 failed", "run 8 failed https://lab.example.org/runs/8/"]


def test_a_500_is_retried_after_the_backoff_and_delivered_once(team, receiver, loopback_allowed):
    receiver.statuses = [500, 200]
    target(team, url=receiver.url)
    event = emit.emit(team.pk, RUN_FAILED, "k", "run failed", {})
    deliver_due()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (Delivery.PENDING, 1)
    assert delivery.next_attempt > delivery.tries.get().at, "not due again before its backoff"
    assert deliver_due() == 0, "the backoff has not passed"
    time.sleep(0.06)
    deliver_until_settled()
    for _ in range(3):
        deliver_due()
    assert receiver.ids() == [str(event.id)] * 2, "the same event id on the retry, nothing after the 200"
    tries = list(
        DeliveryAttempt.objects.order_by("number").values_list("number", "status_code", "ok", "outcome")
    )
    assert tries == [(1, 500, False, "retrying"), (2, 200, True, Delivery.DELIVERED)]


def test_a_delivery_is_given_up_after_the_documented_number_of_tries(team, receiver, loopback_allowed):
    receiver.statuses = [500]
    target(team, url=receiver.url)
    emit.emit(team.pk, RUN_FAILED, "k", "run failed", {})
    deliver_until_settled()
    assert len(receiver.requests) == 4 == loopback_allowed.LAB_ALERTS_MAX_ATTEMPTS
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (Delivery.GIVEN_UP, 4)
    outcomes = list(delivery.tries.order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["retrying"] * 3 + [Delivery.GIVEN_UP]
    assert all("HTTP 500" in error for error in delivery.tries.values_list("error", flat=True))
    times = list(delivery.tries.order_by("number").values_list("at", flat=True))
    for number, (before, after) in enumerate(zip(times, times[1:], strict=False), start=1):
        assert after - before >= Delivery.backoff(number), f"try {number + 1} came before its backoff"


def test_backoff_doubles_up_to_its_ceiling(settings):
    settings.LAB_ALERTS_BACKOFF_S, settings.LAB_ALERTS_BACKOFF_MAX_S = 30, 3600
    assert [Delivery.backoff(n).total_seconds() for n in range(1, 9)] == [
        30,
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
    ]


def test_each_event_reaches_each_target_once(team, receiver, loopback_allowed):
    receiver.statuses = [500, 200]  # the first try of all fails: at least once, still once per success
    target(team, url=receiver.url, events=[RUN_FAILED, SWEEP_FINISHED])
    target(team, kind=Target.SLACK, url=receiver.url + "/slack", events=[RUN_FAILED])
    target(team, url=receiver.url + "/never", events=[RUN_SUCCEEDED])
    failed = emit.emit(team.pk, RUN_FAILED, "run 1 failed", "run 1 failed", {})
    finished = emit.emit(team.pk, SWEEP_FINISHED, "sweep 1 finished", "sweep finished", {})
    assert emit.emit(team.pk, RUN_FAILED, "run 1 failed", "run 1 failed", {}) is None, (
        "stored once by its key"
    )
    deliver_until_settled()
    for _ in range(3):
        deliver_due()
    delivered = sorted((r.path, r.headers["X-Lab-Event-Id"]) for r in receiver.requests[1:])
    assert delivered == sorted(
        [("/hook", str(failed.id)), ("/hook", str(finished.id)), ("/hook/slack", str(failed.id))]
    )
    assert not any(r.path == "/hook/never" for r in receiver.requests)


def test_email_goes_through_djangos_email_backend(team, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    target(team, kind=Target.EMAIL, email="oncall@example.org")
    event = emit.emit(team.pk, RUN_FAILED, "k", "run 3 failed: boom", {"run": 3, "error": "boom"})
    deliver_due()
    (message,) = mail.outbox
    assert message.to == ["oncall@example.org"] and message.subject == "[lab] run 3 failed: boom"
    assert "run: 3" in message.body and str(event.id) in message.body
    assert Delivery.objects.get().status == Delivery.DELIVERED


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_loopback_is_refused_at_delivery_unless_allowed(team, receiver, settings, host):
    settings.LAB_ALERTS_ALLOW_PRIVATE = False
    target(team, url=receiver.url.replace("127.0.0.1", host))  # saved past the form's check
    emit.emit(team.pk, RUN_FAILED, "k", "run failed", {})
    deliver_due()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == (Delivery.GIVEN_UP, 1), "refused at once, not retried"
    assert "LAB_ALERTS_ALLOW_PRIVATE=1" in delivery.tries.get().error
    assert receiver.requests == []


def test_a_redirect_is_not_followed(team, receiver, loopback_allowed):
    receiver.statuses = [302]
    loopback_allowed.LAB_ALERTS_MAX_ATTEMPTS = 1
    target(team, url=receiver.url)
    emit.emit(team.pk, RUN_FAILED, "k", "run failed", {})
    deliver_due()
    assert len(receiver.requests) == 1
    assert "HTTP 302" in DeliveryAttempt.objects.get().error


def test_old_events_go_with_their_log_once_nothing_delivers_them(team, receiver, loopback_allowed):
    receiver.statuses = [200, 500]
    target(team, url=receiver.url)
    done = emit.emit(team.pk, RUN_FAILED, "done", "run 1 failed", {})
    deliver_due()
    pending = emit.emit(team.pk, RUN_FAILED, "pending", "run 2 failed", {})
    deliver_due()
    recent = emit.emit(team.pk, RUN_FAILED, "recent", "run 3 failed", {})
    long_ago = timezone.now() - timedelta(days=loopback_allowed.LAB_ALERTS_KEEP_DAYS + 1)
    Event.objects.filter(pk__in=[done.pk, pending.pk]).update(created=long_ago)
    assert prune() == 1
    assert set(Event.objects.values_list("pk", flat=True)) == {pending.pk, recent.pk}, "one still retrying"
    assert not DeliveryAttempt.objects.filter(delivery__event=done.pk).exists()
