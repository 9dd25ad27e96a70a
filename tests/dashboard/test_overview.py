"""The overview page (server side): roll-ups of stored telemetry per application, fleet totals, recent
changes restricted to what the user may view, and the live stream wiring."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from apps.policies.models import SloPolicy
from apps.telemetry.models import ApplicationSample, RuntimeSample
from apps.telemetry.rollup import ApplicationCatalogue, RouterCounts, VariantServed, application_rollup
from apps.telemetry.selectors import application_catalogue_for, application_history
from apps.users.roles import user_role_set
from tests.factories import ApplicationFactory, HostFactory, ModelVariantFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def served_app():
    application = ApplicationFactory(name="ov-app")
    SloPolicy.objects.create(application=application, latency_p99_ms=30)
    ModelVariantFactory(application=application, name="fast", accuracy=0.6)
    ModelVariantFactory(application=application, name="good", accuracy=0.8)
    host = HostFactory(name="ov-host")
    at = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=5)
    for second in range(3):
        when = at + timedelta(seconds=second)
        for router, p99 in (("r1", 20.0 + second), ("r2", 35.0)):
            ApplicationSample.objects.create(host=host, router=router, application=application, application_name="ov-app", at=when,
                                             interval_s=1.0, arrivals=100, served=95, late=3, dropped=2, latency_p99_ms=p99)
        RuntimeSample.objects.create(host=host, runtime_key="gpu0/1g.5gb@0", application=application, application_name="ov-app",
                                     variant_name="fast", at=when, interval_s=1.0, arrivals=100, served=50)
        RuntimeSample.objects.create(host=host, runtime_key="gpu0/3g.20gb@4", application=application, application_name="ov-app",
                                     variant_name="good", at=when, interval_s=1.0, arrivals=100, served=150)
    return application


def test_rollup_definitions():
    catalogue = {"a": ApplicationCatalogue(slo_ms=10, accuracies={"v1": 0.5, "v2": 1.0}), "idle": ApplicationCatalogue(slo_ms=None, accuracies={})}
    rolled = application_rollup(
        routers=[RouterCounts("r1", "a", 0, 2.0, 100, 90, 5, 5, 0, 8.0), RouterCounts("r2", "a", 0, 1.0, 0, 0, 0, 0, 0, 99.0),
                 RouterCounts("r3", "a", 0, 1.0, 10, 0, 0, 0, 10, 12.0)],
        variants=[VariantServed("a", "v1", 30), VariantServed("a", "v2", 10), VariantServed("a", "unknown", 1000)],
        catalogue=catalogue,
    )
    a = rolled["a"]
    assert a.demand_rps == 60 and a.served_rps == 45  # per second: 100/2 + 0 + 10
    assert a.p99_ms == 12.0  # the worst router with traffic; r2 had none
    assert a.slo_met is False and a.violation_ratio == pytest.approx(20 / 110)
    assert a.accuracy == pytest.approx((0.5 * 30 + 1.0 * 10) / 40)  # unknown variants carry no accuracy
    idle = rolled["idle"]
    assert (idle.demand_rps, idle.p99_ms, idle.accuracy, idle.violation_ratio, idle.slo_met) == (0, None, None, None, None)


def test_history_rolls_up_stored_samples_per_second(served_app, users, django_assert_max_num_queries):
    catalogue = application_catalogue_for(users["viewer"])
    with django_assert_max_num_queries(2):
        history = application_history(catalogue=catalogue, seconds=60)
    series = history["applications"]["ov-app"]
    assert len(history["t"]) == 3
    assert series["demand_rps"] == [200, 200, 200] and series["served_rps"] == [190, 190, 190]
    assert series["p99_ms"] == [35.0, 35.0, 35.0]
    assert series["accuracy"] == [pytest.approx((0.6 * 50 + 0.8 * 150) / 200)] * 3
    assert series["violation_ratio"] == [pytest.approx(10 / 200)] * 3


def test_viewer_sees_the_overview(client, users, served_app):
    client.force_login(users["viewer"])
    response = client.get("/overview/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-live-topics="metrics jobs changes"' in html and "uPlot.iife.min.js" in html and "overview.js" in html
    assert 'data-application="ov-app"' in html and ">200.0<" in html and ">35.0<" in html and "missed" in html
    history = json.loads(html.split('<script id="overview-history" type="application/json">')[1].split("</script>")[0])
    assert history["slo_ms"]["ov-app"] == 30 and len(history["applications"]["ov-app"]["demand_rps"]) == 3
    assert "ov-host" in html  # the host's creation is among the recent changes
    assert client.get("/").url == "/overview/"


def test_roleless_user_is_refused_and_changes_are_filtered(client, users, served_app):
    nobody = UserFactory(username="ov-nobody")
    user_role_set(nobody, None)
    client.force_login(nobody)
    assert client.get("/overview/").status_code == 403
    from apps.dashboard.overview import recent_changes

    assert recent_changes(nobody) == []
    assert {c["object_type"] for c in recent_changes(users["viewer"])} >= {"inventory.host", "registry.application"}
