"""Proteus's own inputs as Tessera's problem and traces: the profiles, the 40-device cluster and the
Twitter-shaped traces that the paper's end-to-end figures (Ahmad et al., ASPLOS'24, §6.2, Figures 4-5) were
made from, read from a checkout of the authors' artefact (github.com/UMass-LIDS/Proteus). Nothing of the
artefact is copied into Tessera: a user points at their own checkout.

What is read (engine/reference/data/proteus says the same, with the figures Proteus's simulator records):
- `profiling/aggregate_profiled.csv`: per (model, accelerator, batch) the p50 latency (`50th_pct`, the
  column the artefact's simulator reads); batch sizes 1, 2, 4, 8 only (its `allowed_batch_sizes`). Where a
  key appears twice (efficientnet-b1 on CPU) the later row wins, as in the artefact's dict.
- `traces/model_variants/<family>`: `variant,accuracy` with accuracy normalised so that the best variant
  of a family is 100; Tessera's accuracy is that / 100.
- `traces/twitter/asplos/<scenario>/300/<family>.txt`: `arrival_ms,1,deadline_ms` per query; every row is
  kept and the families are merged in time order.

The cluster (the artefact's config, `core/simulator.py`): 10 devices each of CPU, GPU_AMPERE, VPU and
GPU_PASCAL, one model instance per device; a VPU runs the CPU profile (the artefact copies the CPU
latencies to the VPU). In Tessera the CPUs and VPUs are CPU hosts (`cpu`, profiled at `PROTEUS_CPU_CORES`
cores: the artefact does not say how many cores its CPU had, and one instance per host makes the number
immaterial) and the two GPU kinds are whole GPUs without MIG (`GPU_AMPERE`, `GPU_PASCAL`). Proteus models
no memory, so variants get a nominal 1 MB. The SLO is the trace's deadline (300 ms), and the largest batch
is the largest whose latency is under SLO / 2, which is Tessera's `latency_budget_fraction` 0.5.

Departures, all small and stated: a variant's name loses the `/` of a Hugging Face id
(`prajjwal1/bert-tiny` -> `prajjwal1--bert-tiny`), because Tessera's names are path-safe; a batch exactly
at SLO / 2 is allowed in Tessera (the artefact's test is strict), which no profiled point hits."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from engine.plans.problem import (
    CPU_DEVICE_TYPE,
    FULL_SLICE,
    ApplicationSpec,
    DeviceSpec,
    Problem,
    ProblemError,
    ProfilePoint,
    SolveOptions,
    VariantSpec,
    problem_from_dict,
    problem_to_dict,
)
from engine.simulation.workload import Trace

# The artefact's scenario folders under traces/twitter/asplos, by the short names its README and ours use.
PROTEUS_SCENARIOS: Mapping[str, str] = {
    "zipf": "zipf_exponential",
    "bursty": "zipf_exponential_bursty",
    "mnl": "medium-normal_load",
}
PROTEUS_SLO_MS = 300.0
PROTEUS_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8)
PROTEUS_DEVICES_PER_TYPE = 10
PROTEUS_CPU_CORES = 8
PROTEUS_GPU_MEMORY_MB = {"GPU_AMPERE": 40960.0, "GPU_PASCAL": 12288.0}  # nominal: Proteus models no memory
PROTEUS_VARIANT_MEMORY_MB = 1.0
# onnxruntime provider in the CSV -> Tessera device type.
_ACCELERATORS = {"onnxruntime_cpu": CPU_DEVICE_TYPE, "onnxruntime_gpu_ampere": "GPU_AMPERE", "onnxruntime_gpu_pascal": "GPU_PASCAL"}


class ProteusArtefactError(ValueError):
    """The checkout is not a Proteus artefact, or a file in it is not as expected (the message says which)."""


def proteus_variant_name(name: str) -> str:
    """The Tessera name of an artefact variant: Hugging Face ids lose their `/`."""
    return name.replace("/", "--")


def _checkout_file(checkout: Path, relative: str) -> Path:
    path = Path(checkout) / relative
    if not path.is_file():
        raise ProteusArtefactError(f"{path}: not found; is {checkout} a checkout of github.com/UMass-LIDS/Proteus?")
    return path


def proteus_families(checkout: Path) -> dict[str, dict[str, float]]:
    """family -> {artefact variant name: normalised accuracy (best = 100)} from traces/model_variants."""
    folder = Path(checkout) / "traces" / "model_variants"
    if not folder.is_dir():
        raise ProteusArtefactError(f"{folder}: not found; is {checkout} a checkout of github.com/UMass-LIDS/Proteus?")
    families: dict[str, dict[str, float]] = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        variants: dict[str, float] = {}
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            name, sep, accuracy = line.rpartition(",")
            try:
                value = float(accuracy)
            except ValueError:
                value = float("nan")
            if not sep or not name or not np.isfinite(value) or value <= 0:
                raise ProteusArtefactError(f"{path}: line {number}: expected 'variant,accuracy', got {line!r}")
            variants[name.strip()] = value
        if variants:
            families[path.name] = variants
    if not families:
        raise ProteusArtefactError(f"{folder}: no model families")
    return families


def proteus_profile_latencies(checkout: Path) -> dict[tuple[str, str, int], float]:
    """(artefact variant, Tessera device type, batch) -> p50 latency in ms, batches 1/2/4/8, later rows winning."""
    path = _checkout_file(checkout, "profiling/aggregate_profiled.csv")
    latencies: dict[tuple[str, str, int], float] = {}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"Model", "Accel", "batchsize", "50th_pct"} - set(reader.fieldnames or ())
        if missing:
            raise ProteusArtefactError(f"{path}: missing columns {', '.join(sorted(missing))}")
        for row in reader:
            device_type = _ACCELERATORS.get(row["Accel"])
            try:
                batch = int(row["batchsize"])
                latency = float(row["50th_pct"])
            except ValueError as exc:
                raise ProteusArtefactError(f"{path}: line {reader.line_num}: {exc}") from None
            if device_type is None or batch not in PROTEUS_BATCH_SIZES or not (np.isfinite(latency) and latency > 0):
                continue
            latencies[(row["Model"], device_type, batch)] = latency
    return latencies


def proteus_problem(checkout: Path, *, demand_rps: Mapping[str, float] | None = None, options: SolveOptions | None = None) -> Problem:
    """The artefact's cluster, variants and profiles as a Tessera problem (one application per family, SLO
    300 ms). `demand_rps` per family defaults to 0 (the simulator plans from the trace)."""
    families = proteus_families(checkout)
    latencies = proteus_profile_latencies(checkout)
    applications = tuple(
        ApplicationSpec(name=family, slo_ms=PROTEUS_SLO_MS, demand_rps=float((demand_rps or {}).get(family, 0.0))) for family in families
    )
    variants = tuple(
        VariantSpec(name=proteus_variant_name(v), application=family, accuracy=accuracy / 100.0, memory_mb=PROTEUS_VARIANT_MEMORY_MB)
        for family, members in families.items() for v, accuracy in members.items()
    )
    family_of = {v: family for family, members in families.items() for v in members}
    profiles = tuple(
        ProfilePoint(
            variant=proteus_variant_name(variant), device_type=device_type,
            slice=str(PROTEUS_CPU_CORES) if device_type == CPU_DEVICE_TYPE else FULL_SLICE, batch=batch, latency_ms=latency,
        )
        for (variant, device_type, batch), latency in sorted(latencies.items())
        if variant in family_of
    )
    devices: list[DeviceSpec] = []
    for kind, device_type in (("cpu", CPU_DEVICE_TYPE), ("ampere", "GPU_AMPERE"), ("vpu", CPU_DEVICE_TYPE), ("pascal", "GPU_PASCAL")):
        for i in range(PROTEUS_DEVICES_PER_TYPE):
            if device_type == CPU_DEVICE_TYPE:
                devices.append(DeviceSpec(name=f"{kind}-{i:02d}", type=CPU_DEVICE_TYPE, cores=PROTEUS_CPU_CORES))
            else:
                devices.append(DeviceSpec(name=f"{kind}-{i:02d}", type=device_type, memory_mb=PROTEUS_GPU_MEMORY_MB[device_type]))
    problem = Problem(
        applications=applications, variants=variants, devices=tuple(devices), profiles=profiles,
        options=options or SolveOptions(latency_budget_fraction=0.5),
    )
    try:
        return problem_from_dict(problem_to_dict(problem))  # the file format's checks, as for a problem read from disk
    except ProblemError as exc:  # a checkout whose files parse but do not make a problem
        raise ProteusArtefactError(f"{checkout}: the artefact does not make a valid problem: {exc}") from exc


def proteus_trace(checkout: Path, scenario: str, *, applications: tuple[str, ...] | None = None) -> Trace:
    """The scenario's queries, all families merged in time order (a stable sort: ties keep family order).
    Deadlines are per query, from the trace's third column."""
    if scenario not in PROTEUS_SCENARIOS:
        raise ProteusArtefactError(f"unknown scenario {scenario!r}; choose one of {', '.join(PROTEUS_SCENARIOS)}")
    folder = Path(checkout) / "traces" / "twitter" / "asplos" / PROTEUS_SCENARIOS[scenario] / "300"
    if not folder.is_dir():
        raise ProteusArtefactError(f"{folder}: not found; is {checkout} a checkout of github.com/UMass-LIDS/Proteus?")
    names = applications or tuple(sorted(proteus_families(checkout)))
    times: list[np.ndarray] = []
    apps: list[np.ndarray] = []
    deadlines: list[np.ndarray] = []
    for index, family in enumerate(names):
        path = folder / f"{family}.txt"
        if not path.is_file():
            raise ProteusArtefactError(f"{path}: not found (every family of traces/model_variants needs a trace)")
        try:
            rows = np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
        except ValueError as exc:
            raise ProteusArtefactError(f"{path}: expected rows 'arrival_ms,1,deadline_ms': {exc}") from None
        if rows.size == 0:
            continue
        if rows.shape[1] != 3 or not np.all(np.isfinite(rows)) or np.any(rows[:, 0] < 0) or np.any(rows[:, 2] <= 0):
            raise ProteusArtefactError(f"{path}: expected rows 'arrival_ms,1,deadline_ms' with times >= 0 and deadlines > 0")
        times.append(rows[:, 0] / 1000.0)
        deadlines.append(rows[:, 2])
        apps.append(np.full(rows.shape[0], index, dtype=np.int32))
    time_s = np.concatenate(times) if times else np.zeros(0)
    order = np.argsort(time_s, kind="stable")
    return Trace(
        time_s=time_s[order], application=(np.concatenate(apps) if apps else np.zeros(0, np.int32))[order],
        applications=names, deadline_ms=(np.concatenate(deadlines) if deadlines else np.zeros(0))[order],
    )


