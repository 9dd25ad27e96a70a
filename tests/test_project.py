"""Project-wide guarantees: migrations match the models, the OpenAPI schema generates without warnings,
the engine and the workers import nothing from Django, and production settings refuse to start without
their secrets (Django's deployment checks in each production environment: tests/security/test_deploy_checks.py)."""
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_migrations_match_models():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_openapi_schema_has_no_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(out)],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test"},
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    for path in ("/api/v1/hosts/{id}/report/", "/api/v1/artifacts/", "/api/v1/slo-policies/", "/api/v1/tokens/"):
        assert path in text


def test_import_contracts():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _production_env(**overrides):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings.production",
        DJANGO_SECRET_KEY="x" * 20 + "-a-long-and-random-production-secret-value-0123456789",
        DJANGO_ALLOWED_HOSTS="tessera.example.org",
        DATABASE_URL="postgres://tessera@127.0.0.1:5432/tessera",
        REDIS_URL="redis://127.0.0.1:6379/0",
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_ALLOWED_HOSTS"])
def test_production_settings_have_no_default_secrets(missing):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, capture_output=True, text=True,
        env=_production_env(**{missing: None}),
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and missing in result.stderr


def test_health_and_root(client, db):
    assert client.get("/healthz").json()["status"] == "ok"  # per service: tests/integration/test_outages.py
    assert client.get("/").headers["Location"] == "/overview/"  # the dashboard opens on the overview


def test_collectstatic_under_production_settings_collects_the_project_assets(tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput"], cwd=REPO, capture_output=True,
                            text=True, env=_production_env(TESSERA_STATIC_ROOT=str(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("img/favicon.svg", "img/logo.svg", "css/tessera.css", "dashboard/dashboard.css",
                 "vendor/uplot-1.6.32/uPlot.iife.min.js", "vendor/uplot-1.6.32/LICENSE"):
        assert (tmp_path / name).is_file(), name
    # Served with their gzip forms; brotli ones only when TESSERA_STATIC_BROTLI asks (controlplane/storage.py).
    assert (tmp_path / "css/tessera.css.gz").is_file() and not list(tmp_path.rglob("*.br"))


def test_static_files_get_brotli_forms_only_when_asked(settings):
    pytest.importorskip("brotli")
    from controlplane.storage import StaticFilesStorage

    assert not StaticFilesStorage().create_compressor(quiet=True).use_brotli
    settings.TESSERA_STATIC_BROTLI = True
    assert StaticFilesStorage().create_compressor(quiet=True).use_brotli


def test_healthz_says_which_service_is_down_without_the_drivers_message(client, db, monkeypatch):
    from django.db import OperationalError

    from apps.core import outages

    def refused():
        raise OperationalError('connection to server at "10.0.0.7", port 5432 failed: Connection refused\n'
                               'FATAL: role "tessera" does not exist')

    monkeypatch.setattr(outages, "_database_check", refused)
    response = client.get("/healthz")
    assert response.status_code == 503 and response.json()["down"] == ["database"]
    assert response.json()["services"]["database"]["error"] == "connection refused"
    assert "10.0.0.7" not in response.content.decode() and "tessera" not in response.content.decode()
