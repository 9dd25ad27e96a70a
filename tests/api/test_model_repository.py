"""The control plane's side of the Open Inference Protocol: routing tables carry each application as a model
(its tensors in the protocol's spelling), and the model repository extension's load and unload pin and
release an application (`POST /api/v1/routing-tables/repository/`), for operators and for routers an admin
allowed, audited, with the release winning over any plan applied later and the planner leaving it out."""
import pytest

from apps.core.models import ObjectChange
from apps.deployments.models import RoutingTable
from apps.deployments.services import application_pin, application_release, routing_table_publish
from apps.inventory.services import router_credential_issue
from tests.conftest import _token_client
from tests.factories import ApplicationFactory, ArtifactFactory, CpuFactory, HostFactory, ModelVariantFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/routing-tables/repository/"


@pytest.fixture
def tabular(db):
    CpuFactory(host=HostFactory(name="h"), index=0, cpu_cores=8)
    app = ApplicationFactory(name="tabular", input_spec=[{"name": "input", "dtype": "tensor(float)", "shape": ["batch", 8]}])
    SloPolicyFactory(application=app, latency_p99_ms=50.0)
    outputs = [{"name": "probabilities", "dtype": "tensor(float)", "shape": ["batch", 3]}]
    small = ModelVariantFactory(application=app, name="linear", artifact=ArtifactFactory(), inputs=app.input_spec, outputs=outputs)
    big = ModelVariantFactory(application=app, name="mlp", artifact=ArtifactFactory(), inputs=app.input_spec,
                              outputs=[*outputs, {"name": "logits", "dtype": "tensor(double)", "shape": ["batch", 3]}])
    routing_table_publish(application=app, routes=[{"instance": "h/cpu0/0", "variant": small.pk, "weight": 1.0},
                                                   {"instance": "h/cpu0/1", "variant": big.pk, "weight": 1.0}])
    return app


def test_a_routing_table_describes_its_application_as_a_model(tabular, clients) -> None:
    table = clients["viewer"].get("/api/v1/routing-tables/?active=true").json()["results"][0]
    model = table["model"]
    assert model["platform"] == "onnxruntime_onnx"
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
    # The application's outputs are those every variant has; each variant's own are under its name.
    assert [o["name"] for o in model["outputs"]] == ["probabilities"]
    assert model["versions"]["mlp"]["outputs"][1] == {"name": "logits", "datatype": "FP64", "shape": [-1, 3]}


