"""`tessera pipeline`: declare pipelines (DAGs of applications with per-path SLOs) from YAML or JSON, or a
chain in one line; list and delete them. The same service as the REST API (`/api/v1/pipelines/`) and the
admin writes them, so the same checks and messages apply and nothing is stored on bad input."""
from __future__ import annotations

from pathlib import Path

import typer

from ._common import EXIT_MALFORMED, django_setup, fail

pipeline_app = typer.Typer(help="Pipelines: DAGs of applications planned as a whole (fa2, ipa).", no_args_is_help=True)


def _describe(pipeline) -> str:
    paths = "; ".join(f"{q['name']}: {' -> '.join(q['stages'])} within {q['slo_ms']:g} ms at {q['demand_rps']:g} rps" for q in pipeline.paths)
    return f"{pipeline.name} ({len(pipeline.stages)} stage(s), entry {pipeline.entry}): {paths}"


def _documents_read(path: Path) -> list[dict]:
    import json

    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise fail(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if isinstance(data, dict) and "pipelines" in data:
        data = data["pipelines"]
    documents = data if isinstance(data, list) else [data]
    if not documents or not all(isinstance(d, dict) for d in documents):
        raise fail(f"{path}: expected a pipeline (a mapping with name and stages), a list of them, or {{pipelines: [...]}}")
    return documents


def _save_all(documents: list[dict]) -> list[tuple[str, object]]:
    """Create or change each pipeline by name, all or none."""
    from django.core.exceptions import ValidationError
    from django.db import transaction

    from apps.core.context import change_context
    from apps.registry.models import Pipeline
    from apps.registry.services.pipelines import pipeline_save

    done = []
    try:
        with change_context(source="command"), transaction.atomic():
            for k, document in enumerate(documents):
                existing = Pipeline.objects.filter(name=document.get("name")).first()
                try:
                    if existing is not None and "paths" not in document and "slo_ms" not in document:
                        raise ValidationError("give its paths, or slo_ms and demand_rps for a chain: apply replaces a pipeline's declaration")
                    saved = pipeline_save(data=document, pipeline=existing)
                except ValidationError as exc:
                    label = document.get("name") or f"document {k + 1}"
                    raise ValidationError(f"{label}: {'; '.join(exc.messages)}") from exc
                done.append(("updated" if existing is not None else "created", saved))
    except ValidationError as exc:
        raise fail(f"{'; '.join(exc.messages)} (nothing was stored)", EXIT_MALFORMED) from exc
    return done


@pipeline_app.command("apply")
def pipeline_apply_cmd(
    file: Path = typer.Option(..., "--file", "-f", help="YAML or JSON: one pipeline, a list, or {pipelines: [...]}, as the problem format writes them"),
) -> None:
    """Create or replace the pipelines in FILE, by name; all or none. Exit 2 on bad input (nothing stored)."""
    documents = _documents_read(file)
    django_setup()
    for verb, pipeline in _save_all(documents):
        typer.echo(f"{verb} {_describe(pipeline)}")


@pipeline_app.command("chain")
def pipeline_chain_cmd(
    name: str = typer.Argument(..., help="Pipeline name"),
    stages: str = typer.Argument(..., help="The stages in order: 'detect -> classify -> caption'"),
    slo_ms: float = typer.Option(..., "--slo-ms", help="End-to-end latency SLO in ms"),
    demand_rps: float = typer.Option(..., "--demand-rps", help="Expected demand in requests per second"),
) -> None:
    """Declare (or replace) a linear pipeline in one line."""
    django_setup()
    for verb, pipeline in _save_all([{"name": name, "stages": stages, "slo_ms": slo_ms, "demand_rps": demand_rps}]):
        typer.echo(f"{verb} {_describe(pipeline)}")


@pipeline_app.command("list")
def pipeline_list_cmd() -> None:
    """Every pipeline with its paths."""
    django_setup()
    from apps.registry.models import Pipeline

    for pipeline in Pipeline.objects.order_by("name"):
        typer.echo(_describe(pipeline))


@pipeline_app.command("delete")
def pipeline_delete_cmd(name: str = typer.Argument(..., help="Pipeline name")) -> None:
    """Delete a pipeline; its applications stay, as applications of their own."""
    django_setup()
    from apps.core.context import change_context
    from apps.registry.models import Pipeline
    from apps.registry.services.pipelines import pipeline_delete

    pipeline = Pipeline.objects.filter(name=name).first()
    if pipeline is None:
        raise fail(f"no pipeline {name!r}")
    with change_context(source="command"):
        pipeline_delete(pipeline=pipeline)
    typer.echo(f"deleted {name}")
