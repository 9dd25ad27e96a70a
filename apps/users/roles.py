"""Roles are Django groups with model permissions:
- viewer reads everything Tessera holds;
- operator also changes the fleet, the registry, the policies and the deployments (desired states,
  routing tables);
- admin also manages users, groups and every API token, and may read the audit log's actors' accounts.
The groups are rebuilt after every migrate so a new model's permissions reach the roles."""
from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.db.models import Q

from .choices import RoleChoices

TESSERA_APPS = ("core", "users", "inventory", "registry", "policies", "planning", "deployments", "telemetry", "jobs")
OPERATOR_APPS = ("inventory", "registry", "policies", "planning", "deployments", "telemetry")
ADMIN_EXTRA_APPS = ("auth", "users", "django_celery_beat")


def _role_permissions(role: str):
    perms = Permission.objects.all()
    # Every role may hold API tokens of its own (the queryset restriction keeps them to their owner).
    own_tokens = Q(content_type__app_label="users", codename__in=["view_token", "add_token", "delete_token"])
    viewer = Q(content_type__app_label__in=TESSERA_APPS, codename__startswith="view_") | own_tokens
    if role == RoleChoices.VIEWER:
        return perms.filter(viewer)
    operator = viewer | Q(content_type__app_label__in=OPERATOR_APPS)
    if role == RoleChoices.OPERATOR:
        return perms.filter(operator)
    return perms.filter(operator | Q(content_type__app_label__in=ADMIN_EXTRA_APPS))


def roles_sync() -> None:
    for role in RoleChoices.values:
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(_role_permissions(role))


def user_role(user) -> str | None:
    """The highest role a user holds (superusers are admins)."""
    if user.is_superuser:
        return RoleChoices.ADMIN
    names = set(user.groups.values_list("name", flat=True))
    for role in (RoleChoices.ADMIN, RoleChoices.OPERATOR, RoleChoices.VIEWER):
        if role in names:
            return role
    return None


def user_role_set(user, role: str | None) -> None:
    user.groups.remove(*Group.objects.filter(name__in=RoleChoices.values))
    if role:
        if not Group.objects.filter(name=role).exists():
            roles_sync()
        user.groups.add(Group.objects.get(name=role))
