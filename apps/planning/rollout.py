"""A plan's lifecycle after it is validated: approval, rollout (and its failure), operator rollback.

Rollout (`rollout_execute`, the work of a rollout job) keeps capacity while the fleet changes:

1. *Make*: each host gets a desired state holding both what it runs now and what the plan adds, where its
   GPUs have room for both (the union of the MIG layouts is valid and the CPU threads fit); a host without
   room goes straight to the plan's state (its agent drains what goes before it creates what comes).
   Hosts are written in waves (a fraction of the fleet at a time); each wave waits until every agent in
   it reports the new version converged, within a deadline. Before a wave is written, the routes to the
   slots it changes (a slot the plan gives another application or variant, or takes away) are withdrawn
   and the live routers confirm it (`routes_withdraw`): no slot changes while a router still sends it
   queries for the model it served.
2. *Switch*: every application's routing table moves to the plan's in one transaction, so routers see
   either all old tables or all new ones.
3. *Break*: hosts that kept old instances get the plan's state, again in waves with the same deadline.

A host whose agent reaches its state but for runtimes that failed to start (an artifact that does not load,
a process that dies: `Host.settled_version`) does not fail the rollout: those runtimes are reported (the
job's log, the plan's rollout record and notes), routers route only to ready runtimes so their routes stay
withdrawn, the agent keeps retrying them, and every other change goes on. One application's broken model
never rolls back the others' changes.

A host that does not converge in time (or routers that do not confirm a withdrawal) fails the rollout:
every host touched gets its state from before the rollout back (as a new version, with the same
withdrawal first), then the routing tables from before the rollout are restored, and the plan is FAILED. The job is idempotent: a retried task re-derives what is left from the stored state (a host whose
latest desired state already is the target is not written again; tables already switched are not
switched again)."""
from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.core.context import change_context
from apps.deployments.choices import RuntimeStateChoices
from apps.deployments.models import RoutingTable, Runtime
from apps.deployments.services import (
    RoutersBehind,
    host_desired_state_latest,
    host_desired_state_set,
    host_desired_state_validate,
    routes_withdraw,
    routing_tables_publish,
)
from apps.inventory.models import Host
from apps.jobs.choices import JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import job_checkpoint_set, job_create, job_enqueue, job_progress
from apps.registry.models import Application
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import mig_layout_validate

from .choices import PLAN_TRANSITIONS, PlanStatusChoices
from .models import Plan

__all__ = ["RolloutFailed", "plan_apply", "plan_approve", "plan_rollback", "plan_status_set", "rollback_execute", "rollout_execute"]

log = logging.getLogger("tessera.planning")

# Defaults for a rollout's parameters (the job's params may override them).
WAVE_FRACTION = 0.5  # of the hosts written at once
CONVERGE_DEADLINE_S = 120.0  # per wave
POLL_S = 0.25


class RolloutFailed(Exception):
    """A host did not converge in time (or refused its desired state)."""


def plan_status_set(*, plan: Plan, status: str, **fields: Any) -> Plan:
    """Move a plan to `status` if its lifecycle allows it (ValidationError otherwise), with audit."""
    plan = Plan.objects.select_for_update().get(pk=plan.pk)
    if status not in PLAN_TRANSITIONS[PlanStatusChoices(plan.status)]:
        raise ValidationError({"status": f"A {plan.get_status_display().lower()} plan cannot become {PlanStatusChoices(status).label.lower()}."})
    plan.status = status
    for name, value in fields.items():
        setattr(plan, name, value)
    # Only what changed: a full save rewrites the plan's problem, result and prediction (hundreds of kB in
    # PostgreSQL's TOAST) on every status move, and the soak saw the dead copies outgrow the live rows.
    plan.save(update_fields=["status", "last_updated", *fields])
    return plan


def _user(actor: Any):
    return actor if getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None) else None


@transaction.atomic
def plan_approve(*, plan: Plan, actor: Any) -> Plan:
    """An operator's (or auto-apply's) approval of a validated plan."""
    return plan_status_set(plan=plan, status=PlanStatusChoices.APPROVED, approved_by=_user(actor), approved_at=timezone.now())


