"""Applications and variants, with the ONNX upload."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.shortcuts import redirect, render

from apps.core.context import change_context
from apps.registry.models import ModelVariant
from apps.registry.services.artifacts import artifact_create

from ..selectors import application_queryset_for, applications_overview, pipelines_declared
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
        "pipelines": pipelines_declared(request.user),
        "errors": errors, "values": values,
        "application_choices": application_queryset_for(request.user).values_list("pk", "name") if can_upload else [],
    }
    return render(request, "dashboard/applications.html", context, status=status)


