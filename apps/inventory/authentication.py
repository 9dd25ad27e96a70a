from rest_framework import authentication, exceptions

from apps.core.principals import AgentPrincipal
from apps.users.tokens import AGENT_TOKEN_PREFIX, token_from_header

from .services import host_by_agent_token


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """Host agent tokens (`tsa_…`): the request acts as that host's agent, which may read its own host's
    records and report its own host's actual state, nothing else."""

    def authenticate(self, request):
        secret = token_from_header(request.META.get("HTTP_AUTHORIZATION"))
        if secret is None or not secret.startswith(AGENT_TOKEN_PREFIX):
            return None
        host = host_by_agent_token(secret=secret)
        if host is None:
            raise exceptions.AuthenticationFailed("Invalid agent token.")
        return AgentPrincipal(host=host), None

    def authenticate_header(self, request):
        return "Token"
