"""What every dashboard view module shares."""
from django.core.exceptions import PermissionDenied


def _require(request, perm: str, what: str) -> None:
    """Refuse (403) a user without `perm`; `what` says which role the page needs."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(what)