@dataclass(frozen=True)
class ProteusRecorded:
    """One row of the figures Proteus's own simulator recorded (engine/reference/data/proteus)."""

    scenario: str
    system: str
    demand: int
    served: int
    throughput_rps: float
    effective_accuracy: float  # percent of the family's best, as Proteus reports it
    slo_violation_ratio: float


_RECORDED_COLUMNS = ("scenario", "system", "demand", "served", "throughput_rps", "effective_accuracy_pct", "slo_violation_ratio")


def proteus_recorded_figures(path: Path) -> list[ProteusRecorded]:
    """The figures Proteus's own simulator recorded (engine/reference/data/proteus/recorded_figures.csv; its
    README gives the columns and units)."""
    rows = []
    with Path(path).open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in _RECORDED_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ProteusArtefactError(f"{path}: missing columns {', '.join(missing)}")
        for line, r in enumerate(reader, start=2):
            try:
                rows.append(ProteusRecorded(
                    r["scenario"].strip(), r["system"].strip(), int(r["demand"]), int(r["served"]),
                    float(r["throughput_rps"]), float(r["effective_accuracy_pct"]), float(r["slo_violation_ratio"]),
                ))
            except (TypeError, ValueError) as exc:
                raise ProteusArtefactError(f"{path}:{line}: {exc}") from None
    if not rows:
        raise ProteusArtefactError(f"{path}: no recorded figures")
    return rows
