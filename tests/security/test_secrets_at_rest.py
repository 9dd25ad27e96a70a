"""Secrets at rest (issue 44, security): API tokens, agent tokens and router credentials are stored as SHA-256
hashes only. Each is made through its service and through the API (so the audit log has its rows, with the
request's context), then every row of every table of the database is read back as text: the secret is in
none of them, the hash is in its own column only (not in the audit log: `audit_exclude_fields`)."""
from __future__ import annotations

import pytest
from django.db import connection

from apps.core.models import ObjectChange
from apps.core.security import secrets_in_logs_find
from apps.inventory.models import Host, RouterCredential
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.users.models import Token
from apps.users.services import token_create
from apps.users.tokens import token_hash
from tests.factories import HostFactory

pytestmark = pytest.mark.django_db


def _database_text() -> str:
    """Every row of every table, one line each: `table: (column values...)`."""
    lines = []
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # nosec B608 - a table name the database listed, quoted
            lines += [f"{table}: {row!r}" for row in cursor.fetchall()]
    return "\n".join(lines)


@pytest.fixture
def made(users, clients):
    """{name: (secret, the model instance that holds its hash, the hash's column)}: one of each kind through
    its service, one through the API."""
    out = {}
    token, secret = token_create(user=users["operator"], description="at rest, service")
    out["API token (service)"] = (secret, token, "key_hash")
    created = clients["operator"].post("/api/v1/tokens/", {"description": "at rest, API"}, format="json").json()
    out["API token (API)"] = (created["key"], Token.objects.get(pk=created["id"]), "key_hash")

    host = HostFactory(name="at-rest-host")
    out["agent token (service)"] = (host_agent_token_rotate(host=host), host, "agent_token_hash")
    api_host = HostFactory(name="at-rest-api-host")
    rotated = clients["admin"].post(f"/api/v1/hosts/{api_host.pk}/agent-token/").json()
    out["agent token (API)"] = (rotated["token"], api_host, "agent_token_hash")

    credential, secret = router_credential_issue(name="at-rest-router")
    out["router credential (service)"] = (secret, credential, "token_hash")
    issued = clients["admin"].post("/api/v1/router-credentials/", {"name": "at-rest-api-router"}, format="json").json()
    out["router credential (API)"] = (issued["token"], RouterCredential.objects.get(pk=issued["id"]), "token_hash")
    for instance in (o for _, o, _ in out.values()):
        instance.refresh_from_db()
    return out


def test_every_secret_is_stored_as_its_hash_and_nowhere_in_the_database(made, clients):
    for name, (secret, instance, column) in made.items():
        assert getattr(instance, column) == token_hash(secret), name
        # The secret works (it is the real one), so its absence below is not for want of a real secret.
        assert type(instance).objects.filter(**{column: token_hash(secret)}).exists(), name
    assert clients["operator"].get("/api/v1/applications/").status_code == 200
    text = _database_text()
    assert "users_token" in text and "inventory_host" in text and "core_objectchange" in text
    findings = secrets_in_logs_find(text, {name: secret for name, (secret, _, _) in made.items()})
    assert findings == [], "\n".join(map(str, findings))


def test_the_audit_log_has_each_secrets_change_but_neither_the_secret_nor_its_hash(made):
    changes = ObjectChange.objects.all()
    audit = "\n".join(repr(row) for row in changes.values_list())
    for name, (secret, instance, column) in made.items():
        rows = changes.filter(changed_object_id=instance.pk, changed_object_type__model=type(instance)._meta.model_name)
        assert rows.exists(), f"{name}: no audit row"  # created, or the host's token prefix changed
        assert column not in {field for row in rows for field in row.changed_fields}, name
        assert token_hash(secret) not in audit and secret not in audit, name
    assert secrets_in_logs_find(audit, [secret for secret, _, _ in made.values()]) == []
    # What the audit log does show of a secret: its display prefix, too short to be one.
    assert Host.objects.get(name="at-rest-host").agent_token_prefix in audit
