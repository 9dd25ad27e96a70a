"""Declaring pipelines over REST: chains and DAGs in the planning problem's format, checked by the same
parser (acyclic, one entry, stages exist, SLOs positive), stored in normal form, audited, and nothing
stored on bad input."""
import pytest

from apps.core.models import ObjectChange
from apps.registry.models import Application, Pipeline, PipelineStage
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/pipelines/"


@pytest.fixture
def stages():
    return [ApplicationFactory(name=name) for name in ("detect", "classify", "ocr")]


def _error(response) -> str:
    body = response.json()["error"]
    return " ".join([body.get("message", "")] + [m for ms in (body.get("fields") or {}).values() for m in ms])


def test_a_chain_is_declared_as_text_and_stored_with_its_path_written_out(clients, stages):
    response = clients["operator"].post(URL, {"name": "video", "stages": "detect -> classify", "slo_ms": 200, "demand_rps": 40}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["entry"] == "detect"
    assert [s["application"] for s in body["stages"]] == ["detect", "classify"]
    assert body["paths"] == [{"name": "video", "stages": ["detect", "classify"], "slo_ms": 200.0, "demand_rps": 40.0}]
    assert list(PipelineStage.objects.filter(pipeline_id=body["id"]).values_list("application__name", "position")) == [
        ("detect", 0), ("classify", 1)]
    # The application says which pipeline it is a stage of.
    assert clients["viewer"].get(f"/api/v1/applications/{stages[0].pk}/").json()["pipeline"] == "video"
    assert [a["name"] for a in clients["viewer"].get("/api/v1/applications/?pipeline=video").json()["results"]] == ["classify", "detect"]


def test_a_dag_with_per_path_slos_and_a_pinned_variant(clients, stages):
    variant = ModelVariantFactory(application=stages[1], name="resnet50")
    payload = {
        "name": "video",
        "stages": ["detect", {"application": "classify", "variant": "resnet50", "max_batch": 16}, "ocr"],
        "paths": [{"name": "objects", "stages": ["detect", "classify"], "slo_ms": 150, "demand_rps": 30},
                  {"name": "text", "stages": "detect -> ocr", "slo_ms": 300, "demand_rps": 10}],
        "beta": 0.05,
    }
    response = clients["operator"].post(URL, payload, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["paths"][1]["stages"] == ["detect", "ocr"]
    assert PipelineStage.objects.get(application=stages[1]).variant == variant
    # The pinned variant and the stage applications cannot go while the pipeline uses them.
    gone = clients["operator"].delete(f"/api/v1/variants/{variant.pk}/")
    assert gone.status_code == 409 and "used by pipeline stage video[1] classify" in gone.json()["error"]["message"]
    assert clients["operator"].delete(f"/api/v1/applications/{stages[0].pk}/").status_code == 409
    assert Application.objects.filter(pk=stages[0].pk).exists()
    # Nor be renamed from under it.
    renamed = clients["operator"].patch(f"/api/v1/applications/{stages[0].pk}/", {"name": "detector"}, format="json")
    assert renamed.status_code == 400 and "stage of pipeline video" in _error(renamed)


@pytest.mark.parametrize("payload, message", [
    ({"name": "p", "stages": "detect -> nope", "slo_ms": 10, "demand_rps": 1}, "unknown application 'nope'"),
    ({"name": "p", "stages": ["detect", "classify"], "slo_ms": 0, "demand_rps": 1}, "must be > 0"),
    ({"name": "p", "stages": ["detect", "classify"]}, "give 'paths', or 'slo_ms' and 'demand_rps'"),
    ({"name": "p", "stages": ["detect", "classify", "ocr"], "paths": [
        {"name": "a", "stages": ["detect", "classify", "ocr"], "slo_ms": 9, "demand_rps": 1},
        {"name": "b", "stages": ["detect", "ocr", "classify"], "slo_ms": 9, "demand_rps": 1}]}, "cycle"),
    ({"name": "p", "stages": ["detect", "classify"], "paths": [
        {"name": "a", "stages": ["detect"], "slo_ms": 9, "demand_rps": 1},
        {"name": "b", "stages": ["classify"], "slo_ms": 9, "demand_rps": 1}]}, "one entry stage"),
    ({"name": "p", "stages": [{"application": "classify", "variant": "nope"}], "slo_ms": 9, "demand_rps": 1}, "does not have"),
])
def test_bad_pipelines_are_refused_and_nothing_is_stored(clients, stages, payload, message):
    changes = ObjectChange.objects.count()
    response = clients["operator"].post(URL, payload, format="json")
    assert response.status_code == 400
    assert message in _error(response), response.content
    assert not Pipeline.objects.exists() and not PipelineStage.objects.exists()
    assert ObjectChange.objects.count() == changes


def test_an_application_is_a_stage_of_one_pipeline_at_most(clients, stages):
    op = clients["operator"]
    assert op.post(URL, {"name": "one", "stages": "detect -> classify", "slo_ms": 100, "demand_rps": 1}, format="json").status_code == 201
    second = op.post(URL, {"name": "two", "stages": "classify -> ocr", "slo_ms": 100, "demand_rps": 1}, format="json")
    assert second.status_code == 400 and "already a stage of pipeline 'one'" in _error(second)
    clash = op.post(URL, {"name": "one", "stages": "ocr", "slo_ms": 100, "demand_rps": 1}, format="json")
    assert clash.status_code == 400 and "already exists" in _error(clash)


def test_patching_a_chain_keeps_what_is_not_given_and_is_audited_before_and_after(clients, stages, users):
    op = clients["operator"]
    pk = op.post(URL, {"name": "video", "stages": "detect -> classify", "slo_ms": 200, "demand_rps": 40}, format="json").json()["id"]
    slower = op.patch(f"{URL}{pk}/", {"slo_ms": 300}, format="json")
    assert slower.status_code == 200, slower.content
    assert slower.json()["paths"][0] == {"name": "video", "stages": ["detect", "classify"], "slo_ms": 300.0, "demand_rps": 40.0}
    longer = op.patch(f"{URL}{pk}/", {"stages": "detect -> classify -> ocr"}, format="json")
    assert longer.status_code == 200 and longer.json()["paths"][0]["stages"] == ["detect", "classify", "ocr"]
    assert PipelineStage.objects.filter(pipeline_id=pk).count() == 3
    update = ObjectChange.objects.filter(changed_object_type__model="pipeline", action="update").order_by("id").last()
    assert update.user == users["operator"]
    assert update.prechange_data["paths"][0]["stages"] == ["detect", "classify"]
    assert update.postchange_data["paths"][0]["stages"] == ["detect", "classify", "ocr"]
    # Deleting the pipeline frees its stages.
    assert op.delete(f"{URL}{pk}/").status_code == 204
    assert not PipelineStage.objects.exists()
    assert op.delete(f"/api/v1/applications/{stages[0].pk}/").status_code == 204


def test_viewers_read_and_cannot_declare(clients, stages):
    assert clients["viewer"].post(URL, {"name": "v", "stages": "detect", "slo_ms": 1, "demand_rps": 1}, format="json").status_code == 403
    assert clients["viewer"].get(URL).status_code == 200


def test_the_cli_applies_yaml_and_one_line_chains_all_or_nothing(tmp_path, stages):
    from typer.testing import CliRunner

    from controlplane.cli import app as cli

    runner = CliRunner()
    good = tmp_path / "pipelines.yaml"
    good.write_text(
        "pipelines:\n"
        "  - name: video\n"
        "    stages: [detect, {application: classify, max_batch: 16}]\n"
        "    paths:\n"
        "      - {name: objects, stages: detect -> classify, slo_ms: 150, demand_rps: 30}\n"
    )
    applied = runner.invoke(cli, ["pipeline", "apply", "-f", str(good)])
    assert applied.exit_code == 0, applied.output
    assert "created video (2 stage(s), entry detect): objects: detect -> classify within 150 ms at 30 rps" in applied.output
    assert Pipeline.objects.get(name="video").stages[1] == {"application": "classify", "max_batch": 16}
    # A second document with a fault: nothing of the file is stored, the first pipeline is unchanged.
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: video, stages: detect -> classify -> ocr, slo_ms: 300, demand_rps: 5}\n"
                   "- {name: other, stages: nope, slo_ms: 10, demand_rps: 1}\n")
    refused = runner.invoke(cli, ["pipeline", "apply", "-f", str(bad)])
    assert refused.exit_code == 2 and "unknown application 'nope'" in refused.output and "nothing was stored" in refused.output
    assert len(Pipeline.objects.get(name="video").stages) == 2 and not Pipeline.objects.filter(name="other").exists()
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert runner.invoke(cli, ["pipeline", "apply", "-f", str(broken)]).exit_code == 2
    chain = runner.invoke(cli, ["pipeline", "chain", "video", "detect -> classify -> ocr", "--slo-ms", "300", "--demand-rps", "12"])
    assert chain.exit_code == 0 and chain.output.startswith("updated video (3 stage(s)")
    listed = runner.invoke(cli, ["pipeline", "list"])
    assert "video: detect -> classify -> ocr within 300 ms at 12 rps" in listed.output
    assert runner.invoke(cli, ["pipeline", "delete", "video"]).exit_code == 0
    assert runner.invoke(cli, ["pipeline", "delete", "video"]).exit_code == 2
    sources = set(ObjectChange.objects.filter(changed_object_type__model="pipeline").values_list("source", flat=True))
    assert sources == {"command"}


