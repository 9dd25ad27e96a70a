"""Plan approval and apply in a real browser (same pattern as test_fleet_browser.py: Debian's Chromium
driven by Playwright against the live server; the database is seeded before the browser starts)."""
import re

import pytest

from apps.planning.models import Plan
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)


@pytest.fixture
def validated_plan(transactional_db):
    """The demo logins and a validated plan whose rollout has nothing to write (it succeeds at once)."""
    seeded = demo_seed()
    plan = Plan.objects.create(status="validated", solver="pulp", solver_status="Optimal", gap=0.0, effective_accuracy=0.9,
                               prediction={"slo_violation_ratio": 0.0, "effective_accuracy": 0.9, "applications": {}},
                               desired_states={}, routing={}, notes=["browser test plan"])
    return {"plan": plan.pk, "logins": seeded.logins}


def _login(page, url, username, password):
    page.goto(f"{url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("form button[type=submit]")
    page.wait_for_load_state()


@pytest.mark.django_db(transaction=True)
def test_operator_approves_and_applies_a_plan(asgi_live_server, validated_plan, browser_page):
    page, url, pk = browser_page, asgi_live_server.url, validated_plan["plan"]
    _login(page, url, "operator", validated_plan["logins"]["operator"])
    page.goto(f"{url}/plans/{pk}/")
    page.click("button[name=approve]")
    page.wait_for_selector('[data-plan-status="approved"]')
    assert page.locator("button[name=approve]").count() == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "plan-approved.png"), full_page=True)
    page.click("button[name=apply]")
    page.wait_for_url(re.compile(rf"{re.escape(url)}/jobs/\d+/$"))
    page.wait_for_selector('[data-job-status="succeeded"]')
    bar = page.locator(".progress .bar")
    assert page.locator("[data-progress]").get_attribute("data-progress") == "100"
    assert bar.evaluate("e => e.getBoundingClientRect().width") == pytest.approx(
        page.locator(".progress").evaluate("e => e.getBoundingClientRect().width"), abs=1)
    page.screenshot(path=str(SCREENSHOTS / "job.png"), full_page=True)
    assert (SCREENSHOTS / "plan-approved.png").stat().st_size > 0 and (SCREENSHOTS / "job.png").stat().st_size > 0

    # A viewer sees the (now active) plan without any action.
    page.click(".logout button")
    _login(page, url, "viewer", validated_plan["logins"]["viewer"])
    page.goto(f"{url}/plans/{pk}/")
    page.wait_for_selector('[data-plan-status="active"]')
    for name in ("approve", "apply", "rollback"):
        assert page.locator(f"button[name={name}]").count() == 0

    # The lists, as the viewer sees them (kept as artefacts with the other pages' screenshots).
    page.goto(f"{url}/plans/")
    page.wait_for_selector(f'tr[data-plan="{pk}"]')
    page.screenshot(path=str(SCREENSHOTS / "plans.png"), full_page=True)
    page.goto(f"{url}/jobs/")
    page.wait_for_selector("tr[data-job]")
    assert page.locator("tr[data-job] .badge").first.text_content() == "Succeeded"
    page.screenshot(path=str(SCREENSHOTS / "jobs.png"), full_page=True)


@pytest.fixture
def checked_plan(transactional_db):
    """A plan that was active for its window, its prediction compared with what the routers measured, and the
    active plan that replaced it, whose window is not over."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.planning.prediction import plan_prediction_check
    from apps.telemetry.models import ApplicationSample

    seeded = demo_seed()
    Plan.objects.filter(status="active").update(status="superseded")
    start = timezone.now() - timedelta(minutes=20)
    prediction = {"slo_violation_ratio": 0.01, "effective_accuracy": 0.9, "demand_rps": {"classify-mobile": 10.0},
                  "applications": {"classify-mobile": {"queries": 300, "on_time": 297, "late": 3, "dropped": 0, "slo_violation_ratio": 0.01,
                                                       "effective_accuracy": 0.9, "latency_p99_ms": 40.0}}}
    old = Plan.objects.create(status="superseded", solver="proteus", activated_at=start, prediction=prediction)
    ApplicationSample.objects.create(at=start + timedelta(seconds=60), interval_s=60, router="r1", application_name="classify-mobile",
                                     arrivals=600, served=600, late=12, latency_p99_ms=50.0)
    plan_prediction_check(plan_id=old.pk, now=start + timedelta(seconds=400))
    new = Plan.objects.create(status="active", solver="proteus", activated_at=timezone.now(), prediction=prediction)
    return {"old": old.pk, "new": new.pk, "logins": seeded.logins}


@pytest.mark.django_db(transaction=True)
def test_a_plan_shows_its_prediction_against_what_was_measured(asgi_live_server, checked_plan, browser_page):
    page, url = browser_page, asgi_live_server.url
    _login(page, url, "viewer", checked_plan["logins"]["viewer"])
    page.goto(f"{url}/plans/{checked_plan['old']}/")
    row = page.locator('tr[data-prediction-check="classify-mobile"]')
    row.wait_for()
    assert row.locator("[data-violation-error]").text_content() == "+1.0 pt"  # measured 2.0 %, predicted 1.0 %
    assert row.locator("[data-p99-error]").text_content() == "+25%"  # measured 50 ms, predicted 40 ms
    assert "300" in row.text_content()  # its window, in seconds
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#prediction-checks").screenshot(path=str(SCREENSHOTS / "plan-prediction-checks.png"))
    page.goto(f"{url}/plans/{checked_plan['new']}/")
    pending = page.locator("[data-prediction-check-pending]")
    pending.wait_for()
    assert "once it has been active 300 s" in pending.text_content()
    assert page.locator("tr[data-prediction-check]").count() == 0
