"""Credentials: `token create` (API tokens for users), `agent-token` (a host's agent token) and
`router-credential issue|revoke` (a router's credential, scoped to its name)."""
from __future__ import annotations

import typer

from ._common import django_setup

token_app = typer.Typer(help="API tokens for CI and scripts.", no_args_is_help=True)


def _found_or_exit(queryset, what: str, **lookup):
    """The one object `lookup` finds, or the error "no WHAT 'x'" and exit status 2."""
    found = queryset.filter(**lookup).first()
    if found is None:
        typer.echo(f"error: no {what} {next(iter(lookup.values()))!r}", err=True)
        raise typer.Exit(2)
    return found


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

    account = _found_or_exit(get_user_model().objects, "user", username=user)
    with change_context(source="command"):
        token, secret = token_create(user=account, description=description, write_enabled=not read_only)
    typer.echo(secret)


def agent_token(host: str = typer.Argument(..., help="Host name")) -> None:
    """Issue a new agent token for HOST and print it (shown once; the previous token stops working)."""
    django_setup()
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate

    target = _found_or_exit(Host.objects, "host", name=host)
    with change_context(source="command"):
        typer.echo(host_agent_token_rotate(host=target))


router_credential_app = typer.Typer(help="Routers' credentials, each scoped to one router name.", no_args_is_help=True)


@router_credential_app.command("issue")
def router_credential_issue_cmd(
    name: str = typer.Argument(..., help="Router name: the name its reports carry"),
    description: str = typer.Option(None, help="What or where the router is"),
    may_load_models: bool = typer.Option(None, "--may-load-models/--may-not-load-models",
                                         help="Whether the router may relay the Open Inference Protocol's model load/unload "
                                              "(pin/release an application); omitted: as it was, off for a new credential"),
) -> None:
    """Issue a credential for router NAME and print it (shown once; re-issuing replaces the previous one)."""
    django_setup()
    from django.core.exceptions import ValidationError

    from apps.core.context import change_context
    from apps.inventory.services import router_credential_issue

    try:
        with change_context(source="command"):
            _, secret = router_credential_issue(name=name, description=description, may_load_models=may_load_models)
    except ValidationError as exc:
        typer.echo(f"error: {'; '.join(exc.messages)}", err=True)
        raise typer.Exit(2) from None
    typer.echo(secret)


@router_credential_app.command("update")
def router_credential_update_cmd(
    name: str = typer.Argument(..., help="Router name"),
    description: str = typer.Option(None, help="What or where the router is"),
    may_load_models: bool = typer.Option(None, "--may-load-models/--may-not-load-models",
                                         help="Whether the router may relay the Open Inference Protocol's model load/unload"),
) -> None:
    """Change router NAME's description or permissions, keeping its secret (the running router goes on working)."""
    django_setup()
    from django.core.exceptions import ValidationError

    from apps.core.context import change_context
    from apps.inventory.models import RouterCredential
    from apps.inventory.services import router_credential_update

    if description is None and may_load_models is None:
        typer.echo("error: nothing to change: give --description and/or --may-load-models/--may-not-load-models", err=True)
        raise typer.Exit(2)
    credential = _found_or_exit(RouterCredential.objects, "router credential", name=name)
    try:
        with change_context(source="command"):
            credential = router_credential_update(credential=credential, description=description, may_load_models=may_load_models)
    except ValidationError as exc:
        typer.echo(f"error: {'; '.join(exc.messages)}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"router {name}: may load models: {'yes' if credential.may_load_models else 'no'}; "
               f"description: {credential.description or '-'}")


@router_credential_app.command("revoke")
def router_credential_revoke_cmd(name: str = typer.Argument(..., help="Router name")) -> None:
    """Revoke router NAME's credential: its requests are refused from now on."""
    django_setup()
    from apps.core.context import change_context
    from apps.inventory.models import RouterCredential
    from apps.inventory.services import router_credential_revoke

    credential = _found_or_exit(RouterCredential.objects, "router credential", name=name)
    with change_context(source="command"):
        router_credential_revoke(credential=credential)
    typer.echo(f"revoked the credential of router {name}")
