"""URLs of the claims' pages: the comparison page's JSON, a new claim, a claim's permalink."""

from __future__ import annotations

from django.urls import path

from dashboards.claims import views

urlpatterns = [
    path("claims/data", views.claims_data, name="claims-data"),
    path("claims/new", views.claim_new, name="claim-new"),
    path("claims/<int:claim_id>/", views.claim_detail, name="claim-detail"),
    path("claims/<int:claim_id>/withdraw", views.claim_withdraw, name="claim-withdraw"),
]
