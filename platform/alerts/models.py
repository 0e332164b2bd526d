"""A team's alert targets (a Slack-compatible webhook, a generic HMAC-signed webhook, or an email
address, each with the events it wants), the events that happened (`Event`, one uuid each, the id
a receiver drops duplicates by), one `Delivery` per event and target (the outbox the workers
deliver from, at least once, with retries and backoff: `alerts.deliver`) and one
`DeliveryAttempt` per try (the delivery log on the team page). docs/alerts.md."""

from __future__ import annotations

import secrets
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Team

RUN_SUCCEEDED, RUN_FAILED, RUN_LOST, RUN_COLLAPSED = (
    "run.succeeded",
    "run.failed",
    "run.lost",
    "run.collapsed",
)
SWEEP_FINISHED, CLAIM_VERDICT = "sweep.finished", "claim.verdict_changed"
TEST = "test"  # the team page's "send a test": to one target, whatever events it wants
EVENTS = {
    RUN_SUCCEEDED: "a run succeeded",
    RUN_FAILED: "a run failed",
    RUN_LOST: "a run was lost (its worker stopped sending heartbeats)",
    RUN_COLLAPSED: "a run's policy collapsed (held-out accuracy fell to near zero)",
    SWEEP_FINISHED: "a sweep finished (none of its runs queued or running any more)",
    CLAIM_VERDICT: "a claim's verdict changed",
}


class Target(models.Model):
    """Where a team's alerts go, and which events it wants."""

    SLACK, WEBHOOK, EMAIL = "slack", "webhook", "email"
    KINDS = {
        SLACK: 'Slack-compatible webhook ({"text": …})',
        WEBHOOK: "generic JSON webhook, signed with HMAC-SHA256",
        EMAIL: "email",
    }

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="alert_targets")
    kind = models.CharField(max_length=10, choices=list(KINDS.items()))
    url = models.URLField(max_length=2000, blank=True, help_text="the webhook's URL (http or https)")
    email = models.EmailField(blank=True, help_text="the address an email target sends to")
    secret = models.CharField(
        max_length=64, blank=True, help_text="a generic webhook's HMAC-SHA256 key (X-Lab-Signature)"
    )
    events = models.JSONField(default=list, help_text="the event kinds it wants (EVENTS)")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )

    class Meta:
        ordering = ["team", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.email or self.url}"

    def save(self, *args, **kwargs) -> None:
        if self.kind == self.WEBHOOK and not self.secret:
            self.secret = secrets.token_hex(32)
        super().save(*args, **kwargs)

    def wants(self, kind: str) -> bool:
        return kind == TEST or kind in self.events


class Event(models.Model):
    """Something that happened to a team's runs, sweeps or claims; `key` makes it happen once
    (two workers noticing the same sweep finish store one event)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="alert_events")
    kind = models.CharField(max_length=40)
    key = models.CharField(max_length=200, unique=True, help_text="what makes it one event")
    text = models.TextField(help_text="one line a person reads (a Slack message, an email's subject)")
    payload = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"


class Delivery(models.Model):
    """One event to one target: pending until a worker delivers it, or gives up after
    `LAB_ALERTS_MAX_ATTEMPTS` tries. A worker leases it while it tries (`leased_until`): one
    whose worker died is tried again once the lease ends, with the same event id."""

    PENDING, DELIVERED, GIVEN_UP = "pending", "delivered", "given up"
    STATUSES = [(s, s) for s in (PENDING, DELIVERED, GIVEN_UP)]

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    target = models.ForeignKey(Target, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=STATUSES, default=PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt = models.DateTimeField(default=timezone.now, db_index=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["event", "target"], name="one_delivery_per_target")]

    def __str__(self) -> str:
        return f"{self.event.kind} to {self.target}"

    @staticmethod
    def backoff(attempts: int) -> timedelta:
        """How long after its `attempts`-th failed try a delivery is tried again: doubling from
        `LAB_ALERTS_BACKOFF_S`, at most `LAB_ALERTS_BACKOFF_MAX_S`."""
        base = settings.LAB_ALERTS_BACKOFF_S
        return timedelta(seconds=min(settings.LAB_ALERTS_BACKOFF_MAX_S, base * 2 ** (attempts - 1)))


class DeliveryAttempt(models.Model):
    """One try: when, what came back (an HTTP status, or why there was none), and how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    outcome = models.CharField(
        max_length=10, help_text="what became of the delivery: delivered, retrying or given up"
    )

    class Meta:
        ordering = ["-at", "-id"]


class ClaimVerdict(models.Model):
    """A claim's verdict as alerts last saw it: a claim.verdict_changed event fires when a run of
    its cells ends and its verdict is no longer this one."""

    claim = models.OneToOneField("dashboards.Claim", on_delete=models.CASCADE, related_name="+")
    verdict = models.CharField(max_length=40)
    changes = models.PositiveIntegerField(default=0, help_text="how many times it changed (the event key)")


class ClaimCheck(models.Model):
    """A team's claims to check again because one of its runs ended (the workers' alert thread
    checks them, off the run's own path)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    run_id = models.PositiveIntegerField()
    experiment_id = models.PositiveIntegerField()
    created = models.DateTimeField(default=timezone.now)
