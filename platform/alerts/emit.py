"""Where alerts come from. A run's transition that ends an attempt sends
`experiments.signals.run_ended` (succeeded, failed, lost; collapsed is read from the summary
stored with it); `run_ended` here does its work once the transition has committed and never
raises: an alert never fails, rolls back or holds up the run's own path. A run's end also ends its
sweep when none of the sweep's runs is queued or running any more, and asks the workers' alert
thread to check its team's claims (`check_claims`, off the run's path: a verdict takes a few
queries and tests to compute) against the verdicts seen last (`claim_stated`, from
`dashboards.signals.claim_stated`, remembers the first). `AlertsConfig.ready` connects them.

`emit` stores an event once (by its key) with a delivery per target of the team that wants it;
the workers deliver them (`alerts.deliver`)."""

from __future__ import annotations

import logging
from collections import Counter

from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse

from alerts import models as alert_models
from alerts.models import ClaimCheck, ClaimVerdict, Delivery, Event, Target

log = logging.getLogger(__name__)


def link(name: str, *args) -> str:
    """The page's URL: absolute when `LAB_BASE_URL` is set, else its path."""
    return settings.LAB_BASE_URL.rstrip("/") + reverse(name, args=args)


def emit(team_id: int, kind: str, key: str, text: str, payload: dict, targets=None) -> Event | None:
    """Store the event `key` (if it is new) and a pending delivery to each of `targets` (default:
    the team's targets that want `kind`); None when no target wants it or it was stored before."""
    if targets is None:
        targets = [t for t in Target.objects.filter(team_id=team_id) if t.wants(kind)]
    if not targets:
        return None
    try:
        with transaction.atomic():
            event = Event.objects.create(team_id=team_id, kind=kind, key=key, text=text, payload=payload)
            Delivery.objects.bulk_create([Delivery(event=event, target=target) for target in targets])
    except IntegrityError:
        return None  # another process stored this event first
    return event


def after_commit(what: str, fn, *args) -> None:
    """Run `fn(*args)` once the current transaction commits (now, outside one); log, never raise."""

    def guarded() -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("alerts: %s failed; no alert for it", what)

    try:
        transaction.on_commit(guarded)
    except Exception:
        log.exception("alerts: %s could not be scheduled; no alert for it", what)


def run_ended(sender, run, status: str, attempt: int, **kwargs) -> None:
    """`experiments.signals.run_ended`: attempt `attempt` of `run` just ended `status`
    (succeeded, failed, lost or cancelled); `run` as it is now (a lost run may be queued again)."""
    ended = {
        "status": status,
        "attempt": attempt,
        "summary": dict(run.summary),
        "error": run.error,
    }
    after_commit(f"run {run.pk} ending {status}", _run_ended, run.pk, ended)


def _run_ended(run_id: int, ended: dict) -> None:
    from experiments.models import Run

    run = Run.objects.select_related("experiment").filter(pk=run_id).first()
    if run is None:
        return
    experiment = run.experiment
    team_id = experiment.team_id
    wanted = {kind for target in Target.objects.filter(team_id=team_id) for kind in target.events}
    if not wanted:
        return  # most teams: one query, nothing else
    status, attempt, summary = ended["status"], ended["attempt"], ended["summary"]
    base = {
        "run": run.pk,
        "attempt": attempt,
        "status": status,
        "experiment": experiment.pk,
        "experiment_name": experiment.name,
        "preset": run.preset,
        "staleness": run.staleness,
        "variant": run.variant_label,
        "seed": run.seed,
        "url": link("run-detail", run.pk),
    }
    described = f"run {run.pk} ({run.preset}, {run.staleness}, seed {run.seed}) of {experiment.name}"
    kinds = {
        Run.SUCCEEDED: alert_models.RUN_SUCCEEDED,
        Run.FAILED: alert_models.RUN_FAILED,
        Run.LOST: alert_models.RUN_LOST,
    }
    if status in kinds:
        payload = {**base, "final_accuracy": summary.get("eval/accuracy")}
        text = f"{described} {status}"
        if status != Run.SUCCEEDED:
            payload["error"] = ended["error"]
            text += f": {ended['error']}"
        if run.attempt > attempt:
            # Queued again in the transaction that ended the attempt (a lost worker's run, a
            # trainer rank killed from outside, a damaged batch, with attempts left).
            payload["requeued_as_attempt"] = attempt + 1
            text += f" (re-queued as attempt {attempt + 1})"
        emit(team_id, kinds[status], f"run {run.pk} attempt {attempt} {status}", text, payload)
        if summary.get("collapsed") == 1:
            step = summary.get("collapsed_step")
            emit(
                team_id,
                alert_models.RUN_COLLAPSED,
                f"run {run.pk} attempt {attempt} collapsed",
                f"{described}: its policy collapsed" + (f" at step {step:g}" if step is not None else ""),
                {**base, "collapsed_step": step},
            )
    if alert_models.SWEEP_FINISHED in wanted:
        _sweep_ended(experiment)
    if alert_models.CLAIM_VERDICT in wanted and ClaimVerdict.objects.filter(claim__team_id=team_id).exists():
        ClaimCheck.objects.create(team_id=team_id, run_id=run.pk, experiment_id=experiment.pk)


