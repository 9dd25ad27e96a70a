"""Ensemble policies (issue 20): the API over `ensemble_policy_set`, the engine's rules as 400s by field with
nothing stored, members replaced as a whole, the audit record with the members before and after, the
permission matrix, and a member variant that cannot be deleted under its policy."""
import pytest
from django.contrib.contenttypes.models import ContentType

from apps.core.context import change_context
from apps.core.models import ObjectChange
from apps.policies.models import EnsembleMember, EnsemblePolicy
from apps.policies.services import ensemble_policy_delete, ensemble_policy_set
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/ensemble-policies/"


@pytest.fixture
def pool(db):
    """An application with four variants, and another application's variant."""
    application = ApplicationFactory(name="robust")
    variants = [ModelVariantFactory(application=application, name=n) for n in ("a", "b", "c", "d")]
    return {"application": application, "variants": {v.name: v for v in variants}, "foreign": ModelVariantFactory(name="elsewhere")}


def _body(pool, **fields):
    v = pool["variants"]
    body = {
        "application": pool["application"].pk, "mode": "random", "min_size": 2, "max_size": 3, "vote": "soft",
        "members": [{"variant": "a", "probability": 0.4, "weight": 2}, {"variant": v["b"].pk, "probability": 0.3},
                    {"variant": "c", "probability": 0.2}, {"variant": "d", "probability": 0.1, "weight": 0.5}],
    }
    body.update(fields)
    return body


def _changes(policy_pk):
    return ObjectChange.objects.filter(changed_object_type=ContentType.objects.get_for_model(EnsemblePolicy), changed_object_id=str(policy_pk))


def test_create_by_id_and_name_and_read_back(clients, pool, users):
    response = clients["operator"].post(URL, _body(pool), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    v = pool["variants"]
    assert data["mode"] == "random" and (data["min_size"], data["max_size"]) == (2, 3) and data["vote"] == "soft" and data["scheduler"] == ""
    assert data["members"] == [
        {"variant": "a", "variant_id": v["a"].pk, "probability": 0.4, "weight": 2.0},
        {"variant": "b", "variant_id": v["b"].pk, "probability": 0.3, "weight": 1.0},
        {"variant": "c", "variant_id": v["c"].pk, "probability": 0.2, "weight": 1.0},
        {"variant": "d", "variant_id": v["d"].pk, "probability": 0.1, "weight": 0.5},
    ]
    assert data["display"] == "robust: random ensemble"
    assert clients["viewer"].get(f"{URL}{data['id']}/").json() == data
    listing = clients["viewer"].get(URL, {"application": pool["application"].pk, "mode": "random"}).json()
    assert [p["id"] for p in listing["results"]] == [data["id"]]
    assert clients["viewer"].get(URL, {"mode": "learned"}).json()["count"] == 0
    assert clients["viewer"].get(URL, {"application_name": "robust"}).json()["count"] == 1
    change = _changes(data["id"]).get()
    assert change.action == "create" and change.user == users["operator"] and change.prechange_data is None
    assert change.postchange_data["members"][0] == {"variant": "a", "variant_id": v["a"].pk, "probability": 0.4, "weight": 2.0}
    assert change.postchange_data["mode"] == "random" and change.postchange_data["max_size"] == 3


def test_max_size_defaults_to_every_drawable_member(clients, pool):
    body = _body(pool)
    del body["min_size"], body["max_size"]
    body["members"][3]["probability"], body["members"][2]["probability"] = 0.0, 0.3
    response = clients["operator"].post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["min_size"], response.json()["max_size"]) == (1, 3)


