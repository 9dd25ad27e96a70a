"""Plans: list, detail, and the operator's approve, apply and rollback."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.core.context import change_context
from apps.jobs.models import Job
from apps.jobs.services import JobConflict
from apps.planning.rollout import plan_apply, plan_approve, plan_rollback
from engine.solvers.registry import DEFAULT_PLANNER

from ..plan_geometry import plan_geometry
from ..selectors import plan_detail, plan_list, plan_queryset_for, planner_rows
from .common import _require

@login_required
def plans(request):
    """Every plan, newest first (viewer and up: `planning.view_plan`)."""
    _require(request, "planning.view_plan", "Viewing plans needs the viewer role.")
    return render(request, "dashboard/plans.html", {"plans": plan_list(request.user), "planners": planner_rows(),
                                                    "default_planner": DEFAULT_PLANNER, "nav": "plans"})


@login_required
def plan(request, pk: int):
    _require(request, "planning.view_plan", "Viewing plans needs the viewer role.")
    obj = get_object_or_404(plan_queryset_for(request.user), pk=pk)
    context = plan_detail(obj)
    context.update(nav="plans", can_change=request.user.has_perm("planning.change_plan"),
                   geometry=plan_geometry(obj, user=request.user))
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


