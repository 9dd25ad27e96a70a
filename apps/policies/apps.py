from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "apps.policies"
    label = "policies"
    verbose_name = "Policies (SLOs, re-planning)"
