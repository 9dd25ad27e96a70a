from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from . import views

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:overview", permanent=False), name="home"),
    path("overview/", views.overview, name="overview"),
    path("fleet/", views.fleet, name="fleet"),
    path("applications/", views.applications, name="applications"),
    path("applications/<int:pk>/", views.application, name="application"),
    path("applications/<int:pk>/deploy/<str:action>/", views.application_deploy, name="application-deploy"),
    path("policies/", views.policies, name="policies"),
    path("plans/", views.plans, name="plans"),
    path("plans/<int:pk>/", views.plan, name="plan"),
    path("plans/<int:pk>/<str:action>/", views.plan_action, name="plan-action"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:pk>/", views.job, name="job"),
    path("login/", views.login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