@transaction.atomic
def plan_apply(*, plan: Plan, actor: Any, wave_fraction: float = WAVE_FRACTION, deadline_s: float = CONVERGE_DEADLINE_S) -> Job:
    """Start rolling an approved plan out (one rollout at a time in the fleet): hosts are written
    `wave_fraction` of the fleet at a time, and each wave must converge within `deadline_s`."""
    from .rollout_tasks import rollout_task

    if not (0 < wave_fraction <= 1) or not deadline_s > 0:
        raise ValidationError({"params": "wave_fraction must be in (0, 1] and deadline_s > 0."})
    job = job_create(kind=JobKindChoices.ROLLOUT, actor=actor, actor_name="" if _user(actor) else "auto-apply",
                     targets=[plan], params={"plan": plan.pk, "wave_fraction": wave_fraction, "deadline_s": deadline_s},
                     key="rollout:fleet")
    plan_status_set(plan=plan, status=PlanStatusChoices.ROLLING_OUT)
    job_enqueue(job=job, task=rollout_task)
    return job


@transaction.atomic
def plan_rollback(*, plan: Plan, actor: Any, deadline_s: float = CONVERGE_DEADLINE_S) -> Job:
    """An operator takes an active plan back: the fleet returns to what it ran before it."""
    from .rollout_tasks import rollback_task

    plan = Plan.objects.select_for_update().get(pk=plan.pk)
    if plan.status != PlanStatusChoices.ACTIVE:
        raise ValidationError({"status": f"Only the active plan can be rolled back; this one is {plan.get_status_display().lower()}."})
    if not plan.rollout.get("hosts"):
        raise ValidationError({"status": "This plan has no record of the state before its rollout to return to."})
    job = job_create(kind=JobKindChoices.ROLLBACK, actor=actor, targets=[plan], params={"plan": plan.pk, "deadline_s": deadline_s},
                     key="rollout:fleet")
    job_enqueue(job=job, task=rollback_task)
    return job


# --------------------------------------------------------------------------- desired states


def _spec_of(desired) -> dict:
    """A stored desired state as a document that can be posted again (host and version dropped)."""
    if desired is None:
        return {"gpus": [], "runtimes": []}
    return {"gpus": desired.spec.get("gpus", []), "runtimes": desired.spec.get("runtimes", [])}


def _canonical(host: Host, spec: dict) -> dict:
    return host_desired_state_validate(host=host, spec=spec)


def _union_spec(host: Host, before: dict, target: dict) -> dict:
    """What the host runs now plus what the plan adds, when its GPUs and CPUs have room for both; else
    the target itself."""
    catalogue = mig_catalogue_load()
    gpus_before = {g["index"]: g for g in before.get("gpus", [])}
    accelerators = {a.index: a for a in host.accelerators.filter(kind="gpu")}
    gpus = []
    for gpu in target.get("gpus", []):
        old = gpus_before.get(gpu["index"])
        layout = list(gpu.get("layout", []))
        if old is not None and old.get("mig_enabled") and gpu.get("mig_enabled"):
            spec = catalogue.gpu_model_find(accelerators[gpu["index"]].model_name) if gpu["index"] in accelerators else None
            union = sorted(set(layout) | set(old.get("layout", [])))
            if spec is None or not mig_layout_validate(spec, union).valid:
                return target
            layout = union
        elif old is not None and bool(old.get("mig_enabled")) != bool(gpu.get("mig_enabled")):
            return target  # a MIG mode change: nothing old survives on that GPU
        gpus.append({**gpu, "layout": layout})
    runtimes = {r["key"]: r for r in before.get("runtimes", [])}
    runtimes.update({r["key"]: r for r in target.get("runtimes", [])})
    union = {"gpus": gpus, "runtimes": list(runtimes.values())}
    try:
        return _canonical(host, union)
    except ValidationError:
        return target  # e.g. the CPU threads of both do not fit: no room to keep the old ones meanwhile


