from django.utils import timezone
from rest_framework import authentication, exceptions

from .backends import request_address
from .choices import CredentialKindChoices
from .models import Token
from .services import api_auth_address_failing, api_auth_failure_record, api_auth_failure_wait
from .tokens import AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX, USER_TOKEN_PREFIX, token_from_header, token_hash

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
CREDENTIAL_KINDS = {
    USER_TOKEN_PREFIX: CredentialKindChoices.API_TOKEN,
    AGENT_TOKEN_PREFIX: CredentialKindChoices.AGENT_TOKEN,
    ROUTER_TOKEN_PREFIX: CredentialKindChoices.ROUTER_CREDENTIAL,
}


class AuthenticationThrottled(exceptions.Throttled):
    default_detail = "Too many refused credentials from this address."


class BearerAuthentication(authentication.BaseAuthentication):
    """A bearer secret with one of `prefixes` in `Authorization: Token|Bearer <secret>`, checked by
    `secret_authenticate`, with refusals counted per client address (apps/users/services.py, "API
    authentication throttling"): while the address must wait, its secret is refused unchecked, 429 with
    Retry-After in the API's error shape."""

    prefixes: tuple[str, ...] = ()

    def authenticate(self, request):
        secret = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if secret is None or not secret.startswith(self.prefixes):
            return None  # not ours: another authenticator or the session may claim the request
        address = request_address(request)
        wait = api_auth_failure_wait(address=address)
        if wait > 0:
            api_auth_address_failing(address)
            raise AuthenticationThrottled(wait=wait)
        try:
            return self.secret_authenticate(request, secret)
        except exceptions.AuthenticationFailed:
            kind = next(kind for prefix, kind in CREDENTIAL_KINDS.items() if secret.startswith(prefix))
            api_auth_failure_record(address=address, kind=kind)
            raise

    def secret_authenticate(self, request, secret: str):
        """(user, auth) for this secret, or AuthenticationFailed."""
        raise NotImplementedError

    def authenticate_header(self, request):
        return "Token"


class TokenAuthentication(BearerAuthentication):
    """User API tokens (`tsu_…`)."""

    prefixes = (USER_TOKEN_PREFIX,)

    def secret_authenticate(self, request, secret: str):
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
