from django.db import models


class ObjectChangeActionChoices(models.TextChoices):
    CREATE = "create", "Created"
    UPDATE = "update", "Updated"
    DELETE = "delete", "Deleted"


class ActorKindChoices(models.TextChoices):
    USER = "user", "User"
    AGENT = "agent", "Agent"
    SYSTEM = "system", "System"
