"""Demand for planning (apps/planning/demand.py) from synthetic router reports: routers summed per second,
the window, late or missing reports, the forecast, the fallback to the active plan's demand, and the
governing policy's window and horizon."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone

import pytest

from apps.planning.demand import IDLE_FLOOR_RPS, demand_for_planning, plan_assumed_rps, replan_policy_current
from apps.planning.models import Plan
from apps.policies.models import SloPolicy
from apps.telemetry.models import ApplicationSample
from tests.factories import ApplicationFactory, ReplanPolicyFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 21, 12, 0, 0, 500_000, tzinfo=dt_timezone.utc)


def _app(name: str):
    app = ApplicationFactory(name=name)
    SloPolicyFactory(application=app)
    return app


def _report(app, router: str, seconds_ago: float, arrivals: int, interval_s: float = 1.0) -> ApplicationSample:
    return ApplicationSample(
        application=app, application_name=app.name, router=router, at=NOW - timedelta(seconds=seconds_ago),
        interval_s=interval_s, arrivals=arrivals, served=arrivals,
    )


def _series(app, router: str, values: list[int], *, end_ago: float = 0.2) -> list[ApplicationSample]:
    """One report a second, the last `end_ago` s before NOW, oldest first."""
    n = len(values)
    return [_report(app, router, end_ago + (n - 1 - i), v) for i, v in enumerate(values)]


def test_routers_are_summed_per_second_and_the_peak_and_forecast_taken(django_assert_max_num_queries):
    classify = _app("classify")
    ApplicationSample.objects.bulk_create(_series(classify, "router-a", [60] * 30) + _series(classify, "router-b", [40] * 29 + [90]))
    with django_assert_max_num_queries(3):  # the applications, one aggregate over the window, one over the memory
        demand = demand_for_planning(now=NOW, window_s=60, horizon_s=30, memory_s=900)
    assert demand["samples"] == {"classify": 30}
    assert demand["recent_peak"] == {"classify": 150.0}
    assert demand["recent_mean"]["classify"] == pytest.approx(100 + 50 / 30, abs=1e-3)
    assert demand["forecast"]["classify"] > 100.0  # the last second pulled the level (and trend) up
    assert demand["rps"]["classify"] == max(demand["recent_peak"]["classify"], demand["forecast"]["classify"])
    assert demand["fallback"] == {}
    assert demand["method"] == "max(peak of the last 60 s, Holt forecast 30 s ahead, mean of the last 900 s, declared, idle floor 1)"
    assert demand["basis"] == {"classify": "observed"}
    assert demand["window_s"] == 60.0 and demand["horizon_s"] == 30.0


def test_a_steady_rise_is_forecast_above_the_recent_peak():
    ramp = _app("ramp")
    ApplicationSample.objects.bulk_create(_series(ramp, "r", [100 + 2 * i for i in range(60)]))
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=30)
    assert demand["recent_peak"]["ramp"] == 218.0
    assert demand["forecast"]["ramp"] == pytest.approx(218 + 2 * 30, rel=0.05)
    assert demand["rps"]["ramp"] == demand["forecast"]["ramp"]


def test_only_the_window_counts():
    app = _app("windowed")
    old = [_report(app, "r", 100 + i, 1000) for i in range(10)]  # 100..109 s ago: outside a 60 s window
    ApplicationSample.objects.bulk_create(old + _series(app, "r", [10] * 20))
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["recent_peak"]["windowed"] == 10.0 and demand["samples"]["windowed"] == 20
    assert demand_for_planning(now=NOW, window_s=120, horizon_s=0)["recent_peak"]["windowed"] == 1000.0
    # Samples after `now` are not seen either.
    earlier = demand_for_planning(now=NOW - timedelta(seconds=60), window_s=60, horizon_s=0)
    assert earlier["recent_peak"]["windowed"] == 1000.0 and earlier["samples"]["windowed"] == 10


def test_rates_are_per_second_whatever_the_report_interval():
    app = _app("halves")
    # Two reports a second of 0.5 s each, 30 arrivals each: 60 per second.
    rows = [_report(app, "r", 0.2 + i * 0.5, 30, interval_s=0.5) for i in range(40)]
    ApplicationSample.objects.bulk_create(rows)
    demand = demand_for_planning(now=NOW, window_s=30, horizon_s=0)
    assert demand["recent_peak"]["halves"] == pytest.approx(60.0)
    assert demand["recent_mean"]["halves"] == pytest.approx(60.0)


def test_a_late_or_missing_report_holds_the_routers_rate():
    app = _app("gappy")
    a = _series(app, "router-a", [50] * 20)
    b = [r for i, r in enumerate(_series(app, "router-b", [50] * 20)) if i not in (5, 6)]  # two seconds lost
    b = b[:-1]  # and its last report not in yet
    ApplicationSample.objects.bulk_create(a + b)
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["recent_mean"]["gappy"] == pytest.approx(100.0)  # no dips where router-b is missing
    assert demand["recent_peak"]["gappy"] == pytest.approx(100.0)


def test_a_router_that_stopped_reporting_no_longer_counts():
    app = _app("moved")
    a = _series(app, "router-a", [50] * 30)
    b = _series(app, "router-b", [50] * 10, end_ago=20.2)  # router-b went away 20 s ago
    ApplicationSample.objects.bulk_create(a + b)
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["recent_peak"]["moved"] == pytest.approx(100.0)
    assert 40.0 < demand["forecast"]["moved"] < 60.0  # the last 20 s are router-a alone (the trend still points down)


def test_applications_without_samples_keep_the_active_plans_demand():
    seen, _, _ = _app("seen"), _app("quiet"), _app("new")
    no_slo = ApplicationFactory(name="no-slo")  # not plannable: never listed
    ApplicationSample.objects.bulk_create(_series(seen, "r", [20] * 10) + _series(no_slo, "r", [99] * 10))
    Plan.objects.create(status="active", demand={"observed": {"quiet": 42.0, "seen": 5.0}, "planned": {"quiet": 52.5, "seen": 6.25}, "headroom": 1.25})
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert set(demand["rps"]) == {"seen", "quiet", "new"}
    assert demand["rps"]["quiet"] == 42.0 and demand["rps"]["new"] == IDLE_FLOOR_RPS  # a new application: the idle floor
    assert demand["rps"]["seen"] == pytest.approx(20.0)
    assert demand["basis"] == {"seen": "observed", "quiet": "observed", "new": "idle floor"}
    assert demand["fallback"] == {"quiet": "active plan", "new": "none"}
    assert demand["samples"] == {"seen": 10, "quiet": 0, "new": 0}
    assert set(demand["recent_peak"]) == {"seen"}


def test_without_an_active_plan_the_fallback_is_zero_and_the_idle_floor_keeps_an_instance():
    _app("idle")
    Plan.objects.create(status="superseded", demand={"observed": {"idle": 42.0}})
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["rps"] == {"idle": IDLE_FLOOR_RPS} and demand["fallback"] == {"idle": "none"}
    assert demand["basis"] == {"idle": "idle floor"}
    SloPolicy.objects.update(scale_to_zero=True)  # the policy asks for no capacity while idle
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["rps"] == {"idle": 0.0} and demand["basis"] == {"idle": "none"}


def test_a_quiet_minute_does_not_take_the_capacity_away():
    """Fifteen minutes at 60 rps, then a minute of silence: the memory (the mean over 900 s) keeps 56 rps."""
    app = _app("bursty")
    busy = [_report(app, "r", seconds_ago, 60) for seconds_ago in range(61, 900)]
    quiet = [_report(app, "r", seconds_ago, 0) for seconds_ago in range(1, 61)]
    ApplicationSample.objects.bulk_create(busy + quiet)
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=30, memory_s=900)
    assert demand["recent_peak"]["bursty"] == 0.0
    assert demand["memory_mean"]["bursty"] == pytest.approx(60 * 839 / 900, abs=0.01)
    assert demand["rps"]["bursty"] == demand["memory_mean"]["bursty"] and demand["basis"]["bursty"] == "memory"
    # With a memory no longer than the quiet minute, it would have none.
    assert demand_for_planning(now=NOW, window_s=60, horizon_s=30, memory_s=60)["basis"]["bursty"] == "idle floor"


def test_a_declared_demand_is_planned_until_more_is_observed():
    new, busy = _app("new-model"), _app("busy")
    SloPolicy.objects.filter(application__in=[new, busy]).update(expected_rps=25.0)
    ApplicationSample.objects.bulk_create(_series(busy, "r", [80] * 10))
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0, memory_s=900)
    assert demand["rps"]["new-model"] == 25.0 and demand["basis"]["new-model"] == "declared"
    assert demand["rps"]["busy"] == pytest.approx(80.0) and demand["basis"]["busy"] == "observed"
    assert demand["declared"] == {"new-model": 25.0, "busy": 25.0}


def test_a_declared_or_floor_demand_does_not_outlive_its_policy_through_the_active_plan():
    _app("was-declared")
    Plan.objects.create(status="active", demand={"observed": {"was-declared": 25.0}, "details": {"basis": {"was-declared": "declared"}}})
    SloPolicy.objects.update(scale_to_zero=True)
    demand = demand_for_planning(now=NOW, window_s=60, horizon_s=0)
    assert demand["rps"] == {"was-declared": 0.0} and demand["fallback"] == {"was-declared": "none"}


def test_plan_assumed_rps_reads_the_stored_forms():
    assert plan_assumed_rps(None) == {}
    assert plan_assumed_rps(Plan(demand={"observed": {"a": 1.0}, "planned": {"a": 1.25}, "headroom": 1.25})) == {"a": 1.0}
    assert plan_assumed_rps(Plan(demand={"rps": {"a": 2}, "planned_rps": {"a": 3}})) == {"a": 2.0}
    assert plan_assumed_rps(Plan(demand={"a": 3.0, "b": "x", "c": -1})) == {"a": 3.0}
    assert plan_assumed_rps(Plan(demand={})) == {}


def test_window_and_horizon_default_to_the_governing_policy():
    _app("x")
    assert demand_for_planning(now=NOW)["window_s"] == 60.0  # no policy: the model's defaults
    ReplanPolicyFactory(name="b-policy", demand_window_seconds=120, forecast_horizon_seconds=45)
    ReplanPolicyFactory(name="a-disabled", enabled=False, demand_window_seconds=10)
    assert replan_policy_current().name == "b-policy"
    demand = demand_for_planning(now=NOW)
    assert (demand["window_s"], demand["horizon_s"]) == (120.0, 45.0)
    assert demand_for_planning(now=NOW, window_s=30)["window_s"] == 30.0


def test_bad_window_is_refused():
    with pytest.raises(ValueError):
        demand_for_planning(now=NOW, window_s=0, horizon_s=10)
    with pytest.raises(ValueError):
        demand_for_planning(now=NOW, window_s=60, horizon_s=-1)
