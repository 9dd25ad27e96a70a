from django.db import models


class RoleChoices(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    ADMIN = "admin", "Admin"


class CredentialKindChoices(models.TextChoices):
    """The bearer secrets the API takes, by their prefix (apps/users/tokens.py)."""

    API_TOKEN = "api_token", "API token"
    AGENT_TOKEN = "agent_token", "Agent token"
    ROUTER_CREDENTIAL = "router_credential", "Router credential"
