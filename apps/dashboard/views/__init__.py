"""Dashboard views, one module per page family; each view is a thin adapter over selectors and services."""
from .applications import application, application_deploy, applications
from .fleet import fleet
from .jobs import job, jobs
from .login import login
from .overview import overview
from .plans import plan, plan_action, plans
from .policies import policies

__all__ = ["application", "application_deploy", "applications", "fleet", "job", "jobs", "login", "overview", "plan", "plan_action", "plans", "policies"]
