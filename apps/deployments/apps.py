from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "apps.deployments"
    label = "deployments"
    verbose_name = "Deployments (desired state, routing tables, runtimes)"
