"""`manage.py migrate` under its own statement bound (TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S, none by default)
instead of the requests' 4 s: a migration may rewrite a large table (telemetry's), and with the request bound
it failed half-way on a large installation. Otherwise Django's migrate."""
from __future__ import annotations

from django.conf import settings
from django.core.management.commands.migrate import Command as DjangoMigrate

from apps.core.outages import statement_bound_override


class Command(DjangoMigrate):
    help = DjangoMigrate.help + " Each statement is bounded by TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S (0: not at all)."

    def handle(self, *args, **options):
        with statement_bound_override(settings.TESSERA_DB_MIGRATE_STATEMENT_TIMEOUT_S):
            return super().handle(*args, **options)
