"""The overview: how every application is served right now, and what changed."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from ..overview import overview as overview_data
from .common import _require


@login_required
def overview(request):
    """Viewer and up (`telemetry.view_applicationsample`); live through ws/live/ (metrics, jobs, changes)."""
    _require(request, "telemetry.view_applicationsample", "Viewing the overview needs the viewer role.")
    context = overview_data(request.user)
    context["nav"] = "overview"
    return render(request, "dashboard/overview.html", context)
