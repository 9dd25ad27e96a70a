"""A fast path for validating the data plane's reports with their DRF serializers.

DRF validates a field in about 2 us of bookkeeping (empty-value checks, `to_internal_value`, a loop over
validator objects, error collection), so an agent's report of a few hundred fields takes about 0.3 ms, a
large share of what ingest may spend on it at a thousand reports a second. `serializer_compile` reads a
serializer's declared fields once and returns a function that validates the *well-formed* case directly:
exact JSON types (an int for an IntegerField, a str for a CharField), the fields' own bounds and
validators, defaults for missing keys, lists (ListField, many=True) of what it knows. Whatever it cannot
vouch for (a string where a number is due, a value out of bounds, a field type or validator it does not
know) it hands back as `None`, and the caller runs the serializer as usual, which accepts it with the
same value or raises the error a client sees. So the serializer stays the one definition of a report (and
of the API schema); this only skips DRF's machinery where the answer is known. It never accepts what DRF
refuses and never changes a value DRF would keep: tests/api/test_validation_compiled.py and
tests/api/test_validation_compiled_lists.py check both against DRF on generated reports and fields.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from django.core import validators as django_validators
from rest_framework import fields as drf_fields
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

__all__ = ["serializer_compile"]


class _Defer(Exception):
    """This value is DRF's to judge."""


Check = Callable[[Any], Any]


def _overrides(field: drf_fields.Field, base: type, *names: str) -> bool:
    """Whether the field's class changes any of `names` relative to `base` (then its behaviour is its own)."""
    return any(getattr(type(field), name, None) is not getattr(base, name, None) for name in names)


def _validators_check(field: drf_fields.Field) -> Callable[[Any], None] | None:
    """One function running the field's validators on an internal value, raising _Defer where one refuses;
    None when the field has a validator this module does not know (the field then goes to DRF whole)."""
    steps: list[Callable[[Any], bool]] = []
    for validator in field.validators:
        kind = type(validator)
        if kind in (django_validators.MinValueValidator, django_validators.MaxValueValidator,
                    django_validators.MinLengthValidator, django_validators.MaxLengthValidator):
            limit = validator.limit_value
            if callable(limit):
                return None
            if kind is django_validators.MinValueValidator:
                steps.append(lambda v, limit=limit: v >= limit)
            elif kind is django_validators.MaxValueValidator:
                steps.append(lambda v, limit=limit: v <= limit)
            elif kind is django_validators.MinLengthValidator:
                steps.append(lambda v, limit=limit: len(v) >= limit)
            else:
                steps.append(lambda v, limit=limit: len(v) <= limit)
        elif kind is django_validators.ProhibitNullCharactersValidator:
            steps.append(lambda v: "\x00" not in v)
        elif kind is ProhibitSurrogateCharactersValidator:
            steps.append(lambda v: v.isascii() or not any(0xD800 <= ord(c) <= 0xDFFF for c in v))
        else:
            return None

    def run(value: Any) -> None:
        for step in steps:
            if not step(value):
                raise _Defer
    return run


def _configured_only(field: drf_fields.Field, base: type) -> Callable[[Any], None] | None:
    """The field's validators as one function when its class only configures `base` (bounds, defaults) and
    every validator is one this module knows; else None (the field goes to DRF whole)."""
    if _overrides(field, base, "run_validation", "to_internal_value", "validate_empty_values", "run_validators", "validate"):
        return None
    return _validators_check(field)


def _nullable(field: drf_fields.Field, check: Check) -> Check:
    """`check` for a present value; null as the field takes it (DRF returns None without validating)."""
    allow_null = field.allow_null

    def guarded(value: Any) -> Any:
        if value is None:
            if allow_null:
                return None
            raise _Defer
        return check(value)
    return guarded


def _generic(field: drf_fields.Field) -> Check:
    """DRF's own validation of one field (a type this module does not speed up); its refusal defers."""
    def check(value: Any) -> Any:
        try:
            return field.run_validation(value)
        except (serializers.ValidationError, drf_fields.SkipField):
            raise _Defer from None
    return check


def _scalar(field: drf_fields.Field, base: type, convert: Callable[[Any], Any]) -> Check:
    """A scalar field whose class only configures `base` (bounds, defaults): `convert` maps an exact JSON
    value to the internal one or raises _Defer; null is taken when the field allows it."""
    validators_run = _configured_only(field, base)
    if validators_run is None:
        return _generic(field)

    def check(value: Any) -> Any:
        internal = convert(value)
        validators_run(internal)
        return internal
    return _nullable(field, check)


def _integer(value: Any) -> int:
    if type(value) is not int:  # bool is not int here; "12" and 12.0 are DRF's to coerce
        raise _Defer
    return value


def _float(value: Any) -> float:
    if type(value) is float:
        if not math.isfinite(value):
            raise _Defer
        return value
    if type(value) is int:
        return float(value)
    raise _Defer


def _boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise _Defer
    return value


