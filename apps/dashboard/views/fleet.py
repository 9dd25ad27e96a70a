"""The fleet page: hosts, MIG layouts, CPU devices."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from ..selectors import fleet_overview
from .common import _require


@login_required
def fleet(request):
    """Every host with its GPUs' MIG layouts and CPU devices (viewer and up: `inventory.view_host`)."""
    _require(request, "inventory.view_host", "Viewing the fleet needs the viewer role.")
    hosts = fleet_overview(request.user)
    return render(request, "dashboard/fleet.html", {"hosts": hosts, "nav": "fleet"})