def _wait_converged(*, job: Job, waiting: dict[int, int], deadline_s: float, what: str) -> set[int]:
    """Wait until every host (host id -> version) reports converged_version >= its version, or
    settled_version >= it: everything reached but runtimes that failed to start, which the agent reports
    failed and keeps retrying. Returns the hosts that settled so: the rollout goes on without those
    runtimes (routers route only to ready runtimes) rather than failing every application's change."""
    deadline = time.monotonic() + deadline_s
    pending = dict(waiting)
    settled: set[int] = set()
    while pending:
        for host_id, converged, settled_version in Host.objects.filter(pk__in=pending).values_list("pk", "converged_version", "settled_version"):
            if (converged or 0) >= pending[host_id]:
                del pending[host_id]
            elif (settled_version or 0) >= pending[host_id]:
                del pending[host_id]
                settled.add(host_id)
        if not pending:
            return settled
        if time.monotonic() > deadline:
            names = ", ".join(sorted(Host.objects.filter(pk__in=pending).values_list("name", flat=True)))
            raise RolloutFailed(f"{what}: {names} did not converge within {deadline_s:g} s")
        time.sleep(POLL_S)


def _write_waves(*, job: Job, plan: Plan, targets: dict[int, dict], fraction: float, deadline_s: float, phase: str, actor: Any) -> None:
    """Write each host's target state (skipping hosts already there) in waves, waiting for each wave."""
    hosts = {h.pk: h for h in Host.objects.filter(pk__in=targets)}
    todo = []
    for host_id in sorted(targets, key=lambda pk: hosts[pk].name):
        host = hosts[host_id]
        latest = host_desired_state_latest(host=host)
        target = _canonical(host, targets[host_id])
        if latest is not None and _spec_of(latest) == target:
            if (host.converged_version or 0) < latest.version:
                todo.append((host, None, latest.version))  # written by an earlier attempt: just wait for it
            continue
        todo.append((host, target, None))
    if not todo:
        return
    size = max(1, math.ceil(len(todo) * fraction))
    for start in range(0, len(todo), size):
        wave = todo[start:start + size]
        _routes_withdraw(job=job, wave=wave, phase=phase, actor=actor)
        waiting: dict[int, int] = {}
        with transaction.atomic(), change_context(source="rollout", principal=_user(actor)):
            for host, target, version in wave:
                if target is not None:
                    stored = host_desired_state_set(host=host, spec=target, actor=actor)
                    version = stored.version
                    record = plan.rollout["hosts"][host.name]
                    record.setdefault("versions", []).append(version)
                waiting[host.pk] = version
            Plan.objects.filter(pk=plan.pk).update(rollout=plan.rollout)
        names = ", ".join(h.name for h, _t, _v in wave)
        job_progress(job_id=job.pk, log_line=f"{phase}: wrote desired state of {names}; waiting for their agents")
        settled = _wait_converged(job=job, waiting=waiting, deadline_s=deadline_s, what=phase)
        if settled:
            _failed_runtimes_record(job=job, plan=plan, hosts=[h for h, _t, _v in wave if h.pk in settled], phase=phase)
        job_progress(job_id=job.pk, log_line=f"{phase}: {names} converged" + (" (but for the runtimes above)" if settled else ""))


def _failed_runtimes_record(*, job: Job, plan: Plan, hosts: list[Host], phase: str) -> None:
    """The runtimes that hosts settled without (they failed to start): kept in the plan's rollout record and
    its notes, and in the job's log. Their routes stay withdrawn: routers route only to ready runtimes."""
    failed = plan.rollout.setdefault("failed_runtimes", {})
    for runtime in Runtime.objects.filter(host__in=hosts, state=RuntimeStateChoices.FAILED).select_related("host", "application").order_by("host__name", "key"):
        entry = {"key": runtime.key, "application": runtime.application.name if runtime.application else "", "error": runtime.error[:300]}
        if entry not in failed.setdefault(runtime.host.name, []):
            failed[runtime.host.name].append(entry)
            job_progress(job_id=job.pk, log_line=f"{phase}: {runtime.host.name}/{runtime.key} ({entry['application'] or 'unknown application'}) "
                                                 f"did not start: {entry['error'] or 'no reason given'}; the rest goes on, its routes stay withdrawn")
    Plan.objects.filter(pk=plan.pk).update(rollout=plan.rollout)


