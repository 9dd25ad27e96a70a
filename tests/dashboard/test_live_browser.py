"""Live updates in a real browser (Debian's Chromium via Playwright) against Daphne serving HTTP and the
dashboard's WebSocket: a report changes the overview within 2 s; an operator follows a rollout's progress
without reloading; the stale banner shows when the control plane goes away. As in the other browser tests,
the database is seeded before the browser starts (Django refuses ORM calls in Playwright's thread); the
stand-in agents below use the ORM from a thread of their own."""
import re
import time
from datetime import datetime, timezone

import httpx
import pytest
from django.contrib.auth import get_user_model

from apps.inventory.models import Host
from apps.planning.models import Plan
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.users.services import token_create
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)
from tests.dashboard.test_plans_browser import _login
from tests.planning.test_rollout import StandInAgents, cpu_plan

DEMAND_CELL = 'tr[data-application="tabular-cpu"] [data-metric="demand_rps"]'


@pytest.fixture
def seeded(transactional_db):
    seeded = demo_seed()
    Host.objects.update(status="online", converged_version=1)  # the demo's version 1 is what runs
    host = Host.objects.get(name="sim-cpu-01")
    gpu_host = Host.objects.get(name="sim-a100-01")
    operator = get_user_model().objects.get(username="operator")
    return {"logins": seeded.logins, "agent_token": host_agent_token_rotate(host=host),
            "router_token": router_credential_issue(name="browser-test-router")[1],
            "hosts": list(Host.objects.values_list("name", flat=True)),
            "operator_token": token_create(user=operator, description="browser test")[1],
            "gpu_host": gpu_host.pk, "gpu_host_token": host_agent_token_rotate(host=gpu_host)}


def _open_live(page, url, seeded, role, path):
    """Log in as `role`, open `path` and wait until its live stream is open."""
    _login(page, url, role, seeded["logins"][role])
    page.goto(f"{url}{path}")
    page.wait_for_selector('body[data-live-state="open"]')


def _router_report(url: str, token: str, arrivals: int) -> None:
    body = {"router": "browser-test-router", "at": datetime.now(timezone.utc).isoformat(), "interval_s": 1.0,
            "applications": [{"application": "tabular-cpu", "arrivals": arrivals, "served": arrivals, "latency_p99_ms": 3.5}]}
    response = httpx.post(f"{url}/api/v1/router-reports/", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert response.status_code == 201, response.text


@pytest.mark.django_db(transaction=True)
def test_a_report_reaches_the_overview_within_two_seconds(seeded, asgi_live_server, browser_page):
    page, url = browser_page, asgi_live_server.url
    _open_live(page, url, seeded, "viewer", "/overview/")
    page.wait_for_selector(".spark canvas")  # uPlot drew the sparklines
    assert page.locator(DEMAND_CELL).text_content().strip() in ("—", "0", "0.0")

    sent = time.monotonic()
    _router_report(url, seeded["router_token"], arrivals=777)
    page.wait_for_function(f"document.querySelector('{DEMAND_CELL}').textContent.trim() === '777.0'", timeout=2000)
    delay = time.monotonic() - sent
    assert delay < 2.0
    assert page.locator('tr[data-application="tabular-cpu"] [data-slo-state]').text_content() == "met"
    assert page.locator('[data-live-total="demand_rps"]').text_content() == "777.0"
    assert page.locator("#live-banner").is_hidden()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)

    # The control plane goes away: the page says its data may be stale.
    asgi_live_server.process.terminate()
    page.wait_for_selector("#live-banner:not([hidden])", timeout=5000)
    assert "stale" in page.locator("#live-banner").text_content()
    page.screenshot(path=str(SCREENSHOTS / "overview-stale.png"))


@pytest.mark.django_db(transaction=True)
def test_the_fleet_page_shows_live_load_and_utilisation(seeded, asgi_live_server, browser_page):
    page, url = browser_page, asgi_live_server.url
    _open_live(page, url, seeded, "viewer", "/fleet/")
    instance = "sim-a100-01/gpu0/4g.20gb@0"
    bar = page.locator(f'[data-util-bar][data-instance="{instance}"]')
    assert bar.get_attribute("width") == "0"
    report = {"at": datetime.now(timezone.utc).isoformat(), "interval_s": 1.0,
              "gpus": [{"index": 0, "simulated": True, "utilization_pct": 50.0, "instances": [
                  {"placement": "4g.20gb@0", "gr_engine_active_pct": 64.0, "memory_used_mb": 12000}]}],
              "runtimes": [{"key": "gpu0/4g.20gb@0", "application": "classify-resnet", "variant": "resnet50",
                            "arrivals": 120, "served": 120, "latency_p99_ms": 12.5}]}
    response = httpx.post(f"{url}/api/v1/hosts/{seeded['gpu_host']}/metrics/", json=report,
                          headers={"Authorization": f"Bearer {seeded['gpu_host_token']}"}, timeout=5)
    assert response.status_code == 201, response.text
    row = page.locator(f'li[data-instance="{instance}"]')
    page.wait_for_function(f"document.querySelector('li[data-instance=\"{instance}\"] [data-load]').textContent === '120.0'", timeout=2000)
    assert row.locator("[data-util]").text_content() == "64" and row.locator("[data-p99]").text_content() == "12.5"
    full = float(bar.get_attribute("data-bar-width"))
    assert float(bar.get_attribute("width")) == pytest.approx(full * 0.64, abs=0.1)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "fleet-live.png"), full_page=True)


