from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from .selectors import fleet_overview


@login_required
def fleet(request):
    """Every host with its GPUs' MIG layouts and CPU devices (viewer and up: `inventory.view_host`)."""
    if not request.user.has_perm("inventory.view_host"):
        raise PermissionDenied("Viewing the fleet needs the viewer role.")
    hosts = fleet_overview(request.user)
    return render(request, "dashboard/fleet.html", {"hosts": hosts, "nav": "fleet"})