@pytest.mark.parametrize("fields, field, text", [
    ({"members": [{"variant": "a", "probability": 0.5}, {"variant": "b", "probability": 0.6}]}, "members", "sum to 1"),
    ({"members": [{"variant": "a", "probability": 1.5}, {"variant": "b", "probability": -0.5}]}, "members", "in [0, 1]"),
    ({"members": [{"variant": "a", "probability": 1.0, "weight": 0}]}, "members", "weight: must be a number > 0"),
    ({"members": [{"variant": "a", "probability": 0.5}, {"variant": "a", "probability": 0.5}]}, "members", "listed twice"),
    ({"members": [{"variant": "elsewhere", "probability": 1.0}]}, "members", "is not a variant of robust"),
    ({"members": [{"variant": 424242, "probability": 1.0}]}, "members", "is not a variant of robust"),
    ({"members": [{"variant": True, "probability": 1.0}]}, "members", "id (a whole number) or its name"),
    ({"members": []}, "members", "at least one is needed"),
    ({"min_size": 3, "max_size": 2}, "max_size", "need 1 <= min_size <= max_size <= 4"),
    ({"min_size": 0}, "min_size", "need 1 <= min_size"),
    ({"max_size": 5}, "max_size", "max_size <= 4"),
    ({"mode": "single"}, "min_size", "single-variant policy"),
    ({"mode": "learned"}, "scheduler", "a learned policy needs the scheduler"),
    ({"mode": "sometimes"}, "mode", "is not a valid choice"),
    ({"vote": "loud"}, "vote", "is not a valid choice"),
    ({"application": 424242}, "application", "Invalid pk"),
])
def test_bad_input_is_a_400_by_field_and_stores_nothing(clients, pool, fields, field, text):
    response = clients["operator"].post(URL, _body(pool, **fields), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert text in str(error["fields"][field]), error
    assert not EnsemblePolicy.objects.exists() and not EnsembleMember.objects.exists()


def test_one_policy_per_application(clients, pool):
    assert clients["operator"].post(URL, _body(pool), format="json").status_code == 201
    again = clients["operator"].post(URL, _body(pool), format="json")
    assert again.status_code == 400 and "application" in again.json()["error"]["fields"]


def test_patch_keeps_what_it_leaves_out_and_replaces_members_whole(clients, pool, users):
    pk = clients["operator"].post(URL, _body(pool), format="json").json()["id"]
    response = clients["operator"].patch(f"{URL}{pk}/", {"vote": "hard"}, format="json")
    assert response.status_code == 200 and response.json()["vote"] == "hard" and len(response.json()["members"]) == 4
    response = clients["operator"].patch(f"{URL}{pk}/", {
        "members": [{"variant": "a", "probability": 0.5}, {"variant": "c", "probability": 0.5}], "min_size": 1, "max_size": 2}, format="json")
    assert response.status_code == 200, response.content
    assert [m["variant"] for m in response.json()["members"]] == ["a", "c"] and response.json()["vote"] == "hard"
    assert EnsembleMember.objects.filter(policy_id=pk).count() == 2
    update = _changes(pk).filter(action="update").order_by("time", "id").last()
    assert [m["variant"] for m in update.prechange_data["members"]] == ["a", "b", "c", "d"]
    assert [m["variant"] for m in update.postchange_data["members"]] == ["a", "c"]
    assert update.user == users["operator"] and set(update.changed_fields) == {"members", "max_size", "min_size"}

    # Refused: nothing changes, not even the members.
    bad = clients["operator"].patch(f"{URL}{pk}/", {"members": [{"variant": "d", "probability": 1.0}], "max_size": 2}, format="json")
    assert bad.status_code == 400 and "max_size" in bad.json()["error"]["fields"]
    assert [m.variant.name for m in EnsemblePolicy.objects.get(pk=pk).member_list()] == ["a", "c"]

    # PUT: the defaults for what it leaves out.
    put = clients["operator"].put(f"{URL}{pk}/", {"application": pool["application"].pk, "members": [{"variant": "b", "probability": 1}]},
                                  format="json")
    assert put.status_code == 200, put.content
    assert put.json()["vote"] == "soft" and put.json()["mode"] == "random" and put.json()["max_size"] == 1


def test_a_policy_stays_with_its_application(clients, pool):
    pk = clients["operator"].post(URL, _body(pool), format="json").json()["id"]
    other = ModelVariantFactory(name="a").application
    response = clients["operator"].patch(f"{URL}{pk}/", {"application": other.pk}, format="json")
    assert response.status_code == 400 and "application" in response.json()["error"]["fields"]


def test_delete_is_audited_with_the_members(clients, pool):
    pk = clients["operator"].post(URL, _body(pool), format="json").json()["id"]
    assert clients["operator"].delete(f"{URL}{pk}/").status_code == 204
    assert not EnsemblePolicy.objects.exists() and not EnsembleMember.objects.exists()
    deleted = _changes(pk).get(action="delete")
    assert len(deleted.prechange_data["members"]) == 4 and deleted.postchange_data is None


@pytest.mark.parametrize("principal, read, write", [("anonymous", 401, 401), ("viewer", 200, 403), ("operator", 200, 201), ("admin", 200, 201)])
def test_permissions(clients, pool, principal, read, write):
    assert clients[principal].get(URL).status_code == read
    assert clients[principal].post(URL, _body(pool), format="json").status_code == write


def test_agents_and_routers_cannot_reach_it(agent_hosts, pool):
    _hosts, (agent, _other) = agent_hosts
    assert agent.get(URL).status_code == 403
    assert agent.post(URL, _body(pool), format="json").status_code == 403


def test_a_member_variant_is_not_deleted_under_its_policy(clients, pool):
    clients["operator"].post(URL, _body(pool), format="json")
    variant = pool["variants"]["b"]
    response = clients["operator"].delete(f"/api/v1/variants/{variant.pk}/")
    assert response.status_code == 409 and "ensemble member" in response.json()["error"]["message"]
    assert EnsembleMember.objects.filter(variant=variant).exists()
    # Deleting the application takes the policy, its members and its variants together.
    assert clients["operator"].delete(f"/api/v1/applications/{pool['application'].pk}/").status_code == 204
    assert not EnsemblePolicy.objects.exists() and not EnsembleMember.objects.exists()


def test_the_service_with_an_actor_outside_a_request(pool, users):
    policy = ensemble_policy_set(application=pool["application"], data={"members": {"a": 0.5, "b": 0.5}}, actor=users["admin"])
    assert (policy.mode, policy.min_size, policy.max_size) == ("random", 1, 2)
    change = _changes(policy.pk).get()
    assert change.user == users["admin"] and change.source == "system"
    with change_context(source="command"):
        same = ensemble_policy_set(application=pool["application"], data={"members": {"a": 0.5, "b": 0.5}})
    assert same.pk == policy.pk and _changes(policy.pk).count() == 1  # nothing changed: no record
    ensemble_policy_delete(policy=same, actor=users["operator"])
    assert _changes(policy.pk).get(action="delete").user == users["operator"]


def _admin_form(pool, members, **fields):
    form = {"application": str(pool["application"].pk), "mode": "random", "min_size": "1", "max_size": "2", "vote": "soft", "scheduler": "",
            "members-TOTAL_FORMS": str(len(members)), "members-INITIAL_FORMS": "0", "members-MIN_NUM_FORMS": "0", "members-MAX_NUM_FORMS": "1000"}
    for i, (name, probability) in enumerate(members):
        form.update({f"members-{i}-variant": str(pool["variants"][name].pk), f"members-{i}-probability": str(probability),
                     f"members-{i}-weight": "1"})
    form.update(fields)
    return form


def test_the_admin_saves_through_the_same_checks(client, users, pool):
    users["admin"].is_staff = users["admin"].is_superuser = True
    users["admin"].save()
    client.force_login(users["admin"])
    refused = client.post("/admin/policies/ensemblepolicy/add/", _admin_form(pool, [("a", 0.5), ("b", 0.6)]))
    assert refused.status_code == 200 and b"sum to 1" in refused.content
    assert not EnsemblePolicy.objects.exists()
    created = client.post("/admin/policies/ensemblepolicy/add/", _admin_form(pool, [("a", 0.5), ("b", 0.5)]))
    assert created.status_code == 302, created.content[:3000]
    policy = EnsemblePolicy.objects.get()
    assert [(m.variant.name, m.probability) for m in policy.member_list()] == [("a", 0.5), ("b", 0.5)] and policy.max_size == 2
    assert _changes(policy.pk).get().user == users["admin"]
    assert client.get("/admin/policies/ensemblepolicy/").status_code == 200
    assert client.get(f"/admin/policies/ensemblepolicy/{policy.pk}/change/").status_code == 200
    form = _admin_form(pool, [("c", 0.25), ("d", 0.75)], max_size="1", vote="hard")
    form.pop("application")  # read-only once created
    changed = client.post(f"/admin/policies/ensemblepolicy/{policy.pk}/change/", form)
    assert changed.status_code == 302, changed.content[:3000]
    policy = EnsemblePolicy.objects.get()
    assert [m.variant.name for m in policy.member_list()] == ["c", "d"] and (policy.max_size, policy.vote) == (1, "hard")


def test_routing_tables_carry_a_random_or_learned_policy(clients, pool):
    from apps.deployments.services import routing_table_publish

    routing_table_publish(application=pool["application"], routes=[])
    lone = ModelVariantFactory(name="lone").application
    routing_table_publish(application=lone, routes=[])

    def tables():
        response = clients["viewer"].get("/api/v1/routing-tables/", {"active": "true"})
        assert response.status_code == 200
        return {t["application"]: t["ensemble"] for t in response.json()["results"]}

    assert tables() == {"robust": None, lone.name: None}
    clients["operator"].post(URL, _body(pool), format="json")
    v = pool["variants"]
    assert tables() == {lone.name: None, "robust": {
        "mode": "random", "min_size": 2, "max_size": 3, "vote": "soft",
        "members": [{"variant": "a", "variant_id": v["a"].pk, "probability": 0.4, "weight": 2.0},
                    {"variant": "b", "variant_id": v["b"].pk, "probability": 0.3, "weight": 1.0},
                    {"variant": "c", "variant_id": v["c"].pk, "probability": 0.2, "weight": 1.0},
                    {"variant": "d", "variant_id": v["d"].pk, "probability": 0.1, "weight": 0.5}]}}
    ensemble_policy_set(application=pool["application"], data={"mode": "learned", "scheduler": "garrison-table1.onnx", "members": {"a": 1.0}})
    assert tables()["robust"] == {"mode": "learned", "min_size": 1, "max_size": 1, "vote": "soft", "scheduler": "garrison-table1.onnx",
                                  "members": [{"variant": "a", "variant_id": v["a"].pk, "probability": 1.0, "weight": 1.0}]}
    ensemble_policy_set(application=pool["application"], data={"mode": "single", "members": {"a": 1.0}})
    assert tables()["robust"] is None  # one variant per query: as without a policy


def test_routers_read_the_ensemble_with_their_tables(clients, pool, django_assert_max_num_queries):
    from apps.deployments.services import routing_table_publish

    from tests.conftest import _token_client

    credential = clients["admin"].post("/api/v1/router-credentials/", {"name": "router-1"}, format="json").json()
    router = _token_client(credential["token"])
    for k in range(3):
        application = ApplicationFactory(name=f"pool-{k}")
        for name in ("x", "y"):
            ModelVariantFactory(application=application, name=name)
        ensemble_policy_set(application=application, data={"members": {"x": 0.5, "y": 0.5}})
        routing_table_publish(application=application, routes=[])
    router.get("/api/v1/routing-tables/?active=true")  # warm: the router principal's permissions
    with django_assert_max_num_queries(12):  # the members are prefetched, not read per table
        tables = router.get("/api/v1/routing-tables/?active=true").json()["results"]
    assert [len(t["ensemble"]["members"]) for t in tables] == [2, 2, 2]
