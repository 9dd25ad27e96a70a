"""`manage.py gpulet_import [--data-dir DIR] [--application NAME]`: import the gpulets reference data
(engine/reference/data/gpulet) for the variants named like its models: MPS profiles with their L2/DRAM utilisation,
and co-run interference measurements (apps.registry.services.gpulet). All or nothing; idempotent."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.core.context import change_context
from apps.registry.services.gpulet import gpulet_import


class Command(BaseCommand):
    help = ("Import engine/reference/data/gpulet (inference.csv, mem_util.csv, interference.csv) as MPS profiles and co-run "
            "measurements of the variants named like its models. All or nothing; running it again changes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("--data-dir", default=None, help="The folder holding the three CSVs (default: engine/reference/data/gpulet)")
        parser.add_argument("--application", default=None, help="Import for this application's variants only")

    def handle(self, *args, **options):
        try:
            with change_context(source="command"):
                result = gpulet_import(data_dir=options["data_dir"], application=options["application"])
        except ValidationError as exc:
            problems = [f"{k}: {m}" for k, ms in exc.message_dict.items() for m in ms] if hasattr(exc, "error_dict") else exc.messages
            raise CommandError("nothing imported: " + "; ".join(problems)) from exc
        self.stdout.write(result.summary())
