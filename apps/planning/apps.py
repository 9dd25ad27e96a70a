from django.apps import AppConfig


class PlanningConfig(AppConfig):
    name = "apps.planning"
    label = "planning"
    verbose_name = "Planning (plans, their lifecycle and rollout)"

    def ready(self) -> None:
        from . import signals

        signals.connect()
