"""Audit receivers: write an ObjectChange for every save and delete of a ChangeLoggedModel (and for each
object of an audited bulk create, `objects_bulk_create_audited`), and announce it
on the change stream once the transaction commits."""
from __future__ import annotations

import logging
import uuid
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver

from .choices import ActorKindChoices, ObjectChangeActionChoices
from .context import change_context_current
from .models import ChangeLoggedModel, ObjectChange
from .principals import principal_is_agent, principal_is_router

logger = logging.getLogger(__name__)


def _actor(principal: Any) -> tuple[str, str, Any]:
    if principal_is_agent(principal) or principal_is_router(principal):  # the data plane
        return ActorKindChoices.AGENT, principal.username, None
    if principal is not None and getattr(principal, "is_authenticated", False):
        return ActorKindChoices.USER, principal.get_username(), principal
    return ActorKindChoices.SYSTEM, "system", None


def _change_build(instance: ChangeLoggedModel, action: str, before: dict | None, after: dict | None) -> ObjectChange:
    """The (unsaved) audit record of `action` on `instance` by the current change context's actor."""
    ctx = change_context_current()
    kind, name, user = _actor(ctx.actor() if ctx else None)
    return ObjectChange(
        actor_kind=kind,
        actor_name=name,
        user=user,
        request_id=ctx.request_id if ctx else uuid.uuid4(),
        source=ctx.source if ctx else "system",
        action=action,
        changed_object_type=ContentType.objects.get_for_model(instance, for_concrete_model=True),
        changed_object_id=str(instance.pk),
        object_repr=str(instance)[:200],
        prechange_data=before,
        postchange_data=after,
    )


def _record(instance: ChangeLoggedModel, action: str, before: dict | None, after: dict | None) -> None:
    if action == ObjectChangeActionChoices.UPDATE and before == after:
        return  # a save that changed nothing is not a change
    change = _change_build(instance, action, before, after)
    change.save()
    transaction.on_commit(lambda: _announce(change.pk))


# A bulk create announces at most this many of its changes on the change stream (the live "what changed"
# lists); every one is in the audit log.
BULK_ANNOUNCE_MAX = 20


def objects_bulk_create_audited(objects: list[ChangeLoggedModel], *, batch_size: int = 500) -> list[ChangeLoggedModel]:
    """Create `objects` (all of one ChangeLoggedModel, validated by the caller) in bulk, with the audit
    record each would have had from save(): one ObjectChange per object, with the same actor and request.
    For imports of thousands of rows, where a save, its audit insert and its announcement per row cost
    seconds. The first BULK_ANNOUNCE_MAX changes are announced on the change stream once committed. Needs a
    database that returns the new primary keys from a bulk insert (PostgreSQL; SQLite >= 3.35)."""
    if not objects:
        return []
    model = type(objects[0])
    if any(type(o) is not model for o in objects) or not issubclass(model, ChangeLoggedModel):
        raise TypeError("objects_bulk_create_audited takes objects of one ChangeLoggedModel")
    created = model.objects.bulk_create(objects, batch_size=batch_size)
    if any(o.pk is None for o in created):
        raise RuntimeError("the database did not return the new primary keys of a bulk insert")
    changes = ObjectChange.objects.bulk_create(
        [_change_build(o, ObjectChangeActionChoices.CREATE, None, o.audit_snapshot()) for o in created], batch_size=batch_size,
    )
    announce = [c.pk for c in changes[:BULK_ANNOUNCE_MAX] if c.pk is not None]
    transaction.on_commit(lambda: [_announce(pk) for pk in announce])
    return created


def _announce(change_id: int) -> None:
    from .streams import change_stream_publish

    try:
        change_stream_publish(change_id=change_id)
    except Exception:  # noqa: BLE001 - the change is committed; a down channel layer must not fail it
        logger.warning("could not publish change %s to the change stream", change_id, exc_info=True)


@receiver(pre_save)
def _snapshot_before_save(sender, instance, raw=False, **kwargs):
    if raw or not isinstance(instance, ChangeLoggedModel) or instance._state.adding:
        return
    previous = type(instance)._base_manager.filter(pk=instance.pk).first()
    instance._audit_before = previous.audit_snapshot() if previous else None


@receiver(post_save)
def _record_save(sender, instance, created, raw=False, **kwargs):
    if raw or not isinstance(instance, ChangeLoggedModel):
        return
    before = None if created else getattr(instance, "_audit_before", None)
    action = ObjectChangeActionChoices.CREATE if created or before is None else ObjectChangeActionChoices.UPDATE
    _record(instance, action, before, instance.audit_snapshot())
    instance._audit_before = None


@receiver(pre_delete)
def _snapshot_before_delete(sender, instance, **kwargs):
    if isinstance(instance, ChangeLoggedModel):
        instance._audit_before = instance.audit_snapshot()


@receiver(post_delete)
def _record_delete(sender, instance, **kwargs):
    if isinstance(instance, ChangeLoggedModel):
        _record(instance, ObjectChangeActionChoices.DELETE, getattr(instance, "_audit_before", None), None)
