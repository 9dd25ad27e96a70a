"""Celery adapters over registry services."""
from celery import shared_task

from .services import artifact_verify


@shared_task(name="registry.artifact_verify", acks_late=True, max_retries=3, soft_time_limit=300, time_limit=330)
def artifact_verify_task(artifact_id: int) -> dict:
    artifact = artifact_verify(artifact_id=artifact_id)
    return {"artifact": artifact.pk, "ok": not artifact.verify_error, "error": artifact.verify_error}
