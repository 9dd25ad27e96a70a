"""Re-planning triggers (services): when a plan run starts without an operator asking.

`replan_trigger` is the one door: it starts a plan run (`apps.planning.services.plan_run_start`) unless
automatic re-planning is off (no enabled ReplanPolicy), a planning, rollout or rollback job is pending or
running, or a plan run started less than the policy's `debounce_seconds` ago. A manual trigger skips the policy and
the debounce (never the one-run-at-a-time rule). It returns the new job, or None and logs why.

What calls it:

- periodic: the policy's django-celery-beat task "replan:<policy name>" (task "planning.replan_periodic",
  every `interval_seconds`; `replan_schedule_sync` keeps it in step with the policy on every save).
- the watch (task "planning.watch", every `WATCH_INTERVAL_S` seconds, `planning_watch`):
  `fleet_change_check` (marks hosts whose agent went quiet offline, then re-plans when a host joined or
  left the online fleet), `model_pool_change_check` (a variant became plannable on a device type, or a
  variant was deleted) and `demand_change_check` (an application's demand moved beyond the policy's
  threshold from what the current plan assumed).
- model-pool signals (apps/planning/signals.py): a variant's first profile on a device type, and the
  deletion of a variant that had profiles, trigger at once when the transaction commits. Creating a
  variant alone does not: without a profile the planner cannot place it.

The watch's checks are level-triggered: fleet and model-pool changes are the ones made since the last
plan run started (from the audit log and the profiles' creation times; at most a day back), and demand
is compared with the current plan. So a trigger that was debounced, or that arrived while a run was in progress, is not lost:
the next watch after the debounce window sees the same change and re-plans then. Once a run has started
after a change, that change no longer triggers (that run saw it, or failed on its own account: the
periodic re-plan tries again).
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Min
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from apps.core.choices import ObjectChangeActionChoices
from apps.core.context import change_context
from apps.core.models import ObjectChange
from apps.inventory.choices import HostStatusChoices
from apps.inventory.models import Host
from apps.jobs.choices import JOB_ACTIVE_STATUSES, JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import JobConflict
from apps.policies.models import ReplanPolicy
from apps.registry.models import ModelVariant, Profile

from .choices import PlanStatusChoices, PlanTriggerChoices
from .demand import demand_for_planning, plan_assumed_rps, replan_policy_current
from .models import Plan

log = logging.getLogger("tessera.planning.triggers")

__all__ = [
    "DEMAND_MIN_CHANGE_RPS",
    "REPLAN_TASK",
    "WATCH_INTERVAL_S",
    "WATCH_TASK",
    "demand_change_check",
    "demand_changes",
    "fleet_change_check",
    "hosts_lost_mark_offline",
    "model_pool_change_check",
    "planning_watch",
    "replan_periodic",
    "replan_schedule_sync",
    "replan_trigger",
    "watch_schedule_ensure",
]

REPLAN_TASK = "planning.replan_periodic"
WATCH_TASK = "planning.watch"  # the Celery task, and the name of its PeriodicTask
WATCH_INTERVAL_S = 5
# A demand change smaller than this (in requests per second) never triggers, whatever its relative size:
# an application at 0.5 rps going to 1 rps is +100 % and not worth a re-plan.
DEMAND_MIN_CHANGE_RPS = 1.0
DEFAULT_HOST_LOST_AFTER_S = float(ReplanPolicy._meta.get_field("host_lost_after_seconds").default)
DETAIL_MAX = 500  # Plan.trigger_detail's length
CHANGES_LOOKBACK = timedelta(days=1)
# No automatic re-plan starts while one of these is pending or running (a rollout changes the fleet under a
# snapshot); the level-triggered checks catch up once it is done.
BUSY_JOB_KINDS = (JobKindChoices.PLANNING, JobKindChoices.ROLLOUT, JobKindChoices.ROLLBACK)
# The plans whose demand and fleet "the current plan" means: the active one, or a newer one on its way
# (awaiting validation, approval or rollout), so that a change is not re-planned again while it waits.
CURRENT_PLAN_STATUSES = (
    PlanStatusChoices.ACTIVE, PlanStatusChoices.DRAFT, PlanStatusChoices.VALIDATED, PlanStatusChoices.APPROVED,
    PlanStatusChoices.ROLLING_OUT,
)


def _detail(text: str) -> str:
    return text if len(text) <= DETAIL_MAX else text[:DETAIL_MAX - 1] + "…"


def _last_plan_run_at() -> datetime | None:
    return Job.objects.filter(kind=JobKindChoices.PLANNING).order_by("-created").values_list("created", flat=True).first()


def _changes_since() -> datetime:
    """Where the level-triggered checks look from: the start of the last plan run, but no further back
    than CHANGES_LOOKBACK (the audit log keeps everything; with no run yet, a day of it is enough)."""
    floor = timezone.now() - CHANGES_LOOKBACK
    last = _last_plan_run_at()
    return max(last, floor) if last is not None else floor


# --------------------------------------------------------------------------- the one door


def replan_trigger(*, trigger: str, detail: str = "", policy: ReplanPolicy | None = None) -> Job | None:
    """Start a plan run for `trigger` (a PlanTriggerChoices value) unless it is debounced; the job, or None
    (the reason is logged). `policy`: the policy whose debounce applies (default the governing one)."""
    from apps.planning.services import plan_run_start  # written alongside; imported late on purpose

    if trigger not in PlanTriggerChoices.values:
        raise ValueError(f"unknown re-planning trigger {trigger!r}; known: {', '.join(PlanTriggerChoices.values)}")
    detail = _detail(detail)
    if trigger != PlanTriggerChoices.MANUAL:
        policy = policy or replan_policy_current()
        if policy is None or not policy.enabled:
            log.info("re-plan (%s) not started: automatic re-planning is off (no enabled re-planning policy); %s", trigger, detail)
            return None
        active = Job.objects.filter(kind__in=BUSY_JOB_KINDS, status__in=JOB_ACTIVE_STATUSES).order_by("-created").first()
        if active is not None:
            log.info("re-plan (%s) not started: %s job %s is %s; %s", trigger, active.kind, active.pk, active.status, detail)
            return None
        last = _last_plan_run_at()
        if last is not None and timezone.now() - last < timedelta(seconds=policy.debounce_seconds):
            ago = (timezone.now() - last).total_seconds()
            log.info("re-plan (%s) not started: the last plan run started %.0f s ago (debounce %s s); %s",
                     trigger, ago, policy.debounce_seconds, detail)
            return None
    try:
        job = plan_run_start(trigger=trigger, trigger_detail=detail, actor=None)
    except JobConflict as exc:
        log.info("re-plan (%s) not started: %s; %s", trigger, exc, detail)
        return None
    log.info("re-plan (%s) started: job %s; %s", trigger, job.pk, detail)
    return job


def replan_periodic(*, policy_id: int) -> Job | None:
    """The periodic re-plan of one policy (its beat task); nothing when the policy is gone or disabled."""
    policy = ReplanPolicy.objects.filter(pk=policy_id).first()
    if policy is None or not policy.enabled:
        log.info("periodic re-plan skipped: policy %s is %s", policy_id, "gone" if policy is None else "disabled")
        return None
    return replan_trigger(
        trigger=PlanTriggerChoices.PERIODIC, detail=f"every {policy.interval_seconds} s (policy {policy.name})", policy=policy
    )


# --------------------------------------------------------------------------- demand


def _current_plan() -> Plan | None:
    return Plan.objects.filter(status__in=CURRENT_PLAN_STATUSES).order_by("-created", "-id").first()


def _fmt_rps(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def demand_changes(*, demand: dict[str, Any], assumed: dict[str, float] | None, threshold: float) -> list[str]:
    """The applications whose demand moved beyond `threshold` (relative) and `DEMAND_MIN_CHANGE_RPS` from
    `assumed` (None: there is no plan, so any demand is a change), as "name old -> new rps (+x%)".
    Applications whose demand is a fallback (no samples) are not compared: nothing was observed."""
    changes = []
    for name, rps in sorted(demand["rps"].items()):
        if name in demand.get("fallback", {}):
            continue
        before = (assumed or {}).get(name, 0.0)
        if abs(rps - before) < DEMAND_MIN_CHANGE_RPS:
            continue
        if before <= 0:
            changes.append(f"{name} {_fmt_rps(before)} -> {_fmt_rps(rps)} rps (new)")
        elif abs(rps - before) / before > threshold:
            changes.append(f"{name} {_fmt_rps(before)} -> {_fmt_rps(rps)} rps ({(rps - before) / before:+.0%})")
    return changes


def demand_change_check(*, now: datetime | None = None) -> Job | None:
    """Re-plan when any application's demand for planning moved by more than the policy's
    `demand_change_threshold` from what the current plan assumed; with no plan, when there is demand."""
    policy = replan_policy_current()
    if policy is None:
        return None
    demand = demand_for_planning(now=now, window_s=policy.demand_window_seconds, horizon_s=policy.forecast_horizon_seconds)
    plan = _current_plan()
    changes = demand_changes(demand=demand, assumed=plan_assumed_rps(plan) if plan else None, threshold=policy.demand_change_threshold)
    if not changes:
        return None
    against = f"plan {plan.pk} ({plan.status})" if plan else "no plan yet"
    detail = f"demand moved beyond {policy.demand_change_threshold:.0%} against {against}: {', '.join(changes)}"
    return replan_trigger(trigger=PlanTriggerChoices.DEMAND, detail=detail, policy=policy)


# --------------------------------------------------------------------------- fleet


def hosts_lost_mark_offline(*, now: datetime | None = None, lost_after_s: float | None = None) -> list[Host]:
    """Mark offline every online host whose agent last reported more than `lost_after_s` seconds ago
    (default: the governing policy's `host_lost_after_seconds`). Audited, with the system as the actor.
    A host that reports again is marked online by its report (inventory's host_actual_state_apply)."""
    now = now or timezone.now()
    if lost_after_s is None:
        policy = replan_policy_current()
        lost_after_s = policy.host_lost_after_seconds if policy else DEFAULT_HOST_LOST_AFTER_S
    cutoff = now - timedelta(seconds=float(lost_after_s))
    lost = []
    for pk in Host.objects.filter(status=HostStatusChoices.ONLINE, last_seen__lt=cutoff).values_list("pk", flat=True):
        with transaction.atomic(), change_context(source="system"):
            # Re-read under a lock: its report may have come in since.
            host = Host.objects.select_for_update().filter(pk=pk, status=HostStatusChoices.ONLINE, last_seen__lt=cutoff).first()
            if host is None:
                continue
            host.status = HostStatusChoices.OFFLINE
            host.save(update_fields=["status", "last_updated"])
        log.warning("host %s marked offline: no report since %s (more than %g s)", host.name, host.last_seen.isoformat(), lost_after_s)
        lost.append(host)
    return lost


def _fleet_changes(*, since: datetime) -> list[str]:
    """Hosts that joined or left the online fleet since `since` (net: a host that went offline and came
    back is no change), from the audit log: "name online", "name offline", "name deleted"."""
    changes = ObjectChange.objects.filter(changed_object_type=ContentType.objects.get_for_model(Host), time__gt=since)
    net: dict[str, list[Any]] = {}  # host id -> [online before the first change, online now, repr, status now]
    for change in changes.order_by("time", "id").only("changed_object_id", "object_repr", "prechange_data", "postchange_data"):
        before, after = change.prechange_data, change.postchange_data
        was = bool(before) and before.get("status") == HostStatusChoices.ONLINE
        now_online = bool(after) and after.get("status") == HostStatusChoices.ONLINE
        status = after.get("status", "?") if after else "deleted"
        entry = net.setdefault(change.changed_object_id, [was, now_online, change.object_repr, status])
        entry[1:] = [now_online, change.object_repr, status]
    return [f"{name} {'online' if online else status}" for was, online, name, status in net.values() if was != online]


def fleet_change_check(*, now: datetime | None = None) -> Job | None:
    """Mark lost hosts offline (always, policy or not), then re-plan (trigger "fleet") when a host joined
    or left the online fleet since the last plan run started."""
    policy = replan_policy_current()
    hosts_lost_mark_offline(now=now, lost_after_s=policy.host_lost_after_seconds if policy else None)
    if policy is None:
        return None
    changes = _fleet_changes(since=_changes_since())
    if not changes:
        return None
    return replan_trigger(trigger=PlanTriggerChoices.FLEET, detail=f"fleet changed: {', '.join(sorted(changes))}", policy=policy)


# --------------------------------------------------------------------------- model pool


def _model_pool_changes(*, since: datetime) -> list[str]:
    """Variants that can run on a device type they could not before (their first profile for it was
    created since `since`), and variants deleted since then."""
    added = (Profile.objects.values("variant__application__name", "variant__name", "device_type")
             .annotate(first=Min("created")).filter(first__gt=since))
    changes = [f"{r['variant__application__name']}/{r['variant__name']} on {r['device_type']}" for r in added.order_by("first")]
    deleted = ObjectChange.objects.filter(
        changed_object_type=ContentType.objects.get_for_model(ModelVariant), action=ObjectChangeActionChoices.DELETE, time__gt=since,
    )
    changes += [f"{repr_} deleted" for repr_ in deleted.order_by("time").values_list("object_repr", flat=True)]
    return changes


def model_pool_change_check(*, now: datetime | None = None) -> Job | None:
    """Re-plan (trigger "model_pool") when the model pool changed since the last plan run started (the
    signals trigger at once; this catches what they could not: a debounced trigger, profiles written in
    bulk)."""
    policy = replan_policy_current()
    if policy is None:
        return None
    changes = _model_pool_changes(since=_changes_since())
    if not changes:
        return None
    shown = ", ".join(changes[:10]) + (f" and {len(changes) - 10} more" if len(changes) > 10 else "")
    return replan_trigger(trigger=PlanTriggerChoices.MODEL_POOL, detail=f"model pool changed: {shown}", policy=policy)


# --------------------------------------------------------------------------- the watch


def planning_watch(*, now: datetime | None = None) -> dict[str, Any]:
    """What the watch task runs every few seconds: the fleet, model-pool and demand checks, in that order
    (lost hosts are marked offline before a demand-triggered run snapshots the fleet), then the applied plans'
    prediction checks. At most one of them starts a run (the others then find it active or debounced). Returns
    {check: the job id it started, or None} and {"prediction_checks": plans checked}."""
    result: dict[str, Any] = {}
    for name, check in (("fleet", fleet_change_check), ("model_pool", model_pool_change_check), ("demand", demand_change_check)):
        job = check(now=now)
        result[name] = job.pk if job else None
    # Applied plans whose prediction can now be compared with what was measured (apps.planning.prediction).
    from .prediction import plans_prediction_check_due

    result["prediction_checks"] = plans_prediction_check_due(now=now)
    return result


# --------------------------------------------------------------------------- beat schedules


def _interval(seconds: int) -> IntervalSchedule:
    interval = IntervalSchedule.objects.filter(every=seconds, period=IntervalSchedule.SECONDS).order_by("pk").first()
    return interval or IntervalSchedule.objects.create(every=seconds, period=IntervalSchedule.SECONDS)


def watch_schedule_ensure() -> PeriodicTask:
    """The watch's PeriodicTask ("planning.watch" every WATCH_INTERVAL_S s, enabled), made if missing or
    changed. The data migration policies/0004 makes it at install; this puts it back if it was deleted."""
    defaults = {"task": WATCH_TASK, "interval": _interval(WATCH_INTERVAL_S), "kwargs": "{}", "enabled": True,
                "expire_seconds": 2 * WATCH_INTERVAL_S,
                "description": "Re-planning triggers: lost hosts, fleet, model-pool and demand changes (apps/planning/triggers.py)"}
    task = PeriodicTask.objects.filter(name=WATCH_TASK).first()
    if task is None:
        return PeriodicTask.objects.create(name=WATCH_TASK, **defaults)
    if any(getattr(task, k) != v for k, v in defaults.items()):
        for k, v in defaults.items():
            setattr(task, k, v)
        task.save()
    return task


def replan_schedule_sync(*, policy: ReplanPolicy) -> PeriodicTask | None:
    """Make the policy's periodic re-plan match it: a PeriodicTask "replan:<name>" running
    "planning.replan_periodic" with {"policy_id": id} every `interval_seconds`, enabled as the policy is;
    none when the policy no longer exists (deleted). A renamed policy's old task is removed. Also makes
    sure the watch is scheduled. Called by the ReplanPolicy signals in the saving transaction."""
    kwargs = json.dumps({"policy_id": policy.pk})
    mine = PeriodicTask.objects.filter(task=REPLAN_TASK, kwargs=kwargs)
    if policy.pk is None or not ReplanPolicy.objects.filter(pk=policy.pk).exists():
        for task in mine:
            task.delete()
        return None
    name = f"replan:{policy.name}"
    for task in mine.exclude(name=name):
        task.delete()
    values = {"task": REPLAN_TASK, "interval": _interval(policy.interval_seconds), "kwargs": kwargs, "enabled": policy.enabled,
              "expire_seconds": policy.interval_seconds,
              "description": f"Periodic re-plan of re-planning policy {policy.name} (apps/planning/triggers.py)"}
    task = PeriodicTask.objects.filter(name=name).first()
    if task is None:
        task = PeriodicTask.objects.create(name=name, **values)
    elif any(getattr(task, k) != v for k, v in values.items()):
        for k, v in values.items():
            setattr(task, k, v)
        task.save()
    watch_schedule_ensure()
    return task
