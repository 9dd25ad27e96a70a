"""OpenAPI descriptions of Tessera's authentication schemes (drf-spectacular extensions)."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class UserTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.users.authentication.TokenAuthentication"
    name = "userToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http", "scheme": "bearer",
            "description": "A user's API token (`tsu_…`): `Authorization: Bearer <token>` or `Token <token>`.",
        }


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.inventory.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http", "scheme": "bearer",
            "description": "A host agent's token (`tsa_…`): reads its own host, reports its own actual state.",
        }
