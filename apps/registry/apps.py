from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "apps.registry"
    label = "registry"
    verbose_name = "Registry (applications, variants, artifacts, profiles)"
