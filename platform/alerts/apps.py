from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Telling the team without a page open: webhooks (Slack-compatible or HMAC-signed JSON) and
    email on runs ending, failing or collapsing, sweeps finishing and claims changing verdict,
    delivered by the workers at least once, with a delivery log."""

    name = "alerts"

    def ready(self) -> None:
        from alerts import emit
        from dashboards.signals import claim_stated
        from experiments.signals import run_ended

        run_ended.connect(emit.run_ended, dispatch_uid="alerts.run_ended")
        claim_stated.connect(emit.claim_stated, dispatch_uid="alerts.claim_stated")
