import os

import pytest
from rest_framework.test import APIClient

from apps.inventory.services import host_agent_token_rotate
from apps.users.choices import RoleChoices
from apps.users.roles import roles_sync, user_role_set
from apps.users.services import token_create

from .factories import HostFactory, UserFactory

ROLES = (RoleChoices.VIEWER, RoleChoices.OPERATOR, RoleChoices.ADMIN)


def services_required() -> bool:
    """CI sets TESSERA_REQUIRE_SERVICES=1: then a missing PostgreSQL/Redis/worker fails the run instead of
    skipping the tests that need it."""
    return os.environ.get("TESSERA_REQUIRE_SERVICES") == "1"


def service_unavailable(reason: str) -> None:
    if services_required():
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(f"{reason} (set TESSERA_REQUIRE_SERVICES=1 to make this a failure)")


@pytest.fixture
def roles(db):
    roles_sync()


def _user(role: str):
    user = UserFactory(username=role)
    user_role_set(user, role)
    return user


@pytest.fixture
def users(roles):
    return {role: _user(role) for role in ROLES}


def _token_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def clients(users):
    """An API client per principal: anonymous, one per role (with a user API token), and two agents."""
    result = {"anonymous": APIClient()}
    for role, user in users.items():
        _, secret = token_create(user=user, description=f"{role} test token")
        result[role] = _token_client(secret)
    return result


@pytest.fixture
def agent_hosts(db):
    """Two hosts, each with its own agent token, and an API client for each agent."""
    hosts, agent_clients = [], []
    for name in ("agent-host-a", "agent-host-b"):
        host = HostFactory(name=name)
        agent_clients.append(_token_client(host_agent_token_rotate(host=host)))
        hosts.append(host)
    return hosts, agent_clients


@pytest.fixture(autouse=True)
def _media_root(settings, tmp_path):
    """Each test stores files in its own folder, so "nothing left behind" is checkable."""
    settings.MEDIA_ROOT = tmp_path / "media"
