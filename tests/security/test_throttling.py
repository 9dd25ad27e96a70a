"""The API's rate limits (issue 44, security): creating API tokens is limited per user (REST framework's
throttling in the shared cache, apps/core/api/throttling.py), and refused bearer secrets (API tokens, agent
tokens, router credentials) slow their client address down (apps/users/services.py, "API authentication
throttling"): past the free failures every secret from that address waits, refused 429 with Retry-After
unchecked, while the right secret from anywhere else goes on working; the waits end. Password sign-ins:
tests/dashboard/test_login_throttle.py."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from rest_framework.test import APIClient

from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.users.choices import CredentialKindChoices
from apps.users.models import ApiAuthFailure, Token
from apps.users.services import (
    API_AUTH_DELAY_MAX_S,
    API_AUTH_FREE_FAILURES,
    api_auth_failure_wait,
    token_create,
)
from tests.conftest import service_unavailable
from tests.deploy.commands import REPO
from tests.factories import HostFactory

GUESSER, NEIGHBOUR = "10.9.0.66", "10.9.0.7"


def _client(secret: str | None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _age(seconds: float) -> None:
    """The recorded refusals, `seconds` older (the test's clock)."""
    ApiAuthFailure.objects.update(created=timezone.now() - timedelta(seconds=seconds))


def _assert_throttled(response) -> int:
    """A 429 in the API's error shape with its Retry-After; returns the wait."""
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["status"] == 429 and error["code"] == "throttled" and "Expected available in" in error["message"]
    wait = int(response["Retry-After"])
    assert wait >= 1
    return wait


# --------------------------------------------------------------------------- refused secrets, per address


@pytest.fixture
def credentials(users):
    """A right secret of each kind, each with a path it may read."""
    host = HostFactory(name="throttle-host")
    _, router_secret = router_credential_issue(name="throttle-router")
    return {
        "api token": (token_create(user=users["operator"])[1], "/api/v1/applications/"),
        "agent token": (host_agent_token_rotate(host=host), f"/api/v1/hosts/{host.pk}/"),
        "router credential": (router_secret, "/api/v1/routing-tables/"),
    }


WRONG = {"api token": "tsu_" + "x" * 43, "agent token": "tsa_" + "y" * 43, "router credential": "tsr_" + "z" * 43}


@pytest.mark.django_db
def test_guessing_any_kind_of_secret_is_slowed_down_and_the_right_one_waits_too(credentials, caplog):
    kinds = list(credentials)
    caplog.set_level(logging.WARNING, logger="tessera.security")
    # Free failures, of all three kinds (one count per address): each a 401.
    for i in range(API_AUTH_FREE_FAILURES):
        kind = kinds[i % 3]
        assert _client(WRONG[kind]).get(credentials[kind][1], REMOTE_ADDR=GUESSER).status_code == 401
    assert ApiAuthFailure.objects.filter(address=GUESSER).count() == API_AUTH_FREE_FAILURES
    assert {f.kind for f in ApiAuthFailure.objects.all()} == set(CredentialKindChoices.values)
    # The next attempt waits, whatever the secret: wrong ones are refused unchecked and not counted, and a right
    # one is refused too (the guesser cannot tell it was right).
    for kind in kinds:
        _assert_throttled(_client(WRONG[kind]).get(credentials[kind][1], REMOTE_ADDR=GUESSER))
        _assert_throttled(_client(credentials[kind][0]).get(credentials[kind][1], REMOTE_ADDR=GUESSER))
    assert ApiAuthFailure.objects.filter(address=GUESSER).count() == API_AUTH_FREE_FAILURES
    # The right secrets from another address go on working.
    for kind in kinds:
        secret, path = credentials[kind]
        assert _client(secret).get(path, REMOTE_ADDR=NEIGHBOUR).status_code == 200, kind
    # Requests without a secret (a session, an anonymous one) are not this throttle's.
    assert _client(None).get("/api/v1/applications/", REMOTE_ADDR=GUESSER).status_code in (401, 403)
    # The wait (2^0 s after the 10th failure) ends: the right secret works from the guesser's address again.
    _age(2)
    for kind in kinds:
        secret, path = credentials[kind]
        assert _client(secret).get(path, REMOTE_ADDR=GUESSER).status_code == 200, kind
    # Each refusal is a WARNING naming the kind and the address, never the secret.
    warnings = [r.getMessage() for r in caplog.records if r.name == "tessera.security"]
    assert len(warnings) == API_AUTH_FREE_FAILURES and f"(Agent token) from {GUESSER}" in " ".join(warnings)
    assert not any(WRONG[kind] in message or WRONG[kind][4:] in message for message in warnings for kind in kinds)


@pytest.mark.django_db
def test_the_wait_doubles_with_each_checked_failure_up_to_the_cap_and_the_window_forgets():
    now = timezone.now()
    ApiAuthFailure.objects.bulk_create([ApiAuthFailure(address=GUESSER, kind=CredentialKindChoices.API_TOKEN, created=now)
                                        for _ in range(API_AUTH_FREE_FAILURES + 3)])
    assert 7.0 < api_auth_failure_wait(address=GUESSER) <= 8.0  # 2^(13 - 10) s after the last
    assert api_auth_failure_wait(address=NEIGHBOUR) == 0.0 and api_auth_failure_wait(address=None) == 0.0
    ApiAuthFailure.objects.bulk_create([ApiAuthFailure(address=GUESSER, kind=CredentialKindChoices.API_TOKEN, created=now)
                                        for _ in range(20)])
    assert API_AUTH_DELAY_MAX_S - 1 < api_auth_failure_wait(address=GUESSER) <= API_AUTH_DELAY_MAX_S
    _age(16 * 60)  # refusals older than the window no longer count
    assert api_auth_failure_wait(address=GUESSER) == 0.0


@pytest.mark.django_db
def test_a_success_does_not_forgive_the_address(credentials):
    """One valid token of the guesser's own must not reset the count between guesses at others'."""
    own, path = credentials["api token"]
    for _ in range(API_AUTH_FREE_FAILURES - 1):
        assert _client(WRONG["agent token"]).get(path, REMOTE_ADDR=GUESSER).status_code == 401
    assert _client(own).get(path, REMOTE_ADDR=GUESSER).status_code == 200
    assert _client(WRONG["agent token"]).get(path, REMOTE_ADDR=GUESSER).status_code == 401
    _assert_throttled(_client(WRONG["agent token"]).get(path, REMOTE_ADDR=GUESSER))


@pytest.mark.django_db(transaction=True)  # the metrics fast path's writer thread has its own connection
def test_the_agents_metrics_fast_path_does_not_check_secrets_for_an_address_that_waits():
    """The fast path (apps/telemetry/ingest.py) checks agent tokens in its own batches: an address that must
    wait is handed to Django, which refuses it unchecked, so the right token there is no oracle either."""
    from apps.telemetry import ingest
    from apps.telemetry.ingest import MetricsIngestApplication
    from tests.api.test_telemetry import metrics
    from tests.api.test_telemetry_ingest import Spy, post  # its client address: 127.0.0.1

    ingest._batcher = None
    host = HostFactory(name="fast-path-host")
    token = host_agent_token_rotate(host=host)
    application = MetricsIngestApplication(Spy())
    path = f"/api/v1/hosts/{host.pk}/metrics/"
    assert asyncio.run(post(application, path, metrics(), token))[0] == 201
    for _ in range(API_AUTH_FREE_FAILURES):
        assert asyncio.run(post(application, path, metrics(), WRONG["agent token"]))[0] == 401
    status, headers, body = asyncio.run(post(application, path, metrics(), token))
    assert (status, body["error"]["code"]) == (429, "throttled")
    assert int({k.lower(): v for k, v in headers.items()}["retry-after"]) >= 1


# --------------------------------------------------------------------------- creating API tokens, per user


def _create(client: APIClient):
    return client.post("/api/v1/tokens/", {"description": "throttle test"}, format="json")


@pytest.mark.django_db
def test_creating_tokens_is_limited_per_user_at_the_default_rate(clients):
    count, period_s = 20, 3600
    assert django_settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token_create"] == "20/h"
    assert [_create(clients["operator"]).status_code for _ in range(count)] == [201] * count
    wait = _assert_throttled(_create(clients["operator"]))
    assert period_s - 60 < wait <= period_s
    assert Token.objects.filter(description="throttle test").count() == count  # the refused one created nothing
    # Another user creates tokens; the operator still lists, reads and deletes its own.
    assert _create(clients["admin"]).status_code == 201
    listed = clients["operator"].get("/api/v1/tokens/")
    assert listed.status_code == 200
    assert clients["operator"].delete(f"/api/v1/tokens/{listed.json()['results'][0]['id']}/").status_code == 204


@pytest.mark.django_db
def test_the_token_limit_resets_after_its_period(clients, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token_create": "2/2s"}}
    assert [_create(clients["operator"]).status_code for _ in range(2)] == [201, 201]
    assert _assert_throttled(_create(clients["operator"])) <= 2
    time.sleep(2.1)
    assert _create(clients["operator"]).status_code == 201


@pytest.mark.django_db
def test_a_cache_that_cannot_be_reached_lets_token_creation_through(clients, settings, caplog):
    """Redis away must not take token creation down with it: unthrottled, and said at WARNING."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:9/0",
                                   "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}
    with caplog.at_level(logging.WARNING, logger="tessera.security"):
        assert _create(clients["operator"]).status_code == 201
    assert "throttle token_create not applied: its cache is away" in caplog.text


# Another process: the throttle asked about the same user with the same cache (its key prefix as argv[2]).
SHARED_COUNT = """
import sys, types, django
django.setup()
from django.conf import settings
settings.CACHES["default"]["KEY_PREFIX"] = sys.argv[2]
from apps.core.api.throttling import TokenCreateThrottle
request = types.SimpleNamespace(method="POST", user=types.SimpleNamespace(pk=int(sys.argv[1]), is_authenticated=True))
print("allowed" if TokenCreateThrottle().allow_request(request, None) else "refused")
"""


@pytest.mark.services
@pytest.mark.django_db
def test_every_process_shares_the_count_in_redis(clients, users, settings, tmp_path):
    """Wherever REDIS_URL is set (production, local with services) the count is in Redis (base.py's
    redis_settings): another process with the same cache refuses the user this one counted to the limit."""
    import redis

    from controlplane.settings.base import redis_settings

    redis_url = django_settings.TESSERA_TEST_REDIS_URL
    if not redis_url:
        service_unavailable("REDIS_URL is not set")
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
    except redis.exceptions.RedisError as exc:
        service_unavailable(f"Redis at {redis_url}: {exc}")
    prefix = f"tessera-test-{uuid.uuid4().hex[:8]}"  # nothing of another run's
    shared = redis_settings(redis_url)["CACHES"]
    shared["default"]["KEY_PREFIX"] = prefix
    settings.CACHES = shared
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token_create": "2/m"}}
    try:
        assert [_create(clients["operator"]).status_code for _ in range(2)] == [201, 201]
        env = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "REDIS_URL": redis_url,
               "TESSERA_TOKEN_CREATE_RATE": "2/m", "TESSERA_VAR_DIR": str(tmp_path)}
        other = subprocess.run([sys.executable, "-c", SHARED_COUNT, str(users["operator"].pk), prefix], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
        assert other.stdout.split()[-1] == "refused"
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(*client.keys(f"{prefix}:*") or [f"{prefix}:none"])
