"""Giving an application an ensemble policy on the Policies page in a real browser, then editing it (same
pattern as test_policies_browser.py: Debian's Chromium driven by Playwright against the live server; the
database is seeded before the browser starts, and read in a thread of its own while it runs: Playwright's
event loop keeps Django's ORM out of the test's thread)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.policies.models import EnsemblePolicy
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)
from tests.factories import ApplicationFactory, ModelVariantFactory

PASSWORD = "pw-Correct-Horse-1"  # tests.factories.UserFactory's


def _stored():
    """The ensemble policy as stored ((pk, vote, min_size, max_size, members) or None), read in a thread."""
    def read():
        policy = EnsemblePolicy.objects.first()
        if policy is None:
            return None
        return policy.pk, policy.vote, policy.min_size, policy.max_size, [(m.variant.name, m.probability, m.weight) for m in policy.member_list()]
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(read).result()


@pytest.fixture
def seeded(transactional_db, users):
    application = ApplicationFactory(name="robust")
    for name, accuracy in (("resnet18", 0.70), ("resnet50", 0.76), ("vit-b16", 0.81)):
        ModelVariantFactory(application=application, name=name, accuracy=accuracy)
    return {"application": application}


@pytest.mark.django_db(transaction=True)
def test_operator_gives_an_application_an_ensemble_and_edits_it(asgi_live_server, seeded, browser_page):
    page, url = browser_page, asgi_live_server.url
    page.goto(f"{url}/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_load_state()
    page.click("nav a:has-text('Policies')")
    new = '[data-policy="ensemble-new"]'
    page.wait_for_selector(new)
    page.select_option("#id_ensemble_new_application", label="robust")
    page.select_option("#id_ensemble_new_mode", "random")
    page.fill("#id_ensemble_new_min_size", "2")

    # Refused: the probabilities sum to 0.9. The error shows next to the members, the typed values stay.
    typed = "resnet18=0.2\nresnet50=0.3\nvit-b16=0.4:2"
    page.fill("#id_ensemble_new_members", typed)
    page.click(f"{new} button[name=save]")
    error = page.wait_for_selector(f'{new} [data-error-field="members"]')
    assert "the probabilities must sum to 1, they sum to 0.9" in error.inner_text()
    assert page.input_value("#id_ensemble_new_members") == typed and page.input_value("#id_ensemble_new_min_size") == "2"
    assert _stored() is None

    # Accepted: saved, and the page shows the policy's card with its members.
    page.fill("#id_ensemble_new_members", "resnet18=0.2\nresnet50=0.3\nvit-b16=0.5:2")
    page.click(f"{new} button[name=save]")
    message = page.wait_for_selector(".message.success")
    assert "Ensemble policy of robust saved." in message.inner_text()
    pk, vote, min_size, max_size, members = _stored()
    assert (vote, min_size, max_size) == ("soft", 2, 3) and members == [("resnet18", 0.2, 1.0), ("resnet50", 0.3, 1.0), ("vit-b16", 0.5, 2.0)]
    card = f'[data-policy="ensemble-{pk}"]'
    assert [r.get_attribute("data-member") for r in page.query_selector_all(f"{card} [data-member]")] == ["resnet18", "resnet50", "vit-b16"]
    assert page.locator(new).count() == 0  # every application with a variant has a policy now

    # Edited in its card: a hard vote of exactly two members.
    page.select_option(f"#id_ensemble{pk}_vote", "hard")
    page.fill(f"#id_ensemble{pk}_max_size", "2")
    page.click(f"{card} button[name=save]")
    page.wait_for_selector(".message.success")
    assert _stored()[1:4] == ("hard", 2, 2)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "policies-ensemble.png"), full_page=True)

    # A fresh load (not the redirect's) shows what was stored.
    page.goto(f"{url}/policies/")
    assert page.input_value(f"#id_ensemble{pk}_vote") == "hard" and page.input_value(f"#id_ensemble{pk}_max_size") == "2"
    assert page.input_value(f"#id_ensemble{pk}_members") == "resnet18=0.2:1.0\nresnet50=0.3:1.0\nvit-b16=0.5:2.0"