def _routes_withdraw(*, job: Job, wave: list, phase: str, actor: Any) -> None:
    """Withdraw the routes to the slots this wave changes, and wait for the routers (RolloutFailed when they
    do not confirm): a slot's desired state changes only once no router sends it queries for its old model."""
    desired = {host.name: target["runtimes"] for host, target, _version in wave if target is not None}
    if not desired:
        return
    try:
        with change_context(source="rollout", principal=_user(actor)):
            withdrawn = routes_withdraw(desired_runtimes=desired, actor=actor)
    except RoutersBehind as exc:
        raise RolloutFailed(f"{phase}: {exc.message}") from exc
    if withdrawn:
        tables = ", ".join(f"{name} v{version}" for name, version in sorted(withdrawn.items()))
        job_progress(job_id=job.pk, log_line=f"{phase}: routes to the slots that change withdrawn ({tables}); the routers confirmed")


def _active_routing() -> dict[int, list]:
    return {t.application_id: t.routes for t in RoutingTable.objects.filter(active=True)}


def _routing_publish(*, routing: dict[int, list], actor: Any) -> None:
    applications = {a.pk: a for a in Application.objects.filter(pk__in=routing)}
    with change_context(source="rollout", principal=_user(actor)):
        routing_tables_publish(tables={applications[pk]: routes for pk, routes in routing.items() if pk in applications}, actor=actor)


def _plan_routing_by_application_id(plan: Plan) -> dict[int, list]:
    """The plan's tables by application id; applications that had a table and are not in the plan get an
    empty one (no capacity), so no router keeps sending to instances that go."""
    names = {a.name: a.pk for a in Application.objects.all()}
    routing = {names[name]: routes for name, routes in plan.routing.items() if name in names}
    for application_id in RoutingTable.objects.filter(active=True).values_list("application_id", flat=True):
        routing.setdefault(application_id, [])
    return routing


def _restore(*, job: Job, plan: Plan, deadline_s: float, actor: Any) -> None:
    """Every host touched gets back the state it had before the rollout (the routes to the slots that change
    back withdrawn first), then the routing tables before the rollout: no table routes to a slot before it
    serves the routed model again."""
    record = plan.rollout
    hosts = {h.name: h for h in Host.objects.filter(name__in=record.get("hosts", {}))}
    targets = {hosts[name].pk: info["before"] for name, info in record.get("hosts", {}).items() if name in hosts and info.get("versions")}
    if targets:
        try:
            _write_waves(job=job, plan=plan, targets=targets, fraction=1.0, deadline_s=deadline_s, phase="rollback", actor=actor)
        except RolloutFailed as exc:  # the states are written; a host that is away applies its own when back
            job_progress(job_id=job.pk, log_line=f"rollback: {exc}; their previous state is written and waits for them")
    before = {int(k): v for k, v in record.get("routing_before", {}).items()}
    active = _active_routing()
    if before and any(active.get(pk) != routes for pk, routes in before.items()):  # switched, or routes withdrawn
        _routing_publish(routing=before, actor=actor)
        record["switched"] = False
        Plan.objects.filter(pk=plan.pk).update(rollout=record)
        job_progress(job_id=job.pk, log_line="routing tables restored to their versions before the rollout")


# --------------------------------------------------------------------------- the jobs' work


