"""Importing the gpulets reference data (engine/reference/data/gpulet: an RTX 2080 Ti under MPS, see its README) into
the registry, for the variants named like its models ("resnet50", "vgg16", ...):

- inference.csv: each model's solo batch latency on each MPS partition -> `imported` Profile rows on
  device type GPULET_GPU_MODEL, slice "mps<percent>" (the CSV gives one latency: it is stored as both p50
  and p99);
- mem_util.csv: the model's L2 and DRAM bandwidth utilisation alone at that batch and partition -> the
  same Profile rows' l2_util_pct and dram_util_pct (a utilisation without such a profile point is counted,
  not stored);
- interference.csv: co-runs -> CorunMeasurement rows (the model at its batch on its partition, the
  co-runner at its batch on the rest).

The files are read by engine.reference.profiles (the readers the benches use). All or nothing, in one
transaction; idempotent: a row already stored with the same values is left alone (no audit entry), one
with other values is updated in place. New rows are created in bulk, each with its audit record
(`apps.core.signals.objects_bulk_create_audited`): row by row, the 4,095 rows took 3.4 s of every demo seed."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.core.signals import objects_bulk_create_audited
from engine.reference.profiles import (
    GPULET_GPU_MODEL,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
    reference_data_dir,
)
from engine.sharing.partitions import mps_slice_name

from ..choices import ProfileSourceChoices
from ..models import Application, CorunMeasurement, ModelVariant, Profile

__all__ = ["GPULET_SOURCE_DETAIL", "GpuletImportResult", "gpulet_import", "gpulet_variants_match"]

GPULET_SOURCE_DETAIL = {
    "profile": "engine/reference/data/gpulet inference.csv and mem_util.csv (RTX 2080 Ti under MPS; one latency, stored as p50 and p99)",
    "corun": "engine/reference/data/gpulet interference.csv (RTX 2080 Ti under MPS)",
}
_PROFILE_FIELDS = ("latency_p50_ms", "latency_p99_ms", "throughput_rps", "l2_util_pct", "dram_util_pct", "source", "source_detail")
_CORUN_FIELDS = ("latency_ms", "throughput_rps", "source", "source_detail")


@dataclass(frozen=True)
class GpuletImportResult:
    profiles_created: int
    profiles_updated: int
    profiles_unchanged: int
    utilisations: int  # profile points that carry a utilisation from mem_util.csv
    utilisations_without_profile: int  # mem_util.csv rows of a matched model with no inference.csv point
    coruns_created: int
    coruns_updated: int
    coruns_unchanged: int
    models_without_variant: tuple[str, ...]  # CSV models no variant is named like (their rows are skipped)
    device_type: str = GPULET_GPU_MODEL

    def summary(self) -> str:
        lines = [
            f"profiles on {self.device_type}: {self.profiles_created} created, {self.profiles_updated} updated, "
            f"{self.profiles_unchanged} unchanged ({self.utilisations} with L2/DRAM utilisation; "
            f"{self.utilisations_without_profile} utilisations without a profile point, not stored)",
            f"co-run measurements: {self.coruns_created} created, {self.coruns_updated} updated, {self.coruns_unchanged} unchanged",
        ]
        if self.models_without_variant:
            lines.append(f"models without a variant of that name, skipped: {', '.join(self.models_without_variant)}")
        return "\n".join(lines)


def gpulet_variants_match(*, models: set[str], application: str | None = None) -> dict[str, ModelVariant]:
    """The variant named like each model ({model: variant}; models no variant is named like are left out),
    in `application` when given. A name that several applications' variants share is a ValidationError
    (give the application)."""
    variants = ModelVariant.objects.select_related("application").filter(name__in=models)
    if application is not None:
        if not Application.objects.filter(name=application).exists():
            raise ValidationError({"application": f"No application named {application!r}."})
        variants = variants.filter(application__name=application)
    found: dict[str, list[ModelVariant]] = defaultdict(list)
    for variant in variants:
        found[variant.name].append(variant)
    ambiguous = {name: sorted(v.application.name for v in found[name]) for name in sorted(found) if len(found[name]) > 1}
    if ambiguous:
        listed = "; ".join(f"{name} (in {', '.join(apps)})" for name, apps in ambiguous.items())
        raise ValidationError({"application": f"Variants of several applications are named like a gpulet model: {listed}. "
                                              "Give the application to import for."})
    return {name: items[0] for name, items in found.items()}


def _read(data_dir: Path | None) -> tuple[list, list, list]:
    try:
        folder = Path(data_dir) if data_dir is not None else reference_data_dir() / "gpulet"
        return (gpulet_inference_read(folder / "inference.csv"), gpulet_mem_util_read(folder / "mem_util.csv"),
                gpulet_interference_read(folder / "interference.csv"))
    except FileNotFoundError as exc:
        raise ValidationError({"data_dir": f"The gpulet reference data is not there: {exc}"}) from exc
    except ValueError as exc:
        raise ValidationError({"data_dir": f"The gpulet reference data is not readable: {exc}"}) from exc


def _clean(obj: Profile | CorunMeasurement, exclude: list[str], label: str) -> None:
    # Field checks and the model's own clean(), without a query per foreign key (the variants are known).
    try:
        obj.clean_fields(exclude=exclude)
        obj.clean()
    except ValidationError as exc:
        raise ValidationError({label: [f"{k}: {m}" if k != "__all__" else m for k, ms in exc.message_dict.items() for m in ms]}) from exc


def _upsert(obj: Any, existing: Any, fields: tuple[str, ...], counts: dict[str, int], new: list) -> None:
    """Update `existing` to `obj`'s `fields` (audited, by save), or queue `obj` in `new` for the bulk create."""
    if existing is None:
        new.append(obj)
        counts["created"] += 1
        return
    changed = [name for name in fields if getattr(existing, name) != getattr(obj, name)]
    if not changed:
        counts["unchanged"] += 1
        return
    for name in changed:
        setattr(existing, name, getattr(obj, name))
    if existing.pk is not None:  # else a row listed twice in the file: the queued first one takes the values
        existing.save()
    counts["updated"] += 1


