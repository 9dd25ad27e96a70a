"""Base serializer: the model's own `clean()` is the one place an invariant lives, so the API and the
admin refuse the same bad input with the same message."""
from __future__ import annotations

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from .exceptions import validation_error_from_django


class TesseraModelSerializer(serializers.ModelSerializer):
    display = serializers.SerializerMethodField(read_only=True)

    def get_display(self, obj) -> str:
        return str(obj)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model = self.Meta.model
        many_to_many = {f.name for f in model._meta.many_to_many}
        plain = {k: v for k, v in attrs.items() if k not in many_to_many}
        candidate = copy.copy(self.instance) if self.instance is not None else model()
        for name, value in plain.items():
            setattr(candidate, name, value)
        try:
            # Unique checks already ran in DRF's validators with field-level messages.
            candidate.full_clean(validate_unique=False, validate_constraints=False)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc
        # clean() may normalise or derive values (a canonical GPU name, a computed throughput): keep them.
        writable = {name for name, field in self.fields.items() if not field.read_only}
        for field in model._meta.concrete_fields:
            if field.name in writable and field.name not in many_to_many:
                attrs[field.name] = getattr(candidate, field.name)
        return attrs

