"""`tessera`: the command line. Subcommands that need the database set Django up themselves; the engine's
subcommands (mig, plan, simulate) run without Django."""
from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(help="Tessera: SLO-aware control plane for GPU inference fleets.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens for CI and scripts.", no_args_is_help=True)
app.add_typer(token_app, name="token")


def _django_setup(settings: str = "controlplane.settings.local") -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


@app.command()
def demo(
    host: str = typer.Option("127.0.0.1", help="Address to serve on"),
    port: int = typer.Option(8000, help="Port to serve on"),
    serve: bool = typer.Option(True, help="Run the control plane after seeding"),
    admin_password: str = typer.Option(None, envvar="TESSERA_ADMIN_PASSWORD", help="Admin password (random if unset)"),
) -> None:
    """Migrate, seed the demo fleet and run the control plane on embedded defaults."""
    _django_setup()
    from django.conf import settings
    from django.core.management import call_command

    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    result = demo_seed(admin_password=admin_password)
    database = settings.DATABASES["default"]
    typer.echo(f"Database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
    typer.echo("Demo fleet: " + ("seeded" if result.created else "already present, kept"))
    typer.echo(f"Control plane: http://{host}:{port}/   admin: http://{host}:{port}/admin/   API: http://{host}:{port}/api/v1/docs/")
    for user, password in result.logins.items():
        typer.echo(f"  login {user:<9} password {password}")
    if serve:
        call_command("runserver", f"{host}:{port}", use_reloader=False)


@app.command()
def serve(
    bind: str = typer.Option("0.0.0.0", help="Address to bind"),
    port: int = typer.Option(8000),
) -> None:
    """Run the control plane with Daphne (HTTP and WebSocket) under the current settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(["-b", bind, "-p", str(port), "--proxy-headers", "controlplane.asgi:application"])


@app.command()
def worker(
    concurrency: int = typer.Option(2, help="Worker processes"),
    beat: bool = typer.Option(False, help="Also run the beat scheduler in this process"),
    loglevel: str = typer.Option("INFO"),
) -> None:
    """Run a Celery worker for the control plane's background jobs."""
    _django_setup()
    from controlplane.celery import app as celery_app

    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}"]
    if beat:
        argv.append("--beat")
    celery_app.worker_main(argv)


@token_app.command("create")
def token_create_cmd(
    user: str = typer.Option(..., help="Username that the token acts for"),
    description: str = typer.Option("", help="What the token is for"),
    read_only: bool = typer.Option(False, help="Refuse writes with this token"),
) -> None:
    """Create an API token for USER and print its secret (shown once)."""
    _django_setup()
    from django.contrib.auth import get_user_model

    from apps.core.context import change_context
    from apps.users.services import token_create

    account = get_user_model().objects.filter(username=user).first()
    if account is None:
        typer.echo(f"error: no user {user!r}", err=True)
        raise typer.Exit(2)
    with change_context(source="command"):
        token, secret = token_create(user=account, description=description, write_enabled=not read_only)
    typer.echo(secret)


@app.command()
def agent_token(host: str = typer.Argument(..., help="Host name")) -> None:
    """Issue a new agent token for HOST and print it (shown once; the previous token stops working)."""
    _django_setup()
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate

    target = Host.objects.filter(name=host).first()
    if target is None:
        typer.echo(f"error: no host {host!r}", err=True)
        raise typer.Exit(2)
    with change_context(source="command"):
        typer.echo(host_agent_token_rotate(host=target))


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())
