"""Uploading a variant in a real browser (same pattern as test_fleet_browser.py: Debian's Chromium driven by
Playwright against the live server; the database is seeded before the browser starts)."""
import pytest

from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)


@pytest.fixture
def seeded(transactional_db):
    return {"logins": demo_seed().logins}


@pytest.mark.django_db(transaction=True)
def test_operator_sees_an_invalid_upload_rejected_inline(asgi_live_server, seeded, browser_page, tmp_path):
    page, url = browser_page, asgi_live_server.url
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    page.goto(f"{url}/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", seeded["logins"]["operator"])
    page.click("form button[type=submit]")
    page.wait_for_load_state()
    page.goto(f"{url}/applications/")
    page.wait_for_selector('[data-application="tabular-cpu"]')
    page.select_option("#id_application", label="tabular-cpu")
    page.fill("#id_name", "browser-upload")
    page.fill("#id_accuracy", "0.5")
    page.fill("#id_accuracy_metric", "holdout accuracy")
    page.set_input_files("#id_file", str(bad))
    page.click("button[name=upload]")
    errors = page.wait_for_selector("[data-upload-errors]")
    assert "Not an ONNX model" in errors.inner_text()
    assert page.input_value("#id_name") == "browser-upload"  # the form keeps its values
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Its own file: applications.png is test_profile_charts_browser's, which may run at the same time (xdist).
    page.screenshot(path=str(SCREENSHOTS / "applications-upload.png"), full_page=True)
    assert (SCREENSHOTS / "applications-upload.png").stat().st_size > 0
