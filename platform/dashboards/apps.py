from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    """How runs compare: the comparison query, curves with their bands, rliable statistics, claims
    (its one model) and the paper's as templates, CSV."""

    name = "dashboards"
