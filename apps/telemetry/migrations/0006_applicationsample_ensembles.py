"""An application sample's ensemble counts, one block per scheduler that drew them (`ensembles`, a list)
instead of one block under the last scheduler seen (`ensemble`): rows stored before become lists of one."""
from django.db import migrations, models


def _blocks_from_block(apps, schema_editor):
    ApplicationSample = apps.get_model("telemetry", "ApplicationSample")
    for sample in ApplicationSample.objects.filter(ensembles__isnull=False).only("pk", "ensembles").iterator(chunk_size=2000):
        if isinstance(sample.ensembles, dict):
            ApplicationSample.objects.filter(pk=sample.pk).update(ensembles=[sample.ensembles])


def _block_from_blocks(apps, schema_editor):
    ApplicationSample = apps.get_model("telemetry", "ApplicationSample")
    for sample in ApplicationSample.objects.filter(ensembles__isnull=False).only("pk", "ensembles").iterator(chunk_size=2000):
        if isinstance(sample.ensembles, list):  # going back keeps the busiest scheduler's block
            blocks = [b for b in sample.ensembles if isinstance(b, dict)]
            ApplicationSample.objects.filter(pk=sample.pk).update(
                ensembles=max(blocks, key=lambda b: b.get("queries") or 0) if blocks else None)


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0005_applicationsample_query_sizes_ensemble")]

    operations = [
        migrations.RenameField(model_name="applicationsample", old_name="ensemble", new_name="ensembles"),
        migrations.AlterField(model_name="applicationsample", name="ensembles", field=models.JSONField(blank=True, null=True)),
        migrations.RunPython(_blocks_from_block, _block_from_blocks),
    ]
