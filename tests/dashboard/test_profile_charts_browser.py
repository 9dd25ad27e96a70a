"""Profile charts on the applications' pages in a real browser (same pattern as test_fleet_browser.py: Debian's
Chromium driven by Playwright against the live server; the database is seeded and read before the browser
opens): every profiled variant of the demo fleet gets uPlot canvases on its application's page, one panel
per device type; the list links to every page."""
import pytest

from apps.registry.models import Application, ModelVariant, Profile
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)


@pytest.fixture
def seeded(transactional_db):
    result = demo_seed()
    profiled = set(Profile.objects.values_list("variant_id", flat=True).distinct())
    variants = {v.name: v.pk in profiled for v in ModelVariant.objects.all()}
    pages = {a.name: a.pk for a in Application.objects.filter(variants__isnull=False).distinct()}
    devices = {
        v.name: len(set(Profile.objects.filter(variant=v).values_list("device_type", flat=True)))
        for v in ModelVariant.objects.filter(pk__in=profiled)
    }
    by_application = {v.name: v.application.name for v in ModelVariant.objects.select_related("application")}
    return {"viewer_password": result.logins["viewer"], "variants": variants, "devices": devices, "pages": pages,
            "application_of": by_application}


# uPlot sizes its canvas (and the box around it) in its first commit, a microtask after the chart is made; before
# that the canvas is laid out at the browser's default 300 x 150 canvas shape, squeezed into whatever width the
# legend leaves: the 56 x 28 px (2:1) canvas one CI run measured. So the test waits for every chart's commit (the
# wrapper's inline size), which is what it means by "drawn", and reads page errors first: a chart whose commit
# threw is never sized, and the error says why.
ALL_CHARTS_COMMITTED = """() => {
  const wraps = [...document.querySelectorAll("[data-profile-chart] .uplot .u-wrap")];
  return wraps.length > 0 && wraps.every((w) => parseFloat(w.style.width) > 0 && parseFloat(w.style.height) > 0);
}"""


@pytest.mark.django_db(transaction=True)
def test_applications_page_draws_a_chart_per_profiled_variant(asgi_live_server, seeded, browser_page):
    page, url = browser_page, asgi_live_server.url
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", seeded["viewer_password"])
    page.click("form button[type=submit]")
    page.wait_for_load_state()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{url}/applications/")
    for name, pk in seeded["pages"].items():  # the list links to every application's page
        assert page.locator(f'[data-application="{name}"] a[href="/applications/{pk}/"]').count() == 1, name
    page.screenshot(path=str(SCREENSHOTS / "applications.png"), full_page=True)
    assert any(seeded["variants"].values()), "the demo seed stores profiles"
    for application, pk in sorted(seeded["pages"].items()):
        page.goto(f"{url}/applications/{pk}/")
        names = [n for n, a in seeded["application_of"].items() if a == application]
        if any(seeded["variants"][n] for n in names):
            _charts_committed(page, errors)
        assert errors == [], application
        for name in names:
            figure = page.locator(f'[data-variant-profiles="{name}"]')
            assert figure.count() == 1, name
            if seeded["variants"][name]:
                # One uPlot panel per device type the variant was profiled on, each with a drawn canvas.
                assert figure.locator(".uplot canvas").count() >= seeded["devices"][name] >= 1, name
                box = figure.locator(".uplot canvas").first.bounding_box()
                assert box["width"] > 250 and box["height"] > 150, (name, box)
            else:
                assert figure.locator(".uplot").count() == 0 and "Not profiled yet" in figure.inner_text()
    page.goto(f"{url}/applications/{seeded['pages']['classify-resnet']}/")
    _charts_committed(page, errors)
    # The legend (DOM; uPlot paints the axes on the canvas) names the slices and the SLO line.
    resnet = page.locator('[data-variant-profiles="resnet50"]')
    assert "SLO 60 ms" in resnet.locator(".u-legend").first.inner_text()
    a100 = resnet.locator('[data-device="A100-SXM4-40GB"]')
    assert "1g.5gb" in a100.locator(".u-legend").inner_text()
    # Hovering names the batch size in the panel head and shows each slice's latency in the legend.
    a100.locator(".u-over").hover()
    assert a100.locator(".profile-readout").inner_text().startswith("batch ")
    assert " ms" in a100.locator(".u-legend .u-value").nth(1).inner_text()
    page.mouse.move(0, 0)
    assert errors == []

    page.screenshot(path=str(SCREENSHOTS / "application.png"), full_page=True)
    assert (SCREENSHOTS / "applications.png").stat().st_size > 0 and (SCREENSHOTS / "application.png").stat().st_size > 0


def _charts_committed(page, errors: list[str]) -> None:
    page.wait_for_selector("[data-profile-chart] .uplot canvas")
    # Polled by time, not by animation frame (Playwright's default): on a loaded machine Chromium may hold back
    # frames, and a raf-polled wait then sees nothing for its whole bound (one CI run timed out at 60 s). On a
    # timeout, say which charts are not sized and what the page threw.
    try:
        page.wait_for_function(ALL_CHARTS_COMMITTED, polling=250)
    except Exception as exc:  # noqa: BLE001 - re-raised with what the page knows
        unsized = page.evaluate("""() => [...document.querySelectorAll("[data-profile-chart] .uplot .u-wrap")]
            .filter((w) => !(parseFloat(w.style.width) > 0)).map((w) => w.closest("[data-variant-profiles]")?.dataset.variantProfiles)""")
        raise AssertionError(f"charts not sized: {unsized}; page errors: {errors}") from exc
