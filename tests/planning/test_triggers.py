"""Re-planning triggers (apps/planning/triggers.py, signals.py, trigger_tasks.py): the debounce, the
demand-change check, lost hosts and fleet changes, the model pool, the watch, and the beat schedules that
follow the ReplanPolicy."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.db import transaction
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from apps.core.models import ObjectChange
from apps.jobs.choices import JobKindChoices, JobStatusChoices
from apps.jobs.models import Job
from apps.jobs.services import job_create
from apps.planning import services as planning_services
from apps.planning import triggers
from apps.planning.models import Plan
from apps.planning.trigger_tasks import planning_watch_task, replan_periodic_task
from apps.planning.triggers import (
    demand_change_check,
    fleet_change_check,
    hosts_lost_mark_offline,
    model_pool_change_check,
    planning_watch,
    replan_schedule_sync,
    replan_trigger,
)
from apps.policies.models import ReplanPolicy
from apps.registry.models import Profile
from apps.telemetry.models import ApplicationSample
from tests.factories import ApplicationFactory, HostFactory, ModelVariantFactory, ProfileFactory, ReplanPolicyFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 21, 12, 0, 0, 500_000, tzinfo=dt_timezone.utc)


@pytest.fixture
def runs(monkeypatch):
    """plan_run_start replaced by a stand-in that creates the planning job (one active at a time, as the
    real one) without queueing the run; the calls are recorded."""
    calls = []

    def plan_run_start(*, trigger: str, trigger_detail: str = "", actor=None, options=None):
        calls.append({"trigger": trigger, "detail": trigger_detail, "actor": actor, "options": options})
        return job_create(kind=JobKindChoices.PLANNING, actor_name=f"trigger:{trigger}", key="planning:fleet",
                          params={"trigger": trigger, "trigger_detail": trigger_detail})

    monkeypatch.setattr(planning_services, "plan_run_start", plan_run_start)
    return calls


@pytest.fixture
def policy(db):
    return ReplanPolicyFactory(name="default", debounce_seconds=60, demand_change_threshold=0.2, host_lost_after_seconds=30)


def _finish(job: Job, *, ago_s: float = 0.0) -> None:
    """Mark a job finished, started `ago_s` seconds ago."""
    Job.objects.filter(pk=job.pk).update(status=JobStatusChoices.SUCCEEDED, created=timezone.now() - timedelta(seconds=ago_s))


def _all_seen_by_a_past_run(*, run_ago_s: float = 7200) -> None:
    """Everything audited so far happened before a (finished) plan run that started `run_ago_s` ago."""
    ObjectChange.objects.update(time=timezone.now() - timedelta(seconds=run_ago_s + 60))
    Profile.objects.update(created=timezone.now() - timedelta(seconds=run_ago_s + 60))
    _finish(job_create(kind=JobKindChoices.PLANNING), ago_s=run_ago_s)


# --------------------------------------------------------------------------- the one door and its debounce


def test_no_automatic_replan_without_an_enabled_policy(runs):
    ReplanPolicyFactory(name="off", enabled=False)
    assert replan_trigger(trigger="demand", detail="x") is None
    assert replan_trigger(trigger="manual") is not None
    assert [c["trigger"] for c in runs] == ["manual"]


def test_debounce(runs, policy):
    first = replan_trigger(trigger="fleet", detail="host a offline")
    assert first is not None and runs[-1] == {"trigger": "fleet", "detail": "host a offline", "actor": None, "options": None}
    # While it is pending or running: nothing, for any trigger (the manual one meets the one-run rule).
    assert replan_trigger(trigger="demand") is None
    assert replan_trigger(trigger="manual") is None
    _finish(first, ago_s=10)
    # Finished 10 s ago, debounce 60 s: the automatic triggers wait; manual does not.
    assert replan_trigger(trigger="periodic") is None
    manual = replan_trigger(trigger="manual")
    assert manual is not None
    _finish(manual, ago_s=61)
    _finish(first, ago_s=70)
    assert replan_trigger(trigger="periodic") is not None
    assert [c["trigger"] for c in runs] == ["fleet", "manual", "manual", "periodic"]  # the first manual met JobConflict


def test_no_automatic_replan_during_a_rollout(runs, policy):
    rollout = job_create(kind=JobKindChoices.ROLLOUT, key="rollout:fleet")
    assert replan_trigger(trigger="demand") is None and runs == []
    assert replan_trigger(trigger="manual") is not None  # an operator may (plan_run_start decides)
    Job.objects.filter(pk=rollout.pk).update(status=JobStatusChoices.SUCCEEDED)


def test_trigger_detail_is_cut_to_the_plans_field(runs, policy):
    job = replan_trigger(trigger="demand", detail="x" * 900)
    assert len(job.params["trigger_detail"]) == 500


def test_unknown_trigger_is_refused(policy):
    with pytest.raises(ValueError):
        replan_trigger(trigger="whim")


def test_the_real_plan_run_start_is_called_with_its_contract(policy, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = replan_trigger(trigger="model_pool", detail="variant added")
    assert job.kind == JobKindChoices.PLANNING and job.status == JobStatusChoices.PENDING
    assert job.params["trigger"] == "model_pool" and job.params["trigger_detail"] == "variant added"
    # The run is queued on commit (not run here); the other callback announces the new job on the live stream.
    queued = [c for c in callbacks if "job_stream" not in getattr(c, "__qualname__", "")]
    assert len(queued) == 1 and len(callbacks) == 2
    assert replan_trigger(trigger="manual") is None  # JobConflict from plan_run_start: one run at a time


# --------------------------------------------------------------------------- demand


def _app_with_rate(name: str, rps: int, seconds: int = 30):
    app = ApplicationFactory(name=name)
    SloPolicyFactory(application=app)
    ApplicationSample.objects.bulk_create([
        ApplicationSample(application=app, application_name=name, router="r", at=NOW - timedelta(seconds=0.2 + i),
                          interval_s=1.0, arrivals=rps) for i in range(seconds)
    ])
    return app


def test_demand_change_beyond_the_threshold_triggers_and_below_does_not(runs, policy):
    _app_with_rate("classify", 115)
    _app_with_rate("detect", 50)
    Plan.objects.create(status="active", demand={"observed": {"classify": 100.0, "detect": 50.0}, "planned": {}, "headroom": 1.25})
    assert demand_change_check(now=NOW) is None  # +15 % and 0 %
    assert runs == []
    ApplicationSample.objects.filter(application__name="detect").update(arrivals=80)
    job = demand_change_check(now=NOW)
    assert job is not None and job.params["trigger"] == "demand"
    detail = runs[-1]["detail"]
    assert "detect 50 -> 80 rps (+60%)" in detail and "classify" not in detail and "beyond 20%" in detail


def test_a_fall_in_demand_triggers_too(runs, policy):
    _app_with_rate("classify", 40)
    Plan.objects.create(status="active", demand={"observed": {"classify": 100.0}})
    assert demand_change_check(now=NOW) is not None
    assert "classify 100 -> 40 rps (-60%)" in runs[-1]["detail"]


def test_tiny_changes_do_not_trigger(runs, policy):
    _app_with_rate("trickle", 1)
    Plan.objects.create(status="active", demand={"observed": {"trickle": 0.4}})
    assert demand_change_check(now=NOW) is None  # +150 %, but 0.6 rps


def test_without_a_plan_any_demand_triggers(runs, policy):
    _app_with_rate("classify", 30)
    assert demand_change_check(now=NOW) is not None
    assert "no plan yet" in runs[-1]["detail"] and "classify 0 -> 30 rps (new)" in runs[-1]["detail"]


def test_a_plan_awaiting_approval_is_what_demand_is_compared_with(runs, policy):
    _app_with_rate("classify", 150)
    Plan.objects.create(status="active", demand={"observed": {"classify": 100.0}})
    Plan.objects.create(status="validated", demand={"observed": {"classify": 150.0}})
    assert demand_change_check(now=NOW) is None


def test_applications_without_samples_are_not_compared(runs, policy):
    quiet = ApplicationFactory(name="quiet")
    SloPolicyFactory(application=quiet)
    Plan.objects.create(status="active", demand={"observed": {"quiet": 100.0}})
    assert demand_change_check(now=NOW) is None


def test_no_demand_check_without_a_policy(runs):
    _app_with_rate("classify", 30)
    assert demand_change_check(now=NOW) is None


# --------------------------------------------------------------------------- fleet


def test_a_lost_host_is_marked_offline_by_the_system_and_triggers_a_fleet_replan(runs, policy):
    now = timezone.now()
    lost = HostFactory(name="gpu-lost", status="online", last_seen=now - timedelta(seconds=45))
    fresh = HostFactory(name="gpu-fresh", status="online", last_seen=now - timedelta(seconds=5))
    maint = HostFactory(name="gpu-maint", status="maintenance", last_seen=now - timedelta(hours=1))
    _all_seen_by_a_past_run()

    job = fleet_change_check(now=now)
    for host in (lost, fresh, maint):
        host.refresh_from_db()
    assert (lost.status, fresh.status, maint.status) == ("offline", "online", "maintenance")
    change = ObjectChange.objects.filter(changed_object_id=str(lost.pk), action="update").latest("time")
    assert change.actor_kind == "system" and change.actor_name == "system" and change.changed_fields == ["status"]
    assert job is not None and job.params["trigger"] == "fleet"
    assert runs[-1]["detail"] == "fleet changed: gpu-lost offline"
    # A run that started after the change saw it: the next watch does not trigger again.
    ObjectChange.objects.filter(time__gt=now - timedelta(hours=1)).update(time=now - timedelta(hours=1))
    _finish(job, ago_s=1800)
    assert fleet_change_check() is None


def test_a_host_coming_online_triggers(runs, policy):
    _all_seen_by_a_past_run()
    host = HostFactory(name="gpu-new", status="registered")
    assert fleet_change_check() is None  # registered: not in the fleet yet
    host.status = "online"
    host.last_seen = timezone.now()
    host.save()
    assert fleet_change_check() is not None
    assert runs[-1]["detail"] == "fleet changed: gpu-new online"


def test_a_host_that_flapped_back_is_no_change(runs, policy):
    host = HostFactory(name="gpu-flap", status="online", last_seen=timezone.now())
    _all_seen_by_a_past_run()
    for status in ("offline", "online"):
        host.status = status
        host.save()
    assert fleet_change_check() is None


def test_without_a_policy_lost_hosts_are_still_marked_offline(runs):
    host = HostFactory(name="gpu-lost", status="online", last_seen=timezone.now() - timedelta(seconds=45))
    assert fleet_change_check() is None
    host.refresh_from_db()
    assert host.status == "offline" and runs == []


def test_hosts_lost_mark_offline_threshold():
    now = timezone.now()
    host = HostFactory(name="gpu-slow", status="online", last_seen=now - timedelta(seconds=45))
    assert hosts_lost_mark_offline(now=now, lost_after_s=60) == []
    assert [h.name for h in hosts_lost_mark_offline(now=now, lost_after_s=30)] == ["gpu-slow"]
    host.refresh_from_db()
    assert host.status == "offline"
    assert hosts_lost_mark_offline(now=now, lost_after_s=30) == []  # already offline


# --------------------------------------------------------------------------- model pool


def _trigger_callbacks(callbacks) -> list:
    """The on-commit callbacks the planning signals queued (the audit log queues its own too)."""
    return [c for c in callbacks if c.__qualname__.startswith("_model_pool_trigger_on_commit")]


def test_a_variants_first_profile_triggers_on_commit(runs, policy, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        variant = ModelVariantFactory(name="fast", application=ApplicationFactory(name="classify"))
    assert _trigger_callbacks(callbacks) == [] and runs == []  # without profiles it cannot be placed: no re-plan yet
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            ProfileFactory(variant=variant, batch_size=1)
            ProfileFactory(variant=variant, batch_size=8)  # same device type: no second trigger
        assert runs == []  # not before the commit
    assert len(_trigger_callbacks(callbacks)) == 1
    assert [(c["trigger"], c["detail"]) for c in runs] == [("model_pool", "model pool changed: classify/fast on A100-SXM4-40GB")]
    # A new device type for it is a change too (not started here: the first run is still pending).
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        ProfileFactory(variant=variant, device_type="cpu", slice="", cpu_cores=4)
    assert len(_trigger_callbacks(callbacks)) == 1 and len(runs) == 1


def test_deleting_a_profiled_variant_triggers_on_commit(runs, policy, django_capture_on_commit_callbacks):
    profiled = ProfileFactory(variant=ModelVariantFactory(name="old", application=ApplicationFactory(name="classify"))).variant
    bare = ModelVariantFactory(name="bare", application=profiled.application)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        bare.delete()
    assert _trigger_callbacks(callbacks) == [] and runs == []
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        profiled.delete()
    assert len(_trigger_callbacks(callbacks)) == 1
    assert runs[-1]["trigger"] == "model_pool" and "classify" in runs[-1]["detail"] and "deleted" in runs[-1]["detail"]


def test_model_pool_check_catches_what_the_signals_missed(runs, policy):
    ProfileFactory(variant=ModelVariantFactory(name="seen", application=ApplicationFactory(name="detect")))
    _all_seen_by_a_past_run()
    assert model_pool_change_check() is None
    variant = ModelVariantFactory(name="bulk", application=ApplicationFactory(name="classify"))
    Profile.objects.bulk_create([Profile(variant=variant, device_type="A100-SXM4-40GB", slice="full", batch_size=b,
                                         latency_p50_ms=5.0, latency_p99_ms=6.0, throughput_rps=100.0) for b in (1, 8)])
    job = model_pool_change_check()
    assert job is not None and runs[-1]["detail"] == "model pool changed: classify/bulk on A100-SXM4-40GB"
    Profile.objects.filter(variant=variant).update(created=timezone.now() - timedelta(hours=1))
    _finish(job, ago_s=1800)
    assert model_pool_change_check() is None  # that run saw it


# --------------------------------------------------------------------------- the watch and the tasks


def test_watch_runs_the_checks_and_starts_at_most_one_run(runs, policy):
    HostFactory(name="gpu-lost", status="online", last_seen=timezone.now() - timedelta(minutes=5))
    _app_with_rate("classify", 30)
    result = planning_watch(now=NOW)
    assert result["fleet"] is not None and result["model_pool"] is None and result["demand"] is None
    assert [c["trigger"] for c in runs] == ["fleet"]
    assert planning_watch_task.apply().get() == {"fleet": None, "model_pool": None, "demand": None, "prediction_checks": 0}  # debounced


def test_periodic_task(runs, policy):
    result = replan_periodic_task.apply(kwargs={"policy_id": policy.pk}).get()
    assert result["job"] is not None and runs[-1] == {"trigger": "periodic", "detail": "every 300 s (policy default)", "actor": None, "options": None}
    assert replan_periodic_task.apply(kwargs={"policy_id": policy.pk}).get() == {"job": None}  # a duplicate delivery
    ReplanPolicy.objects.filter(pk=policy.pk).update(enabled=False)
    Job.objects.update(status=JobStatusChoices.SUCCEEDED, created=timezone.now() - timedelta(hours=1))
    assert replan_periodic_task.apply(kwargs={"policy_id": policy.pk}).get() == {"job": None}
    assert replan_periodic_task.apply(kwargs={"policy_id": 999_999}).get() == {"job": None}


# --------------------------------------------------------------------------- beat schedules


def _replan_task(policy: ReplanPolicy) -> PeriodicTask:
    return PeriodicTask.objects.get(task="planning.replan_periodic", kwargs=json.dumps({"policy_id": policy.pk}))


def test_saving_a_policy_schedules_its_periodic_replan(db):
    policy = ReplanPolicyFactory(name="nightly", interval_seconds=120)
    task = _replan_task(policy)
    assert task.name == "replan:nightly" and task.enabled
    assert (task.interval.every, task.interval.period) == (120, "seconds")
    watch = PeriodicTask.objects.get(name="planning.watch")
    assert watch.task == "planning.watch" and watch.enabled and (watch.interval.every, watch.interval.period) == (5, "seconds")


def test_editing_the_policy_through_the_api_reschedules(clients):
    response = clients["admin"].post("/api/v1/replan-policies/", {"name": "fleet", "interval_seconds": 300}, format="json")
    assert response.status_code == 201, response.content
    policy = ReplanPolicy.objects.get(pk=response.json()["id"])
    assert _replan_task(policy).interval.every == 300
    assert response.json()["debounce_seconds"] == 60 and response.json()["host_lost_after_seconds"] == 30

    response = clients["admin"].patch(f"/api/v1/replan-policies/{policy.pk}/", {"interval_seconds": 900}, format="json")
    assert response.status_code == 200, response.content
    assert _replan_task(policy).interval.every == 900

    clients["admin"].patch(f"/api/v1/replan-policies/{policy.pk}/", {"enabled": False}, format="json")
    assert not _replan_task(policy).enabled
    clients["admin"].patch(f"/api/v1/replan-policies/{policy.pk}/", {"enabled": True, "name": "fleet-2"}, format="json")
    assert _replan_task(policy).name == "replan:fleet-2" and _replan_task(policy).enabled
    assert not PeriodicTask.objects.filter(name="replan:fleet").exists()

    assert clients["admin"].delete(f"/api/v1/replan-policies/{policy.pk}/").status_code == 204
    assert not PeriodicTask.objects.filter(task="planning.replan_periodic").exists()
    assert PeriodicTask.objects.filter(name="planning.watch").exists()  # the watch stays


def test_schedule_sync_is_idempotent_and_restores_the_watch(db):
    policy = ReplanPolicyFactory(name="p", interval_seconds=60)
    PeriodicTask.objects.filter(name="planning.watch").delete()
    first = replan_schedule_sync(policy=policy)
    again = replan_schedule_sync(policy=policy)
    assert first.pk == again.pk and PeriodicTask.objects.filter(task="planning.replan_periodic").count() == 1
    assert PeriodicTask.objects.filter(name="planning.watch", enabled=True).count() == 1


def test_the_policy_fields_have_sane_defaults(db):
    policy = ReplanPolicy.objects.create(name="plain")
    assert (policy.debounce_seconds, policy.demand_window_seconds, policy.forecast_horizon_seconds, policy.host_lost_after_seconds) == (60, 60, 30, 30)
    assert triggers.WATCH_INTERVAL_S == 5
