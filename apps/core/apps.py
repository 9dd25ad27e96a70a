from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Core (audit log, change stream)"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from . import signals  # noqa: F401  (connects the audit receivers)
        from .api import schema  # noqa: F401  (registers the OpenAPI auth schemes)
        from .outages import statement_watchdog_install

        # Every PostgreSQL statement runs watched: a frozen server cannot hold it past its bound.
        connection_created.connect(statement_watchdog_install, dispatch_uid="tessera-statement-watchdog")
