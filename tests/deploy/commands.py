"""Checks that a command line in a deployment file is one the real programs accept: `tessera …` parsed by
the Typer app's own click commands (unknown commands, options or bad values fail as they would at start),
`python -m django …` by Django's own command parsers, `celery -A controlplane …` against the real
`celery … --help`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from django.core.management import get_commands, load_command_class
from typer.main import get_command
from typer.testing import CliRunner

from controlplane.cli import app

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def tessera_parse(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Parse `tessera ARGS` down to its (sub)command without running it: (the command path, its params).
    Also asks the subcommand for --help, as a user would, and expects it to answer."""
    group = get_command(app)
    ctx = group.make_context("tessera", list(args))
    path: list[str] = []
    command = group
    while hasattr(command, "resolve_command"):  # a group (Typer's own click: not click.Group)
        rest = [*ctx._protected_args, *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, f"tessera {' '.join(path + [name])}: no such command"
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    shown = CliRunner().invoke(app, [*path, "--help"])
    assert shown.exit_code == 0, shown.output
    return path, ctx.params


def django_parse(args: list[str]):
    """`python -m django ARGS`: the management command's own argument parser."""
    name, *rest = args
    assert name in get_commands(), f"django has no command {name!r}"
    command = load_command_class(get_commands()[name], name)
    return name, command.create_parser("django", name).parse_args(rest)


def celery_check(args: list[str]) -> None:
    """`celery -A controlplane SUB OPTIONS`: the app option and every option used must be in the real help."""
    assert args[:2] == ["-A", "controlplane"], args
    sub, *options = args[2:]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test"}
    shown = subprocess.run([str(VENV_BIN / "celery"), "-A", "controlplane", sub, "--help"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    for option in options:
        if option.startswith("-"):
            assert option.split("=")[0] in shown.stdout, f"celery {sub} has no option {option}"


def command_check(argv: list[str], env: dict[str, str] | None = None) -> tuple[str, Any]:
    """Check one command line (its program by basename) in the environment `env` gives it (options that
    read environment variables, such as the agent's TESSERA_CONTROL_PLANE, are taken from there only);
    returns what was parsed."""
    program = Path(argv[0]).name
    if program == "tessera":
        unset = {name: "" for name in os.environ if name.startswith("TESSERA_")}
        with mock.patch.dict(os.environ, {**unset, **(env or {})}):
            for name in unset:
                if name not in (env or {}):
                    del os.environ[name]
            return "tessera", tessera_parse(argv[1:])
    if program.startswith("python") and argv[1:3] == ["-m", "django"]:
        return "django", django_parse(argv[3:])
    if program == "celery":
        celery_check(argv[1:])
        return "celery", argv[1:]
    raise AssertionError(f"unexpected program {argv!r}")


def production_settings_load(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Set Django up in a fresh interpreter with exactly `env` (and PATH); prints MEDIA_ROOT and ALLOWED_HOSTS."""
    code = "import django; django.setup(); from django.conf import settings; print(settings.MEDIA_ROOT, settings.ALLOWED_HOSTS)"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=120)
