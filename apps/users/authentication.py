from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import Token
from .tokens import USER_TOKEN_PREFIX, token_from_header, token_hash

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class TokenAuthentication(authentication.BaseAuthentication):
    """User API tokens (`tsu_…`) in `Authorization: Token|Bearer <secret>`."""

    keyword = "Token"

    def authenticate(self, request):
        secret = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if secret is None or not secret.startswith(USER_TOKEN_PREFIX):
            return None  # not ours: the agent authenticator or the session may claim the request
        token = Token.objects.select_related("user").filter(key_hash=token_hash(secret)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid API token.")
        if token.is_expired:
            raise exceptions.AuthenticationFailed("API token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        if not token.write_enabled and request.method not in SAFE_METHODS:
            raise exceptions.PermissionDenied("This API token is read-only.")
        # last_used is bookkeeping, not a change: update() skips the audit receivers.
        Token.objects.filter(pk=token.pk).update(last_used=timezone.now())
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
