"""Applications and variants, with the ONNX upload."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.core.context import change_context
from apps.jobs.services import JobConflict
from apps.registry.models import ModelVariant
from apps.registry.services.artifacts import artifact_create

from ..applications import APPLICATIONS_WINDOW_S, application_deploy_steps, application_detail, applications_list
from ..selectors import application_queryset_for, pipelines_declared
from .common import _require

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
    """Every application in one table (its SLO, demand, what was served and how fast, at what accuracy, its
    variants and state; viewer and up: `registry.view_application`), each linking to its own page; operators
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
            return redirect("dashboard:application", pk=variant.application_id)
    rows = applications_list(request.user)
    if request.method == "GET" and request.GET.get("application", "").isdigit():
        values = {"application": request.GET["application"]}  # "Upload one" from an application's page
    context = {
        "rows": rows, "nav": "applications", "can_upload": can_upload, "window_s": APPLICATIONS_WINDOW_S,
        "pipelines": pipelines_declared(request.user),
        "errors": errors, "values": values,
        "application_choices": [(r.pk, r.name) for r in rows] if can_upload else [],
    }
    return render(request, "dashboard/applications.html", context, status=status)


@login_required
def application(request, pk: int):
    """One application's page: its SLO and serving configuration, its traffic, its variants with their
    latency profiles, the pipelines and the ensemble it belongs to, and its latest plans."""
    _require(request, "registry.view_application", "Viewing applications needs the viewer role.")
    detail = application_detail(request.user, pk)
    context = {"detail": detail, "a": detail.view, "row": detail.row, "nav": "applications", "can_upload": _can_upload(request.user),
               "pipelines": detail.pipelines, "window_s": APPLICATIONS_WINDOW_S,
               # Each step with whether this user may take its action (the API's permission for the same call).
               "steps": [{"step": step, "allowed": bool(step.action) and request.user.has_perms(DEPLOY_PERMS[step.action])}
                         for step in application_deploy_steps(detail.application, detail.row)]}
    return render(request, "dashboard/application.html", context)


# The guided deploy flow's actions, each with the permission it needs (the API's for the same call).
DEPLOY_PERMS = {"slo": ("policies.add_slopolicy",), "profile": ("registry.view_modelvariant", "registry.add_profilingrequest"),
                "plan": ("planning.add_plan",), "apply": ("planning.change_plan",)}


@login_required
@require_POST
def application_deploy(request, pk: int, action: str):
    """The next step of putting an application into service, from its page: profile its unprofiled variants
    on the fleet's agents, plan the fleet, or approve and apply the plan that serves it. Each opens the job
    that follows it (live progress); a refused step comes back as a message on the page, having changed
    nothing."""
    perms = DEPLOY_PERMS.get(action)
    if perms is None:
        raise Http404("No such step.")
    _require(request, "registry.view_application", "Viewing applications needs the viewer role.")
    if not request.user.has_perms(perms):
        raise PermissionDenied("This step needs the operator role.")
    application = get_object_or_404(application_queryset_for(request.user), pk=pk)
    try:
        with change_context(request=request, source="web"), transaction.atomic():  # a refused step changes nothing
            job = _deploy_step(request, application, action)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("dashboard:application", pk=application.pk)
    except JobConflict as exc:
        messages.error(request, f"Not now: {exc}")
        return redirect("dashboard:application", pk=application.pk)
    if job is None:  # a step that is done at once (the SLO policy)
        messages.success(request, f"{application.name}: SLO policy set.")
        return redirect("dashboard:application", pk=application.pk)
    messages.success(request, f"{application.name}: {action} started as job {job.pk}.")
    return redirect("dashboard:job", pk=job.pk)


def _deploy_step(request, application, action: str):
    from apps.planning.rollout import plan_apply, plan_approve
    from apps.planning.services import plan_run_start
    from apps.registry.services.profiling import variant_profile

    from ..applications import PLAN_APPLICABLE_STATUSES, plan_serving_find

    if action == "slo":
        from apps.policies.models import SloPolicy

        if SloPolicy.objects.filter(application=application).exists():
            raise ValidationError(f"{application.name} has an SLO policy already: change it on the Policies page.")
        values = {}
        for field, required in (("latency_p99_ms", True), ("expected_rps", False)):
            raw = request.POST.get(field, "").strip()
            if not raw and not required:
                continue
            try:
                values[field] = float(raw)
            except ValueError:
                raise ValidationError(f"{field.replace('_', ' ')}: give a number, not {raw!r}.") from None
        policy = SloPolicy(application=application, **values)
        policy.full_clean()
        policy.save()
        return None
    if action == "profile":
        unprofiled = [v for v in application.variants.filter(artifact__isnull=False, profiles__isnull=True).distinct().order_by("name")]
        if not unprofiled:
            raise ValidationError("Every variant with an ONNX file is profiled already.")
        started = None
        for variant in unprofiled:
            start = variant_profile(variant=variant, actor=request.user)
            for skipped in start.skipped:
                where = skipped.device_type + (f" {skipped.slice}" if skipped.slice else "")
                messages.warning(request, f"{variant.name}: not profiled on {where}: {skipped.reason}")
            started = start.job
        return started
    if action == "plan":
        return plan_run_start(trigger="manual", trigger_detail=f"dashboard: deploy {application.name}", actor=request.user)
    plan = plan_serving_find(application, PLAN_APPLICABLE_STATUSES)
    if plan is None:
        raise ValidationError(f"No validated plan serves {application.name}: plan the fleet first.")
    if plan.status == "validated":
        plan_approve(plan=plan, actor=request.user)
    return plan_apply(plan=plan, actor=request.user)
