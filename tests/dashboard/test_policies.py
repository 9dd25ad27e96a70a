"""The Policies page through Django's test client: viewers see every policy read-only; operators edit one
policy at a time through the same services as the API (audited; a re-planning policy's beat schedule
follows), and refused input comes back inline with status 400 and nothing saved."""
import json

import pytest
from django.contrib.contenttypes.models import ContentType
from django_celery_beat.models import PeriodicTask

from apps.core.models import ObjectChange
from apps.policies.models import ProfilingPolicy, ReplanPolicy, SloPolicy
from tests.factories import ModelVariantFactory, ReplanPolicyFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def policies(db):
    slo = SloPolicyFactory(application__name="image-classify", latency_p99_ms=60.0, min_accuracy=0.7, priority=40)
    ModelVariantFactory(application=slo.application, accuracy=0.8)
    replan = ReplanPolicyFactory(name="default", interval_seconds=300, demand_change_threshold=0.25)
    profiling = ProfilingPolicy.objects.create(name="gpus", device_types=["cpu"], batch_sizes=[1, 8])
    return {"slo": slo, "replan": replan, "profiling": profiling}


def _slo_form(policy: SloPolicy, **fields) -> dict:
    form = {"kind": "slo", "pk": str(policy.pk), "latency_p99_ms": str(policy.latency_p99_ms),
            "min_accuracy": "" if policy.min_accuracy is None else str(policy.min_accuracy), "priority": str(policy.priority),
            "drop_rule": policy.drop_rule}
    form.update(fields)
    return form


def _replan_form(policy: ReplanPolicy, **fields) -> dict:
    form = {"kind": "replan", "pk": str(policy.pk)}
    for name in ("interval_seconds", "demand_change_threshold", "debounce_seconds", "demand_window_seconds",
                 "forecast_horizon_seconds", "demand_memory_seconds", "host_lost_after_seconds"):
        form[name] = str(getattr(policy, name))
    for name in ("enabled", "auto_apply"):  # checkboxes: present when on
        if getattr(policy, name):
            form[name] = "on"
    form.update(fields)
    return {k: v for k, v in form.items() if v is not None}


def _snapshot(policy) -> dict:
    return type(policy).objects.get(pk=policy.pk).audit_snapshot()


