"""Every API error is JSON of one shape:
    {"error": {"status": 400, "code": "invalid", "message": "...", "fields": {"name": ["..."]}}}
so CI scripts can print `message` and show `fields` next to their inputs."""
from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError, RestrictedError
from rest_framework import exceptions
from rest_framework.views import exception_handler


def validation_error_from_django(exc: DjangoValidationError) -> exceptions.ValidationError:
    if hasattr(exc, "error_dict"):
        return exceptions.ValidationError(
            {("non_field_errors" if k == "__all__" else k): v for k, v in exc.message_dict.items()}
        )
    return exceptions.ValidationError({"non_field_errors": exc.messages})


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            msg = _first_message(value)
            return msg if key == "non_field_errors" else f"{key}: {msg}"
        return "Invalid input."
    if isinstance(detail, list):
        return _first_message(detail[0]) if detail else "Invalid input."
    return str(detail)


class InUse(exceptions.APIException):
    status_code = 409
    default_code = "in_use"
    default_detail = "The object is in use."


def in_use_from_protected(exc: ProtectedError | RestrictedError) -> InUse:
    """A delete refused by a protected (or restricted) foreign key: 409 naming what still uses the object."""
    users_of = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
    users = sorted({str(o) for o in users_of})
    shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
    kinds = sorted({o._meta.verbose_name for o in users_of})
    return InUse(f"Cannot delete it: it is used by {' / '.join(kinds)} {shown}.")


def tessera_exception_handler(exc, context):
    from ..outages import outage_from_exception
    from ..transactions import request_rollback_note

    if isinstance(exc, DjangoValidationError):
        exc = validation_error_from_django(exc)
    if isinstance(exc, (ProtectedError, RestrictedError)):
        exc = in_use_from_protected(exc)
    # A deadlock victim's request may be run once more before this answer leaves (apps.core.middleware).
    request_rollback_note(context.get("request"), exc)
    exc = outage_from_exception(exc) or exc  # the database away: 503 with Retry-After, not a 500
    response = exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    body = {"status": response.status_code, "code": getattr(exc, "default_code", "error")}
    if isinstance(exc, exceptions.ValidationError):
        body["code"] = "invalid"
        fields = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        body["message"] = _first_message(fields)
        body["fields"] = fields
    else:
        body["message"] = str(detail.get("detail", detail)) if isinstance(detail, dict) else str(detail)
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
        if isinstance(codes, str):
            body["code"] = codes
    response.data = {"error": body}
    return response
