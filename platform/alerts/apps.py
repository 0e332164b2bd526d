from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Telling the team without a page open: webhooks (Slack-compatible or HMAC-signed JSON) and
    email on runs ending, failing or collapsing, sweeps finishing and claims changing verdict,
    delivered by the workers at least once, with a delivery log."""

    name = "alerts"
