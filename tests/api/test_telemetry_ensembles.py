"""Router reports with query sizes and random-ensemble counts (issue 20): accepted, bounded and stored per
application sample; read back by the selectors planning and the dashboard use (D[b]; the frequency table
with the randomness bias)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.policies.services import ensemble_policy_set
from apps.telemetry.models import ApplicationSample
from apps.telemetry.selectors import application_ensemble_frequencies, application_query_sizes
from engine.ensembles.sampling import randomness_bias
from tests.api.test_telemetry import iso, router_report, routers  # noqa: F401 (fixture)
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/router-reports/"


def _report(at_s: float = 1.0, **application):
    return router_report(at=iso(at_s), applications=[{"application": "robust", "arrivals": 10, "served": 10, **application}])


ENSEMBLE = {"queries": 10, "chosen": {"a": 8, "b": 6, "c": 6}, "voted": {"a": 8, "b": 5, "c": 6}, "sizes": {"2": 10}, "scheduler": "random"}


@pytest.fixture
def robust(db):
    application = ApplicationFactory(name="robust")
    for name in ("a", "b", "c"):
        ModelVariantFactory(application=application, name=name)
    return application


def test_query_sizes_and_ensembles_are_stored(clients, routers, robust):
    response = routers["router-1"].post(URL, _report(query_sizes={"1": 6, "4": 3, "64": 1}, ensembles=[ENSEMBLE]), format="json")
    assert response.status_code == 201, response.content
    sample = ApplicationSample.objects.get(application=robust)
    assert sample.query_sizes == {"1": 6, "4": 3, "64": 1} and sample.ensembles == [ENSEMBLE]
    # Both are optional: a router that counts neither reports as before.
    assert routers["router-2"].post(URL, router_report("router-2"), format="json").status_code == 201
    assert ApplicationSample.objects.filter(router="router-2", query_sizes__isnull=True, ensembles__isnull=True).count() == 2
    listed = clients["viewer"].get("/api/v1/application-samples/", {"application": robust.pk}).json()["results"]
    assert listed[0]["query_sizes"] == {"1": 6, "4": 3, "64": 1} and listed[0]["ensembles"][0]["voted"] == {"a": 8, "b": 5, "c": 6}


def test_an_ensemble_report_takes_defaults_for_what_it_leaves_out(routers, robust):
    assert routers["router-1"].post(URL, _report(ensembles=[{"queries": 3}]), format="json").status_code == 201
    assert ApplicationSample.objects.get().ensembles == [{"queries": 3, "chosen": {}, "voted": {}, "sizes": {}, "scheduler": ""}]


def test_a_router_of_the_version_before_sends_one_block_kept_as_a_list_of_one(routers, robust):
    assert routers["router-1"].post(URL, _report(ensemble=ENSEMBLE), format="json").status_code == 201
    assert ApplicationSample.objects.get().ensembles == [ENSEMBLE]


def test_draws_are_counted_under_the_scheduler_that_made_them(routers, robust):
    """A policy changed within a second: the router reports two blocks, and the frequency table of the
    latest scheduler holds only its own draws (issue 38: one label, the last seen, counted the earlier
    policy's draws under the new one)."""
    ensemble_policy_set(application=robust, data={"members": {"a": 0.5, "b": 0.25, "c": 0.25}, "min_size": 2, "max_size": 2})
    robust.refresh_from_db()
    learned = {"scheduler": "learned (favour-a)", "queries": 4, "chosen": {"a": 4, "b": 4}, "voted": {"a": 4, "b": 4}, "sizes": {"2": 4}}
    response = routers["router-1"].post(URL, _report(1, ensembles=[ENSEMBLE, learned]), format="json")
    assert response.status_code == 201, response.content
    routers["router-1"].post(URL, _report(2, ensembles=[learned]), format="json")
    now = timezone.now()
    every = application_ensemble_frequencies(application=robust, window_s=7200, now=now)
    assert every.queries == 18 and every.scheduler is None
    assert [(c.scheduler, c.queries) for c in every.schedulers] == [("learned (favour-a)", 8), ("random", 10)]
    latest = application_ensemble_frequencies(application=robust, window_s=7200, now=now, latest=True)
    assert latest.scheduler == "learned (favour-a)" and latest.queries == 8
    assert [(m.variant, m.chosen) for m in latest.members] == [("a", 8), ("b", 8), ("c", 0)]
    random = application_ensemble_frequencies(application=robust, window_s=7200, now=now, scheduler="random")
    assert random.queries == 10 and [m.chosen for m in random.members] == [8, 6, 6]
    assert application_ensemble_frequencies(application=robust, window_s=7200, now=now, scheduler="nobody") is None


def test_a_scheduler_named_twice_in_one_report_is_refused(routers, robust):
    response = routers["router-1"].post(URL, _report(ensembles=[ENSEMBLE, ENSEMBLE]), format="json")
    assert response.status_code == 400 and "one block per scheduler" in str(response.json()["error"]["fields"])
    assert not ApplicationSample.objects.exists()


@pytest.mark.parametrize("application, text", [
    ({"query_sizes": {"0": 1}}, "a size is a whole number 1..4096"),
    ({"query_sizes": {"4097": 1}}, "a size is a whole number 1..4096"),
    ({"query_sizes": {"x": 1}}, "a size is a whole number 1..4096"),
    ({"query_sizes": {"1": -1}}, "greater than or equal to 0"),
    ({"query_sizes": {"1": 1.5}}, "valid integer"),
    ({"query_sizes": {"1": 2, "01": 3}}, "given twice"),
    ({"query_sizes": {str(k): 1 for k in range(1, 4098)}}, "at most 4096 keys"),
    ({"query_sizes": [[1, 2]]}, "Expected a dictionary"),
    ({"ensemble": {**ENSEMBLE, "queries": -1}}, "greater than or equal to 0"),
    ({"ensemble": {**ENSEMBLE, "chosen": {"a": -2}}}, "greater than or equal to 0"),
    ({"ensemble": {**ENSEMBLE, "voted": {"": 1}}}, "a variant name is 1..100 printable characters"),
    ({"ensemble": {**ENSEMBLE, "voted": {"a\u0000b": 1}}}, "a variant name is 1..100 printable characters"),
    ({"ensemble": {**ENSEMBLE, "sizes": {"5000": 1}}}, "a size is a whole number 1..4096"),
    ({"ensemble": {**ENSEMBLE, "chosen": {f"v{k}": 1 for k in range(4097)}}}, "at most 4096 keys"),
    ({"ensemble": {**ENSEMBLE, "scheduler": "x" * 201}}, "no more than 200 characters"),
    ({"ensemble": [1, 2]}, "Expected a dictionary"),
    ({"ensembles": [{**ENSEMBLE, "queries": -1}]}, "greater than or equal to 0"),
    ({"ensembles": [{**ENSEMBLE, "scheduler": f"s{k}"} for k in range(17)]}, "no more than 16"),
    ({"ensembles": {"queries": 1}}, "Expected a list"),
])
def test_malformed_counts_are_refused_and_nothing_is_stored(routers, robust, application, text):
    response = routers["router-1"].post(URL, _report(**application), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "applications" in error["fields"] and text in str(error["fields"]), error
    assert not ApplicationSample.objects.exists()


def test_query_sizes_over_a_window_summed_over_routers(routers, robust):
    assert application_query_sizes(application=robust, window_s=60) is None
    routers["router-1"].post(URL, _report(1, query_sizes={"1": 6, "4": 2}), format="json")
    routers["router-2"].post(URL, router_report("router-2", at=iso(2), applications=[{"application": "robust", "query_sizes": {"4": 2}}]),
                             format="json")
    routers["router-1"].post(URL, _report(3), format="json")  # no sizes counted: not a row of one
    now = ApplicationSample.objects.order_by("-at").first().at
    assert application_query_sizes(application=robust, window_s=60, now=now) == ((1, 0.6), (4, 0.4))
    # Only the window counts: the first report is more than 1.5 s before the last.
    assert application_query_sizes(application=robust, window_s=1.5, now=now) == ((4, 1.0),)
    assert application_query_sizes(application=robust, window_s=60, now=now + timedelta(hours=1)) is None
    assert application_query_sizes(application=ApplicationFactory(), window_s=60, now=now) is None


def test_ensemble_frequencies_with_the_configured_probabilities(routers, robust):
    assert application_ensemble_frequencies(application=robust, window_s=60) is None
    routers["router-1"].post(URL, _report(1, ensemble=ENSEMBLE), format="json")
    routers["router-2"].post(URL, router_report("router-2", at=iso(2), applications=[{"application": "robust", "ensemble": {
        "queries": 10, "chosen": {"a": 8, "b": 6, "c": 6}, "voted": {"a": 7, "b": 6, "c": 5}, "sizes": {"2": 10}, "scheduler": "random"}}]),
        format="json")
    now = timezone.now()
    seen = application_ensemble_frequencies(application=robust, window_s=7200, now=now)
    assert seen.queries == 20 and seen.mean_size == 2.0 and [c.scheduler for c in seen.schedulers] == ["random"]
    assert [(m.variant, m.chosen, m.voted, m.probability) for m in seen.members] == [
        ("a", 16, 15, None), ("b", 12, 11, None), ("c", 12, 11, None)]
    assert seen.members[0].share == pytest.approx(15 / 37) and seen.members[0].chosen_share == pytest.approx(0.4)
    assert seen.bias is None and seen.voted_bias is None  # no policy to compare with

    ensemble_policy_set(application=robust, data={"members": {"a": 0.4, "b": 0.4, "c": 0.2}, "min_size": 2, "max_size": 2})
    robust.refresh_from_db()
    seen = application_ensemble_frequencies(application=robust, window_s=7200, now=now)
    assert [m.probability for m in seen.members] == [0.4, 0.4, 0.2]
    assert seen.bias == pytest.approx(randomness_bias({"a": 0.4, "b": 0.3, "c": 0.3}, {"a": 0.4, "b": 0.4, "c": 0.2}))
    assert seen.voted_bias == pytest.approx(randomness_bias({"a": 15 / 37, "b": 11 / 37, "c": 11 / 37}, {"a": 0.4, "b": 0.4, "c": 0.2}))


def test_a_variant_no_longer_in_the_policy_is_listed_after_its_members(routers, robust):
    ensemble_policy_set(application=robust, data={"members": {"b": 0.5, "c": 0.5}})
    routers["router-1"].post(URL, _report(1, ensemble={"queries": 4, "chosen": {"a": 2, "b": 3, "c": 3}, "voted": {"a": 2, "b": 3, "c": 3}}),
                             format="json")
    seen = application_ensemble_frequencies(application=robust, window_s=7200)
    assert [(m.variant, m.probability) for m in seen.members] == [("b", 0.5), ("c", 0.5), ("a", None)]
    assert seen.mean_size == 2.0  # no sizes reported: the draws per query
    assert seen.bias == pytest.approx(randomness_bias({"b": 3 / 8, "c": 3 / 8}, {"b": 0.5, "c": 0.5}))
