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



class ChoiceTextField(serializers.CharField):
    """A choice field documented as a string with its values listed, not as an OpenAPI enum. For fields
    whose name another choice set already uses (`state`, `status`): drf-spectacular names enums after the
    field, and two sets under one name would rename the existing enum component."""

    def __init__(self, *, choices, **kwargs):
        self.choice_values = [value for value, _ in choices] if choices and isinstance(choices[0], tuple) else list(choices)
        listed = ", ".join(self.choice_values)
        help_text = kwargs.pop("help_text", "")
        kwargs["help_text"] = f"{help_text} One of: {listed}." if help_text else f"One of: {listed}."
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value not in self.choice_values:
            self.fail("invalid_choice", input=value)
        return value

    default_error_messages = {"invalid_choice": '"{input}" is not a valid choice.'}
