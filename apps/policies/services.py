"""Policy services: the one way a policy is changed, from the REST API (the viewsets' perform_update) and
the dashboard's Policies page alike. Each takes typed values (the API's serializer or the page's form
parses the input), checks them with the model's `full_clean()` (field validators and `clean()`: the one
place a policy's invariants live) and saves in one transaction. Saving is what the rest follows from: the
audit record (apps/core/signals.py) and, for a re-planning policy, its django-celery-beat schedule
(apps/planning/signals.py, `triggers.replan_schedule_sync`), written in the same transaction."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from django.db import models, transaction

from .models import ProfilingPolicy, ReplanPolicy, SloPolicy

PolicyT = TypeVar("PolicyT", SloPolicy, ReplanPolicy, ProfilingPolicy)


def policy_editable_fields(model: type[models.Model]) -> frozenset[str]:
    """The fields a policy update may set: the model's editable concrete fields (not its id, not the
    `created` / `last_updated` timestamps)."""
    return frozenset(f.name for f in model._meta.concrete_fields if f.editable and not f.primary_key)


def _policy_update(policy: PolicyT, data: Mapping[str, Any]) -> PolicyT:
    unknown = sorted(set(data) - policy_editable_fields(type(policy)))
    if unknown:
        raise ValueError(f"{type(policy).__name__} has no editable field {', '.join(unknown)}")
    with transaction.atomic():
        for name, value in data.items():
            setattr(policy, name, value)
        policy.full_clean()
        policy.save()
    return policy


def slo_policy_update(*, policy: SloPolicy, data: Mapping[str, Any]) -> SloPolicy:
    """Set an SLO policy's fields (latency target, minimum accuracy, priority, drop rule, application)
    from `data`, validate and save. Raises django ValidationError (by field) and saves nothing when the
    values are refused."""
    return _policy_update(policy, data)


def replan_policy_update(*, policy: ReplanPolicy, data: Mapping[str, Any]) -> ReplanPolicy:
    """Set a re-planning policy's fields from `data`, validate and save; its periodic re-plan
    ("replan:<name>") is rescheduled, enabled or disabled in the same transaction. Raises django
    ValidationError (by field) and changes nothing when the values are refused."""
    return _policy_update(policy, data)


def profiling_policy_update(*, policy: ProfilingPolicy, data: Mapping[str, Any]) -> ProfilingPolicy:
    """Set a profiling policy's fields from `data`, validate (lists normalised: names stripped, numbers
    sorted) and save. Raises django ValidationError (by field) and saves nothing when refused."""
    return _policy_update(policy, data)
