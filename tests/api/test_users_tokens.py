import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from apps.users.models import Token

pytestmark = pytest.mark.django_db


def test_token_secret_shown_once_and_hashed(clients, users):
    response = clients["operator"].post("/api/v1/tokens/", {"description": "ci pipeline"}, format="json")
    assert response.status_code == 201
    secret = response.json()["key"]
    assert secret.startswith("tsu_")
    token = Token.objects.get(pk=response.json()["id"])
    assert secret not in (token.key_hash, token.display_prefix) and token.user == users["operator"]
    assert "key" not in clients["operator"].get(f"/api/v1/tokens/{token.pk}/").json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert client.get("/api/v1/hosts/").status_code == 200
    token.refresh_from_db()
    assert token.last_used is not None


def test_users_see_only_their_own_tokens(clients, users):
    own = {t["user"] for t in clients["viewer"].get("/api/v1/tokens/").json()["results"]}
    assert own == {users["viewer"].pk}
    everyone = {t["user"] for t in clients["admin"].get("/api/v1/tokens/").json()["results"]}
    assert everyone == {u.pk for u in users.values()}
    operator_token = Token.objects.filter(user=users["operator"]).first()
    assert clients["viewer"].delete(f"/api/v1/tokens/{operator_token.pk}/").status_code == 404


def test_only_admins_create_tokens_for_others(clients, users):
    denied = clients["operator"].post("/api/v1/tokens/", {"user": users["viewer"].pk}, format="json")
    assert denied.status_code == 403
    allowed = clients["admin"].post("/api/v1/tokens/", {"user": users["viewer"].pk, "description": "for viewer"}, format="json")
    assert allowed.status_code == 201 and allowed.json()["user"] == users["viewer"].pk


def test_read_only_token_refuses_writes(users):
    from apps.users.services import token_create

    _, secret = token_create(user=users["operator"], write_enabled=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/hosts/").status_code == 200
    response = client.post("/api/v1/hosts/", {"name": "x"}, format="json")
    assert response.status_code == 403 and "read-only" in response.json()["error"]["message"]


def test_expired_token(users):
    from datetime import timedelta

    from django.utils import timezone

    from apps.users.services import token_create

    _, secret = token_create(user=users["viewer"], expires=timezone.now() - timedelta(seconds=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = client.get("/api/v1/hosts/")
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]


def test_admin_manages_users_and_roles(clients):
    created = clients["admin"].post(
        "/api/v1/users/", {"username": "ci-bot", "role": "operator", "password": "a-Long-enough-pass-99"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["role"] == "operator" and "password" not in created.json()
    user = get_user_model().objects.get(username="ci-bot")
    assert user.has_perm("inventory.add_host") and not user.has_perm("auth.add_user")
    demoted = clients["admin"].patch(f"/api/v1/users/{user.pk}/", {"role": "viewer"}, format="json")
    assert demoted.json()["role"] == "viewer"
    user = get_user_model().objects.get(pk=user.pk)
    assert not user.has_perm("inventory.add_host") and user.has_perm("inventory.view_host")
    weak = clients["admin"].post("/api/v1/users/", {"username": "weak", "password": "123"}, format="json")
    assert weak.status_code == 400 and "password" in weak.json()["error"]["fields"]
