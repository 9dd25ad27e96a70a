"""The overview page's data: every application's recent roll-ups (demand vs served, p99 against its SLO,
effective accuracy, violation ratio), fleet totals, the active plan, running jobs and recent changes, all
restricted to what the user may view. The live feed (ws/live/) then extends the same series."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.core.models import ObjectChange
from apps.deployments.models import Runtime
from apps.inventory.choices import AcceleratorKindChoices, HostStatusChoices
from apps.inventory.models import Accelerator, GpuInstance, Host
from apps.jobs.choices import JOB_ACTIVE_STATUSES
from apps.jobs.models import Job
from apps.planning.choices import PlanStatusChoices
from apps.planning.models import Plan
from apps.telemetry.selectors import application_catalogue_for, application_history

from .selectors import application_colour

HISTORY_SECONDS = 120
RECENT_CHANGES = 15


@dataclass
class ApplicationCard:
    name: str
    colour: str
    slo_ms: float | None
    latest: dict[str, Any]  # the newest second's roll-up, or Nones


def _may_view(user, object_type: str) -> bool:
    app_label, model = object_type.split(".", 1)
    return user.is_superuser or user.has_perm(f"{app_label}.view_{model}")


def recent_changes(user, limit: int = RECENT_CHANGES) -> list[dict[str, Any]]:
    """The newest audited changes to object types the user may view (the same rule as the live feed)."""
    out = []
    for change in ObjectChange.objects.restrict(user, "view").select_related("changed_object_type").order_by("-time")[: limit * 4]:
        object_type = f"{change.changed_object_type.app_label}.{change.changed_object_type.model}"
        if _may_view(user, object_type):
            out.append({
                "time": change.time, "action": change.action, "object_type": object_type,
                "object_repr": change.object_repr, "actor": change.actor_name, "changed_fields": change.changed_fields,
            })
        if len(out) == limit:
            break
    return out


def fleet_totals(user) -> dict[str, Any]:
    hosts = Host.objects.restrict(user, "view")
    return {
        "hosts": hosts.count(),
        "hosts_online": hosts.filter(status=HostStatusChoices.ONLINE).count(),
        "gpus": Accelerator.objects.restrict(user, "view").filter(kind=AcceleratorKindChoices.GPU).count(),
        "gpu_instances": GpuInstance.objects.restrict(user, "view").count(),
        "runtimes": Runtime.objects.restrict(user, "view").count(),
    }


def overview(user) -> dict[str, Any]:
    catalogue = application_catalogue_for(user)
    history = application_history(catalogue=catalogue, seconds=HISTORY_SECONDS)
    cards = []
    for name, entry in catalogue.items():
        series = history["applications"][name]
        latest = {field: (values[-1] if values else None) for field, values in series.items()}
        cards.append(ApplicationCard(name=name, colour=application_colour(name), slo_ms=entry.slo_ms, latest=latest))
    plans = Plan.objects.restrict(user, "view")
    jobs = Job.objects.restrict(user, "view")
    return {
        "applications": cards,
        "history": {**history, "slo_ms": {name: entry.slo_ms for name, entry in catalogue.items()},
                    "colours": {card.name: card.colour for card in cards}},
        "history_seconds": HISTORY_SECONDS,
        "fleet": fleet_totals(user),
        "active_plan": plans.filter(status=PlanStatusChoices.ACTIVE).first(),
        "pending_plans": plans.filter(status__in=[PlanStatusChoices.VALIDATED, PlanStatusChoices.APPROVED, PlanStatusChoices.ROLLING_OUT]).count(),
        "running_jobs": list(jobs.filter(status__in=JOB_ACTIVE_STATUSES)[:10]),
        "changes": recent_changes(user),
    }
