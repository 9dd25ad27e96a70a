"""`manage.py check --deploy` under the production settings, in the environment each control-plane process
really gets: the Kubernetes manifests (ConfigMap, the example Secret, the container's own variables), the
systemd units (tessera.env.example plus each unit's Environment=) and compose.yaml, each with its placeholder
secrets replaced by real random ones. Every warning fails the test: it is fixed in
controlplane/settings/production.py, or silenced there with the reason (SILENCED_SYSTEM_CHECKS), and the test
holds the silenced list to exactly what that environment turned off by name."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.deploy.commands import REPO
from tests.deploy.test_compose import SERVICES as COMPOSE_SERVICES
from tests.deploy.test_compose import TESSERA as COMPOSE_TESSERA
from tests.deploy.test_compose import _environment as compose_environment
from tests.deploy.test_kubernetes import BUILT, _container_env, _containers
from tests.deploy.test_systemd import CONTROL_PLANE as SYSTEMD_CONTROL_PLANE
from tests.deploy.test_systemd import SYSTEMD, env_file, unit_parse

PRODUCTION = "controlplane.settings.production"
# What the examples hold in place of a secret (deploy/kubernetes/secrets.example.yaml, the systemd env example,
# the compose test's .env): an operator puts a long random value there.
SECRET_KEY = secrets.token_urlsafe(50)


def _real_secrets(env: dict[str, str]) -> dict[str, str]:
    return {**env, "DJANGO_SECRET_KEY": SECRET_KEY}


def _kubernetes() -> dict[str, dict[str, str]]:
    out = {}
    for resource, _pod, container in _containers(BUILT["base"]):
        env = _container_env(BUILT["base"], container)
        if env.get("DJANGO_SETTINGS_MODULE") == PRODUCTION:
            out[f"kubernetes {resource['metadata']['name']}/{container['name']}"] = _real_secrets(env)
    return out


def _systemd() -> dict[str, dict[str, str]]:
    out = {}
    for name in SYSTEMD_CONTROL_PLANE:
        service = unit_parse(SYSTEMD / f"{name}.service")["Service"]
        env: dict[str, str] = {}
        for path in service.get("EnvironmentFile", []):
            env.update(env_file(path))
        for line in service.get("Environment", []):
            env.update(pair.split("=", 1) for pair in line.split())
        out[f"systemd {name}"] = _real_secrets(env)
    return out


def _compose() -> dict[str, dict[str, str]]:
    # The image sets DJANGO_SETTINGS_MODULE for every service; the control plane's are those given its secrets.
    return {f"compose {name}": _real_secrets(compose_environment(name)) for name in sorted(COMPOSE_TESSERA)
            if "DJANGO_SECRET_KEY" in COMPOSE_SERVICES[name].get("environment", {})}


def _environments() -> dict[str, dict[str, str]]:
    """Each distinct environment once, named by the processes that run in it."""
    distinct: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, env in {**_kubernetes(), **_systemd(), **_compose()}.items():
        distinct.setdefault(json.dumps(env, sort_keys=True), ([], env))[0].append(name)
    return {", ".join(names): env for names, env in distinct.values()}


ENVIRONMENTS = _environments()


# Django's check --deploy (any warning fails it), then the checks silenced, on the last line.
CHECK = """
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
call_command("check", deploy=True, fail_level="WARNING")
print("silenced:", *settings.SILENCED_SYSTEM_CHECKS)
"""


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    """In a fresh interpreter with exactly `env` (and PATH): nothing of the test's own environment leaks in."""
    return subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=120)


def test_every_control_plane_process_is_covered():
    names = " ".join(ENVIRONMENTS)
    for process in ("tessera-web", "tessera-ingest", "tessera-worker", "tessera-beat", "tessera-migrate"):
        assert f"kubernetes {process}/" in names and f"systemd {process}" in names
    for process in ("web", "ingest", "worker", "beat", "migrate"):
        assert f"compose {process}" in names


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_deploy_checks_pass_in_each_production_environment(name):
    env = ENVIRONMENTS[name]
    result = _check_deploy(env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout
    # Silenced: only a protection this environment turned off by name (production.py says why); the processes
    # that face users through the TLS proxy (web under Kubernetes and systemd) silence nothing.
    expected = (["security.W008"] if env.get("DJANGO_SECURE_SSL_REDIRECT") == "false" else []) + \
               (["security.W004"] if env.get("DJANGO_HSTS_SECONDS") == "0" else [])
    silenced = result.stdout.strip().splitlines()[-1].split()[1:]
    assert sorted(silenced) == sorted(expected)
    if "kubernetes tessera-web/web" in name or "systemd tessera-web" in name:
        assert silenced == []


def test_the_check_is_not_vacuous_the_examples_placeholder_key_is_refused():
    """The examples' placeholder secret, left in place, is what check --deploy catches (security.W009)."""
    env = {**next(env for name, env in ENVIRONMENTS.items() if "kubernetes tessera-web/web" in name),
           "DJANGO_SECRET_KEY": "replace-with-50-random-characters"}
    result = _check_deploy(env)
    assert result.returncode != 0 and "security.W009" in result.stdout + result.stderr
