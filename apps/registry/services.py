"""Registry services: artifact upload and verification, profiling requests' progress and results."""
from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction
from django.utils import timezone

from .choices import CPU_DEVICE_TYPE, PROFILING_FINISHED, ProfileSourceChoices, ProfilingStatusChoices
from .models import Artifact, Profile, ProfilingRequest
from .onnx_inspect import InvalidOnnxModel, onnx_model_inspect

logger = logging.getLogger(__name__)


def _spool(upload: IO[bytes], limit: int) -> Path:
    """Copy an upload to a temporary file, refusing it as soon as it passes the size limit."""
    tmp = tempfile.NamedTemporaryFile(prefix="tessera-upload-", suffix=".onnx", delete=False)
    size = 0
    with tmp:
        for chunk in iter(lambda: upload.read(1024 * 1024), b""):
            size += len(chunk)
            if size > limit:
                Path(tmp.name).unlink(missing_ok=True)
                raise ValidationError({"file": f"File is larger than the limit of {limit} bytes."})
            tmp.write(chunk)
    if size == 0:
        Path(tmp.name).unlink(missing_ok=True)
        raise ValidationError({"file": "The file is empty."})
    return Path(tmp.name)


def artifact_create(*, upload: IO[bytes], original_name: str, uploaded_by=None) -> Artifact:
    """Validate an ONNX upload and store it. A rejected upload (too big, not ONNX, failing the checker,
    not loadable by onnxruntime, already stored) leaves no row and no file behind."""
    limit = settings.TESSERA_ARTIFACT_MAX_BYTES
    declared = getattr(upload, "size", None)
    if declared is not None and declared > limit:
        raise ValidationError({"file": f"File is larger than the limit of {limit} bytes."})
    path = _spool(upload, limit)
    try:
        try:
            info = onnx_model_inspect(path)
        except InvalidOnnxModel as exc:
            raise ValidationError({"file": str(exc)}) from exc
        existing = Artifact.objects.filter(sha256=info.sha256).first()
        if existing is not None:
            raise ValidationError({"file": f"This file is already stored as artifact {existing.pk} ({existing.original_name})."})
        artifact = Artifact(
            original_name=Path(original_name).name[:255] or "model.onnx",
            sha256=info.sha256,
            size_bytes=info.size_bytes,
            ir_version=info.ir_version,
            opset=info.opset,
            producer=info.producer[:100],
            inputs=info.inputs,
            outputs=info.outputs,
            uploaded_by=uploaded_by if getattr(uploaded_by, "pk", None) else None,
        )
        try:
            with transaction.atomic():
                with path.open("rb") as fh:
                    artifact.file.save("model.onnx", File(fh), save=False)
                artifact.save()
        except Exception:
            if artifact.file.name:
                artifact.file.storage.delete(artifact.file.name)
            raise
        return artifact
    finally:
        path.unlink(missing_ok=True)


def artifact_verify(*, artifact_id: int) -> Artifact:
    """Re-read a stored artifact: the bytes must still hash to its sha256 and still load in onnxruntime.
    Records the outcome on the artifact; safe to run any number of times."""
    artifact = Artifact.objects.get(pk=artifact_id)
    error = ""
    try:
        with artifact.file.open("rb") as fh:
            data = fh.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != artifact.sha256:
            error = f"Stored file hashes to {digest}, expected {artifact.sha256}."
        else:
            onnx_model_inspect(data)
    except (OSError, InvalidOnnxModel) as exc:
        error = f"{type(exc).__name__}: {exc}"
    Artifact.objects.filter(pk=artifact.pk).update(last_verified=timezone.now(), verify_error=error)
    if error:
        logger.error("artifact %s failed verification: %s", artifact.pk, error)
    artifact.refresh_from_db()
    return artifact


PROFILING_LOG_MAX_CHARS = 100_000  # the log keeps its latest lines up to this size


def _log_append(log: str, line: str) -> str:
    if not line:
        return log
    log = f"{log}{line.rstrip(chr(10))}\n"
    return log[-PROFILING_LOG_MAX_CHARS:]


def _profiling_request_lock(profiling_request: ProfilingRequest) -> ProfilingRequest:
    locked = ProfilingRequest.objects.select_for_update().select_related("host", "variant__application").get(pk=profiling_request.pk)
    if locked.status in PROFILING_FINISHED:
        raise ValidationError({"status": f"Profiling request {locked.pk} has already {locked.status}."})
    return locked


