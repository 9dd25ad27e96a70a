"""The fleet page in a real browser: Playwright drives Debian's Chromium (/usr/bin/chromium) against
Daphne serving the ASGI application (tests/dashboard/conftest.py). Playwright never downloads a browser here.

Playwright's sync API keeps an event loop running in this thread while it is open, and Django refuses ORM
calls there; so the database is seeded and read before the browser starts (fixture order)."""
from pathlib import Path

import pytest

from apps.inventory.models import GpuInstance
from controlplane.demo import demo_seed
from tests.conftest import service_unavailable

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parent.parent.parent / "test-artifacts" / "screenshots"


@pytest.fixture
def demo_fleet(transactional_db):
    """The demo fleet, and what the page should show, read before the browser opens."""
    seeded = demo_seed()
    return {"viewer_password": seeded.logins["viewer"], "gpu_instances": GpuInstance.objects.count()}


@pytest.fixture
def browser_page():
    if not CHROMIUM.exists():
        service_unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            # A bound on waiting for what the page shows, not a claim about speed: on two loaded cores (Chromium,
            # the Daphne child and another test's work) test_applications_browser once ran past 15 s.
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@pytest.mark.django_db(transaction=True)
def test_viewer_logs_in_and_sees_the_mig_layouts(asgi_live_server, demo_fleet, browser_page):
    page = browser_page
    page.goto(f"{asgi_live_server.url}/fleet/")
    assert "/login/" in page.url
    page.fill("#id_username", "viewer")
    page.fill("#id_password", demo_fleet["viewer_password"])
    page.click("form button[type=submit]")
    page.wait_for_url(f"{asgi_live_server.url}/fleet/")
    page.wait_for_selector("[data-placement]")

    # MIG instances (MPS partitions are "g.block.partition", tests/dashboard/test_fleet_mps.py)
    assert page.locator("g.block[data-placement]:not(.partition)").count() == demo_fleet["gpu_instances"] > 0
    host = page.locator('[data-host="sim-a100-01"]')
    gpu0 = host.locator('[data-accelerator="sim-a100-01/gpu0"]')
    big = gpu0.locator('[data-placement="4g.20gb@0"]')
    gpu1 = host.locator('[data-accelerator="sim-a100-01/gpu1"]')
    small = gpu1.locator('[data-placement="2g.10gb@0"]')
    assert big.is_visible() and small.is_visible()
    big_box, small_box = big.bounding_box(), small.bounding_box()
    assert big_box["width"] > 1.5 * small_box["width"], (big_box, small_box)
    # The stylesheet is served (no CDN): the nav bar is laid out, not unstyled.
    assert page.locator(".topbar").evaluate("e => getComputedStyle(e).display") == "flex"

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "fleet.png"), full_page=True)
    assert (SCREENSHOTS / "fleet.png").stat().st_size > 0
