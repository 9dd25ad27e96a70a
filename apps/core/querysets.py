"""Permissions applied as a queryset restriction (NetBox's RestrictedQuerySet, reduced to Tessera's roles):
every API list and detail view starts from `Model.objects.restrict(principal, action)`, so an object the
principal may not see does not exist for it (404), and a list never leaks rows."""
from __future__ import annotations

from typing import Any

from django.db import models

from .principals import principal_is_agent, principal_is_router


class RestrictedQuerySet(models.QuerySet):
    def restrict(self, principal: Any, action: str = "view") -> "RestrictedQuerySet":
        if principal is None or not getattr(principal, "is_authenticated", False):
            return self.none()
        if principal_is_agent(principal):
            if not principal.has_perm(self._perm_name(action)):
                return self.none()
            scope = getattr(self.model, "agent_scope", None)
            return scope(self, principal.host) if scope else self.none()
        if principal_is_router(principal):
            # A router holds read permissions on routing tables and router credentials only; a model may
            # narrow them further (`router_scope`: a router sees its own credential).
            if not principal.has_perm(self._perm_name(action)):
                return self.none()
            scope = getattr(self.model, "router_scope", None)
            return scope(self, principal.credential) if scope else self
        if principal.is_superuser or principal.has_perm(self._perm_name(action)):
            owner_scope = getattr(self.model, "owner_scope", None)
            return owner_scope(self, principal) if owner_scope else self
        return self.none()

    def _perm_name(self, action: str) -> str:
        meta = self.model._meta
        return f"{meta.app_label}.{action}_{meta.model_name}"
