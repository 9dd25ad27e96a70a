"""Editing an SLO on the Policies page in a real browser (same pattern as test_fleet_browser.py: Debian's
Chromium driven by Playwright against the live server; the database is seeded and read before the browser
starts)."""
import pytest

from apps.policies.models import SloPolicy
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)


@pytest.fixture
def seeded(transactional_db):
    logins = demo_seed().logins
    slo = SloPolicy.objects.select_related("application").order_by("application__name").first()
    return {"logins": logins, "slo": slo.pk, "application": slo.application.name, "latency": slo.latency_p99_ms}


@pytest.mark.django_db(transaction=True)
def test_operator_edits_an_slo(asgi_live_server, seeded, browser_page):
    page, url, pk = browser_page, asgi_live_server.url, seeded["slo"]
    page.goto(f"{url}/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", seeded["logins"]["operator"])
    page.click("form button[type=submit]")
    page.wait_for_load_state()
    page.click("nav a:has-text('Policies')")
    card = page.wait_for_selector(f'[data-policy="slo-{pk}"]')
    assert seeded["application"] in card.inner_text()
    field = f"#id_slo{pk}_latency_p99_ms"
    assert float(page.input_value(field)) == seeded["latency"]

    # Refused: the error shows next to the field, the typed value stays.
    page.fill(field, "-5")
    page.click(f'[data-policy="slo-{pk}"] button[name=save]')
    error = page.wait_for_selector(f'[data-policy="slo-{pk}"] [data-error-field="latency_p99_ms"]')
    assert "greater than or equal to 0.001" in error.inner_text()
    assert page.input_value(field) == "-5"

    # Accepted: saved, and the page shows the new value.
    page.fill(field, "75")
    page.click(f'[data-policy="slo-{pk}"] button[name=save]')
    message = page.wait_for_selector(".message.success")
    assert f"SLO policy of {seeded['application']} saved." in message.inner_text()
    assert page.locator("[data-policy-errors]").count() == 0
    assert float(page.input_value(field)) == 75.0
    assert page.locator('nav a[aria-current="page"]').inner_text() == "Policies"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "policies.png"), full_page=True)
    assert (SCREENSHOTS / "policies.png").stat().st_size > 0

    # A fresh load (not the redirect's) still shows it: it was stored.
    page.goto(f"{url}/policies/")
    assert float(page.input_value(field)) == 75.0