@transaction.atomic
def gpulet_import(*, data_dir: Path | str | None = None, application: str | None = None) -> GpuletImportResult:
    """Import engine/reference/data/gpulet (or `data_dir`) for the variants named like its models (in `application`
    when given; see the module docstring). ValidationError, and nothing stored, when the files cannot be
    read, no variant is named like any of their models, a name is ambiguous, or a row is invalid."""
    inference, mem_util, coruns = _read(Path(data_dir) if data_dir is not None else None)
    models = {p.model for p in inference} | {u.model for u in mem_util} | {c.model for c in coruns} | {c.corunner for c in coruns}
    variants = gpulet_variants_match(models=models, application=application)
    if not variants:
        where = f" in {application}" if application else ""
        raise ValidationError({"variants": f"No variant{where} is named like a gpulet model ({', '.join(sorted(models))}); "
                                           "create them first (e.g. a variant named resnet50)."})
    device_type = GPULET_GPU_MODEL
    ids = [v.pk for v in variants.values()]

    utilisation = {(u.model, u.batch, u.partition_pct): u for u in mem_util if u.model in variants}
    points = {(p.model, p.batch, p.partition_pct) for p in inference if p.model in variants}
    stored = {(p.variant_id, p.slice, p.batch_size): p
              for p in Profile.objects.filter(variant_id__in=ids, device_type=device_type, cpu_cores=None)}
    profile_counts = {"created": 0, "updated": 0, "unchanged": 0}
    new_profiles: list[Profile] = []
    with_utilisation = 0
    for point in inference:
        variant = variants.get(point.model)
        if variant is None:
            continue
        util = utilisation.get((point.model, point.batch, point.partition_pct))
        with_utilisation += util is not None
        profile = Profile(
            variant=variant, device_type=device_type, slice=mps_slice_name(point.partition_pct), batch_size=point.batch,
            latency_p50_ms=point.latency_ms, latency_p99_ms=point.latency_ms, throughput_rps=point.throughput_rps,
            l2_util_pct=util.l2_util_pct if util else None, dram_util_pct=util.dram_util_pct if util else None,
            source=ProfileSourceChoices.IMPORTED, source_detail=GPULET_SOURCE_DETAIL["profile"],
        )
        _clean(profile, ["variant"], f"inference.csv {point.model} b{point.batch} {point.partition_pct}%")
        key = (variant.pk, profile.slice, profile.batch_size)
        _upsert(profile, stored.get(key), _PROFILE_FIELDS, profile_counts, new_profiles)
        stored.setdefault(key, profile)  # a point listed twice in the file updates the first
    objects_bulk_create_audited(new_profiles)

    stored_coruns = {(c.variant_id, c.corunner_id, c.partition_pct, c.batch, c.corunner_batch): c
                     for c in CorunMeasurement.objects.filter(variant_id__in=ids, device_type=device_type)}
    corun_counts = {"created": 0, "updated": 0, "unchanged": 0}
    new_coruns: list[CorunMeasurement] = []
    for row in coruns:
        variant, corunner = variants.get(row.model), variants.get(row.corunner)
        if variant is None or corunner is None:
            continue
        corun = CorunMeasurement(
            variant=variant, corunner=corunner, device_type=device_type, batch=row.batch, partition_pct=row.partition_pct,
            corunner_batch=row.corunner_batch, latency_ms=row.latency_ms, throughput_rps=row.throughput_rps,
            source=ProfileSourceChoices.IMPORTED, source_detail=GPULET_SOURCE_DETAIL["corun"],
        )
        label = f"interference.csv {row.model} b{row.batch} {row.partition_pct}% beside {row.corunner} b{row.corunner_batch}"
        _clean(corun, ["variant", "corunner"], label)
        key = (variant.pk, corunner.pk, row.partition_pct, row.batch, row.corunner_batch)
        _upsert(corun, stored_coruns.get(key), _CORUN_FIELDS, corun_counts, new_coruns)
        stored_coruns.setdefault(key, corun)  # a row listed twice in the file updates the first
    objects_bulk_create_audited(new_coruns)

    return GpuletImportResult(
        profiles_created=profile_counts["created"], profiles_updated=profile_counts["updated"],
        profiles_unchanged=profile_counts["unchanged"], utilisations=with_utilisation,
        utilisations_without_profile=len(set(utilisation) - points),
        coruns_created=corun_counts["created"], coruns_updated=corun_counts["updated"], coruns_unchanged=corun_counts["unchanged"],
        models_without_variant=tuple(sorted(models - set(variants))), device_type=device_type,
    )
