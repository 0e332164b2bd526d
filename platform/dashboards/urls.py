"""URLs of the comparison dashboards (an experiment's, hand-picked runs', a run's curves), of claims
and of reports: each topic's own `urls.py`, in this order."""

from __future__ import annotations

from dashboards.claims import urls as claims
from dashboards.comparison import urls as comparison
from dashboards.reports import urls as reports

urlpatterns = [*comparison.urlpatterns, *claims.urlpatterns, *reports.urlpatterns]
