"""The audit log and the base class of every audited model."""
from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core import serializers
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from .choices import ActorKindChoices, ObjectChangeActionChoices
from .querysets import RestrictedQuerySet


class ChangeLoggedModel(models.Model):
    """Every create, update and delete of a subclass is written to `ObjectChange` with the actor and the
    before/after field values. Fields named in `audit_exclude_fields` (secrets, hashes) are left out."""

    created = models.DateTimeField(auto_now_add=True)
    last_updated = models.DateTimeField(auto_now=True)

    objects = RestrictedQuerySet.as_manager()

    audit_exclude_fields: tuple[str, ...] = ()

    class Meta:
        abstract = True

    def audit_snapshot(self) -> dict[str, Any]:
        data = serializers.serialize("python", [self])[0]["fields"]
        for name in ("created", "last_updated", *self.audit_exclude_fields):
            data.pop(name, None)
        # Through DjangoJSONEncoder once so datetimes, decimals and UUIDs become plain JSON values.
        return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


class ObjectChange(models.Model):
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_kind = models.CharField(max_length=10, choices=ActorKindChoices.choices)
    actor_name = models.CharField(max_length=200)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes"
    )
    request_id = models.UUIDField(db_index=True)
    source = models.CharField(max_length=20, help_text="web (API or admin), task, command or system")
    action = models.CharField(max_length=10, choices=ObjectChangeActionChoices.choices)
    changed_object_type = models.ForeignKey(ContentType, on_delete=models.PROTECT, related_name="+")
    changed_object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    prechange_data = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    postchange_data = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["changed_object_type", "changed_object_id"])]

    def __str__(self) -> str:
        return f"{self.get_action_display()} {self.changed_object_type.model} {self.object_repr} by {self.actor_name}"

    @property
    def changed_fields(self) -> list[str]:
        before, after = self.prechange_data or {}, self.postchange_data or {}
        return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
