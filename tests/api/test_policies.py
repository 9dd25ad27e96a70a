import pytest

from apps.policies.models import ReplanPolicy, SloPolicy
from tests.factories import ApplicationFactory, ModelVariantFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"latency_p99_ms": -5}, "latency_p99_ms"),
        ({"latency_p99_ms": 0}, "latency_p99_ms"),
        ({"min_accuracy": 1.5}, "min_accuracy"),
        ({"priority": 101}, "priority"),
        ({"drop_rule": "sometimes"}, "drop_rule"),
        ({"application": 424242}, "application"),
        ({"expected_rps": -1}, "expected_rps"),
        ({"expected_rps": "lots"}, "expected_rps"),
        ({"scale_to_zero": "maybe"}, "scale_to_zero"),
    ],
)
def test_slo_bad_input(clients, payload, field):
    body = {"application": ApplicationFactory().pk, "latency_p99_ms": 50, **payload}
    response = clients["operator"].post("/api/v1/slo-policies/", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert not SloPolicy.objects.exists()


def test_slo_min_accuracy_must_be_reachable(clients):
    variant = ModelVariantFactory(accuracy=0.7)
    response = clients["operator"].post(
        "/api/v1/slo-policies/", {"application": variant.application_id, "latency_p99_ms": 50, "min_accuracy": 0.8}, format="json"
    )
    assert response.status_code == 400 and "best is 0.7" in response.json()["error"]["message"]


def test_one_slo_per_application(clients):
    policy = SloPolicyFactory()
    response = clients["operator"].post("/api/v1/slo-policies/", {"application": policy.application_id, "latency_p99_ms": 10}, format="json")
    assert response.status_code == 400


def test_slo_update(clients):
    policy = SloPolicyFactory()
    response = clients["operator"].patch(f"/api/v1/slo-policies/{policy.pk}/", {"latency_p99_ms": 75, "drop_rule": "slo-2x"}, format="json")
    assert response.status_code == 200
    policy.refresh_from_db()
    assert policy.latency_p99_ms == 75 and policy.drop_rule == "slo-2x"


@pytest.mark.parametrize("payload,field", [({"interval_seconds": 5}, "interval_seconds"), ({"demand_change_threshold": 0}, "demand_change_threshold"),
                                           ({"demand_memory_seconds": 10}, "demand_memory_seconds"),
                                           ({"headroom_target": 0.5}, "headroom_target"), ({"headroom_target": 11}, "headroom_target")])
def test_replan_bad_input(clients, payload, field):
    response = clients["operator"].post("/api/v1/replan-policies/", {"name": "fast", **payload}, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert not ReplanPolicy.objects.exists()
