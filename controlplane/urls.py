"""URL map: admin, REST API v1 (with its OpenAPI schema and browsable docs), health, the favicon, and the
operator dashboard; the error views (JSON under /api/, HTML pages elsewhere) are controlplane/errors.py."""
from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.core.views import healthz, metrics

api_v1 = [
    path("", include("apps.core.api.urls")),
    path("", include("apps.users.api.urls")),
    path("", include("apps.inventory.api.urls")),
    path("", include("apps.registry.api.urls")),
    path("", include("apps.policies.api.urls")),
    path("", include("apps.jobs.api.urls")),
    path("", include("apps.deployments.api.urls")),
    path("", include("apps.planning.api.urls")),
    path("", include("apps.telemetry.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="api-redoc"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"))),
    path("api-auth/", include("rest_framework.urls")),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),  # the control plane's own Prometheus metrics
    # Pages link the SVG favicon (templates/base.html); this answers browsers that ask for /favicon.ico anyway.
    path("favicon.ico", RedirectView.as_view(url=f"{settings.STATIC_URL}img/favicon.svg"), name="favicon"),
    # The operator dashboard (server-rendered pages, login at /login/).
    path("", include("apps.dashboard.urls")),
]

handler400 = "controlplane.errors.bad_request"
handler403 = "controlplane.errors.permission_denied"
handler404 = "controlplane.errors.page_not_found"
handler500 = "controlplane.errors.server_error"
