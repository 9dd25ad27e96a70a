from django.apps import AppConfig


class UsersConfig(AppConfig):
    name = "apps.users"
    label = "users"
    verbose_name = "Users, roles and API tokens"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from .roles import roles_sync

        # Permissions exist only after migrate; the role groups are (re)built from them each time.
        post_migrate.connect(lambda **kwargs: roles_sync(), dispatch_uid="tessera.roles_sync", weak=False)
