"""Registry services for Profile rows: the one upsert that measured results (profiling.py) and imports
share, and the import of profiles measured elsewhere (CSV or JSON rows, all or nothing)."""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from django.core.exceptions import ValidationError
from django.db import transaction

from ..choices import CPU_DEVICE_TYPE, ProfileSourceChoices
from ..models import ModelVariant, Profile


def profile_upsert(*, profile: Profile) -> bool:
    """Save `profile`, replacing the stored point with the same key (variant, device type, slice, CPU cores,
    batch size) if there is one; True when it replaced one. Runs in its caller's transaction (one
    request's results, or one import: all or nothing)."""
    existing = Profile.objects.filter(
        variant=profile.variant, device_type=profile.device_type, slice=profile.slice,
        cpu_cores=profile.cpu_cores, batch_size=profile.batch_size,
    ).first()
    if existing is not None:
        profile.pk, profile.created = existing.pk, existing.created
        profile._state.adding = False
    profile.save()
    return existing is not None


# --------------------------------------------------------------------------- profile import

PROFILE_IMPORT_MAX_ROWS = 50_000
PROFILE_IMPORT_COLUMNS = (
    "variant", "device_type", "slice", "cpu_cores", "batch_size", "latency_p50_ms", "latency_p99_ms", "throughput_rps",
    "memory_mb", "l2_util_pct", "dram_util_pct", "source_detail",
)
PROFILE_IMPORT_REQUIRED = ("variant", "device_type", "batch_size", "latency_p50_ms", "latency_p99_ms")


@dataclass(frozen=True)
class ProfileImportResult:
    created: int
    updated: int


def _csv_records(reader) -> Iterator[list[str]]:
    """The reader's records; one the csv module cannot read (a field past its size limit, say) is a
    ValidationError naming its line, not a server error."""
    try:
        yield from reader
    except csv.Error as exc:
        raise ValidationError({f"line {reader.line_num}": f"Not readable as CSV: {exc}."}) from exc


def profile_rows_from_csv(*, text: str) -> list[tuple[str, dict[str, Any]]]:
    """CSV with a header row naming PROFILE_IMPORT_COLUMNS (the optional ones may be left out) -> rows
    labelled "line N" (N counting the header as line 1)."""
    # newline="": a record may end in \r\n, \n or a bare \r (old Mac exports), as the csv module expects.
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff"), newline=""))
    header: list[str] | None = None
    rows: list[tuple[str, dict[str, Any]]] = []
    line = 1
    for record in _csv_records(reader):
        if not record or all(not cell.strip() for cell in record):
            line = reader.line_num + 1
            continue
        if header is None:
            header = [cell.strip().lower() for cell in record]
            unknown = [c for c in header if c not in PROFILE_IMPORT_COLUMNS]
            missing = [c for c in PROFILE_IMPORT_REQUIRED if c not in header]
            problems = []
            if unknown:
                problems.append(f"unknown column(s) {', '.join(unknown)}")
            if missing:
                problems.append(f"missing column(s) {', '.join(missing)}")
            if len(set(header)) != len(header):
                problems.append("a column is named twice")
            if problems:
                raise ValidationError({f"line {line}": f"{'; '.join(problems)} (columns: {', '.join(PROFILE_IMPORT_COLUMNS)})"})
        else:
            if len(record) != len(header):
                rows.append((f"line {line}", {"__error__": f"{len(record)} values for {len(header)} columns"}))
            else:
                rows.append((f"line {line}", dict(zip(header, record))))
        line = reader.line_num + 1
    if header is None:
        raise ValidationError({"file": "The CSV is empty: give a header row and at least one profile."})
    return rows


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _number(row: dict[str, Any], name: str, kind: type, errors: list[str], *, required: bool, minimum: float) -> Any:
    value = row.get(name)
    if _blank(value):
        if required:
            errors.append(f"{name}: required")
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        if kind is int:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            number = int(number)
        else:
            number = float(value)
    except (TypeError, ValueError):
        errors.append(f"{name}: {value!r} is not a {'whole number' if kind is int else 'number'}")
        return None
    if not math.isfinite(number):
        errors.append(f"{name}: {value!r} is not a finite number")
        return None
    if number < minimum:
        errors.append(f"{name}: must be at least {minimum:g}")
        return None
    return number


def _variant_resolve(value: Any, cache: dict[str, ModelVariant | None]) -> ModelVariant | None:
    key = str(value).strip()
    if key not in cache:
        if key.isdigit():
            cache[key] = ModelVariant.objects.select_related("application").filter(pk=int(key)).first()
        elif key.count("/") == 1:
            application, name = (part.strip() for part in key.split("/"))
            cache[key] = ModelVariant.objects.select_related("application").filter(application__name=application, name=name).first()
        else:
            cache[key] = None
    return cache[key]


