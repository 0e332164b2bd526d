from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    """How runs compare: the comparison query, curves with their bands, findings and CSV (no models)."""

    name = "dashboards"