@pytest.fixture
def cpu_runtimes(seeded):
    """The CPU host's two runtimes as its agent reports them, one with a minute of cores history."""
    from datetime import timedelta

    from apps.deployments.models import Runtime
    from apps.registry.models import Application
    from apps.telemetry.models import RuntimeSample

    host = Host.objects.get(name="sim-cpu-01")
    application = Application.objects.get(name="tabular-cpu")
    for key in ("cpu0/0", "cpu0/1"):
        Runtime.objects.create(host=host, key=key, application=application, variant=application.variants.first(), state="ready")
    now = datetime.now(timezone.utc)
    RuntimeSample.objects.bulk_create([RuntimeSample(host=host, runtime_key="cpu0/0", application_name="tabular-cpu", at=now - timedelta(seconds=60 - s),
                                                     interval_s=1.0, cores=1) for s in range(0, 60, 5)])
    return host.pk


@pytest.mark.django_db(transaction=True)
def test_the_fleet_page_charts_cores_per_cpu_runtime_as_they_are_resized(seeded, cpu_runtimes, asgi_live_server, browser_page):
    page, url = browser_page, asgi_live_server.url
    _open_live(page, url, seeded, "viewer", "/fleet/")
    line = page.locator('polyline[data-cores-line="sim-cpu-01/cpu0/0"]')
    assert line.get_attribute("data-cores-now") == "1"  # drawn from the stored history at load
    assert page.locator('polyline[data-cores-line="sim-cpu-01/cpu0/1"]').count() == 0
    report = {"at": datetime.now(timezone.utc).isoformat(), "interval_s": 1.0,
              "runtimes": [{"key": "cpu0/0", "application": "tabular-cpu", "arrivals": 40, "served": 40, "cores": 2, "max_batch": 4},
                           {"key": "cpu0/1", "application": "tabular-cpu", "arrivals": 5, "served": 5, "cores": 1, "max_batch": 1}]}
    response = httpx.post(f"{url}/api/v1/hosts/{cpu_runtimes}/metrics/", json=report,
                          headers={"Authorization": f"Bearer {seeded['agent_token']}"}, timeout=5)
    assert response.status_code == 201, response.text
    page.wait_for_function("document.querySelector('polyline[data-cores-line=\"sim-cpu-01/cpu0/0\"]').dataset.coresNow === '2'", timeout=2000)
    assert page.locator('li[data-instance="sim-cpu-01/cpu0/0"] [data-cores]').text_content() == "2"
    assert page.locator('polyline[data-cores-line="sim-cpu-01/cpu0/1"]').get_attribute("data-cores-now") == "1"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator('[data-cores-chart="sim-cpu-01/cpu0"]').screenshot(path=str(SCREENSHOTS / "fleet-cores.png"))


@pytest.fixture
def approved_plan(seeded, settings):
    settings.TESSERA_JOBS_IN_THREAD = True  # the server runs the rollout in a thread, as the demo does
    plan = cpu_plan()
    Plan.objects.filter(pk=plan.pk).update(status="approved")
    return plan.pk


@pytest.mark.django_db(transaction=True)
def test_operator_follows_the_rollout_live(seeded, approved_plan, asgi_live_server, browser_page):
    page, url = browser_page, asgi_live_server.url
    _open_live(page, url, seeded, "operator", f"/plans/{approved_plan}/")
    # Agents that converge 1.5 s after each write, so the rollout takes a few seconds.
    with StandInAgents(set(seeded["hosts"]), delay_s=1.5):
        page.click("button[name=apply]")
        page.wait_for_url(re.compile(rf"{re.escape(url)}/jobs/\d+/$"))
        # Record every progress value the bar shows, and mark the document: a reload would lose the mark.
        page.evaluate("""() => {
            window.__sameDocument = true; window.__progressSeen = [];
            const bar = document.querySelector('.progress');
            window.__progressSeen.push(Number(bar.dataset.progress));
            new MutationObserver(() => window.__progressSeen.push(Number(bar.dataset.progress)))
                .observe(bar, {attributes: true, attributeFilter: ['data-progress']});
        }""")
        page.wait_for_selector('[data-job-status="running"]', timeout=10_000)
        page.screenshot(path=str(SCREENSHOTS / "job-running.png"), full_page=True)
        page.wait_for_selector('[data-job-status="succeeded"]', timeout=30_000)
    seen = page.evaluate("window.__progressSeen")
    assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded
    assert seen[-1] == 100 and any(0 < value < 100 for value in seen), seen
    assert "switch" in page.locator("[data-job-log]").text_content().lower()
    page.screenshot(path=str(SCREENSHOTS / "job-live.png"), full_page=True)  # job.png is test_plans_browser's


@pytest.fixture
def validated_plan_pk(seeded):
    return cpu_plan().pk


@pytest.mark.django_db(transaction=True)
def test_a_plan_page_follows_an_approval_made_elsewhere(seeded, validated_plan_pk, asgi_live_server, browser_page):
    page, url = browser_page, asgi_live_server.url
    _open_live(page, url, seeded, "viewer", f"/plans/{validated_plan_pk}/")
    assert page.locator("[data-plan-status]").get_attribute("data-plan-status") == "validated"
    response = httpx.post(f"{url}/api/v1/plans/{validated_plan_pk}/approve/", headers={"Authorization": f"Bearer {seeded['operator_token']}"}, timeout=5)
    assert response.status_code == 200, response.text
    page.wait_for_selector('[data-plan-status="approved"]', timeout=3000)  # the page redrew itself
