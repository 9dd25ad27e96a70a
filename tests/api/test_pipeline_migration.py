"""The migration that turned a pipeline from a chain of applications (Application.pipeline and
pipeline_stage, one SLO on the pipeline) into a DAG keeps every declared chain: its stages in order, one
path with its SLO, the stage index built."""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("registry", "0004_profile_utilisation_corunmeasurement")]
AFTER = [("registry", "0005_pipeline_dag")]


@pytest.mark.django_db(transaction=True)
def test_old_chains_become_one_path_graphs():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    Pipeline, Application = old.get_model("registry", "Pipeline"), old.get_model("registry", "Application")
    video = Pipeline.objects.create(name="video", slo_ms=250.0)
    Pipeline.objects.create(name="empty", slo_ms=10.0)
    Application.objects.create(name="classify", pipeline=video, pipeline_stage=1)
    Application.objects.create(name="detect", pipeline=video, pipeline_stage=0)
    Application.objects.create(name="alone")
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(AFTER)
        new = executor.loader.project_state(AFTER).apps
        migrated = new.get_model("registry", "Pipeline").objects.get(name="video")
        assert [s["application"] for s in migrated.stages] == ["detect", "classify"]
        assert migrated.paths == [{"name": "video", "stages": ["detect", "classify"], "slo_ms": 250.0, "demand_rps": 0.0}]
        rows = new.get_model("registry", "PipelineStage").objects.filter(pipeline=migrated).order_by("position")
        assert [r.application.name for r in rows] == ["detect", "classify"]
        assert new.get_model("registry", "Pipeline").objects.get(name="empty").paths == []
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
