from rest_framework.permissions import BasePermission, DjangoModelPermissions

from ..principals import principal_is_agent


class TesseraModelPermissions(DjangoModelPermissions):
    """Role checks by model permission, reading included: a user without `view_<model>` gets 403.
    Which rows are visible is decided by the queryset restriction in the view, not here."""

    perms_map = {
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "OPTIONS": ["%(app_label)s.view_%(model_name)s"],
        "HEAD": ["%(app_label)s.view_%(model_name)s"],
        "POST": ["%(app_label)s.add_%(model_name)s"],
        "PUT": ["%(app_label)s.change_%(model_name)s"],
        "PATCH": ["%(app_label)s.change_%(model_name)s"],
        "DELETE": ["%(app_label)s.delete_%(model_name)s"],
    }


class IsAgent(BasePermission):
    """Agent-only actions (reports, metrics, profiling progress): any host agent passes here; which host's
    records it reaches is decided by the queryset restriction (its own host only, else 404)."""

    message = "Only a host's agent may do this."

    def has_permission(self, request, view):
        return principal_is_agent(request.user)