def rollout_execute(*, job: Job) -> dict:
    plan = Plan.objects.get(pk=job.params["plan"])
    actor = job.actor
    fraction = float(job.params.get("wave_fraction", WAVE_FRACTION))
    deadline_s = float(job.params.get("deadline_s", CONVERGE_DEADLINE_S))
    if plan.status == PlanStatusChoices.ACTIVE:
        return {"plan": plan.pk, "status": plan.status}  # a re-delivered task after the work was done
    hosts = {h.name: h for h in Host.objects.filter(name__in=plan.desired_states)}
    if not plan.rollout.get("hosts"):
        # What each host ran before, so that a failure (or an operator) can bring it back.
        plan.rollout = {
            "hosts": {name: {"before": _spec_of(host_desired_state_latest(host=host)), "versions": []} for name, host in hosts.items()},
            "routing_before": {str(k): v for k, v in _active_routing().items()},
            "switched": False,
        }
        Plan.objects.filter(pk=plan.pk).update(rollout=plan.rollout)
        job_checkpoint_set(job_id=job.pk, name="recorded", value=True)
    timings: dict[str, float] = {}
    try:
        started = time.monotonic()
        final = {hosts[name].pk: spec for name, spec in plan.desired_states.items() if name in hosts}
        if not plan.rollout.get("switched"):
            make = {
                hosts[name].pk: _union_spec(hosts[name], plan.rollout["hosts"][name]["before"], spec)
                for name, spec in plan.desired_states.items() if name in hosts
            }
            job_progress(job_id=job.pk, progress=10, log_line=f"make: {len(make)} hosts, waves of {max(1, math.ceil(len(make) * fraction))}")
            _write_waves(job=job, plan=plan, targets=make, fraction=fraction, deadline_s=deadline_s, phase="make", actor=actor)
            timings["make_s"] = time.monotonic() - started
            job_progress(job_id=job.pk, progress=50)
            switch_started = time.monotonic()
            _routing_publish(routing=_plan_routing_by_application_id(plan), actor=actor)
            plan.rollout["switched"] = True
            plan.rollout["switched_at"] = timezone.now().isoformat()
            Plan.objects.filter(pk=plan.pk).update(rollout=plan.rollout)
            timings["switch_s"] = time.monotonic() - switch_started
            job_progress(job_id=job.pk, progress=60, log_line="routing tables switched to the plan's, all applications at once")
        break_started = time.monotonic()
        _write_waves(job=job, plan=plan, targets=final, fraction=fraction, deadline_s=deadline_s, phase="break", actor=actor)
        timings["break_s"] = time.monotonic() - break_started
    except (RolloutFailed, ValidationError) as exc:
        message = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        job_progress(job_id=job.pk, log_line=f"rollout failed: {message}; rolling back")
        _restore(job=job, plan=plan, deadline_s=deadline_s, actor=actor)
        with transaction.atomic(), change_context(source="rollout", principal=_user(actor)):
            plan_status_set(plan=plan, status=PlanStatusChoices.FAILED)
        raise RolloutFailed(f"{message} (rolled back)") from exc
    failed = _failed_runtimes_now(plan)
    with transaction.atomic(), change_context(source="rollout", principal=_user(actor)):
        for previous in Plan.objects.select_for_update().filter(status=PlanStatusChoices.ACTIVE).exclude(pk=plan.pk):
            plan_status_set(plan=previous, status=PlanStatusChoices.SUPERSEDED)
        extra = {}
        if failed:
            extra["notes"] = [*plan.notes, *(f"rollout: {host}/{r['key']} ({r['application']}) did not start: {r['error']}; its routes stay "
                                             "withdrawn while its agent retries" for host, rows in sorted(failed.items()) for r in rows)]
        plan_status_set(plan=plan, status=PlanStatusChoices.ACTIVE, activated_at=timezone.now(), **extra)
    result = {"plan": plan.pk, "status": "active", "hosts": len(final), **{k: round(v, 3) for k, v in timings.items()}}
    if failed:
        result["failed_runtimes"] = failed
    return result


def _failed_runtimes_now(plan: Plan) -> dict[str, list]:
    """Of the runtimes the rollout went on without, those still not running once it is done (an agent's
    retry may have started one meanwhile)."""
    recorded = plan.rollout.get("failed_runtimes") or {}
    still = set(Runtime.objects.filter(host__name__in=recorded, state=RuntimeStateChoices.FAILED).values_list("host__name", "key"))
    return {host: rows for host, entries in recorded.items() if (rows := [r for r in entries if (host, r["key"]) in still])}


def rollback_execute(*, job: Job) -> dict:
    plan = Plan.objects.get(pk=job.params["plan"])
    actor = job.actor
    if plan.status == PlanStatusChoices.ROLLED_BACK:
        return {"plan": plan.pk, "status": plan.status}
    _restore(job=job, plan=plan, deadline_s=float(job.params.get("deadline_s", CONVERGE_DEADLINE_S)), actor=actor)
    with transaction.atomic(), change_context(source="rollback", principal=_user(actor)):
        plan_status_set(plan=plan, status=PlanStatusChoices.ROLLED_BACK)
        if plan.previous_id and Plan.objects.filter(pk=plan.previous_id, status=PlanStatusChoices.SUPERSEDED).exists():
            plan_status_set(plan=plan.previous, status=PlanStatusChoices.ACTIVE)
    return {"plan": plan.pk, "status": "rolled_back"}
