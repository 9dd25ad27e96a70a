"""Credentials: `token create` (API tokens for users) and `agent-token` (a host's agent token)."""
from __future__ import annotations

import typer

from ._common import django_setup

token_app = typer.Typer(help="API tokens for CI and scripts.", no_args_is_help=True)


@token_app.command("create")
def token_create_cmd(
    user: str = typer.Option(..., help="Username that the token acts for"),
    description: str = typer.Option("", help="What the token is for"),
    read_only: bool = typer.Option(False, help="Refuse writes with this token"),
) -> None:
    """Create an API token for USER and print its secret (shown once)."""
    django_setup()
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


def agent_token(host: str = typer.Argument(..., help="Host name")) -> None:
    """Issue a new agent token for HOST and print it (shown once; the previous token stops working)."""
    django_setup()
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate

    target = Host.objects.filter(name=host).first()
    if target is None:
        typer.echo(f"error: no host {host!r}", err=True)
        raise typer.Exit(2)
    with change_context(source="command"):
        typer.echo(host_agent_token_rotate(host=target))
