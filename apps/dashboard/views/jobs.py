"""Profiling, planning and rollout jobs."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from ..selectors import job_queryset_for
from .common import _require


@login_required
def jobs(request):
    """Every job, newest first (viewer and up: `jobs.view_job`)."""
    _require(request, "jobs.view_job", "Viewing jobs needs the viewer role.")
    return render(request, "dashboard/jobs.html", {"jobs": job_queryset_for(request.user)[:200], "nav": "jobs"})


@login_required
def job(request, pk: int):
    _require(request, "jobs.view_job", "Viewing jobs needs the viewer role.")
    obj = get_object_or_404(job_queryset_for(request.user), pk=pk)
    plan_ids = [t.get("id") for t in obj.targets if t.get("type") == "planning.plan"]
    return render(request, "dashboard/job.html", {"job": obj, "plan_ids": plan_ids, "nav": "jobs"})
