"""Password sign-in with throttling: Django's model backend, refusing to check a password while its
username or the client's address must wait (apps/users/services.py, "sign-in throttling")."""
from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from .services import login_throttle_wait

__all__ = ["THROTTLED_ATTRIBUTE", "ThrottledModelBackend", "request_address"]

# Set on a request whose sign-in was refused unchecked, so that the refusal is not counted as a failure.
THROTTLED_ATTRIBUTE = "tessera_login_throttled"


def request_address(request) -> str | None:
    """The client's address as the server saw it (behind a proxy: what the proxy headers set, which the
    ASGI server trusts only from configured proxies)."""
    return (request.META.get("REMOTE_ADDR") or None) if request is not None else None


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(self._username_field())
        if username is not None and login_throttle_wait(username=str(username), address=request_address(request)) > 0:
            if request is not None:
                setattr(request, THROTTLED_ATTRIBUTE, True)
            raise PermissionDenied("too many failed sign-ins")  # authenticate() stops here: no other backend is asked
        return super().authenticate(request, username=username, password=password, **kwargs)

    @staticmethod
    def _username_field() -> str:
        from django.contrib.auth import get_user_model

        return get_user_model().USERNAME_FIELD
