"""The control plane's own Prometheus metrics at `GET /metrics` (issue 21, section 4): the exposition
parses, names follow Prometheus's conventions, the figures move with what happens (plans, hosts, agents'
reports stored and refused), and a database that is away is reported, not a failed scrape."""
from __future__ import annotations

import re
import shutil
import subprocess
from unittest import mock

import pytest
from django.db import OperationalError
from prometheus_client.parser import text_string_to_metric_families

from apps.inventory.services import host_agent_token_rotate
from tests.factories import HostFactory

from .test_telemetry import metrics as metrics_report

pytestmark = pytest.mark.django_db


def _scrape(client) -> dict[str, dict]:
    """Family name (counters without `_total`, as the parser names them) -> {labels: value, "_type": type}."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.content.decode()):
        families[family.name] = {tuple(sorted(s.labels.items())): s.value for s in family.samples if not s.name.endswith("_created")}
        families[family.name]["_type"] = family.type
    return families


def _value(families, name, **labels) -> float:
    return families[name].get(tuple(sorted(labels.items())), 0.0)


def test_the_figures_follow_what_happens(client) -> None:
    host = HostFactory(name="metrics-host", status="online")
    before = _scrape(client)
    assert _value(before, "tessera_database_up") == 1 and _value(before, "tessera_hosts", status="online") >= 1
    assert before["tessera_agent_reports_ingested"]["_type"] == "counter" and before["tessera_plans"]["_type"] == "gauge"
    ingested = _value(before, "tessera_agent_reports_ingested")
    rejected = _value(before, "tessera_agent_reports_rejected", reason="invalid")
    token = host_agent_token_rotate(host=host)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    ok = client.post(f"/api/v1/hosts/{host.pk}/metrics/", metrics_report(runtimes=[]), content_type="application/json", **auth)
    bad = client.post(f"/api/v1/hosts/{host.pk}/metrics/", {"at": "sometime"}, content_type="application/json", **auth)
    assert ok.status_code == 201, ok.content
    assert bad.status_code == 400
    after = _scrape(client)
    assert _value(after, "tessera_agent_reports_ingested") == ingested + 1
    assert _value(after, "tessera_agent_reports_rejected", reason="invalid") == rejected + 1
    assert "tessera_plan_solve_seconds" in after and after["tessera_plan_solve_seconds"]["_type"] == "summary"


def test_names_follow_the_conventions(client) -> None:
    text = client.get("/metrics").content.decode()
    names = set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert names and all(name.startswith("tessera_") for name, _ in names)
    for name, kind in names:
        assert name.endswith("_total") == (kind == "counter"), (name, kind)  # counters, and only counters, end in _total
        assert not re.search(r"_(ms|milliseconds|count|sum|bucket)$", name), name  # base units, no reserved suffixes


def test_a_database_that_is_away_is_reported_and_the_scrape_still_answers(client) -> None:
    with mock.patch("apps.planning.models.Plan.objects.values", side_effect=OperationalError("connection refused")):
        families = _scrape(client)
    assert _value(families, "tessera_database_up") == 0
    assert "tessera_plans" not in families and "tessera_live_sockets" in families


def test_promtool_finds_nothing_to_lint(client) -> None:
    """Debian's promtool (.ci/run installs the `prometheus` package) on the whole exposition."""
    promtool = shutil.which("promtool")
    if promtool is None:
        from tests.conftest import service_unavailable

        service_unavailable("no promtool (apt-get install prometheus)")
    HostFactory(name="lint-host", status="online")
    text = client.get("/metrics").content
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (result.stdout, result.stderr)
