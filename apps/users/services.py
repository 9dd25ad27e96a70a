from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction

from .choices import CredentialKindChoices
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
    failures = _login_failures(username=username, address=address)
    by_user = failures.filter(username=username)
    counts = [by_user.count()] + ([failures.filter(address=address).count()] if address else [])
    count = max(counts)
    if count < LOGIN_FREE_FAILURES:
        return 0.0
    last = failures.order_by("-created").values_list("created", flat=True).first()
    return _backoff_wait(count=count, free=LOGIN_FREE_FAILURES, delay_max_s=LOGIN_DELAY_MAX_S, last=last)


def _backoff_wait(*, count: int, free: int, delay_max_s: float, last) -> float:
    """Seconds still to wait after `count` failures, the last at `last`: none for the first `free`, then
    2^(count - free) s after the last failure, at most `delay_max_s`."""
    from django.utils import timezone

    if count < free or last is None:
        return 0.0
    delay = min(delay_max_s, 2.0 ** (count - free))
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


# --------------------------------------------------------------------------- API authentication throttling
# A bearer secret the API refuses (API token, agent token, router credential: wrong, revoked or expired) is a
# failure of the client's address. An address gets API_AUTH_FREE_FAILURES failures within
# API_AUTH_FAILURE_WINDOW_S free; after that every request from it that presents a secret must wait
# 2^(k - free) s after its last failure (k failures so far), at most API_AUTH_DELAY_MAX_S, or it is refused
# (429) without its secret being checked, so a guesser learns nothing during the wait, right secret or wrong.
# A success forgives nothing: one valid token would otherwise reset the count between guesses at others.
# More free failures and a shorter cap than a password's: the clients are programs that retry, and every
# agent, router and script behind one address shares its count (a stale credential among them is named, by
# kind and address, in a WARNING on tessera.security); one try a minute is nothing against 256-bit secrets.
# Counted in the database, which checking any secret needs anyway: every process counts the same, and the
# API's availability does not come to depend on Redis.
API_AUTH_FREE_FAILURES = 10
API_AUTH_FAILURE_WINDOW_S = 15 * 60
API_AUTH_DELAY_MAX_S = 60
API_AUTH_FAILURE_KEEP_S = 24 * 3600
# Addresses this process saw refused past their free failures, with when (time.monotonic()): the agents'
# metrics fast path (apps/telemetry/ingest.py), which checks agent tokens in its own batches, leaves them to
# Django, which refuses them while they wait. Without this, a waiting address could try secrets there.
_failing_addresses: dict[str, float] = {}
_failing_lock = threading.Lock()


def api_auth_failure_wait(*, address: str | None) -> float:
    """Seconds this address must still wait before a secret it presents is checked again (0: now; an
    unknown address is never held)."""
    from datetime import timedelta

    from django.db.models import Count, Max
    from django.utils import timezone

    from .models import ApiAuthFailure

    if not address:
        return 0.0
    since = timezone.now() - timedelta(seconds=API_AUTH_FAILURE_WINDOW_S)
    seen = ApiAuthFailure.objects.filter(address=address, created__gte=since).aggregate(count=Count("id"), last=Max("created"))
    return _backoff_wait(count=seen["count"], free=API_AUTH_FREE_FAILURES, delay_max_s=API_AUTH_DELAY_MAX_S, last=seen["last"])


def api_auth_failure_record(*, address: str | None, kind: str) -> None:
    """One refused secret of `kind` (CredentialKindChoices) from `address`; rows older than a day go."""
    from datetime import timedelta

    from django.utils import timezone

    from .models import ApiAuthFailure

    logging.getLogger("tessera.security").warning("API authentication refused (%s) from %s", CredentialKindChoices(kind).label,
                                                  address or "an unknown address")
    if not address:
        return
    ApiAuthFailure.objects.create(address=address, kind=kind)
    ApiAuthFailure.objects.filter(created__lt=timezone.now() - timedelta(seconds=API_AUTH_FAILURE_KEEP_S)).delete()
    if api_auth_failure_wait(address=address) > 0:
        api_auth_address_failing(address)


def api_auth_address_failing(address: str) -> None:
    """This process saw `address` refused past its free failures (see `api_auth_address_failed_recently`)."""
    now = time.monotonic()
    with _failing_lock:
        _failing_addresses[address] = now
        if len(_failing_addresses) > 10_000:  # many addresses: forget those past the window
            for old in [a for a, at in _failing_addresses.items() if now - at > API_AUTH_FAILURE_WINDOW_S]:
                del _failing_addresses[old]


def api_auth_address_failed_recently(address: str | None) -> bool:
    """Whether this process saw `address` refused past its free failures within the window: no database
    query, for a path that must not wait on one."""
    if not address:
        return False
    at = _failing_addresses.get(address)
    return at is not None and time.monotonic() - at <= API_AUTH_FAILURE_WINDOW_S
