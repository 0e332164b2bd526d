"""Delivering alerts, in the workers: every worker process (`cpu`, `gpu`, `rollout`) runs a thread
that calls `deliver_due` every `LAB_ALERTS_INTERVAL_S` (`workers.tasks`), as it runs the reaper:
a Celery message would wait behind the run its solo pool is training. Each due delivery is
leased, tried once, logged (`DeliveryAttempt`) and then delivered, retried after a doubling
backoff, or given up after `LAB_ALERTS_MAX_ATTEMPTS` tries. At least once: a worker that dies
mid-try leaves its lease to end, and another tries again with the same event id.

The bodies: Slack-compatible `{"text": …}`, or for a generic webhook the event as JSON, signed
`X-Lab-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed by the target's secret>`;
both carry `X-Lab-Event-Id` and `X-Lab-Event`. Email goes through Django's email backend."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts import addresses
from alerts.models import Delivery, DeliveryAttempt, Event, Target

log = logging.getLogger(__name__)

USER_AGENT = "OffPolicyLab-Alerts/1"


def sign(secret: str, body: bytes) -> str:
    """The X-Lab-Signature header's value for `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def generic_body(event: Event) -> dict:
    return {
        "id": str(event.id),
        "kind": event.kind,
        "created": event.created.isoformat(),
        "team": event.team.name,
        "text": event.text,
        "data": event.payload,
    }


def text_with_link(event: Event) -> str:
    """The event's line, and its page's address when that is absolute (`LAB_BASE_URL`)."""
    url = event.payload.get("url", "")
    return f"{event.text} {url}" if url.startswith(("http://", "https://")) else event.text


def request(event: Event, target: Target) -> tuple[bytes, dict[str, str]]:
    """The raw body and headers a webhook target is sent."""
    body = generic_body(event) if target.kind == Target.WEBHOOK else {"text": text_with_link(event)}
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Lab-Event-Id": str(event.id),
        "X-Lab-Event": event.kind,
    }
    if target.kind == Target.WEBHOOK:
        headers["X-Lab-Signature"] = sign(target.secret, raw)
    return raw, headers


def email_text(event: Event) -> str:
    lines = [text_with_link(event), ""]
    lines += [
        f"{name}: {value}" for name, value in event.payload.items() if not isinstance(value, dict | list)
    ]
    lines += ["", f"event id {event.id}, team {event.team.name}"]
    return "\n".join(lines)


class Refused(Exception):
    """A try that no later try would change: given up at once."""


def send(event: Event, target: Target) -> int | None:
    """One try: the HTTP status (None for an email handed to the backend). Raises on a network
    or mail error, `Refused` for an address that may not be delivered to."""
    if target.kind == Target.EMAIL:
        send_mail(f"[lab] {event.text}", email_text(event), None, [target.email])
        return None
    raw, headers = request(event, target)
    try:
        return addresses.post(target.url, raw, headers, settings.LAB_ALERTS_TIMEOUT_S)
    except addresses.AddressRefused as exc:
        raise Refused(str(exc)) from None


def _lease(delivery_id: int, now) -> bool:
    free = Q(leased_until=None) | Q(leased_until__lt=now)
    until = now + timedelta(seconds=2 * settings.LAB_ALERTS_TIMEOUT_S + 30)
    return (
        Delivery.objects.filter(free, pk=delivery_id, status=Delivery.PENDING, next_attempt__lte=now).update(
            leased_until=until
        )
        == 1
    )


def attempt(delivery: Delivery) -> DeliveryAttempt | None:
    """Try `delivery` once (leased by the caller) and record how it went (None: its target is gone)."""
    started = time.monotonic()
    status_code, error, refused = None, "", False
    try:
        status_code = send(delivery.event, delivery.target)
    except Refused as exc:
        error, refused = str(exc), True
    except Exception as exc:  # a network or mail error: tried again later
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    ok = not error and (status_code is None or 200 <= status_code < 300)
    if not ok and not error:
        error = f"HTTP {status_code}: only a 2xx answer counts as delivered"
    number = delivery.attempts + 1
    now = timezone.now()
    if ok:
        outcome, changes = Delivery.DELIVERED, {"status": Delivery.DELIVERED, "finished": now}
    elif refused or number >= settings.LAB_ALERTS_MAX_ATTEMPTS:
        outcome, changes = Delivery.GIVEN_UP, {"status": Delivery.GIVEN_UP, "finished": now}
    else:
        outcome, changes = "retrying", {"next_attempt": now + Delivery.backoff(number)}
    with transaction.atomic():  # the UPDATE's row lock holds off a removal of its target until logged
        if not Delivery.objects.filter(pk=delivery.pk).update(attempts=number, leased_until=None, **changes):
            return None  # its target was removed meanwhile, and its deliveries and their log with it
        logged = DeliveryAttempt.objects.create(
            delivery=delivery,
            number=number,
            ok=ok,
            status_code=status_code,
            error=error[:2000],
            duration_ms=round(1000 * (time.monotonic() - started)),
            outcome=outcome,
        )
    level = logging.INFO if ok else logging.WARNING
    log.log(
        level,
        "alert %s to %s: try %d, %s%s",
        delivery.event_id,
        delivery.target,
        number,
        outcome,
        f" ({error})" if error else "",
    )
    return logged


PRUNE_EVERY_S = 3600
_pruned_at: float | None = None  # time.monotonic() of this process's last prune


def prune() -> int:
    """Delete the events older than `LAB_ALERTS_KEEP_DAYS` that nothing is still delivering, with
    their deliveries and log; how many events went."""
    cutoff = timezone.now() - timedelta(days=settings.LAB_ALERTS_KEEP_DAYS)
    old = Event.objects.filter(created__lt=cutoff).exclude(deliveries__status=Delivery.PENDING)
    return (
        Event.objects.filter(pk__in=list(old.values_list("pk", flat=True)[:1000]))
        .delete()[1]
        .get(Event._meta.label, 0)
    )


def deliver_due(limit: int = 50) -> int:
    """Try each pending delivery that is due and not leased by another worker, at most `limit`;
    then check the claims a run's end asked about (`alerts.emit.check_claims`), and once an hour
    prune the old events (`prune`). How many were tried."""
    global _pruned_at
    from alerts.emit import check_claims

    now = timezone.now()
    due = (
        Delivery.objects.filter(status=Delivery.PENDING, next_attempt__lte=now)
        .filter(Q(leased_until=None) | Q(leased_until__lt=now))
        .order_by("next_attempt", "id")
        .values_list("pk", flat=True)[:limit]
    )
    tried = 0
    for pk in list(due):
        if not _lease(pk, now):
            continue  # another worker has it
        delivery = Delivery.objects.select_related("event__team", "target").get(pk=pk)
        attempt(delivery)
        tried += 1
    check_claims()
    if _pruned_at is None or time.monotonic() - _pruned_at > PRUNE_EVERY_S:
        prune()
        _pruned_at = time.monotonic()
    return tried
