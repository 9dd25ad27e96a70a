from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.core.context import change_context
from apps.jobs.models import Job
from apps.jobs.services import JobConflict
from apps.planning.rollout import plan_apply, plan_approve, plan_rollback
from apps.registry.models import ModelVariant
from apps.registry.services import artifact_create

from .selectors import (
    application_queryset_for,
    applications_overview,
    fleet_overview,
    job_queryset_for,
    plan_detail,
    plan_list,
    plan_queryset_for,
)


@login_required
def fleet(request):
    """Every host with its GPUs' MIG layouts and CPU devices (viewer and up: `inventory.view_host`)."""
    if not request.user.has_perm("inventory.view_host"):
        raise PermissionDenied("Viewing the fleet needs the viewer role.")
    hosts = fleet_overview(request.user)
    return render(request, "dashboard/fleet.html", {"hosts": hosts, "nav": "fleet"})


def _require(request, perm: str, what: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied(what)


# --------------------------------------------------------------------------- applications

UPLOAD_PERMS = ("registry.add_artifact", "registry.add_modelvariant")
UPLOAD_FIELDS = ("application", "name", "accuracy", "accuracy_metric", "file")


def _can_upload(user) -> bool:
    return all(user.has_perm(perm) for perm in UPLOAD_PERMS)


def _errors_by_field(exc: ValidationError) -> dict[str, list[str]]:
    """A ValidationError as {form field: [messages]}; anything not tied to a form field goes under "form"."""
    if not hasattr(exc, "error_dict"):
        return {"form": list(exc.messages)}
    errors: dict[str, list[str]] = {}
    for field, messages_ in exc.message_dict.items():
        key = field if field in UPLOAD_FIELDS else "form"
        if key == "form" and field not in ("__all__", "form"):
            messages_ = [f"{field}: {m}" for m in messages_]
        errors.setdefault(key, []).extend(messages_)
    return errors


def _variant_upload(request) -> ModelVariant:
    """Store the uploaded ONNX file as an artifact and a new variant using it, both or neither."""
    data = request.POST
    errors: dict[str, str] = {}
    application = None
    application_id = data.get("application", "")
    if application_id.isdigit():
        application = application_queryset_for(request.user).filter(pk=int(application_id)).first()
    if application is None:
        errors["application"] = "Choose an application."
    upload = request.FILES.get("file")
    if upload is None:
        errors["file"] = "Choose an ONNX file."
    if errors:
        raise ValidationError(errors)
    artifact = None
    try:
        with change_context(request=request, source="web"), transaction.atomic():
            artifact = artifact_create(upload=upload, original_name=upload.name, uploaded_by=request.user)
            variant = ModelVariant(
                application=application, name=data.get("name", "").strip(), accuracy=data.get("accuracy", "").strip(),
                accuracy_metric=data.get("accuracy_metric", "").strip(), artifact=artifact,
            )
            variant.full_clean()
            variant.save()
    except Exception:
        # The rows are rolled back; the stored file must go too.
        if artifact is not None and artifact.file.name:
            artifact.file.storage.delete(artifact.file.name)
        raise
    return variant


@login_required
def applications(request):
    """Every application with its SLO and variants (viewer and up: `registry.view_application`); operators
    and up also get a form to upload a new variant with its ONNX file."""
    _require(request, "registry.view_application", "Viewing applications needs the viewer role.")
    can_upload = _can_upload(request.user)
    status, errors, values = 200, {}, {}
    if request.method == "POST":
        if not can_upload:
            raise PermissionDenied("Uploading a variant needs the operator role.")
        try:
            variant = _variant_upload(request)
        except ValidationError as exc:
            status, errors = 400, _errors_by_field(exc)
            values = {key: request.POST.get(key, "") for key in UPLOAD_FIELDS if key != "file"}
        else:
            messages.success(request, f"Variant {variant} uploaded (artifact {variant.artifact.sha256[:12]}).")
            return redirect("dashboard:applications")
    context = {
        "applications": applications_overview(request.user), "nav": "applications", "can_upload": can_upload,
        "errors": errors, "values": values,
        "application_choices": application_queryset_for(request.user).values_list("pk", "name") if can_upload else [],
    }
    return render(request, "dashboard/applications.html", context, status=status)


# --------------------------------------------------------------------------- plans and jobs


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
