"""The URL map: each room's pages (`accounts`, `experiments`, `dashboards`, `alerts`, `imports`), the API at /api/,
the admin, and the readiness check at /health."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from lab import views
from lab.api import api
from lab.moves import MOVED_FROM_EXPERIMENTS

handler500 = "lab.middleware.server_error"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="experiment-list"), name="home"),
    path("health", views.health, name="health"),
    # Browsers ask for /favicon.ico on pages without our <link rel=icon> (the admin, the API docs).
    path("favicon.ico", RedirectView.as_view(url=static("experiments/favicon.svg"), permanent=True)),
    re_path(
        rf"^admin/experiments/(?P<model>{'|'.join(MOVED_FROM_EXPERIMENTS)})/(?P<rest>.*)$", views.moved_admin
    ),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("", include("accounts.urls")),
    path("", include("experiments.urls")),
    path("", include("dashboards.urls")),
    path("", include("alerts.urls")),
    path("", include("imports.urls")),
]
