from rest_framework.permissions import BasePermission

from apps.core.principals import principal_is_agent, principal_is_router


class MayLoadModels(BasePermission):
    """Pinning and releasing applications (the model repository extension): operators who may change
    applications, and routers whose credential an admin allowed (`RouterCredential.may_load_models`);
    never agents."""

    message = "Loading and unloading models needs registry.change_application, or a router credential allowed to (may_load_models)."

    def has_permission(self, request, view):
        user = request.user
        if principal_is_router(user):
            return bool(user.credential.may_load_models) and user.credential.active
        if principal_is_agent(user) or not getattr(user, "is_authenticated", False):
            return False
        return user.has_perm("registry.change_application")
