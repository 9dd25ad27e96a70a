"""Helpers the command modules share: exit codes, error exits, Django set-up, problem and plan JSON reading."""
from __future__ import annotations

import os
from pathlib import Path

import typer

# Exit codes of the engine commands: 0 fine, 1 the thing checked is invalid, 2 the input is malformed.
EXIT_INVALID = 1
EXIT_MALFORMED = 2


def django_setup(settings: str = "controlplane.settings.local") -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


def fail(message: str, code: int = EXIT_MALFORMED) -> typer.Exit:
    """Print `error: message` to stderr and return the exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def number(value: float | None, fmt: str = ".6g") -> str:
    return "-" if value is None else format(value, fmt)


# The engine is imported inside each function: `tessera --help` stays fast and never loads the solvers.


def json_read(path: Path, what: str):
    import json

    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise fail(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise fail(f"{what} {path} is not valid JSON: {exc}") from exc


def problem_read(path: Path):
    from engine.plans.problem import ProblemError, problem_from_dict
    from engine.plans.schema import json_validate, problem_schema

    raw = json_read(path, "problem")
    try:
        json_validate(raw, problem_schema(), what=f"problem {path}")
        return problem_from_dict(raw)
    except ProblemError as exc:  # SchemaError is a ProblemError
        raise fail(str(exc) if str(exc).startswith("problem ") else f"problem {path}: {exc}") from exc


def plan_read(path: Path):
    from engine.plans.problem import ProblemError, plan_from_dict
    from engine.plans.schema import json_validate, plan_schema

    raw = json_read(path, "plan")
    try:
        json_validate(raw, plan_schema(), what=f"plan {path}")
        return plan_from_dict(raw)
    except ProblemError as exc:
        raise fail(str(exc) if str(exc).startswith("plan ") else f"plan {path}: {exc}") from exc
