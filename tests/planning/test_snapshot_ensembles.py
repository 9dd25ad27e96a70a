"""The planning snapshot carries each application's ensemble policy (random or learned; variants by engine
name) and the query sizes the routers counted (issue 20): what the garrison planners read."""
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.planning.snapshot import fleet_problem_build
from apps.policies.services import ensemble_policy_set
from apps.telemetry.models import ApplicationSample
from engine.plans.problem import problem_from_dict, problem_to_dict
from tests.factories import ModelVariantFactory

pytestmark = pytest.mark.django_db


def _sample(application, seconds_ago: float, **fields):
    ApplicationSample.objects.create(router="router-1", application=application, application_name=application.name,
                                     at=timezone.now() - timedelta(seconds=seconds_ago), interval_s=1.0, **fields)


def _app(problem, name):
    return next(a for a in problem.applications if a.name == name)


def test_without_policies_or_sizes_nothing_changes(small_fleet):
    problem = fleet_problem_build(demand={"classify": 100}).problem
    assert all(a.ensemble is None and a.query_sizes is None for a in problem.applications)


def test_the_ensemble_and_query_sizes_reach_the_problem(small_fleet):
    f = small_fleet
    ensemble_policy_set(application=f.classify, data={"members": [{"variant": "small", "probability": 0.25}, {"variant": "big", "probability": 0.75,
                                                                                                                "weight": 2}], "vote": "hard"})
    _sample(f.classify, 10, query_sizes={"1": 3, "8": 1})
    _sample(f.classify, 20, query_sizes={"8": 4})
    _sample(f.classify, 5000, query_sizes={"64": 100})  # outside the window
    snapshot = fleet_problem_build(demand={"classify": 100, "tabular": 10})
    classify = _app(snapshot.problem, "classify")
    assert classify.ensemble.mode == "random" and classify.ensemble.vote == "hard" and (classify.ensemble.min_size, classify.ensemble.max_size) == (1, 2)
    assert [(m.variant, m.probability, m.weight) for m in classify.ensemble.members] == [("classify/small", 0.25, 1.0), ("classify/big", 0.75, 2.0)]
    assert classify.query_sizes == ((1, 0.375), (8, 0.625))
    assert _app(snapshot.problem, "tabular").ensemble is None
    # The problem round-trips through its JSON form (what a plan stores as its inputs).
    assert problem_from_dict(problem_to_dict(snapshot.problem)) == snapshot.problem
    assert fleet_problem_build(demand={"classify": 100}, query_sizes_window_s=15).problem.applications[0].query_sizes == ((1, 0.75), (8, 0.25))


def test_a_single_policy_plans_as_none_and_learned_keeps_its_scheduler(small_fleet):
    f = small_fleet
    ensemble_policy_set(application=f.classify, data={"mode": "single", "members": {"small": 1.0}})
    assert _app(fleet_problem_build(demand={"classify": 1}).problem, "classify").ensemble is None
    ensemble_policy_set(application=f.classify, data={"mode": "learned", "scheduler": "demo-ensemble", "members": {"small": 0.5, "big": 0.5}})
    ensemble = _app(fleet_problem_build(demand={"classify": 1}).problem, "classify").ensemble
    assert ensemble.mode == "learned" and ensemble.scheduler == "demo-ensemble" and ensemble.variants == ("classify/small", "classify/big")


def test_members_left_out_of_the_problem_are_dropped_with_a_note(small_fleet):
    f = small_fleet
    ModelVariantFactory(application=f.classify, name="unprofiled")
    ensemble_policy_set(application=f.classify, data={"members": {"small": 0.3, "big": 0.5, "unprofiled": 0.2}, "min_size": 3})
    snapshot = fleet_problem_build(demand={"classify": 1})
    ensemble = _app(snapshot.problem, "classify").ensemble
    assert ensemble.probabilities == pytest.approx({"classify/small": 0.375, "classify/big": 0.625})
    assert (ensemble.min_size, ensemble.max_size) == (2, 2)
    assert any("unprofiled" in n and "renormalised" in n for n in snapshot.notes)

    ensemble_policy_set(application=f.classify, data={"members": {"small": 0.0, "unprofiled": 1.0}})
    snapshot = fleet_problem_build(demand={"classify": 1})
    assert _app(snapshot.problem, "classify").ensemble is None
    assert any("ensemble of classify left out" in n for n in snapshot.notes)
