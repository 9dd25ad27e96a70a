"""Declaring pipelines: one write path for the REST API, the CLI and the admin.

A pipeline arrives in the planning problem's format (engine/plans/problem.py, `pipeline_from_dict`): its
stages (application names, or {application, variant, max_batch}; a chain may be text, "detect ->
classify") and its paths, or for a chain one `slo_ms` and `demand_rps`. The engine's parser checks the
graph (acyclic, one entry, stages exist and appear once, SLOs positive) with the messages planning gives;
this service checks what only the registry knows (the applications and pinned variants exist, no
application is a stage of another pipeline), stores the normal form (paths written out) and rewrites the
stage index in the same transaction. Nothing is stored on bad input."""
from __future__ import annotations

from typing import Any, Mapping

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from engine.plans.problem import ProblemError, pipeline_from_dict, pipeline_to_dict

from ..models import Application, ModelVariant, Pipeline, PipelineStage

__all__ = ["pipeline_delete", "pipeline_save", "pipeline_spec_read"]


def pipeline_spec_read(data: Mapping[str, Any], *, pipeline: Pipeline | None = None) -> dict[str, Any]:
    """The pipeline `data` declares, checked and in normal form, or ValidationError naming the fault. For
    an update, `pipeline` is the one being changed: keys `data` leaves out keep its values."""
    if not isinstance(data, Mapping):
        raise ValidationError("A pipeline is an object: {name, stages, paths} or {name, stages, slo_ms, demand_rps}.")
    raw = dict(pipeline.engine_dict()) if pipeline is not None else {}
    description = data.get("description", pipeline.description if pipeline is not None else "")
    if pipeline is not None and "paths" not in data and any(k in data for k in ("stages", "slo_ms", "demand_rps")):
        # A chain changed: its one path follows the stages, and keeps its SLO and demand unless given.
        old = raw.pop("paths", None) or []
        if len(old) == 1:
            raw["slo_ms"], raw["demand_rps"] = old[0]["slo_ms"], old[0]["demand_rps"]
    raw.update({k: v for k, v in data.items() if k != "description"})
    if not isinstance(description, str):
        raise ValidationError({"description": "Expected text."})
    names = set(Application.objects.values_list("name", flat=True))
    try:
        spec = pipeline_from_dict(raw, names, where="pipeline")
    except ProblemError as exc:
        raise ValidationError(str(exc)) from exc
    for st in spec.stages:
        if st.variant is not None and not ModelVariant.objects.filter(application__name=st.application, name=st.variant).exists():
            raise ValidationError(f"pipeline ({spec.name}): stage {st.application!r} pins variant {st.variant!r}, which {st.application} does not have.")
    taken = (
        PipelineStage.objects.filter(application__name__in=[st.application for st in spec.stages])
        .exclude(pipeline=pipeline)
        .select_related("application", "pipeline")
        .first()
    )
    if taken is not None:
        raise ValidationError(f"pipeline ({spec.name}): application {taken.application.name!r} is already a stage of pipeline "
                              f"{taken.pipeline.name!r}; an application is a stage of at most one pipeline.")
    normal = pipeline_to_dict(spec)
    normal["description"] = description
    return normal


@transaction.atomic
def pipeline_save(*, data: Mapping[str, Any], pipeline: Pipeline | None = None) -> Pipeline:
    """Create a pipeline from `data`, or change `pipeline` (the keys `data` gives), and rewrite its stage
    index; audited with the actor like every change (ChangeLoggedModel)."""
    spec = pipeline_spec_read(data, pipeline=pipeline)
    pipeline = pipeline or Pipeline()
    for key in ("name", "description", "stages", "paths", "alpha", "beta", "delta", "ipa_threshold_rps"):
        setattr(pipeline, key, spec[key])
    try:
        pipeline.full_clean(validate_unique=True)
        pipeline.save()
        pipeline.stage_rows.all().delete()
        apps = {a.name: a for a in Application.objects.filter(name__in=[s["application"] for s in spec["stages"]])}
        variants = {
            (v.application.name, v.name): v
            for v in ModelVariant.objects.filter(application__name__in=list(apps)).select_related("application")
        }
        PipelineStage.objects.bulk_create([
            PipelineStage(pipeline=pipeline, application=apps[s["application"]], position=k,
                          variant=variants.get((s["application"], s.get("variant"))) if s.get("variant") else None)
            for k, s in enumerate(spec["stages"])
        ])
    except IntegrityError as exc:  # a concurrent write took one of its applications first
        raise ValidationError(f"pipeline ({spec['name']}): {exc}") from exc
    return pipeline


@transaction.atomic
def pipeline_delete(*, pipeline: Pipeline) -> None:
    pipeline.delete()