def test_the_admin_declares_pipelines_through_the_same_checks(client, users, stages):
    users["admin"].is_staff = users["admin"].is_superuser = True
    users["admin"].save()
    client.force_login(users["admin"])
    form = {"name": "video", "description": "", "stages": '"detect -> classify"', "paths": "null",
            "alpha": "1", "beta": "0.01", "delta": "0.000001", "ipa_threshold_rps": "0"}
    refused = client.post("/admin/registry/pipeline/add/", form)
    assert refused.status_code == 200 and b"give &#x27;paths&#x27;" in refused.content  # a chain needs its SLO: paths here
    assert not Pipeline.objects.exists()
    form["paths"] = '[{"name": "main", "stages": "detect -> classify", "slo_ms": 200, "demand_rps": 40}]'
    created = client.post("/admin/registry/pipeline/add/", form)
    assert created.status_code == 302, created.content[:3000]
    pipeline = Pipeline.objects.get(name="video")
    assert pipeline.paths[0]["stages"] == ["detect", "classify"]
    assert PipelineStage.objects.filter(pipeline=pipeline).count() == 2
    assert client.get("/admin/registry/pipeline/").status_code == 200


def test_routing_tables_carry_the_pipeline_so_that_routers_run_it(clients, stages):
    from apps.deployments.services import routing_tables_publish

    clients["operator"].post(URL, {"name": "video", "stages": ["detect", {"application": "classify", "inputs": {"x": "boxes"}}],
                                   "slo_ms": 180, "demand_rps": 40}, format="json")
    routing_tables_publish(tables={stages[0]: [], stages[1]: [], stages[2]: []})
    tables = {t["application"]: t for t in clients["viewer"].get("/api/v1/routing-tables/?active=true").json()["results"]}
    assert tables["classify"]["pipeline"]["name"] == "video"
    assert tables["classify"]["pipeline"]["stages"][1]["inputs"] == {"x": "boxes"}
    assert tables["classify"]["pipeline"]["paths"][0]["stages"] == ["detect", "classify"]
    # No SLO policy of its own: a stage's table takes the tightest path's SLO.
    assert tables["detect"]["slo_ms"] == 180.0
    assert tables["ocr"]["pipeline"] is None and tables["ocr"]["slo_ms"] is None
