from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction

from .models import Token
from .roles import user_role_set
from .tokens import USER_TOKEN_PREFIX, token_display, token_generate, token_hash

User = get_user_model()


@transaction.atomic
def token_create(*, user, description: str = "", write_enabled: bool = True, expires: datetime | None = None) -> tuple[Token, str]:
    """Create an API token and return it with its secret, which is not stored and cannot be shown again."""
    secret = token_generate(USER_TOKEN_PREFIX)
    token = Token.objects.create(
        user=user,
        key_hash=token_hash(secret),
        display_prefix=token_display(secret),
        description=description,
        write_enabled=write_enabled,
        expires=expires,
    )
    return token, secret


@transaction.atomic
def user_create(*, username: str, password: str | None, role: str | None, email: str = "", is_active: bool = True):
    user = User(username=username, email=email, is_active=is_active)
    if password:
        user.set_password(password)
    else:
        user.set_unusable_password()  # token-only accounts, e.g. for CI
    user.save()
    user_role_set(user, role)
    return user


@transaction.atomic
def user_update(*, user, role: str | None = None, password: str | None = None, **fields):
    for name, value in fields.items():
        setattr(user, name, value)
    if password:
        user.set_password(password)
    user.save()
    if role is not None:
        user_role_set(user, role or None)
    return user


# --------------------------------------------------------------------------- sign-in throttling
# A password sign-in (the dashboard's, the admin's) is free for the first LOGIN_FREE_FAILURES failures of a
# username, or from an address, within LOGIN_FAILURE_WINDOW_S; after that each attempt must wait 2^(k - free)
# seconds after the last failure (k failures so far), at most LOGIN_DELAY_MAX_S, or it is refused without
# the password being checked. A success clears the username's failures. Counted in the database, which every
# sign-in needs anyway, so every control plane process sees the same count.
LOGIN_FREE_FAILURES = 5
LOGIN_FAILURE_WINDOW_S = 15 * 60
LOGIN_DELAY_MAX_S = 5 * 60
LOGIN_FAILURE_KEEP_S = 24 * 3600


def _login_failures(*, username: str, address: str | None):
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from .models import LoginFailure

    since = timezone.now() - timedelta(seconds=LOGIN_FAILURE_WINDOW_S)
    who = Q(username=username) | Q(address=address) if address else Q(username=username)
    return LoginFailure.objects.filter(who, created__gte=since)


def login_throttle_wait(*, username: str, address: str | None) -> float:
    """Seconds this username, or this address, must still wait before its password is checked again (0:
    now). The count is whichever of the two has failed more."""
    from django.utils import timezone

    failures = _login_failures(username=username, address=address)
    by_user = failures.filter(username=username)
    counts = [by_user.count()] + ([failures.filter(address=address).count()] if address else [])
    count = max(counts)
    if count < LOGIN_FREE_FAILURES:
        return 0.0
    last = failures.order_by("-created").values_list("created", flat=True).first()
    delay = min(LOGIN_DELAY_MAX_S, 2.0 ** (count - LOGIN_FREE_FAILURES))
    return max(0.0, delay - (timezone.now() - last).total_seconds())


def login_failure_record(*, username: str, address: str | None) -> None:
    """One failed sign-in; rows older than a day go."""
    from datetime import timedelta

    from django.utils import timezone

    from .models import LoginFailure

    LoginFailure.objects.create(username=username[:150], address=address or None)
    LoginFailure.objects.filter(created__lt=timezone.now() - timedelta(seconds=LOGIN_FAILURE_KEEP_S)).delete()


def login_failures_clear(*, username: str) -> None:
    """A successful sign-in: the username's failures are forgiven (the address's stay counted)."""
    from .models import LoginFailure

    LoginFailure.objects.filter(username=username).delete()
