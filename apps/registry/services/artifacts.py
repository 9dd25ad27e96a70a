"""Registry services for ONNX artifacts: an upload is spooled (size-capped), inspected (ONNX checker,
onnxruntime) and stored once per sha256; a stored artifact can be verified again at any time."""
from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path
from typing import IO

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction
from django.utils import timezone

from ..models import Artifact
from ..onnx_inspect import InvalidOnnxModel, onnx_model_inspect

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