def _char(field: serializers.CharField) -> Check:
    validators_run = _configured_only(field, serializers.CharField)
    if validators_run is None:
        return _generic(field)
    allow_blank, trim = field.allow_blank, field.trim_whitespace

    def check(value: Any) -> Any:
        if type(value) is not str:
            raise _Defer
        internal = value.strip() if trim else value
        if internal == "" or value == "":
            if allow_blank:
                return ""  # as DRF: a blank string skips the validators
            raise _Defer
        validators_run(internal)
        return internal
    return _nullable(field, check)


def _list(field: serializers.ListSerializer) -> Check:
    if _overrides(field, serializers.ListSerializer, "run_validation", "to_internal_value", "validate_empty_values", "validate") \
            or field.validators:
        return _generic(field)
    child = _compile(field.child)
    allow_empty, max_length, min_length = field.allow_empty, field.max_length, field.min_length

    def check(value: Any) -> Any:
        if type(value) is not list:
            raise _Defer
        n = len(value)
        if (not allow_empty and n == 0) or (max_length is not None and n > max_length) or (min_length is not None and n < min_length):
            raise _Defer
        return [child(item) for item in value]
    return _nullable(field, check)


def _list_field(field: serializers.ListField) -> Check:
    """A ListField (a list of scalars, say CPU ids): a JSON list, not empty unless the field allows it,
    its length within the field's min_length/max_length (DRF's validators, run on the items as DRF does)
    and each item its child's."""
    validators_run = _configured_only(field, serializers.ListField)
    if validators_run is None or _overrides(field, serializers.ListField, "run_child_validation", "get_value"):
        return _generic(field)
    child, allow_empty = _compile(field.child), field.allow_empty

    def check(value: Any) -> Any:
        if type(value) is not list or (not allow_empty and not value):
            raise _Defer
        items = [child(item) for item in value]
        validators_run(items)
        return items
    return _nullable(field, check)


def _serializer(serializer: serializers.Serializer) -> Check:
    if _overrides(serializer, serializers.Serializer, "run_validation", "to_internal_value", "validate_empty_values", "validate") \
            or serializer.validators:
        return _generic(serializer)
    plan: list[tuple[str, Check, Any, bool | None]] = []  # (name, check, default getter, has_default); None: required
    for name, field in serializer.fields.items():
        if field.read_only:
            if field.default is not empty:
                return _generic(serializer)  # a read-only default lands in the data: DRF's business
            continue
        if field.source_attrs != [name] or hasattr(serializer, f"validate_{name}"):
            return _generic(serializer)
        if field.default is not empty:
            plan.append((name, _compile(field), _default_getter(field), True))
        elif not field.required:
            plan.append((name, _compile(field), None, False))
        else:
            plan.append((name, _compile(field), None, None))

    def check(value: Any) -> Any:
        if type(value) is not dict:
            raise _Defer
        out = {}
        for name, field_check, default, has_default in plan:
            if name in value:
                out[name] = field_check(value[name])
            elif has_default:
                out[name] = default()  # a fresh list for default=list, as DRF gives
            elif has_default is None:
                raise _Defer  # required and missing
        return out
    return _nullable(serializer, check)


def _default_getter(field: drf_fields.Field) -> Callable[[], Any]:
    """What `field.get_default()` returns, without its walk to the root serializer on every call: the
    constant itself, or the callable's value (a fresh list for `default=list`); DRF's own method for a
    default that needs its context or a partial root (which skips defaults)."""
    default = field.default
    if getattr(field.root, "partial", False) or getattr(default, "requires_context", False):
        return field.get_default
    if callable(default):
        return default
    return lambda: default


def _compile(field: drf_fields.Field) -> Check:
    if isinstance(field, serializers.ListSerializer):
        return _list(field)
    if isinstance(field, serializers.Serializer):
        return _serializer(field)
    if isinstance(field, serializers.ListField):
        return _list_field(field)
    # Exact classes and subclasses that only configure them (the report fields' _Count, _Percent, ...).
    if isinstance(field, serializers.BooleanField):
        return _scalar(field, serializers.BooleanField, _boolean)
    if isinstance(field, serializers.IntegerField):
        return _scalar(field, serializers.IntegerField, _integer)
    if isinstance(field, serializers.FloatField):
        return _scalar(field, serializers.FloatField, _float)
    if isinstance(field, serializers.CharField):
        return _char(field)  # EmailField, SlugField, ... carry validators of their own, so they go to DRF whole
    return _generic(field)


def serializer_compile(serializer: serializers.Serializer) -> Callable[[Any], dict | None]:
    """`serializer` (an instance whose fields are built) as a function: the validated data for the
    well-formed case, or None where DRF must judge (then run the serializer: it accepts the data with the
    same values or raises the client's error)."""
    check = _serializer(serializer)

    def validate(data: Any) -> dict | None:
        try:
            return check(data)
        except _Defer:
            return None
    return validate
