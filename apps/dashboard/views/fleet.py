"""The fleet page: hosts, MIG layouts, CPU devices, and the routers' credentials."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from ..selectors import fleet_overview, router_credentials_for
from .common import _require


@login_required
def fleet(request):
    """Every host with its GPUs' MIG layouts and CPU devices, and every router credential (viewer and up:
    `inventory.view_host`)."""
    _require(request, "inventory.view_host", "Viewing the fleet needs the viewer role.")
    hosts = fleet_overview(request.user)
    routers = router_credentials_for(request.user)
    return render(request, "dashboard/fleet.html", {"hosts": hosts, "routers": routers, "nav": "fleet"})
