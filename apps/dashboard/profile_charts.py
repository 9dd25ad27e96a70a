"""Chart data for variant profiles: per variant, p99 latency against batch size, one series per device type
and slice (MIG profile, MPS partition percent, whole GPU, or CPU core count). Only stored Profile rows are used; a batch size a
series was not measured at is None, never interpolated. One query for any number of variants."""
from __future__ import annotations

import re
from collections.abc import Iterable

from django.db.models import QuerySet

from apps.registry.choices import CPU_DEVICE_TYPE, FULL_SLICE, ProfileSourceChoices
from apps.registry.models import ModelVariant, Profile
from engine.sharing.partitions import mps_slice_percent

_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb", re.IGNORECASE)
_SOURCE_LABELS = dict(ProfileSourceChoices.choices)


def slice_rank(slice_name: str) -> tuple:
    """Sort key for slices, smallest first: "1g.5gb" < "1g.10gb" < "2g.10gb" < ... < MPS partitions by
    percent ("mps20" < "mps40" < ...) < "full". Distinct slices get distinct keys (a series each)."""
    if slice_name == FULL_SLICE:
        return (1_000, 0)
    percent = mps_slice_percent(slice_name)
    if percent is not None:
        return (500, percent)
    match = _MIG_PROFILE.match(slice_name or "")
    return (int(match[1]), int(match[2])) if match else (999, 0, slice_name or "")


def _series_key(device_type: str, slice_name: str, cpu_cores: int | None) -> tuple:
    if device_type == CPU_DEVICE_TYPE:
        return (1, device_type, (cpu_cores or 0, 0))
    return (0, device_type, slice_rank(slice_name))


def _labels(device_type: str, slice_name: str, cpu_cores: int | None) -> tuple[str, str]:
    """(device label, series label) as the page shows them."""
    if device_type == CPU_DEVICE_TYPE:
        cores = cpu_cores or 0
        return "CPU", f"{cores} core{'' if cores == 1 else 's'}"
    if slice_name == FULL_SLICE:
        return device_type, "full GPU"
    percent = mps_slice_percent(slice_name)
    return device_type, f"MPS {percent} %" if percent is not None else slice_name


def variant_profile_series(variants: Iterable[int | ModelVariant] | QuerySet, profiles: QuerySet | None = None) -> dict[int, dict]:
    """{variant id: {"batch_sizes": [...], "series": [{"device_type", "device", "slice", "cpu_cores", "label",
    "source", "source_label", "source_detail", "latency_ms": [p99 per batch size, None where not measured]}]}}.

    `variants` is a ModelVariant queryset (used as a subquery) or an iterable of variants or their ids;
    `profiles` restricts which Profile rows may be read (e.g. `Profile.objects.restrict(user, "view")`).
    Variants without any profile are absent from the result. Batch sizes are the union over the variant's
    series, ascending; series come GPU models first (by name, slices smallest to largest), then CPU."""
    if isinstance(variants, QuerySet):
        where = {"variant__in": variants.values("pk")}
    else:
        ids = {v.pk if isinstance(v, ModelVariant) else int(v) for v in variants}
        if not ids:
            return {}
        where = {"variant_id__in": ids}
    rows = (
        (profiles if profiles is not None else Profile.objects.all()).filter(**where).order_by()
        .values_list("variant_id", "device_type", "slice", "cpu_cores", "batch_size", "latency_p99_ms", "source", "source_detail")
    )
    # variant -> series key -> {"points": {batch: latency}, ...}
    found: dict[int, dict[tuple, dict]] = {}
    for variant_id, device_type, slice_name, cpu_cores, batch, p99, source, detail in rows:
        key = _series_key(device_type, slice_name, cpu_cores)
        series = found.setdefault(variant_id, {}).get(key)
        if series is None:
            device, label = _labels(device_type, slice_name, cpu_cores)
            series = found[variant_id][key] = {
                "device_type": device_type, "device": device, "slice": slice_name, "cpu_cores": cpu_cores,
                "label": label, "sources": set(), "source_detail": detail, "points": {},
            }
        series["points"][batch] = p99
        series["sources"].add(source)
        if not series["source_detail"] and detail:
            series["source_detail"] = detail
    result: dict[int, dict] = {}
    for variant_id, by_key in found.items():
        batch_sizes = sorted({b for s in by_key.values() for b in s["points"]})
        out = []
        for key in sorted(by_key):
            s = by_key[key]
            sources = sorted(s["sources"])
            source = sources[0] if len(sources) == 1 else "mixed"
            out.append({
                "device_type": s["device_type"], "device": s["device"], "slice": s["slice"], "cpu_cores": s["cpu_cores"],
                "label": s["label"], "source": source,
                "source_label": _SOURCE_LABELS.get(source, "Measured and imported"),
                "source_detail": s["source_detail"],
                "latency_ms": [s["points"].get(b) for b in batch_sizes],
            })
        result[variant_id] = {"batch_sizes": batch_sizes, "series": out}
    return result
