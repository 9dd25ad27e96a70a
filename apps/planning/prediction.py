"""Prediction error on every applied plan (issue 41, item 4): how far to trust the next what-if.

Every plan carries the simulator's prediction of the demand it was made on (`Plan.prediction`, written by
apps.planning.services: per application its violation ratio and p99, per ensemble application and per
pipeline the same). Once an applied plan has been active for TESSERA_PREDICTION_CHECK_WINDOW_S, or until
the next plan became active if that came sooner, `plan_prediction_check` compares each of those targets
with what the routers measured over that window (the application and pipeline-path samples, summed over the
routers) and stores one `PredictionCheck` per target: predicted and measured demand, violation ratio and
p99, and the errors. The planning watch runs `plans_prediction_check_due` every few seconds, so no task is
queued per plan and a plan whose check was missed (a worker down) is checked on the next tick.

Measured figures follow the dashboard's definitions (apps.telemetry.selectors): violation ratio = (late +
dropped + no route (+ failed, for a pipeline)) / arrivals, p99 = the highest per-interval p99 any router
reported, which overstates a window's p99 when intervals are short. The prediction replays the demand the plan
was made on; where the measured demand differs, part of the error is the demand's, not the simulator's, and
both rates are stored to tell them apart."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Sum
from django.utils import timezone

from apps.telemetry.models import ApplicationSample, PipelinePathSample

from .choices import PlanStatusChoices, PredictionTargetChoices
from .models import Plan, PredictionCheck

__all__ = ["plan_prediction_check", "plan_prediction_window", "plans_prediction_check_due"]

log = logging.getLogger("tessera.planning")

DUE_PER_TICK = 20  # plans checked per call at most; the rest on the next tick


def plan_prediction_window(*, plan: Plan, now: datetime) -> tuple[datetime, datetime] | None:
    """The window a plan's prediction is compared over: from its activation for the configured window, or
    until the next plan's activation when that came sooner. None while it is not over yet (or the plan was
    never active)."""
    if plan.activated_at is None:
        return None
    start = plan.activated_at
    end = start + timedelta(seconds=settings.TESSERA_PREDICTION_CHECK_WINDOW_S)
    successor = (Plan.objects.filter(activated_at__gt=start).exclude(pk=plan.pk).order_by("activated_at")
                 .values_list("activated_at", flat=True).first())
    if successor is not None and successor < end:
        return start, successor
    return (start, end) if now >= end else None


def _predicted_targets(prediction: dict[str, Any]) -> list[dict[str, Any]]:
    """(target, kind, predicted rps, violation ratio, p99, note) of every target the prediction covers."""
    demand = prediction.get("demand_rps") or {}
    out = []
    for name, app in (prediction.get("applications") or {}).items():
        out.append({"target": name, "kind": PredictionTargetChoices.APPLICATION, "rps": demand.get(name),
                    "violation": app.get("slo_violation_ratio"), "p99": app.get("latency_p99_ms"), "note": ""})
    for name, app in (prediction.get("ensembles") or {}).items():
        out.append({"target": name, "kind": PredictionTargetChoices.ENSEMBLE, "rps": demand.get(name),
                    "violation": app.get("slo_violation_ratio"), "p99": app.get("latency_p99_ms"), "note": app.get("skipped", "")})
    for name, pipeline in (prediction.get("pipelines") or {}).items():
        p99s = [p.get("latency_p99_ms") for p in (pipeline.get("paths") or {}).values() if p.get("latency_p99_ms") is not None]
        out.append({"target": name, "kind": PredictionTargetChoices.PIPELINE, "rps": None,
                    "violation": pipeline.get("slo_violation_ratio"), "p99": max(p99s) if p99s else None, "note": pipeline.get("skipped", "")})
    return out


def _measured(kind: str, target: str, start: datetime, end: datetime) -> dict[str, Any]:
    """Arrivals, violation ratio and p99 over (start, end], summed over the routers (one query)."""
    if kind == PredictionTargetChoices.PIPELINE:
        rows = PipelinePathSample.objects.filter(pipeline_name=target, at__gt=start, at__lte=end)
        bad = F("late") + F("dropped") + F("failed") + F("no_route")
    else:
        rows = ApplicationSample.objects.filter(application_name=target, at__gt=start, at__lte=end)
        bad = F("late") + F("dropped") + F("no_route")
    agg = rows.aggregate(arrivals=Sum("arrivals"), bad=Sum(bad), p99=Max("latency_p99_ms"))
    arrivals = agg["arrivals"] or 0
    return {"arrivals": arrivals, "violation": (agg["bad"] or 0) / arrivals if arrivals else None, "p99": agg["p99"]}


def plan_prediction_check(*, plan_id: int, now: datetime | None = None) -> list[PredictionCheck] | None:
    """Compare an applied plan's prediction with what was measured over its window and store one
    PredictionCheck per target. Idempotent: a plan already checked returns its checks; one whose window is
    not over returns None."""
    now = now or timezone.now()
    # Not due (the common case on every watch tick): answered without taking the plan's row lock.
    if plan_prediction_window(plan=Plan.objects.only("pk", "activated_at").get(pk=plan_id), now=now) is None:
        return None
    return _plan_prediction_check_due(plan_id=plan_id, now=now)


def _plan_prediction_check_due(*, plan_id: int, now: datetime) -> list[PredictionCheck] | None:
    """`plan_prediction_check` for a plan found due: under its row lock, the window read again."""
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan_id)
        if plan.prediction_checked_at is not None:  # a concurrent tick did it
            return list(plan.prediction_checks.all())
        window = plan_prediction_window(plan=plan, now=now)
        if window is None:
            return None
        start, end = window
        seconds = (end - start).total_seconds()
        short = seconds < settings.TESSERA_PREDICTION_CHECK_MIN_S
        checks = []
        for t in _predicted_targets(plan.prediction or {}):
            check = PredictionCheck(plan=plan, target=t["target"][:100], kind=t["kind"], window_start=start, window_end=end,
                                    predicted_rps=t["rps"], predicted_violation_ratio=t["violation"], predicted_p99_ms=t["p99"])
            notes = [t["note"]] if t["note"] else []
            if short:
                notes.append(f"active {seconds:.0f} s, under the {settings.TESSERA_PREDICTION_CHECK_MIN_S:g} s a comparison needs")
            else:
                measured = _measured(t["kind"], t["target"], start, end)
                check.measured_rps = measured["arrivals"] / seconds
                check.measured_violation_ratio = measured["violation"]
                check.measured_p99_ms = measured["p99"]
                if not measured["arrivals"]:
                    notes.append("no traffic measured in the window")
                if check.measured_violation_ratio is not None and check.predicted_violation_ratio is not None:
                    check.violation_error = check.measured_violation_ratio - check.predicted_violation_ratio
                if check.measured_p99_ms is not None and check.predicted_p99_ms:
                    check.p99_error = (check.measured_p99_ms - check.predicted_p99_ms) / check.predicted_p99_ms
            check.note = "; ".join(notes)[:300]
            checks.append(check)
        PredictionCheck.objects.bulk_create(checks)
        # Derived bookkeeping, not an operator's change: not audited (as telemetry is not).
        Plan.objects.filter(pk=plan.pk).update(prediction_checked_at=now)
    return checks


def plans_prediction_check_due(*, now: datetime | None = None) -> int:
    """Check every applied plan whose window is over and that is not checked yet (what the planning watch
    runs). Plans activated before the telemetry's retention are passed over: their measurements are gone.
    Returns how many plans were checked."""
    now = now or timezone.now()
    horizon = now - timedelta(days=min(1.0, settings.TESSERA_TELEMETRY_RETENTION_DAYS))
    candidates = (Plan.objects.filter(prediction_checked_at__isnull=True, activated_at__gte=horizon,
                                      activated_at__lte=now - timedelta(seconds=min(settings.TESSERA_PREDICTION_CHECK_MIN_S,
                                                                                    settings.TESSERA_PREDICTION_CHECK_WINDOW_S)),
                                      status__in=(PlanStatusChoices.ACTIVE, PlanStatusChoices.SUPERSEDED))
                  .order_by("activated_at").only("pk", "activated_at")[:DUE_PER_TICK])
    checked = 0
    for plan in candidates:
        if plan_prediction_window(plan=plan, now=now) is not None and _plan_prediction_check_due(plan_id=plan.pk, now=now) is not None:
            checked += 1
    return checked
