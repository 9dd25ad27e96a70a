"""Prediction error on every applied plan (issue 41, item 4): once a plan has been active for its window,
its prediction is compared, per application, ensemble and pipeline, with what the routers measured over that
window, stored, and shown in the API, the plan's record and the control plane's metrics."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.core.housekeeping import history_prune
from apps.planning.models import Plan, PredictionCheck
from apps.planning.prediction import plan_prediction_check, plans_prediction_check_due
from apps.planning.triggers import planning_watch
from apps.telemetry.models import ApplicationSample, PipelinePathSample

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - timedelta(hours=1)

PREDICTION = {
    "demand_rps": {"classify": 10.0, "vote": 4.0},
    "applications": {"classify": {"queries": 300, "slo_violation_ratio": 0.01, "latency_p99_ms": 40.0}},
    "ensembles": {"vote": {"queries": 120, "slo_violation_ratio": 0.05, "latency_p99_ms": 20.0}},
    "pipelines": {"chain": {"slo_violation_ratio": 0.0, "paths": {"a>b": {"latency_p99_ms": 30.0}, "a>c": {"latency_p99_ms": 35.0}}}},
}


def _plan(*, activated_s: float = 0, status: str = "active", prediction: dict | None = None) -> Plan:
    return Plan.objects.create(status=status, activated_at=T0 + timedelta(seconds=activated_s), prediction=PREDICTION if prediction is None else prediction)


def _sample(name: str, at_s: float, *, arrivals=100, late=0, dropped=0, no_route=0, p99=None, router="r1") -> None:
    ApplicationSample.objects.create(at=T0 + timedelta(seconds=at_s), interval_s=10, router=router, application_name=name, arrivals=arrivals,
                                     served=arrivals - dropped - no_route, late=late, dropped=dropped, no_route=no_route, latency_p99_ms=p99)


def test_a_plan_is_compared_with_what_was_measured_over_its_window() -> None:
    plan = _plan()
    _sample("classify", -5, arrivals=999, dropped=999, p99=900)  # before the plan: not its
    _sample("classify", 100, arrivals=1000, late=10, dropped=5, no_route=5, p99=48.0)
    _sample("classify", 200, arrivals=1000, late=20, p99=60.0, router="r2")  # the routers' counts add up
    _sample("classify", 400, arrivals=999, dropped=999, p99=900)  # after its window: not its
    _sample("vote", 150, arrivals=600, late=60, p99=25.0)
    PipelinePathSample.objects.create(at=T0 + timedelta(seconds=120), interval_s=10, router="r1", pipeline_name="chain", path="a>b",
                                      arrivals=300, served=297, failed=3, latency_p99_ms=70.0)

    assert plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=299)) is None  # the window is not over
    checks = {c.target: c for c in plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=301))}
    assert set(checks) == {"classify", "vote", "chain"}
    classify = checks["classify"]
    assert (classify.kind, classify.window_start, classify.window_end) == ("application", T0, T0 + timedelta(seconds=300))
    assert classify.predicted_rps == 10.0 and classify.measured_rps == pytest.approx(2000 / 300)
    assert classify.measured_violation_ratio == pytest.approx(40 / 2000) and classify.violation_error == pytest.approx(0.02 - 0.01)
    assert classify.measured_p99_ms == 60.0 and classify.p99_error == pytest.approx(0.5)
    assert checks["vote"].kind == "ensemble" and checks["vote"].violation_error == pytest.approx(0.1 - 0.05)
    chain = checks["chain"]
    assert chain.kind == "pipeline" and chain.predicted_p99_ms == 35.0 and chain.measured_p99_ms == 70.0 and chain.p99_error == pytest.approx(1.0)
    assert chain.measured_violation_ratio == pytest.approx(0.01) and chain.predicted_rps is None
    plan.refresh_from_db()
    assert plan.prediction_checked_at == T0 + timedelta(seconds=301)
    # Idempotent: a second tick returns the same rows and writes none.
    again = plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=900))
    assert sorted(c.pk for c in again) == sorted(c.pk for c in checks.values()) and PredictionCheck.objects.count() == 3


def test_the_window_ends_when_the_next_plan_became_active() -> None:
    plan = _plan(status="superseded", prediction={"demand_rps": {"classify": 10.0}, "applications": {"classify": {"slo_violation_ratio": 0.0, "latency_p99_ms": 40.0}}})
    _plan(activated_s=120)
    _sample("classify", 60, arrivals=600, p99=30.0)
    _sample("classify", 130, arrivals=600, dropped=600)  # the next plan's
    (check,) = plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=121))  # due before its 300 s: it was replaced
    assert check.window_end == T0 + timedelta(seconds=120)
    assert check.measured_violation_ratio == 0.0 and check.measured_rps == pytest.approx(5.0) and check.p99_error == pytest.approx(-0.25)


def test_a_plan_active_too_briefly_or_without_traffic_says_so() -> None:
    brief = _plan(status="superseded")
    _plan(activated_s=10)
    (check,) = [c for c in plan_prediction_check(plan_id=brief.pk, now=T0 + timedelta(seconds=60)) if c.target == "classify"]
    assert check.measured_violation_ratio is None and check.violation_error is None and "under the 30 s" in check.note
    quiet = _plan(activated_s=3600, status="superseded")
    Plan.objects.filter(pk__in=[p.pk for p in Plan.objects.exclude(pk__in=[brief.pk, quiet.pk])]).update(activated_at=T0 - timedelta(days=1))
    checks = {c.target: c for c in plan_prediction_check(plan_id=quiet.pk, now=T0 + timedelta(seconds=3901))}
    assert checks["classify"].measured_rps == 0.0 and checks["classify"].measured_violation_ratio is None
    assert "no traffic measured" in checks["classify"].note


def test_the_watch_checks_what_is_due_and_nothing_else() -> None:
    now = timezone.now()
    due = Plan.objects.create(status="superseded", activated_at=now - timedelta(seconds=700), prediction=PREDICTION)
    active = Plan.objects.create(status="active", activated_at=now - timedelta(seconds=200), prediction=PREDICTION)
    rolled_back = Plan.objects.create(status="rolled_back", activated_at=now - timedelta(seconds=1000), prediction=PREDICTION)
    stale = Plan.objects.create(status="superseded", activated_at=now - timedelta(days=3), prediction=PREDICTION)
    assert planning_watch()["prediction_checks"] == 1  # `due`; `active`'s window (300 s) is not over
    assert set(PredictionCheck.objects.values_list("plan_id", flat=True)) == {due.pk}
    assert plans_prediction_check_due(now=now + timedelta(seconds=101)) == 1  # now `active`'s is
    assert set(PredictionCheck.objects.values_list("plan_id", flat=True)) == {due.pk, active.pk}
    assert not PredictionCheck.objects.filter(plan__in=[rolled_back, stale]).exists()
    assert plans_prediction_check_due(now=now + timedelta(seconds=400)) == 0


def test_the_checks_are_in_the_api_the_plan_and_the_metrics(clients) -> None:
    plan = _plan()
    _sample("classify", 100, arrivals=1000, late=20, p99=50.0)
    plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=301))
    viewer = clients["viewer"]
    listed = viewer.get("/api/v1/prediction-checks/", {"plan": plan.pk, "kind": "application"})
    assert listed.status_code == 200, listed.content
    (row,) = listed.json()["results"]
    assert row["target"] == "classify" and row["kind"] == "application" and row["violation_error"] == pytest.approx(0.01)
    assert row["measured_p99_ms"] == 50.0 and row["p99_error"] == pytest.approx(0.25)
    detail = viewer.get(f"/api/v1/plans/{plan.pk}/").json()
    assert {c["target"] for c in detail["prediction_checks"]} == {"classify", "vote", "chain"} and detail["prediction_checked_at"]
    assert clients["anonymous"].get("/api/v1/prediction-checks/").status_code in (401, 403)
    assert clients["operator"].post("/api/v1/prediction-checks/", {"plan": plan.pk, "target": "x"}).status_code in (403, 405)  # read-only
    assert PredictionCheck.objects.count() == 3
    scrape = viewer.get("/metrics")
    families = {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples} for f in text_string_to_metric_families(scrape.content.decode())}
    assert families["tessera_plan_prediction_error"][(("measure", "violation"), ("target", "classify"))] == pytest.approx(0.01)
    assert families["tessera_plan_prediction_checked_plan"][()] == plan.pk


def test_pruning_an_old_plan_takes_its_checks_with_it() -> None:
    plan = _plan(status="superseded")
    plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=301))
    assert PredictionCheck.objects.filter(plan=plan).exists()
    Plan.objects.filter(pk=plan.pk).update(created=T0 - timedelta(days=40))
    assert history_prune(older_than=timedelta(days=30))["plan"] == 1
    assert not PredictionCheck.objects.exists()


def test_the_plan_page_shows_the_checks_or_when_they_will_come(client, users) -> None:
    plan = _plan(status="superseded")
    _sample("classify", 100, arrivals=1000, late=20, p99=50.0)
    plan_prediction_check(plan_id=plan.pk, now=T0 + timedelta(seconds=301))
    recent = Plan.objects.create(status="active", activated_at=timezone.now(), prediction=PREDICTION)
    client.force_login(users["viewer"])
    page = client.get(f"/plans/{plan.pk}/").content.decode()
    assert "Predicted against measured" in page and 'data-prediction-check="classify"' in page
    assert "+1.0 pt" in page and "+25%" in page and "no traffic measured" in page  # vote had none
    page = client.get(f"/plans/{recent.pk}/").content.decode()
    assert "data-prediction-check-pending" in page and 'data-prediction-check="' not in page
