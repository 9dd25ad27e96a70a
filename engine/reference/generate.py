"""Deterministic generators of planning problems, for benchmarks and tests. Pure Python + numpy.

Everything is drawn from one `numpy.random.default_rng(seed)`, so a seed gives the same problem on every
machine (the draws are listed below in the order they are made). Profiles come from the measured gpulets
data (`engine/reference/data/gpulet`, an RTX 2080 Ti under MPS) through `engine.reference.profiles.gpulet_profiles_derive`:
on the 2080 Ti itself they are the measurements; on catalogue GPUs and their MIG slices they are the
labelled derivation (partition rule + illustrative speed-ups) documented there; on CPUs they come from the
stated synthetic cost model below. None of it is a measurement of an A100, H100, H200 or CPU.

How the numbers are made (both generators)
------------------------------------------
1. Applications `app00`, `app01`, ... The `n_variants` variants are split as evenly as possible (the first
   applications get one more). For each application, in order:
   - `m = min(count, rng.integers(2, 5))` base models (2..4) are drawn without replacement from the 10
     gpulets models (`rng.choice`);
   - its variants are the `m` base models unchanged (`app03.resnet50`: top-1 accuracy of the torchvision
     weights, measured latency), then perturbed copies cycling over the bases (`app03.resnet50.v1`, ...),
     standing for quantised / pruned / distilled versions: for each, `f = rng.uniform(0.35, 0.95)` scales
     every latency (faster), and the accuracy drops by `(1 - f) * rng.uniform(0.02, 0.12)` (at most 7.8
     points; the faster, the larger the drop on average). Memory = base estimate x (0.5 + 0.5 f).
2. SLO per application: `k * L1` with `k = rng.uniform(3, 6)` and `L1` the batch-1 latency of the
   application's fastest variant on the RTX 2080 Ti as measured (x f). With the capacity model's budget of
   half the SLO, that variant always fits at batch 1 on any GPU of the catalogue (all are >= 2080 Ti here).
3. Demand: weights `w_a = rng.uniform(0.5, 1.5)`, normalised to sum 1. The fleet's max-throughput capacity
   for application a, `C_a`, is the sum over devices of the best capacity any variant of a reaches there
   (engine capacity model: largest batch within half the SLO and the memory): a whole GPU at slice `full`,
   a CPU at its cores, a MIG GPU in its best homogeneous geometry (max over profiles p of
   min(max_count_p, 7 // compute_p) x capacity on p, and the whole GPU). Total demand D solves
   `sum_a w_a D / C_a = load`: serving every application with its highest-throughput variant, the fleet
   would be busy `load` of the time (before integrality). `demand_rps_a = w_a D`.

CPU cost model (synthetic, stated): a CPU device has 16 cores; a variant's batch latency there is
`f * (1.0 ms + batch * GFLOPs * 1.5 ms)` for batches 1..16 (GFLOPs per image from the torchvision
documentation, `engine.reference.profiles.GPULET_GFLOPS`), i.e. ~0.67 GFLOP/ms effective on 16 cores and no batching
gain beyond the fixed overhead.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import layout_parse, mig_layout_validate
from engine.plans.capacity import capacity_for, cpu_slice
from engine.plans.problem import (
    CPU_DEVICE_TYPE,
    FULL_SLICE,
    ApplicationSpec,
    InterferenceSpec,
    DeviceSpec,
    Problem,
    ProfilePoint,
    SolveOptions,
    VariantSpec,
)
from engine.reference.profiles import (
    GPULET_GFLOPS,
    GPULET_GPU_MEMORY_MB,
    GPULET_GPU_MODEL,
    GPULET_TOP1_ACCURACY,
    GPULET_VARIANT_MEMORY_MB,
    GpuletPoint,
    gpulet_inference_read,
    gpulet_mem_util_read,
    gpulet_profiles_derived,
)
from engine.reference.gpulet_problem import gpulet_interference_model
from engine.sharing.partitions import mps_slice_name

__all__ = [
    "DEVICE_TYPE_ORDER",
    "GPULET_BASE_MODELS",
    "mig_fleet_problem",
    "mixed_fleet_problem",
    "proteus_sized_problem",
]

# Device types in the order `n_device_types` takes them: Proteus's 4 types are 3 GPU generations and CPUs.
DEVICE_TYPE_ORDER: tuple[str, ...] = (
    GPULET_GPU_MODEL, "A100-SXM4-40GB", "H100-SXM5-80GB", CPU_DEVICE_TYPE, "A100-SXM4-80GB", "H100-PCIE-80GB", "H200-141GB",
)
GPULET_BASE_MODELS: tuple[str, ...] = tuple(sorted(GPULET_TOP1_ACCURACY))

CPU_CORES = 16
CPU_OVERHEAD_MS = 1.0
CPU_MS_PER_GFLOP = 1.5
CPU_BATCHES = (1, 2, 4, 8, 16)

BASES_PER_APPLICATION = (2, 4)  # inclusive range of distinct base models per application
SPEED_FACTOR_RANGE = (0.35, 0.95)  # latency multiplier of a perturbed variant
ACCURACY_DROP_PER_SPEEDUP = (0.02, 0.12)  # accuracy drop = (1 - f) * this
SLO_FACTOR_RANGE = (3.0, 6.0)
DEMAND_WEIGHT_RANGE = (0.5, 1.5)


@dataclass(frozen=True)
class _Variant:
    name: str
    application: str
    base: str
    speed: float  # latency multiplier, 1 for the base model itself
    accuracy: float
    memory_mb: float


def _points(points: Sequence[GpuletPoint] | None) -> Sequence[GpuletPoint]:
    return points if points is not None else _cached_points()


_POINTS_CACHE: list[GpuletPoint] = []


def _cached_points() -> list[GpuletPoint]:
    # Read the CSV once per process: a benchmark builds dozens of problems.
    if not _POINTS_CACHE:
        _POINTS_CACHE.extend(gpulet_inference_read())
    return _POINTS_CACHE


def _variants_draw(rng: np.random.Generator, n_applications: int, n_variants: int) -> list[_Variant]:
    if n_applications < 1:
        raise ValueError("n_applications must be at least 1")
    if n_variants < n_applications:
        raise ValueError(f"n_variants ({n_variants}) must be at least n_applications ({n_applications})")
    out: list[_Variant] = []
    for a in range(n_applications):
        app = f"app{a:02d}"
        count = n_variants // n_applications + (1 if a < n_variants % n_applications else 0)
        m = min(count, int(rng.integers(BASES_PER_APPLICATION[0], BASES_PER_APPLICATION[1] + 1)))
        bases = [GPULET_BASE_MODELS[i] for i in rng.choice(len(GPULET_BASE_MODELS), size=m, replace=False)]
        for j in range(count):
            base = bases[j % m]
            top1 = GPULET_TOP1_ACCURACY[base]
            if j < m:
                out.append(_Variant(f"{app}.{base}", app, base, 1.0, top1, float(GPULET_VARIANT_MEMORY_MB[base])))
                continue
            f = float(rng.uniform(*SPEED_FACTOR_RANGE))
            drop = (1.0 - f) * float(rng.uniform(*ACCURACY_DROP_PER_SPEEDUP))
            out.append(
                _Variant(
                    f"{app}.{base}.v{j // m}", app, base, round(f, 4), round(top1 - drop, 4),
                    round(GPULET_VARIANT_MEMORY_MB[base] * (0.5 + 0.5 * f), 1),
                )
            )
    return out


def _base_profiles(points: Sequence[GpuletPoint], device_type: str, slices: set[str] | None) -> dict[str, list[ProfilePoint]]:
    """Profiles of the 10 base models on one device type, by model name."""
    by_model: dict[str, list[ProfilePoint]] = {m: [] for m in GPULET_BASE_MODELS}
    if device_type == CPU_DEVICE_TYPE:
        for m in GPULET_BASE_MODELS:
            by_model[m] = [
                ProfilePoint(m, CPU_DEVICE_TYPE, str(CPU_CORES), b, CPU_OVERHEAD_MS + b * GPULET_GFLOPS[m] * CPU_MS_PER_GFLOP)
                for b in CPU_BATCHES
            ]
        return by_model
    for p in gpulet_profiles_derived(points, device_type, models=GPULET_BASE_MODELS):
        if slices is None or p.slice in slices:
            by_model[p.variant].append(p)
    return by_model


def _profiles(variants: Sequence[_Variant], base: dict[str, dict[str, list[ProfilePoint]]]) -> list[ProfilePoint]:
    out = []
    for v in variants:
        for by_model in base.values():
            for p in by_model[v.base]:
                out.append(ProfilePoint(v.name, p.device_type, p.slice, p.batch, round(p.latency_ms * v.speed, 6)))
    return out


def _slos(rng: np.random.Generator, variants: Sequence[_Variant], points: Sequence[GpuletPoint], n_applications: int) -> list[float]:
    b1 = {p.model: p.latency_ms for p in points if p.batch == 1 and p.partition_pct == 100}
    slos = []
    for a in range(n_applications):
        app = f"app{a:02d}"
        fastest = min(b1[v.base] * v.speed for v in variants if v.application == app)
        slos.append(round(float(rng.uniform(*SLO_FACTOR_RANGE)) * fastest, 3))
    return slos


def _device_max_capacity(problem: Problem, variant: str, device: DeviceSpec) -> float:
    """Highest throughput `variant` alone reaches on `device` (see the module docstring, step 3)."""
    if device.is_cpu:
        slice_name = cpu_slice(problem, variant, device)
        cap = capacity_for(problem, variant, device, slice_name) if slice_name else None
        return cap.capacity_rps if cap else 0.0
    best = 0.0
    full = capacity_for(problem, variant, device, mps_slice_name(100) if device.mps else FULL_SLICE)
    if full is not None:
        best = full.capacity_rps
    if device.mig:
        spec = mig_catalogue_load().gpu_model_get(device.type)
        for p in spec.profiles:
            if p.media_extensions:
                continue
            cap = capacity_for(problem, variant, device, p.name)
            if cap is not None:
                best = max(best, min(p.max_count, spec.compute_slices // p.compute_slices) * cap.capacity_rps)
    return best


def _finish(
    rng: np.random.Generator,
    variants: Sequence[_Variant],
    devices: Sequence[DeviceSpec],
    profiles: Sequence[ProfilePoint],
    slos: Sequence[float],
    load: float,
    options: SolveOptions,
) -> Problem:
    if load <= 0:
        raise ValueError(f"load must be positive, got {load:g}")
    n_apps = len(slos)
    apps = [ApplicationSpec(f"app{a:02d}", slos[a], 0.0) for a in range(n_apps)]
    specs = tuple(VariantSpec(v.name, v.application, v.accuracy, v.memory_mb) for v in variants)
    # A demand-free problem first: the capacity model needs SLOs, variants and devices, not demand.
    draft = Problem(tuple(apps), specs, tuple(devices), tuple(profiles), options)
    weights = rng.uniform(*DEMAND_WEIGHT_RANGE, size=n_apps)
    weights = weights / weights.sum()
    # Devices of one type and memory have the same capacity: compute it once per type.
    per_type: dict[tuple[str, bool, float | None], DeviceSpec] = {}
    type_count: dict[tuple[str, bool, float | None], int] = {}
    for d in devices:
        key = (d.type, d.mig, d.memory_mb)
        per_type.setdefault(key, d)
        type_count[key] = type_count.get(key, 0) + 1
    fleet_time = 0.0
    for a, app in enumerate(apps):
        capacity = 0.0
        for key, device in per_type.items():
            best = max(_device_max_capacity(draft, v.name, device) for v in specs if v.application == app.name)
            capacity += type_count[key] * best
        if capacity <= 0:
            raise ValueError(f"{app.name}: no variant fits any device within its SLO (generator bug)")
        fleet_time += weights[a] / capacity
    total = load / fleet_time
    apps = [ApplicationSpec(app.name, app.slo_ms, round(float(weights[a] * total), 3)) for a, app in enumerate(apps)]
    return Problem(tuple(apps), specs, tuple(devices), tuple(profiles), options)


def _gpu_memory(device_type: str) -> float:
    if device_type == GPULET_GPU_MODEL:
        return GPULET_GPU_MEMORY_MB
    return float(mig_catalogue_load().gpu_model_get(device_type).memory_mib)


def proteus_sized_problem(
    n_devices: int,
    n_device_types: int,
    n_variants: int,
    n_applications: int,
    seed: int = 0,
    load: float = 0.7,
    *,
    options: SolveOptions | None = None,
    points: Sequence[GpuletPoint] | None = None,
) -> Problem:
    """A heterogeneous fleet of whole GPUs and CPUs, sized like Proteus's evaluation (its own size: 40
    devices of 4 types, 46 variants, 9 query types; Figure 10 grows them to 160, 450 and 17).

    Devices: the first `n_device_types` of `DEVICE_TYPE_ORDER` (RTX-2080Ti, A100-SXM4-40GB,
    H100-SXM5-80GB, cpu, A100-SXM4-80GB, H100-PCIE-80GB, H200-141GB), `n_devices` split as evenly as
    possible (the earlier types get the remainder), every GPU whole (`mig: false`), every CPU with 16
    cores. Profiles: every variant on every device type present (slice `full` on GPUs). Variants, SLOs and
    demand: see the module docstring. Draw order: variants, SLOs, demand weights."""
    if not 1 <= n_device_types <= len(DEVICE_TYPE_ORDER):
        raise ValueError(f"n_device_types must be 1..{len(DEVICE_TYPE_ORDER)}, got {n_device_types}")
    if n_devices < n_device_types:
        raise ValueError(f"n_devices ({n_devices}) must be at least n_device_types ({n_device_types})")
    rng = np.random.default_rng(seed)
    pts = _points(points)
    types = DEVICE_TYPE_ORDER[:n_device_types]
    devices: list[DeviceSpec] = []
    for t, device_type in enumerate(types):
        count = n_devices // n_device_types + (1 if t < n_devices % n_device_types else 0)
        for k in range(count):
            name = f"{device_type.lower()}-{k:03d}"
            if device_type == CPU_DEVICE_TYPE:
                devices.append(DeviceSpec(name, CPU_DEVICE_TYPE, cores=CPU_CORES))
            else:
                devices.append(DeviceSpec(name, device_type, mig=False, memory_mb=_gpu_memory(device_type)))
    variants = _variants_draw(rng, n_applications, n_variants)
    base = {t: _base_profiles(pts, t, {FULL_SLICE}) for t in types}
    profiles = _profiles(variants, base)
    slos = _slos(rng, variants, pts, n_applications)
    return _finish(rng, variants, devices, profiles, slos, load, options or SolveOptions())


def mig_fleet_problem(
    n_gpus: int,
    gpu_model: str = "A100-SXM4-40GB",
    n_applications: int = 6,
    seed: int = 0,
    load: float = 0.7,
    current_layout: Sequence[str] | Sequence[Sequence[str]] | None = None,
    *,
    variants_per_application: int = 4,
    options: SolveOptions | None = None,
    points: Sequence[GpuletPoint] | None = None,
) -> Problem:
    """`n_gpus` MIG-enabled GPUs of one catalogue model, for the joint (variant + geometry) planner.

    Every GPU has `mig: true`; `current_layout` is either one layout (placement strings such as
    `["3g.20gb@0", "3g.20gb@4"]`) given to every GPU, or one layout per GPU; None leaves the GPUs without
    a current layout. Layouts are never fixed (`fixed_layout: false`): the planner may change them.
    `n_applications * variants_per_application` variants; profiles on `full` and every MIG profile
    without media extensions (derived, see `engine.reference.profiles.gpulet_profiles_derive`). Variants, SLOs and
    demand as in the module docstring; the max-throughput capacity of a GPU is its best homogeneous
    geometry. Draw order: variants, SLOs, demand weights."""
    if n_gpus < 1:
        raise ValueError("n_gpus must be at least 1")
    if variants_per_application < 1:
        raise ValueError("variants_per_application must be at least 1")
    spec = mig_catalogue_load().gpu_model_get(gpu_model)
    layouts: list[tuple | None]
    if current_layout is None:
        layouts = [None] * n_gpus
    elif current_layout and not isinstance(current_layout[0], str):
        if len(current_layout) != n_gpus:
            raise ValueError(f"current_layout: {len(current_layout)} layouts for {n_gpus} GPUs")
        layouts = [layout_parse(list(layout)) for layout in current_layout]  # type: ignore[arg-type]
    else:
        layouts = [layout_parse(list(current_layout))] * n_gpus  # type: ignore[arg-type]
    for i, layout in enumerate(layouts):
        if layout is not None:
            verdict = mig_layout_validate(spec, layout)
            if not verdict.valid:
                raise ValueError(f"current_layout of GPU {i}: {verdict.reason}")
    rng = np.random.default_rng(seed)
    pts = _points(points)
    slug = spec.name.lower()
    devices = [
        DeviceSpec(f"{slug}-{i:03d}", spec.name, mig=True, layout=layouts[i], memory_mb=float(spec.memory_mib)) for i in range(n_gpus)
    ]
    variants = _variants_draw(rng, n_applications, n_applications * variants_per_application)
    profiles = _profiles(variants, {spec.name: _base_profiles(pts, spec.name, None)})
    slos = _slos(rng, variants, pts, n_applications)
    return _finish(rng, variants, devices, profiles, slos, load, options or SolveOptions())


def mixed_fleet_problem(
    n_mig: int = 4,
    n_mps: int = 4,
    n_whole: int = 2,
    n_cpu: int = 2,
    n_applications: int = 6,
    seed: int = 0,
    load: float = 0.7,
    *,
    variants_per_application: int = 4,
    mig_gpu: str = "A100-SXM4-40GB",
    whole_gpu: str = "H100-SXM5-80GB",
    interference: bool = True,
    ensembles: int = 0,
    pipelines: int = 0,
    options: SolveOptions | None = None,
    points: Sequence[GpuletPoint] | None = None,
) -> Problem:
    """A fleet of every kind (issue 40): `n_mig` MIG GPUs of `mig_gpu` (no current layout), `n_mps` RTX 2080 Ti
    in MPS mode, `n_whole` whole GPUs of `whole_gpu` and `n_cpu` CPU hosts of 16 cores.

    Profiles: on the 2080 Ti every MPS partition the gpulets data measured, each point's latency x the
    variant's speed factor, with the base model's measured L2 and DRAM utilisation (a perturbed variant is
    taken to load the memory system as its base does: stated, not measured), and the interference model
    fitted on the measured co-runs (unless `interference` is false); on the other GPUs the derivation of
    the module docstring (every MIG profile and `full`); on CPUs the synthetic cost model. Variants, SLOs
    and demand as in the module docstring (an MPS GPU counts at its best partition alone for the demand's
    scale). Draw order: variants, SLOs, demand weights.

    Workloads beside the flat applications: the last `ensembles` applications become random ensembles of
    their variants (uniform probabilities, one or two members a query); `pipelines` two-stage pipelines
    (`pipe<k>.detect` -> `pipe<k>.classify`, two variants a stage, on the CPU hosts: FA2's Table P1.3
    shape with the synthetic CPU cost model at 1, 2, 4, 8 and 16 cores) each take `load` x 20 % of one CPU
    host's throughput, with an SLO of 4 x the two stages' batch-1 latency at one core."""
    if min(n_mig, n_mps, n_whole, n_cpu) < 0 or n_mig + n_mps + n_whole + n_cpu < 1:
        raise ValueError("device counts must be >= 0, and the fleet must have a device")
    rng = np.random.default_rng(seed)
    pts = _points(points)
    mig_spec = mig_catalogue_load().gpu_model_get(mig_gpu)
    devices: list[DeviceSpec] = []
    devices += [DeviceSpec(f"{mig_spec.name.lower()}-{i:03d}", mig_spec.name, mig=True, memory_mb=float(mig_spec.memory_mib))
                for i in range(n_mig)]
    devices += [DeviceSpec(f"rtx2080ti-mps-{i:03d}", GPULET_GPU_MODEL, mig=False, mps=True, memory_mb=GPULET_GPU_MEMORY_MB)
                for i in range(n_mps)]
    devices += [DeviceSpec(f"{whole_gpu.lower()}-{i:03d}", whole_gpu, mig=False, memory_mb=_gpu_memory(whole_gpu)) for i in range(n_whole)]
    devices += [DeviceSpec(f"cpu-{i:03d}", CPU_DEVICE_TYPE, cores=CPU_CORES) for i in range(n_cpu)]
    variants = _variants_draw(rng, n_applications, n_applications * variants_per_application)
    base: dict[str, dict[str, list[ProfilePoint]]] = {}
    if n_mig:
        base[mig_spec.name] = _base_profiles(pts, mig_spec.name, None)
    if n_whole:
        base[whole_gpu] = _base_profiles(pts, whole_gpu, {FULL_SLICE})
    if n_cpu:
        base[CPU_DEVICE_TYPE] = _base_profiles(pts, CPU_DEVICE_TYPE, None)
    profiles = _profiles(variants, base)
    if n_mps:
        utilisation = {(u.model, u.batch, u.partition_pct): u for u in gpulet_mem_util_read()}
        for v in variants:
            for p in pts:
                if p.model != v.base:
                    continue
                u = utilisation.get((p.model, p.batch, p.partition_pct))
                profiles.append(ProfilePoint(v.name, GPULET_GPU_MODEL, mps_slice_name(p.partition_pct), p.batch,
                                             round(p.latency_ms * v.speed, 6), l2_util_pct=u.l2_util_pct if u else None,
                                             dram_util_pct=u.dram_util_pct if u else None))
    slos = _slos(rng, variants, pts, n_applications)
    problem = _finish(rng, variants, devices, profiles, slos, load, options or SolveOptions())
    if n_mps and interference:
        model = gpulet_interference_model()
        problem = dataclasses.replace(problem, interference=InterferenceSpec(model.form, tuple(model.coefficients)))
    if ensembles or pipelines:
        problem = _workloads_add(problem, ensembles=min(ensembles, n_applications), pipelines=pipelines if n_cpu else 0, load=load)
    return problem


PIPELINE_STAGE_MODELS = (("detect", ("resnet50", "mobilenet")), ("classify", ("densenet121", "resnet101")))
PIPELINE_CORES = (1, 2, 4, 8, 16)


def _workloads_add(problem: Problem, *, ensembles: int, pipelines: int, load: float) -> Problem:
    """Ensembles and pipelines on a generated problem (see `mixed_fleet_problem`), through the problem's own
    dict form, so that derived fields (a stage's demand and SLO from its paths) are what users get."""
    from engine.plans.problem import problem_from_dict, problem_to_dict

    raw = problem_to_dict(problem)
    for app in raw["applications"][len(raw["applications"]) - ensembles:]:
        members = [v["name"] for v in raw["variants"] if v["application"] == app["name"]]
        app["ensemble"] = {"mode": "random", "members": {m: 1.0 / len(members) for m in members}, "min_size": 1,
                           "max_size": min(2, len(members))}
    raw.setdefault("pipelines", [])
    for k in range(pipelines):
        stages, batch1 = [], 0.0
        for stage, bases in PIPELINE_STAGE_MODELS:
            name = f"pipe{k}.{stage}"
            raw["applications"].append({"name": name})
            stages.append(name)
            fastest = None
            for base in bases:
                variant = f"{name}.{base}"
                raw["variants"].append({"name": variant, "application": name, "accuracy": GPULET_TOP1_ACCURACY[base],
                                        "memory_mb": float(GPULET_VARIANT_MEMORY_MB[base])})
                for cores in PIPELINE_CORES:
                    for b in CPU_BATCHES:
                        # The cost model's 16-core latency, slower in proportion on fewer cores.
                        latency = (CPU_OVERHEAD_MS + b * GPULET_GFLOPS[base] * CPU_MS_PER_GFLOP) * CPU_CORES / cores
                        raw["profiles"].append({"variant": variant, "device_type": CPU_DEVICE_TYPE, "slice": str(cores), "batch": b,
                                                "latency_ms": round(latency, 6)})
                one_core = (CPU_OVERHEAD_MS + GPULET_GFLOPS[base] * CPU_MS_PER_GFLOP) * CPU_CORES
                fastest = one_core if fastest is None else min(fastest, one_core)
            batch1 += fastest or 0.0
        host_rps = 1000.0 / (CPU_OVERHEAD_MS + GPULET_GFLOPS[PIPELINE_STAGE_MODELS[0][1][0]] * CPU_MS_PER_GFLOP)
        raw["pipelines"].append({"name": f"pipe{k}", "stages": stages, "slo_ms": round(4 * batch1, 3),
                                 "demand_rps": round(load * 0.2 * host_rps, 3)})
    return problem_from_dict(raw)
