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
    assert loaded == {"model": "tabular", "action": "load", "released": False, "changed": True, "routing_table_version": active.version}


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
    assert missing.status_code == 404 and "unknown model: 'nope'" in missing.json()["error"]["message"]
    assert operator.post(URL, {"model": "tabular", "action": "delete"}, format="json").status_code == 400
    assert operator.post(URL, {"action": "unload"}, format="json").status_code == 400
    tabular.refresh_from_db()
    assert tabular.released is False and RoutingTable.objects.filter(application=tabular).count() == 1
