"""A planning problem for a fleet of MPS GPUs from `engine/reference/data/gpulet`, measured on an RTX 2080 Ti: every
model's latency on every partition and batch, its L2 and DRAM utilisation there, and an interference model
fitted on the co-runs. The gpulets benches, the MPS planners' tests and the demo's MPS host read it here.

SLOs are the paper's, Table 3 of gpulets (ATC'22), by model family (VGG-16's for both VGGs, ResNet50's for
the three ResNets, DenseNet's for the three DenseNets, GoogLeNet's for Inception v3, MobileNet v2's for
MobileNet): the shared data has other members of the families than the paper measured."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from engine.plans.problem import Problem, problem_from_dict
from engine.reference.profiles import (
    GPULET_GPU_MEMORY_MB,
    GPULET_GPU_MODEL,
    GPULET_TOP1_ACCURACY,
    GPULET_VARIANT_MEMORY_MB,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
)
from engine.sharing.interference import (
    INTERFERENCE_FORM_DEFAULT,
    InterferenceModel,
    interference_model_fit,
    interference_samples_build,
)
from engine.sharing.partitions import mps_slice_name

__all__ = ["GPULET_SLO_MS_TABLE3", "gpulet_interference_model", "gpulet_mps_problem", "gpulet_mps_problem_dict", "gpulet_slo_ms"]

# gpulets Table 3 (ms), by family prefix of the shared data's model names.
GPULET_SLO_MS_TABLE3: dict[str, float] = {"vgg": 142.0, "resnet": 108.0, "densenet": 202.0, "inception": 66.0, "mobilenet": 64.0}


def gpulet_slo_ms(model: str) -> float:
    for family, slo in GPULET_SLO_MS_TABLE3.items():
        if model.startswith(family):
            return slo
    raise ValueError(f"no gpulets Table 3 SLO for {model!r} (families: {', '.join(GPULET_SLO_MS_TABLE3)})")


@lru_cache(maxsize=4)
def gpulet_interference_model(form: str = INTERFERENCE_FORM_DEFAULT) -> InterferenceModel:
    """The interference model fitted on every co-run of engine/reference/data/gpulet (its validation on unseen pairs
    is benches/gpulets_interference.py's)."""
    inference = gpulet_inference_read()
    samples = interference_samples_build(inference, gpulet_interference_read(), gpulet_mem_util_read()).samples
    return interference_model_fit(samples, form=form)


def gpulet_mps_problem_dict(
    rates: Mapping[str, float],
    *,
    gpus: int = 4,
    slo_ms: Mapping[str, float] | None = None,
    interference: bool = True,
    device_prefix: str = "gpu",
    running: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The problem's JSON form: one application per model in `rates` (named after it, its one variant the
    model), `gpus` RTX 2080 Ti GPUs in MPS mode, mpsNN profiles with utilisations, and the fitted
    interference model unless `interference` is false. `running` optionally gives each GPU's current
    `mps_layout` and `running` (as the problem format writes them)."""
    inference = gpulet_inference_read()
    utilisation = {(u.model, u.batch, u.partition_pct): u for u in gpulet_mem_util_read()}
    models = list(rates)
    unknown = sorted(set(models) - {p.model for p in inference})
    if unknown:
        raise ValueError(f"not in engine/reference/data/gpulet: {', '.join(unknown)}")
    slos = {m: (slo_ms or {}).get(m, gpulet_slo_ms(m)) for m in models}
    profiles = []
    for p in inference:
        if p.model not in rates:
            continue
        point: dict[str, Any] = {"variant": p.model, "device_type": GPULET_GPU_MODEL, "slice": mps_slice_name(p.partition_pct),
                                 "batch": p.batch, "latency_ms": p.latency_ms}
        u = utilisation.get((p.model, p.batch, p.partition_pct))
        if u is not None:
            point["l2_util_pct"], point["dram_util_pct"] = u.l2_util_pct, u.dram_util_pct
        profiles.append(point)
    devices = []
    for i in range(gpus):
        device: dict[str, Any] = {"name": f"{device_prefix}{i}", "type": GPULET_GPU_MODEL, "mps": True, "memory_mb": GPULET_GPU_MEMORY_MB}
        if running is not None and i < len(running):
            device.update(running[i])
        devices.append(device)
    raw: dict[str, Any] = {
        "format_version": 1,
        "name": f"gpulets: {len(models)} models on {gpus} MPS GPU(s) (engine/reference/data/gpulet, RTX 2080 Ti)",
        "applications": [{"name": m, "slo_ms": slos[m], "demand_rps": float(rates[m])} for m in models],
        "variants": [{"name": m, "application": m, "accuracy": GPULET_TOP1_ACCURACY[m], "memory_mb": GPULET_VARIANT_MEMORY_MB[m]} for m in models],
        "devices": devices,
        "profiles": profiles,
    }
    if interference:
        model = gpulet_interference_model()
        raw["interference"] = {"form": model.form, "coefficients": list(model.coefficients)}
    return raw


def gpulet_mps_problem(rates: Mapping[str, float], **kwargs: Any) -> Problem:
    return problem_from_dict(gpulet_mps_problem_dict(rates, **kwargs))
