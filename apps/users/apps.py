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

        from django.contrib.auth.signals import user_logged_in, user_login_failed

        user_login_failed.connect(_login_failed, dispatch_uid="tessera.login_failed", weak=False)
        user_logged_in.connect(_logged_in, dispatch_uid="tessera.logged_in", weak=False)


def _login_failed(sender, credentials, request=None, **kwargs) -> None:
    """A password that did not match (not a sign-in refused unchecked while throttled): counted."""
    import logging

    from .backends import THROTTLED_ATTRIBUTE, request_address
    from .services import login_failure_record

    username = credentials.get("username")
    if not username or getattr(request, THROTTLED_ATTRIBUTE, False):
        return
    address = request_address(request)
    logging.getLogger("tessera.security").warning("failed sign-in for %r from %s", str(username)[:150], address or "an unknown address")
    login_failure_record(username=str(username), address=address)


def _logged_in(sender, request, user, **kwargs) -> None:
    from .services import login_failures_clear

    login_failures_clear(username=user.get_username())
