"""URL map: admin, REST API v1 (with its OpenAPI schema and browsable docs), health, and the operator dashboard."""
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.core.views import healthz

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
    # The operator dashboard (server-rendered pages, login at /login/).
    path("", include("apps.dashboard.urls")),
]
