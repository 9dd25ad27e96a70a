from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator's web dashboard: server-rendered pages over the same models and role permissions as the API."""

    name = "apps.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"
