from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Core (audit log, change stream)"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the audit receivers)
        from .api import schema  # noqa: F401  (registers the OpenAPI auth schemes)
