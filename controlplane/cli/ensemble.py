"""`tessera ensemble`: show, set and clear an application's ensemble policy (Garrison's random ensembles:
mode, members with sampling probability and vote weight, size bounds, vote). The same service as the REST
API (`/api/v1/ensemble-policies/`), the admin and the dashboard writes it (`ensemble_policy_set`), so the
same rules and messages apply and nothing is stored on bad input. Exit 0 fine, 1 the policy is refused by
its rules, 2 the command line is malformed or names no application."""
from __future__ import annotations

import typer

from ._common import EXIT_INVALID, django_setup, fail

ensemble_app = typer.Typer(help="Ensemble policies: which variants answer an application's queries together.", no_args_is_help=True)

# The engine's modes and votes (engine.ensembles.policy.ENSEMBLE_MODES, ENSEMBLE_VOTES), spelt out so that
# `--help` loads no engine module (tests/api/test_ensemble_cli.py keeps them equal).
MODES = ("single", "random", "learned")
VOTES = ("soft", "hard")


def _application(name: str):
    from apps.registry.models import Application

    application = Application.objects.filter(name=name).first()
    if application is None:
        raise fail(f"no application {name!r}")
    return application


def _describe(policy) -> list[str]:
    lines = [f"{policy.application.name}: {policy.mode} ensemble of {policy.min_size}..{policy.max_size} member(s), {policy.vote} vote"
             + (f", scheduler {policy.scheduler}" if policy.scheduler else "")]
    lines += [f"  {m.variant.name:<32} p={m.probability:<8g} weight={m.weight:g}" for m in policy.member_list()]
    return lines


@ensemble_app.command("show")
def ensemble_show_cmd(
    application: str = typer.Argument(..., help="Application name"),
    as_json: bool = typer.Option(False, "--json", help="Print the policy as the routing tables carry it (JSON)"),
) -> None:
    """An application's ensemble policy and its members; without one, its queries are answered by one variant each."""
    django_setup()
    import json

    policy = getattr(_application(application), "ensemble_policy", None)
    if as_json:
        typer.echo(json.dumps(None if policy is None else policy.engine_dict(), indent=2))
    elif policy is None:
        typer.echo(f"{application}: no ensemble policy (one variant per query, as the plan routes it)")
    else:
        typer.echo("\n".join(_describe(policy)))


@ensemble_app.command("set")
def ensemble_set_cmd(
    application: str = typer.Argument(..., help="Application name"),
    members: list[str] = typer.Option(..., "--member", "-m", help="VARIANT=PROBABILITY[:WEIGHT], once per member; the probabilities sum to 1"),
    mode: str = typer.Option("random", "--mode", help=f"One of {', '.join(MODES)}"),
    min_size: int = typer.Option(None, "--min-size", help="Fewest members per query (default 1)"),
    max_size: int = typer.Option(None, "--max-size", help="Most members per query (default: every member with a probability > 0; single: 1)"),
    vote: str = typer.Option("soft", "--vote", help=f"One of {', '.join(VOTES)}"),
    scheduler: str = typer.Option("", "--scheduler", help="learned: the scheduler's ONNX policy (a name or path the router resolves)"),
) -> None:
    """Create or replace an application's ensemble policy, members as a whole. Exit 1 when the rules refuse it
    (nothing is stored), 2 on a malformed command line or an unknown application."""
    if mode not in MODES:
        raise fail(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if vote not in VOTES:
        raise fail(f"--vote must be one of {', '.join(VOTES)}, got {vote!r}")
    django_setup()
    from django.core.exceptions import ValidationError

    from apps.core.context import change_context
    from apps.policies.services import ensemble_members_parse, ensemble_policy_set

    try:
        parsed = [m for text in members for m in ensemble_members_parse(text)]
    except ValidationError as exc:
        raise fail(f"--member {exc.message_dict['members'][0]}") from exc
    data = {"mode": mode, "vote": vote, "scheduler": scheduler, "members": parsed}
    data.update({k: v for k, v in (("min_size", min_size), ("max_size", max_size)) if v is not None})
    target = _application(application)
    try:
        with change_context(source="command"):
            policy = ensemble_policy_set(application=target, data=data)
    except ValidationError as exc:
        fields = getattr(exc, "message_dict", {"": exc.messages})
        detail = "; ".join(f"{k}: {m}" if k and k != "__all__" and not m.startswith(k) else m for k, ms in fields.items() for m in ms)
        raise fail(f"{application}: {detail} (nothing was stored)", EXIT_INVALID) from exc
    typer.echo("\n".join(_describe(policy)))


@ensemble_app.command("clear")
def ensemble_clear_cmd(application: str = typer.Argument(..., help="Application name")) -> None:
    """Delete an application's ensemble policy: its queries are answered by one variant each again."""
    django_setup()
    from apps.core.context import change_context
    from apps.policies.services import ensemble_policy_delete

    policy = getattr(_application(application), "ensemble_policy", None)
    if policy is None:
        typer.echo(f"{application} has no ensemble policy")
        return
    with change_context(source="command"):
        ensemble_policy_delete(policy=policy)
    typer.echo(f"cleared the ensemble policy of {application}")
