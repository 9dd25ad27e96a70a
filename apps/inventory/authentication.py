from django.utils import timezone
from rest_framework import exceptions

from apps.core.principals import AgentPrincipal, RouterPrincipal
from apps.users.authentication import BearerAuthentication
from apps.users.tokens import AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX

from .models import RouterCredential
from .services import host_by_agent_token, router_credential_by_secret


class AgentTokenAuthentication(BearerAuthentication):
    """The data plane's credentials. Host agent tokens (`tsa_…`): the request acts as that host's agent,
    which may read its own host's records and report its own host's actual state, nothing else. Router
    credentials (`tsr_…`): the request acts as that router (`RouterPrincipal`), which reads the routing
    tables and reports under its own name; a revoked one is refused (401). Refusals are counted per address
    like every bearer secret's (BearerAuthentication)."""

    prefixes = (AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX)

    def secret_authenticate(self, request, secret: str):
        if secret.startswith(ROUTER_TOKEN_PREFIX):
            credential = router_credential_by_secret(secret=secret)
            if credential is None:
                raise exceptions.AuthenticationFailed("Invalid or revoked router credential.")
            # last_used is bookkeeping, not a change: update() skips the audit receivers.
            RouterCredential.objects.filter(pk=credential.pk).update(last_used=timezone.now())
            return RouterPrincipal(credential=credential), None
        host = host_by_agent_token(secret=secret)
        if host is None:
            raise exceptions.AuthenticationFailed("Invalid agent token.")
        return AgentPrincipal(host=host), None
