from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.core.models import ChangeLoggedModel

from .choices import CredentialKindChoices


class Token(ChangeLoggedModel):
    """A user's API token for CI and scripts. It acts with its user's role; `write_enabled` off makes it
    read-only whatever the role."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    display_prefix = models.CharField(max_length=16, editable=False)
    description = models.CharField(max_length=200, blank=True)
    write_enabled = models.BooleanField(default=True)
    expires = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    audit_exclude_fields = ("key_hash", "last_used")

    class Meta:
        ordering = ["user__username", "-created"]

    def __str__(self) -> str:
        return f"{self.display_prefix}… ({self.user.get_username()})"

    @property
    def is_expired(self) -> bool:
        return self.expires is not None and self.expires <= timezone.now()

    @staticmethod
    def owner_scope(queryset, user):
        # Admins see every token; everyone else only their own.
        if user.is_superuser or user.has_perm("auth.change_user"):
            return queryset
        return queryset.filter(user=user)


class LoginFailure(models.Model):
    """A failed password sign-in (dashboard, admin): what `login_throttle_wait` counts to slow a
    password-guessing client down. Kept a day (`login_failure_record` prunes older rows)."""

    username = models.CharField(max_length=150, db_index=True)
    address = models.GenericIPAddressField(null=True, blank=True, db_index=True)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.username} from {self.address or 'unknown'} at {self.created:%Y-%m-%d %H:%M:%S}"


class ApiAuthFailure(models.Model):
    """A bearer secret the API refused (an API token, agent token or router credential that is wrong, revoked
    or expired), by the client's address: what `api_auth_failure_wait` counts to slow a guessing client down.
    The secret itself is never kept. Kept a day (`api_auth_failure_record` prunes older rows)."""

    address = models.GenericIPAddressField()
    kind = models.CharField(max_length=32, choices=CredentialKindChoices.choices)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["address", "created"], name="users_apiauthfail_addr_created")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} refused from {self.address} at {self.created:%Y-%m-%d %H:%M:%S}"