def test_unload_releases_and_load_pins_for_operators(tabular, clients) -> None:
    response = clients["operator"].post(URL, {"model": "tabular", "action": "unload"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["released"] is True and response.json()["changed"] is True
    active = RoutingTable.objects.get(application=tabular, active=True)
    assert active.routes == [] and response.json()["routing_table_version"] == active.version
    assert ObjectChange.objects.filter(changed_object_type__model="application", changed_object_id=str(tabular.pk), action="update").exists()
    # Again: nothing changes, no new table.
    again = clients["operator"].post(URL, {"model": "tabular", "action": "unload"}, format="json").json()
    assert again["changed"] is False and RoutingTable.objects.filter(application=tabular).count() == 2
    loaded = clients["operator"].post(URL, {"model": "tabular", "action": "load"}, format="json").json()
    assert loaded == {"model": "tabular", "action": "load", "released": False, "changed": True, "routing_table_version": active.version,
                      "max_batch_size": None, "batching_delay_ms": None}


def test_a_release_wins_over_a_plan_applied_after_it(tabular) -> None:
    variant = tabular.variants.get(name="linear")
    application_release(application=tabular)
    table = routing_table_publish(application=tabular, routes=[{"instance": "h/cpu0/0", "variant": variant.pk, "weight": 1.0}])
    assert table.routes == []
    assert application_pin(application=tabular) is True
    assert routing_table_publish(application=tabular, routes=[{"instance": "h/cpu0/0", "variant": variant.pk, "weight": 1.0}]).routes


def test_the_planner_leaves_a_released_application_out(tabular) -> None:
    from apps.planning.snapshot import fleet_problem_build

    application_release(application=tabular)
    snapshot = fleet_problem_build(demand={"tabular": 10.0})
    assert "released" in snapshot.left_out["applications"]["tabular"]
    assert "tabular" not in snapshot.applications


def test_who_may_load_and_unload(tabular, clients) -> None:
    body = {"model": "tabular", "action": "unload"}
    assert clients["viewer"].post(URL, body, format="json").status_code == 403
    assert clients["anonymous"].post(URL, body, format="json").status_code in (401, 403)
    _, secret = router_credential_issue(name="edge-1")
    router = _token_client(secret)
    refused = router.post(URL, body, format="json")
    assert refused.status_code == 403 and "may_load_models" in refused.json()["error"]["message"]
    router_credential_issue(name="edge-2", may_load_models=True)
    _, allowed_secret = router_credential_issue(name="edge-2")  # re-issued: the permission stays
    allowed = _token_client(allowed_secret).post(URL, body, format="json")
    assert allowed.status_code == 200 and allowed.json()["released"] is True
    change = ObjectChange.objects.filter(changed_object_type__model="application", changed_object_id=str(tabular.pk)).latest("pk")
    assert change.actor_name == "router:edge-2" and change.changed_fields == ["released"]


def test_bad_requests_change_nothing(tabular, clients) -> None:
    operator = clients["operator"]
    missing = operator.post(URL, {"model": "nope", "action": "unload"}, format="json")
    assert missing.status_code == 400 and "failed to unload 'nope'" in str(missing.json()["error"])
    missing = operator.post(URL, {"model": "nope", "action": "load"}, format="json")
    assert missing.status_code == 400 and "failed to load 'nope': no application of that name" in str(missing.json()["error"])
    assert operator.post(URL, {"model": "tabular", "action": "delete"}, format="json").status_code == 400
    assert operator.post(URL, {"action": "unload"}, format="json").status_code == 400
    tabular.refresh_from_db()
    assert tabular.released is False and RoutingTable.objects.filter(application=tabular).count() == 1


def test_admins_change_a_routers_permission_without_rotating_its_secret(tabular, clients, users) -> None:
    """Issue 38: the permission to load models was switchable only in the admin; through the API an admin
    could only re-issue the credential, which rotated the secret and broke the running router."""
    credential, secret = router_credential_issue(name="edge-3")
    router = _token_client(secret)
    body = {"model": "tabular", "action": "unload"}
    assert router.post(URL, body, format="json").status_code == 403
    path = f"/api/v1/router-credentials/{credential.pk}/"
    for role in ("viewer", "operator"):
        assert clients[role].patch(path, {"may_load_models": True}, format="json").status_code == 403
    assert router.patch(path, {"may_load_models": True}, format="json").status_code == 403  # not its own to grant
    bad = clients["admin"].patch(path, {"may_load_model": True}, format="json")  # misspelt: refused, not ignored
    assert bad.status_code == 400 and "may_load_model" in bad.json()["error"]["fields"]
    assert clients["admin"].patch(path, {"may_load_models": "maybe"}, format="json").status_code == 400
    credential.refresh_from_db()
    assert credential.may_load_models is False
    changed = clients["admin"].patch(path, {"may_load_models": True}, format="json")
    assert changed.status_code == 200 and changed.json()["may_load_models"] is True and "token" not in changed.json()
    assert changed.json()["token_prefix"] == credential.token_prefix
    assert router.post(URL, body, format="json").status_code == 200  # the same secret, now allowed
    change = ObjectChange.objects.filter(changed_object_type__model="routercredential", changed_object_id=str(credential.pk)).latest("pk")
    assert change.changed_fields == ["may_load_models"] and change.user == users["admin"]
    assert clients["admin"].patch(path, {"may_load_models": True}, format="json").status_code == 200  # unchanged: no audit row
    assert ObjectChange.objects.filter(changed_object_type__model="routercredential", changed_object_id=str(credential.pk)).latest("pk") == change


def test_the_cli_changes_a_routers_permission_keeping_its_secret(tabular) -> None:
    from typer.testing import CliRunner

    from controlplane.cli import app

    credential, secret = router_credential_issue(name="edge-4")
    runner = CliRunner()
    result = runner.invoke(app, ["router-credential", "update", "edge-4", "--may-load-models"])
    assert result.exit_code == 0 and "may load models: yes" in result.output, result.output
    credential.refresh_from_db()
    assert credential.may_load_models is True
    assert _token_client(secret).post(URL, {"model": "tabular", "action": "unload"}, format="json").status_code == 200
    assert runner.invoke(app, ["router-credential", "update", "edge-4"]).exit_code == 2  # nothing to change
    assert runner.invoke(app, ["router-credential", "update", "nobody", "--may-load-models"]).exit_code != 0


def test_a_loads_configuration_is_applied_where_it_maps(tabular, clients) -> None:
    """Issue 38: a load's `parameters.config` was ignored with 200. Its max_batch_size caps the plans' batch
    and its dynamic batching delay picks Triton's batcher for the runtimes; audited; the next plan honours
    the cap (the snapshot leaves the larger profiled batches out)."""
    from apps.inventory.models import Host
    from apps.planning.snapshot import fleet_problem_build
    from apps.registry.models import Profile

    for variant in tabular.variants.all():
        for batch in (1, 4, 16):
            Profile.objects.create(variant=variant, device_type="cpu", cpu_cores=2, batch_size=batch, latency_p50_ms=1.0 + batch,
                                   latency_p99_ms=1.5 + batch, throughput_rps=1000.0 * batch / (1.0 + batch), source="measured")
    config = '{"name": "tabular", "platform": "onnxruntime_onnx", "max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 1500}, "input": [{"name": "input"}]}'
    response = clients["operator"].post(URL, {"model": "tabular", "action": "load", "config": config}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["changed"] is True and response.json()["max_batch_size"] == 4 and response.json()["batching_delay_ms"] == 1.5
    tabular.refresh_from_db()
    assert (tabular.max_batch_size, tabular.batching_delay_ms) == (4, 1.5)
    change = ObjectChange.objects.filter(changed_object_type__model="application", changed_object_id=str(tabular.pk)).latest("pk")
    assert set(change.changed_fields) == {"max_batch_size", "batching_delay_ms"}
    Host.objects.filter(name="h").update(status="online")
    snapshot = fleet_problem_build(demand={"tabular": 10.0})
    assert snapshot.problem is not None, (snapshot.notes, snapshot.left_out)
    assert {p.batch for p in snapshot.problem.profiles if p.variant.startswith("tabular")} == {1, 4}
    # Triton's 0 (no batching) caps the batch at one query; a configuration as an object is taken too.
    assert clients["operator"].post(URL, {"model": "tabular", "action": "load", "config": {"max_batch_size": 0}}, format="json").status_code == 200
    tabular.refresh_from_db()
    assert tabular.max_batch_size == 1


@pytest.mark.parametrize("config, field", [
    ('{"max_batch_size": 4, "instance_group": [{"count": 2}]}', "instance_group"),
    ('{"max_batch_size": -1}', "max_batch_size"),
    ('{"max_batch_size": 5000}', "max_batch_size"),
    ('{"dynamic_batching": {"preferred_batch_size": [4]}}', "dynamic_batching.preferred_batch_size"),
    ('{"dynamic_batching": {"max_queue_delay_microseconds": 20000000}}', "dynamic_batching.max_queue_delay_microseconds"),
    ('{"name": "other"}', "name"),
    ('{"platform": "tensorrt_plan"}', "platform"),
    ('{"input": [{"name": "pixels"}]}', "input[0].name"),
    ('{"sequence_batching": {}}', "sequence_batching"),
    ('{"max_batch_size": ', "config"),
    ('[1, 2]', "config"),
])
def test_a_configuration_that_does_not_map_is_refused_naming_the_field_and_changes_nothing(tabular, clients, config, field) -> None:
    application_release(application=tabular)
    response = clients["operator"].post(URL, {"model": "tabular", "action": "load", "config": config}, format="json")
    assert response.status_code == 400, response.content
    assert f"failed to load 'tabular': {field}:" in str(response.json()["error"]), response.json()
    tabular.refresh_from_db()
    assert tabular.released is True and tabular.max_batch_size is None and tabular.batching_delay_ms is None


def test_a_configuration_is_for_a_load_only(tabular, clients) -> None:
    response = clients["operator"].post(URL, {"model": "tabular", "action": "unload", "config": {"max_batch_size": 4}}, format="json")
    assert response.status_code == 400 and "applies to a load only" in str(response.json()["error"])
    tabular.refresh_from_db()
    assert tabular.released is False