@transaction.atomic
def profiling_request_progress(
    *, profiling_request: ProfilingRequest, status: str | None = None, progress: int | None = None, log_line: str = "", error: str = ""
) -> ProfilingRequest:
    """The agent's progress on a profiling request: `running` (any report on a pending request starts it),
    `failed` (finishes it, with `error`), a percentage, a log line appended. A finished request refuses."""
    pr = _profiling_request_lock(profiling_request)
    now = timezone.now()
    if status not in (None, ProfilingStatusChoices.RUNNING, ProfilingStatusChoices.FAILED):
        raise ValidationError({"status": "Progress sets running or failed; results set succeeded."})
    if progress is not None and not 0 <= progress <= 100:
        raise ValidationError({"progress": "Progress is a percentage, 0 to 100."})
    if pr.started is None:
        pr.started = now
    pr.status = status or ProfilingStatusChoices.RUNNING
    if progress is not None:
        pr.progress = progress
    if pr.status == ProfilingStatusChoices.FAILED:
        pr.finished = now
        pr.error = error or "The agent reported a failure."
    elif error:
        pr.error = error
    pr.log = _log_append(pr.log, log_line)
    pr.save()
    return pr


@transaction.atomic
def profiling_results_record(*, profiling_request: ProfilingRequest, points: list[dict[str, Any]], log_line: str = "") -> list[Profile]:
    """Store a profiling request's measurements as `measured` Profile rows (a point already profiled is
    updated in place) and mark the request succeeded. Each point must be one the request asked for: its
    device type and slice, one of its batch sizes (and, on a CPU, one of its thread counts as cpu_cores).
    All or nothing."""
    pr = _profiling_request_lock(profiling_request)
    if not points:
        raise ValidationError({"points": "Give at least one measured point."})
    now = timezone.now()
    device_type, slice_name = pr.profile_device_type, pr.profile_slice
    is_cpu = device_type == CPU_DEVICE_TYPE
    where = f"{pr.device}/{pr.placement}" if pr.placement else pr.device
    detail = f"Measured on {pr.host.name} {where} (profiling request {pr.pk})"[:200]
    errors, profiles, keys = [], [], set()
    for i, point in enumerate(points):
        profile = Profile(
            variant=pr.variant, device_type=point.get("device_type", ""), slice=point.get("slice") or "",
            cpu_cores=point.get("cpu_cores"), batch_size=point.get("batch_size"),
            latency_p50_ms=point.get("latency_p50_ms"), latency_p99_ms=point.get("latency_p99_ms"),
            throughput_rps=point.get("throughput_rps"), memory_mb=point.get("memory_mb"),
            source=ProfileSourceChoices.MEASURED, source_detail=detail, measured_at=now,
        )
        try:
            profile.full_clean(validate_unique=False, validate_constraints=False)  # normalises GPU and slice names
        except ValidationError as exc:
            errors.append(f"points[{i}]: {'; '.join(exc.messages)}")
            continue
        problems = []
        if profile.device_type != device_type:
            problems.append(f"device_type {profile.device_type!r} is not the request's ({device_type!r})")
        if profile.slice != slice_name:
            problems.append(f"slice {profile.slice!r} is not the request's ({slice_name!r})")
        if is_cpu and profile.cpu_cores not in pr.cpu_threads:
            problems.append(f"cpu_cores {profile.cpu_cores} is not one of the request's thread counts {pr.cpu_threads}")
        if profile.batch_size not in pr.batch_sizes:
            problems.append(f"batch_size {profile.batch_size} is not one of the request's {pr.batch_sizes}")
        key = (profile.device_type, profile.slice, profile.cpu_cores, profile.batch_size)
        if key in keys:
            problems.append("the same point is given twice")
        keys.add(key)
        if problems:
            errors.append(f"points[{i}]: {'; '.join(problems)}")
            continue
        profiles.append(profile)
    if errors:
        raise ValidationError({"points": errors})
    stored = []
    for profile in profiles:
        existing = Profile.objects.filter(
            variant=pr.variant, device_type=profile.device_type, slice=profile.slice,
            cpu_cores=profile.cpu_cores, batch_size=profile.batch_size,
        ).first()
        if existing is not None:
            profile.pk, profile.created = existing.pk, existing.created
            profile._state.adding = False
        profile.save()
        stored.append(profile)
    pr.status = ProfilingStatusChoices.SUCCEEDED
    pr.progress = 100
    pr.started = pr.started or now
    pr.finished = now
    pr.log = _log_append(pr.log, log_line)
    pr.save()
    return stored
