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