def test_viewer_sees_policies_without_forms(client, users, policies):
    client.force_login(users["viewer"])
    response = client.get("/policies/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-policy="slo-%d"' % policies["slo"].pk in html and "image-classify" in html
    assert 'data-policy="replan-%d"' % policies["replan"].pk in html and 'data-policy="profiling-%d"' % policies["profiling"].pk in html
    assert "<dt>p99 latency SLO (ms)</dt><dd>60</dd>" in html and "<dt>Demand change threshold</dt><dd>0.25</dd>" in html
    assert "<dt>Batch sizes</dt><dd>1, 8</dd>" in html and "governs triggers" in html
    assert "<form" not in html.replace('<form class="logout"', "") and 'name="latency_p99_ms"' not in html
    assert 'href="/policies/" class="active"' in html


def test_viewer_post_is_forbidden_and_changes_nothing(client, users, policies):
    client.force_login(users["viewer"])
    before = _snapshot(policies["slo"])
    response = client.post("/policies/", _slo_form(policies["slo"], latency_p99_ms="99"))
    assert response.status_code == 403
    assert _snapshot(policies["slo"]) == before
    response = client.post("/policies/", _replan_form(policies["replan"], interval_seconds="900"))
    assert response.status_code == 403 and ReplanPolicy.objects.get(pk=policies["replan"].pk).interval_seconds == 300


def test_anonymous_is_sent_to_login(client):
    response = client.get("/policies/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_unknown_policy_is_404(client, users, policies):
    client.force_login(users["operator"])
    assert client.post("/policies/", {"kind": "slo", "pk": "424242"}).status_code == 404
    assert client.post("/policies/", {"kind": "nonsense", "pk": str(policies["slo"].pk)}).status_code == 404


def test_operator_edits_an_slo_and_it_is_saved_and_audited(client, users, policies):
    client.force_login(users["operator"])
    slo = policies["slo"]
    html = client.get("/policies/").content.decode()
    assert f'id="id_slo{slo.pk}_latency_p99_ms"' in html and 'name="save"' in html
    response = client.post("/policies/", _slo_form(slo, latency_p99_ms="75.5", priority="70", drop_rule="slo-2x"), follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/policies/"
    assert "SLO policy of image-classify saved." in response.content.decode()
    slo.refresh_from_db()
    assert slo.latency_p99_ms == 75.5 and slo.priority == 70 and slo.drop_rule == "slo-2x" and slo.min_accuracy == 0.7
    change = ObjectChange.objects.filter(changed_object_type=ContentType.objects.get_for_model(SloPolicy),
                                         changed_object_id=str(slo.pk), action="update").first()
    assert change is not None and change.user == users["operator"] and change.actor_name == "operator"
    assert change.source == "web" and change.changed_fields == ["drop_rule", "latency_p99_ms", "priority"]


def test_an_operator_declares_the_demand_a_new_application_is_planned_for(client, users, policies):
    client.force_login(users["operator"])
    slo = policies["slo"]
    assert client.post("/policies/", _slo_form(slo, expected_rps="40", scale_to_zero="on")).status_code == 302
    slo.refresh_from_db()
    assert slo.expected_rps == 40.0 and slo.scale_to_zero is True
    response = client.post("/policies/", _slo_form(slo, expected_rps="-1"))
    assert response.status_code == 400 and 'data-error-field="expected_rps">' in response.content.decode()
    slo.refresh_from_db()
    assert slo.expected_rps == 40.0


def test_empty_minimum_accuracy_clears_it(client, users, policies):
    client.force_login(users["operator"])
    response = client.post("/policies/", _slo_form(policies["slo"], min_accuracy=""))
    assert response.status_code == 302
    assert SloPolicy.objects.get(pk=policies["slo"].pk).min_accuracy is None


@pytest.mark.parametrize("fields, field, text", [
    ({"latency_p99_ms": "-5"}, "latency_p99_ms", "greater than or equal to 0.001"),
    ({"latency_p99_ms": "fast"}, "latency_p99_ms", "Enter a number."),
    ({"priority": "101"}, "priority", "less than or equal to 100"),
    ({"drop_rule": "sometimes"}, "drop_rule", "Select a valid choice."),
    ({"min_accuracy": "0.95"}, "min_accuracy", "best is 0.8"),  # the model's clean(): no variant reaches it
])
def test_invalid_slo_is_shown_inline_and_nothing_changes(client, users, policies, fields, field, text):
    client.force_login(users["operator"])
    slo = policies["slo"]
    before, changes = _snapshot(slo), ObjectChange.objects.count()
    response = client.post("/policies/", _slo_form(slo, **fields))
    assert response.status_code == 400
    html = response.content.decode()
    assert "data-policy-errors" in html and f'data-error-field="{field}">' in html and text in html
    for name, value in fields.items():  # the form keeps what was typed
        if name != "drop_rule":
            assert f'value="{value}"' in html and f'id="id_slo{slo.pk}_{name}"' in html
    assert _snapshot(slo) == before and ObjectChange.objects.count() == changes


def test_replan_edit_has_the_api_effect_on_the_beat_schedule(client, users, clients, policies):
    """The same edit through the page and through the API leaves the same periodic re-plan."""
    page_policy, api_policy = policies["replan"], ReplanPolicyFactory(name="zz-api", interval_seconds=300)
    client.force_login(users["operator"])
    response = client.post("/policies/", _replan_form(page_policy, interval_seconds="900", demand_change_threshold="0.5",
                                                      auto_apply="on", enabled=None))
    assert response.status_code == 302
    response = clients["operator"].patch(f"/api/v1/replan-policies/{api_policy.pk}/",
                                         {"interval_seconds": 900, "demand_change_threshold": 0.5, "auto_apply": True, "enabled": False},
                                         format="json")
    assert response.status_code == 200
    page_policy.refresh_from_db()
    api_policy.refresh_from_db()
    fields = ("enabled", "interval_seconds", "demand_change_threshold", "auto_apply", "debounce_seconds")
    assert [getattr(page_policy, f) for f in fields] == [getattr(api_policy, f) for f in fields] == [False, 900, 0.5, True, 60]
    page_task, api_task = PeriodicTask.objects.get(name="replan:default"), PeriodicTask.objects.get(name="replan:zz-api")
    assert json.loads(page_task.kwargs) == {"policy_id": page_policy.pk}
    for task in (page_task, api_task):
        assert task.task == "planning.replan_periodic" and task.interval.every == 900 and task.enabled is False
        assert task.expire_seconds == 900
    assert ObjectChange.objects.filter(changed_object_type=ContentType.objects.get_for_model(ReplanPolicy),
                                       changed_object_id=str(page_policy.pk), user=users["operator"], source="web").exists()


def test_invalid_replan_is_refused_and_the_schedule_stays(client, users, policies):
    client.force_login(users["operator"])
    policy = policies["replan"]
    before = _snapshot(policy)
    for fields, field in (({"interval_seconds": "5"}, "interval_seconds"), ({"debounce_seconds": "-1"}, "debounce_seconds"),
                          ({"demand_change_threshold": "0"}, "demand_change_threshold")):
        response = client.post("/policies/", _replan_form(policy, **fields))
        assert response.status_code == 400
        html = response.content.decode()
        assert f'data-error-field="{field}">' in html and f'value="{fields[field]}"' in html
    assert _snapshot(policy) == before and PeriodicTask.objects.get(name="replan:default").interval.every == 300


def test_replan_headroom_target_is_edited_on_the_page_and_kept_when_not_sent(client, users, policies):
    client.force_login(users["operator"])
    policy = policies["replan"]
    assert client.post("/policies/", _replan_form(policy, headroom_target="1.5")).status_code == 302
    policy.refresh_from_db()
    assert policy.headroom_target == 1.5
    assert client.post("/policies/", _replan_form(policy, interval_seconds="600")).status_code == 302  # not sent: kept
    policy.refresh_from_db()
    assert (policy.interval_seconds, policy.headroom_target) == (600, 1.5)
    before = _snapshot(policy)
    response = client.post("/policies/", _replan_form(policy, headroom_target="0.5"))
    assert response.status_code == 400 and 'data-error-field="headroom_target">' in response.content.decode()
    assert _snapshot(policy) == before


def test_operator_edits_a_profiling_policy(client, users, policies):
    client.force_login(users["operator"])
    policy = policies["profiling"]
    form = {"kind": "profiling", "pk": str(policy.pk), "enabled": "on", "device_types": " cpu , A100-SXM4-40GB",
            "slices": "", "batch_sizes": "16, 1, 4", "cpu_threads": "", "timeout_s": "600"}
    assert client.post("/policies/", form).status_code == 302
    policy.refresh_from_db()
    assert policy.device_types == ["cpu", "A100-SXM4-40GB"] and policy.batch_sizes == [1, 4, 16] and policy.timeout_s == 600
    assert policy.auto_profile_new_variants is False  # its checkbox was not sent
    response = client.post("/policies/", {**form, "batch_sizes": "1, two"})
    assert response.status_code == 400 and "Enter whole numbers separated by commas." in response.content.decode()
    response = client.post("/policies/", {**form, "batch_sizes": "1, 1"})
    assert response.status_code == 400 and "A value is listed twice." in response.content.decode()
    assert 'value="1, 1"' in response.content.decode()
    policy.refresh_from_db()
    assert policy.batch_sizes == [1, 4, 16]


def test_api_update_goes_through_the_service(clients, policies):
    """The API's validation is unchanged: refused values still come back by field."""
    response = clients["operator"].patch(f"/api/v1/slo-policies/{policies['slo'].pk}/", {"latency_p99_ms": -1}, format="json")
    assert response.status_code == 400 and "latency_p99_ms" in response.json()["error"]["fields"]
    response = clients["operator"].patch(f"/api/v1/slo-policies/{policies['slo'].pk}/", {"latency_p99_ms": 42}, format="json")
    assert response.status_code == 200 and response.json()["latency_p99_ms"] == 42
