import pytest

from apps.core.models import ObjectChange
from tests.factories import HostFactory

pytestmark = pytest.mark.django_db


def test_api_changes_are_audited_with_actor_and_before_after(clients, users):
    op = clients["operator"]
    host_id = op.post("/api/v1/hosts/", {"name": "audited", "description": "first"}, format="json").json()["id"]
    op.patch(f"/api/v1/hosts/{host_id}/", {"description": "second"}, format="json")
    op.delete(f"/api/v1/hosts/{host_id}/")
    changes = list(ObjectChange.objects.filter(changed_object_type__model="host", changed_object_id=str(host_id)).order_by("id"))
    assert [c.action for c in changes] == ["create", "update", "delete"]
    assert all(c.user == users["operator"] and c.actor_kind == "user" and c.source == "web" for c in changes)
    create, update, delete = changes
    assert create.prechange_data is None and create.postchange_data["description"] == "first"
    assert update.prechange_data["description"] == "first" and update.postchange_data["description"] == "second"
    assert update.changed_fields == ["description"]
    assert delete.prechange_data["name"] == "audited" and delete.postchange_data is None
    # Secrets never reach the audit log.
    assert "agent_token_hash" not in create.postchange_data


def test_audit_log_api_filters(clients):
    clients["operator"].post("/api/v1/hosts/", {"name": "h-audit"}, format="json")
    clients["operator"].post("/api/v1/applications/", {"name": "a-audit"}, format="json")
    rows = clients["viewer"].get("/api/v1/object-changes/?object_type=inventory.host&action=create").json()["results"]
    assert [r["object_repr"] for r in rows] == ["h-audit"]
    assert rows[0]["actor_name"] == "operator" and rows[0]["object_type"] == "inventory.host"


def test_failed_request_leaves_no_audit_row(clients):
    before = ObjectChange.objects.count()
    assert clients["operator"].post("/api/v1/hosts/", {"name": "!!"}, format="json").status_code == 400
    assert ObjectChange.objects.count() == before


def test_admin_changes_are_audited(client, users):
    host = HostFactory(name="via-admin")
    users["admin"].is_staff = users["admin"].is_superuser = True
    users["admin"].save()
    client.force_login(users["admin"])
    response = client.post(
        f"/admin/inventory/host/{host.pk}/change/",
        {"name": "via-admin", "address": "", "labels": "{}", "status": "maintenance", "backend": "simulated", "description": "",
         "accelerators-TOTAL_FORMS": "0", "accelerators-INITIAL_FORMS": "0"},
    )
    assert response.status_code == 302, response.content[:2000]
    change = ObjectChange.objects.filter(changed_object_type__model="host", action="update").get()
    assert change.user == users["admin"] and change.postchange_data["status"] == "maintenance"