@transaction.atomic
def profiles_import(*, rows: Sequence[tuple[str, dict[str, Any]]], source_detail: str = "") -> ProfileImportResult:
    """Upsert profiles measured elsewhere as `imported` Profile rows. Each row (labelled, e.g. "line 3")
    names its variant by id or "application/variant", its device_type, slice ("full", a MIG profile or
    "mpsNN" on GPUs; empty on CPUs), cpu_cores (CPUs), batch_size, latency_p50_ms, latency_p99_ms, and
    optionally throughput_rps (batch / p50 when empty), memory_mb, l2_util_pct and dram_util_pct (GPUs, 0..100)
    and source_detail (`source_detail` otherwise). A
    point already stored (measured or imported) is updated in place. All or nothing: every bad row is
    reported under its label."""
    if not rows:
        raise ValidationError({"rows": "Nothing to import: give at least one profile."})
    if len(rows) > PROFILE_IMPORT_MAX_ROWS:
        raise ValidationError({"rows": f"{len(rows)} rows is more than the limit of {PROFILE_IMPORT_MAX_ROWS}: import in parts."})
    variants: dict[str, ModelVariant | None] = {}
    errors: dict[str, list[str]] = {}
    profiles: list[Profile] = []
    keys: dict[tuple, str] = {}
    for label, row in rows:
        problems: list[str] = []
        if not isinstance(row, dict):
            errors[label] = ["expected an object of column values"]
            continue
        if "__error__" in row:
            errors[label] = [row["__error__"]]
            continue
        unknown = sorted(k for k in row if k not in PROFILE_IMPORT_COLUMNS)
        if unknown:
            problems.append(f"unknown field(s) {', '.join(unknown)}")
        variant = None
        if _blank(row.get("variant")):
            problems.append("variant: required")
        else:
            variant = _variant_resolve(row["variant"], variants)
            if variant is None:
                problems.append(f"variant: no variant {str(row['variant']).strip()!r} (give its id or application/variant)")
        device_type = "" if _blank(row.get("device_type")) else str(row["device_type"]).strip()
        if not device_type:
            problems.append("device_type: required")
        values = {
            "cpu_cores": _number(row, "cpu_cores", int, problems, required=False, minimum=1),
            "batch_size": _number(row, "batch_size", int, problems, required=True, minimum=1),
            "latency_p50_ms": _number(row, "latency_p50_ms", float, problems, required=True, minimum=0.0001),
            "latency_p99_ms": _number(row, "latency_p99_ms", float, problems, required=True, minimum=0.0001),
            "throughput_rps": _number(row, "throughput_rps", float, problems, required=False, minimum=0.0),
            "memory_mb": _number(row, "memory_mb", int, problems, required=False, minimum=0),
            "l2_util_pct": _number(row, "l2_util_pct", float, problems, required=False, minimum=0.0),
            "dram_util_pct": _number(row, "dram_util_pct", float, problems, required=False, minimum=0.0),
        }
        detail = "" if _blank(row.get("source_detail")) else str(row["source_detail"]).strip()
        if len(detail) > 200:
            problems.append("source_detail: at most 200 characters")
        if problems:
            errors[label] = problems
            continue
        slice_name = "" if _blank(row.get("slice")) else str(row["slice"]).strip()
        profile = Profile(
            variant=variant, device_type=CPU_DEVICE_TYPE if device_type.lower() == CPU_DEVICE_TYPE else device_type, slice=slice_name,
            source=ProfileSourceChoices.IMPORTED, source_detail=(detail or source_detail)[:200], measured_at=None, **values,
        )
        try:
            profile.full_clean(validate_unique=False, validate_constraints=False)  # normalises GPU and slice names
        except ValidationError as exc:
            errors[label] = [f"{k}: {m}" if k != "__all__" else m for k, ms in exc.message_dict.items() for m in ms]
            continue
        key = (profile.variant_id, profile.device_type, profile.slice, profile.cpu_cores, profile.batch_size)
        if key in keys:
            errors[label] = [f"the same point as {keys[key]}"]
            continue
        keys[key] = label
        profiles.append(profile)
    if errors:
        raise ValidationError(errors)
    replaced = sum(profile_upsert(profile=profile) for profile in profiles)
    return ProfileImportResult(created=len(profiles) - replaced, updated=replaced)
