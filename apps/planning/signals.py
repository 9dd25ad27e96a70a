"""Planning's signal receivers, connected in PlanningConfig.ready():

- ReplanPolicy saved or deleted: its periodic re-plan (django-celery-beat) is rescheduled, enabled,
  disabled or removed in the same transaction (`triggers.replan_schedule_sync`), so editing the interval
  through the API takes effect at once.
- The model pool changed: a variant's first profile on a device type (it can now be placed there), or the
  deletion of a variant that had profiles: a "model_pool" re-plan is queued once the transaction commits
  (task "planning.replan_trigger", debounced there). Creating a variant alone does not trigger: without a
  profile the planner cannot place it; its first profile does. Profiles written in bulk (bulk_create sends
  no signals) are caught by the watch's model_pool_change_check.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_delete

from apps.policies.models import ReplanPolicy
from apps.registry.models import ModelVariant, Profile

from .choices import PlanTriggerChoices

log = logging.getLogger("tessera.planning.triggers")


def _replan_policy_saved(sender, instance: ReplanPolicy, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    from .triggers import replan_schedule_sync

    replan_schedule_sync(policy=instance)


def _replan_policy_deleted(sender, instance: ReplanPolicy, **kwargs) -> None:
    from .triggers import replan_schedule_sync

    replan_schedule_sync(policy=instance)


def _model_pool_trigger_on_commit(detail: str) -> None:
    def enqueue() -> None:
        from .trigger_tasks import replan_trigger_task

        replan_trigger_task.delay(trigger=PlanTriggerChoices.MODEL_POOL.value, detail=detail)

    # robust: a broker that is down must not fail the save that committed (the watch catches up).
    transaction.on_commit(enqueue, robust=True)


def _profile_saved(sender, instance: Profile, created: bool = False, raw: bool = False, **kwargs) -> None:
    if raw or not created:
        return
    others = Profile.objects.filter(variant_id=instance.variant_id, device_type=instance.device_type).exclude(pk=instance.pk)
    if others.exists():
        return
    variant = instance.variant
    _model_pool_trigger_on_commit(f"model pool changed: {variant.application.name}/{variant.name} on {instance.device_type}")


def _variant_deleting(sender, instance: ModelVariant, **kwargs) -> None:
    instance._planning_had_profiles = instance.profiles.exists()


def _variant_deleted(sender, instance: ModelVariant, **kwargs) -> None:
    if getattr(instance, "_planning_had_profiles", False):
        _model_pool_trigger_on_commit(f"model pool changed: {instance} deleted")


def connect() -> None:
    post_save.connect(_replan_policy_saved, sender=ReplanPolicy, dispatch_uid="planning.replan_policy_saved")
    post_delete.connect(_replan_policy_deleted, sender=ReplanPolicy, dispatch_uid="planning.replan_policy_deleted")
    post_save.connect(_profile_saved, sender=Profile, dispatch_uid="planning.profile_saved")
    pre_delete.connect(_variant_deleting, sender=ModelVariant, dispatch_uid="planning.variant_deleting")
    post_delete.connect(_variant_deleted, sender=ModelVariant, dispatch_uid="planning.variant_deleted")