def _sweep_ended(experiment) -> None:
    from experiments.models import Run

    statuses = list(experiment.runs.values_list("status", "attempt"))
    if any(status in Run.ACTIVE for status, _ in statuses):
        return
    counts = Counter(status for status, _ in statuses)
    # Retries and added seeds change the key: a sweep that finishes again is a new event.
    key = f"experiment {experiment.pk} finished: {len(statuses)} runs, {sum(a for _, a in statuses)} attempts"
    told = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    emit(
        experiment.team_id,
        alert_models.SWEEP_FINISHED,
        key,
        f"sweep {experiment.name} finished: {told}",
        {
            "experiment": experiment.pk,
            "experiment_name": experiment.name,
            "runs": len(statuses),
            "by_status": dict(counts),
            "url": link("experiment-detail", experiment.pk),
        },
    )


def claim_stated(sender, claim, verdict: str, **kwargs) -> None:
    """`dashboards.signals.claim_stated`: remember a new claim's verdict, to tell when it changes."""
    after_commit(
        f"claim {claim.pk} stated",
        lambda: ClaimVerdict.objects.update_or_create(claim=claim, defaults={"verdict": verdict}),
    )


def check_claims() -> int:
    """Check the claims of the runs that ended since the last check (`ClaimCheck`, each taken by
    one worker); an event for each whose verdict changed. How many changed. (The workers' alert
    thread calls this.)"""
    from dashboards.models import Claim

    taken = [
        check
        for check in ClaimCheck.objects.order_by("id")[:500]
        if ClaimCheck.objects.filter(pk=check.pk).delete()[0] == 1  # 0: another worker took it
    ]
    to_check: dict[int, Claim] = {}
    for team_id in {check.team_id for check in taken}:
        ended = [check for check in taken if check.team_id == team_id]
        for claim in Claim.objects.filter(team_id=team_id).select_related("team"):
            if any(claim.experiment_id == c.experiment_id or c.run_id in claim.run_ids for c in ended):
                to_check[claim.pk] = claim
    return sum(_check_claim(claim) for claim in to_check.values())


def _check_claim(claim) -> bool:
    """Compare the claim's verdict now with the one seen last; emit an event if it changed."""
    from dashboards.claims import service

    verdict = service.result(claim)["verdict"]
    seen = ClaimVerdict.objects.filter(claim=claim).first()
    if seen is None:  # stated before alerts saw it: from now on
        ClaimVerdict.objects.create(claim=claim, verdict=verdict)
        return False
    if seen.verdict == verdict:
        return False
    before = seen.verdict
    seen.verdict, seen.changes = verdict, seen.changes + 1
    seen.save(update_fields=["verdict", "changes"])
    emit(
        claim.team_id,
        alert_models.CLAIM_VERDICT,
        f"claim {claim.pk} change {seen.changes}",
        f"claim {claim}: {before} → {verdict}",
        {
            "claim": claim.pk,
            "title": str(claim),
            "before": before,
            "verdict": verdict,
            "experiment": claim.experiment_id,
            "url": link("claim-detail", claim.pk),
        },
    )
    return True
