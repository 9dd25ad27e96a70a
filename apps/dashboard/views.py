from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.core.context import change_context
from apps.jobs.models import Job
from apps.jobs.services import JobConflict
from apps.planning.rollout import plan_apply, plan_approve, plan_rollback

from .selectors import fleet_overview, job_queryset_for, plan_detail, plan_list, plan_queryset_for


@login_required
def fleet(request):
    """Every host with its GPUs' MIG layouts and CPU devices (viewer and up: `inventory.view_host`)."""
    if not request.user.has_perm("inventory.view_host"):
        raise PermissionDenied("Viewing the fleet needs the viewer role.")
    hosts = fleet_overview(request.user)
    return render(request, "dashboard/fleet.html", {"hosts": hosts, "nav": "fleet"})


# --------------------------------------------------------------------------- plans and jobs

def _require(request, perm: str, what: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied(what)


@login_required
def plans(request):
    """Every plan, newest first (viewer and up: `planning.view_plan`)."""
    _require(request, "planning.view_plan", "Viewing plans needs the viewer role.")
    return render(request, "dashboard/plans.html", {"plans": plan_list(request.user), "nav": "plans"})


@login_required
def plan(request, pk: int):
    _require(request, "planning.view_plan", "Viewing plans needs the viewer role.")
    obj = get_object_or_404(plan_queryset_for(request.user), pk=pk)
    context = plan_detail(obj)
    context.update(nav="plans", can_change=request.user.has_perm("planning.change_plan"))
    return render(request, "dashboard/plan.html", context)


PLAN_SERVICES = {"approve": plan_approve, "apply": plan_apply, "rollback": plan_rollback}


@login_required
@require_POST
def plan_action(request, pk: int, action: str):
    """Approve, apply or roll back a plan (operator and up: `planning.change_plan`). A refused action comes
    back as a message on the plan's page; apply and rollback open their job's page."""
    _require(request, "planning.change_plan", "Changing plans needs the operator role.")
    service = PLAN_SERVICES.get(action)
    if service is None:
        raise Http404("No such action.")
    obj = get_object_or_404(plan_queryset_for(request.user), pk=pk)
    try:
        with change_context(request=request, source="web"):
            result = service(plan=obj, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("dashboard:plan", pk=obj.pk)
    except JobConflict as exc:
        messages.error(request, f"Another rollout is running: {exc}")
        return redirect("dashboard:plan", pk=obj.pk)
    if isinstance(result, Job):
        messages.success(request, f"Plan {obj.pk}: {action} started as job {result.pk}.")
        return redirect("dashboard:job", pk=result.pk)
    messages.success(request, f"Plan {obj.pk} approved.")
    return redirect("dashboard:plan", pk=obj.pk)


@login_required
def jobs(request):
    """Every job, newest first (viewer and up: `jobs.view_job`)."""
    _require(request, "jobs.view_job", "Viewing jobs needs the viewer role.")
    return render(request, "dashboard/jobs.html", {"jobs": job_queryset_for(request.user)[:200], "nav": "jobs"})


@login_required
def job(request, pk: int):
    _require(request, "jobs.view_job", "Viewing jobs needs the viewer role.")
    obj = get_object_or_404(job_queryset_for(request.user), pk=pk)
    plan_ids = [t.get("id") for t in obj.targets if t.get("type") == "planning.plan"]
    return render(request, "dashboard/job.html", {"job": obj, "plan_ids": plan_ids, "nav": "jobs"})
