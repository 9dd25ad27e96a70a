"""Readers for the measured reference data in `engine/reference/data` (see its README). Pure functions: the demo
seed, the planner's tests and the benchmarks read the same numbers through here.

Two kinds of numbers live here and are kept apart by name:
- *measured*: what `engine/reference/data/gpulet` holds (an RTX 2080 Ti under MPS), read by `gpulet_inference_read`;
- *derived*: profiles for MIG slices and whole GPUs of other models, computed from the measurements by
  `gpulet_profiles_derive` with the stated partition rule and the illustrative speed-ups of
  `GPULET_DERIVED_SPEEDUP`. They are a labelled derivation, not a measurement of those GPUs."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from engine.geometry.catalogue import mig_catalogue_load
from engine.plans.problem import FULL_SLICE, ProfilePoint

# gpulets models -> the variant families used by the demo and the benchmarks, with the ImageNet top-1
# accuracy of the torchvision reference weights (torchvision model documentation), normalised to 0..1.
GPULET_TOP1_ACCURACY = {
    "vgg16": 0.7159,
    "vgg19": 0.7238,
    "resnet50": 0.7613,
    "resnet101": 0.7737,
    "resnet152": 0.7831,
    "densenet121": 0.7443,
    "densenet169": 0.7560,
    "densenet201": 0.7690,
    "inception": 0.7729,  # Inception v3
    "mobilenet": 0.7188,  # MobileNet v2
}

# Compute per image (the "GFLOPS" column of the torchvision model documentation, same weights as above).
# Used only where a generator needs a size-aware cost model the measurements lack (e.g. synthetic CPUs).
GPULET_GFLOPS = {
    "vgg16": 15.47, "vgg19": 19.63, "resnet50": 4.09, "resnet101": 7.80, "resnet152": 11.51,
    "densenet121": 2.83, "densenet169": 3.36, "densenet201": 4.29, "inception": 5.71, "mobilenet": 0.30,
}

# Approximate weights plus workspace at batch 1 (MiB), for memory fit in the planner. Estimates, not
# measurements (the reference data has no memory footprint).
GPULET_VARIANT_MEMORY_MB = {
    "vgg16": 1100, "vgg19": 1150, "resnet50": 400, "resnet101": 550, "resnet152": 700,
    "densenet121": 350, "densenet169": 420, "densenet201": 500, "inception": 450, "mobilenet": 250,
}

# The GPU gpulets measured, as a device type of the planning engine (it is not MIG-capable).
GPULET_GPU_MODEL = "RTX-2080Ti"
GPULET_GPU_MEMORY_MB = 11264.0  # 11 GB GDDR6
# MPS partitions (percent of the GPU's SMs) present in engine/reference/data/gpulet/inference.csv.
GPULET_PARTITIONS = (20, 40, 50, 60, 80, 100)

# Illustrative speed-ups of a whole GPU over the RTX 2080 Ti that gpulets measured. NOT measurements:
# planners, the demo and the benchmarks need plausible numbers for GPUs the reference data lacks; real
# fleets profile their own. The PCIe H100 has fewer SMs at lower clocks than the SXM5 part (~0.8x); the
# H200 has the H100 SXM5's compute with more memory bandwidth.
GPULET_DERIVED_SPEEDUP: dict[str, float] = {
    GPULET_GPU_MODEL: 1.0,
    "A100-SXM4-40GB": 2.2,
    "A100-SXM4-80GB": 2.3,
    "H100-SXM5-80GB": 3.8,
    "H100-PCIE-80GB": 3.0,
    "H200-141GB": 4.0,
}


@dataclass(frozen=True)
class GpuletPoint:
    """One measurement: `model` alone on `partition_pct` percent of an RTX 2080 Ti (MPS) at `batch`."""

    model: str
    batch: int
    partition_pct: int
    throughput_rps: float
    latency_ms: float  # time for the whole batch


# The measured data bundled with Tessera (engine/reference/data/README.md names its sources).
BUNDLED_REFERENCE_DATA = Path(__file__).resolve().parent / "data"


def reference_data_dir() -> Path:
    """The reference-data folder: `TESSERA_REFERENCE_DATA` where set (another data set laid out like the
    bundled one), else the data bundled in `engine/reference/data`. A configured folder that does not exist
    is an error, not a silent fall-back to the bundled data."""
    configured = os.environ.get("TESSERA_REFERENCE_DATA", "").strip()
    if not configured:
        return BUNDLED_REFERENCE_DATA
    folder = Path(configured).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"TESSERA_REFERENCE_DATA={configured!r} is not a folder.")
    return folder


def gpulet_inference_read(path: Path | None = None) -> list[GpuletPoint]:
    path = path or reference_data_dir() / "gpulet" / "inference.csv"
    points = []
    with path.open(newline="") as fh:
        for row in csv.reader(fh):
            if not row or len(row) < 8:
                continue
            model, batch, pct, _, throughput, _, latency_s, flag = row[:8]
            if flag.strip() != "1":
                continue
            points.append(GpuletPoint(model, int(batch), int(pct), float(throughput), float(latency_s) * 1000.0))
    if not points:
        raise ValueError(f"No valid measurements in {path}.")
    return points


@dataclass(frozen=True)
class GpuletCorun:
    """One co-run measurement: `model` at `batch` on `partition_pct` percent of the GPU while `corunner` runs
    at `corunner_batch` on the rest (100 - partition_pct percent)."""

    model: str
    batch: int
    partition_pct: int
    corunner: str
    corunner_batch: int
    throughput_rps: float
    latency_ms: float


@dataclass(frozen=True)
class GpuletMemUtil:
    """`model` alone at `batch` on `partition_pct` percent of the GPU: DRAM bandwidth and L2 utilisation (%)."""

    model: str
    batch: int
    partition_pct: int
    dram_util_pct: float
    l2_util_pct: float


def _gpulet_rows(path: Path, width: int) -> Iterator[tuple[int, list[str]]]:
    with path.open(newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            if len(row) < width:
                raise ValueError(f"{path}:{line}: {len(row)} fields, expected {width}")
            yield line, [cell.strip() for cell in row[:width]]


def gpulet_interference_read(path: Path | None = None) -> list[GpuletCorun]:
    """The valid rows (flag 1) of engine/reference/data/gpulet/interference.csv."""
    path = path or reference_data_dir() / "gpulet" / "interference.csv"
    found = []
    for line, (model, batch, pct, corunner, corunner_batch, _, throughput, _, latency_s, flag) in _gpulet_rows(path, 10):
        if flag != "1":
            continue
        try:
            found.append(GpuletCorun(model, int(batch), int(pct), corunner, int(corunner_batch), float(throughput), float(latency_s) * 1000.0))
        except ValueError as exc:
            raise ValueError(f"{path}:{line}: {exc}") from None
    if not found:
        raise ValueError(f"No valid measurements in {path}.")
    return found


def gpulet_mem_util_read(path: Path | None = None) -> list[GpuletMemUtil]:
    """Every row of engine/reference/data/gpulet/mem_util.csv (its last column is no validity flag: the README names
    none, and the rows of every model are measurements)."""
    path = path or reference_data_dir() / "gpulet" / "mem_util.csv"
    found = []
    for line, (model, batch, pct, _, dram, _, l2, _flag) in _gpulet_rows(path, 8):
        try:
            found.append(GpuletMemUtil(model, int(batch), int(pct), float(dram), float(l2)))
        except ValueError as exc:
            raise ValueError(f"{path}:{line}: {exc}") from None
    if not found:
        raise ValueError(f"No measurements in {path}.")
    return found


# --------------------------------------------------------------------------- derived profiles


def gpulet_partition_for(share_pct: float) -> int:
    """The partition rule: a slice with `share_pct` percent of a GPU's compute is modelled by the smallest
    measured MPS partition with at least that share (1/7 -> 20 %, 2/7 -> 40 %, 3/7 -> 50 %, 4/7 -> 60 %,
    7/7 -> 100 %). Rounding up, then scaling the latency up by partition/share, never credits a slice with
    more compute than it has."""
    for partition in GPULET_PARTITIONS:
        if partition >= share_pct - 1e-9:
            return partition
    raise ValueError(f"no measured partition covers {share_pct:g} % of the GPU")


@dataclass(frozen=True)
class GpuletDerivedProfile:
    """A profile point and where it comes from: the gpulets measurement of `model` at `batch` on
    `partition_pct` % of an RTX 2080 Ti, scaled by `partition_pct / share_pct` and divided by `speedup`."""

    point: ProfilePoint  # variant = the gpulets model name
    model: str
    partition_pct: int
    share_pct: float
    compute_slices: int | None  # of 7 on a MIG GPU; None on the 2080 Ti itself
    speedup: float

    @property
    def measured(self) -> bool:
        """True only for the 2080 Ti's own whole-GPU points, which are the measurement itself."""
        return self.compute_slices is None and self.speedup == 1.0 and self.partition_pct == 100

    @property
    def detail(self) -> str:
        p = self.point
        if self.measured:
            return f"measured: engine/reference/data/gpulet {self.model} b{p.batch} at 100% of RTX 2080 Ti (MPS)"
        return (
            f"derived: engine/reference/data/gpulet {self.model} b{p.batch} at {self.partition_pct}% of RTX 2080 Ti, "
            f"x{self.partition_pct / self.share_pct:.2f} for {self.compute_slices}/7 compute, /{self.speedup} for {p.device_type}"
        )


def gpulet_profiles_derive(
    points: Iterable[GpuletPoint],
    gpu_model_name: str,
    speedup: float | None = None,
    *,
    models: Sequence[str] | None = None,
) -> list[GpuletDerivedProfile]:
    """Profiles of the gpulets models on `gpu_model_name`, each with its provenance.

    - `RTX-2080Ti`: slice `full` only, the 100 % partition as measured (speed-up 1).
    - A MIG catalogue model: slice `full` and every MIG profile without media extensions. A slice with c of
      the GPU's 7 compute slices uses the partition `gpulet_partition_for(100 c / 7)`; its batch latency is
      the measured one x partition / share (latency taken inversely proportional to compute), / speedup.
    `speedup` defaults to `GPULET_DERIVED_SPEEDUP[gpu_model_name]`. Batches are those measured; a
    (model, batch, partition) without a valid measurement gives no point (no extrapolation)."""
    by_key: dict[tuple[str, int, int], GpuletPoint] = {}
    for p in points:
        by_key[(p.model, p.batch, p.partition_pct)] = p
    wanted = list(models) if models is not None else sorted({m for m, _, _ in by_key})
    if gpu_model_name == GPULET_GPU_MODEL:
        device_type, factor = GPULET_GPU_MODEL, 1.0 if speedup is None else speedup
        slices: list[tuple[str, int | None, int]] = [(FULL_SLICE, None, 1)]
    else:
        spec = mig_catalogue_load().gpu_model_get(gpu_model_name)
        device_type = spec.name
        if speedup is None and spec.name not in GPULET_DERIVED_SPEEDUP:
            raise ValueError(f"no stated speed-up for {spec.name} in GPULET_DERIVED_SPEEDUP; pass one explicitly")
        factor = GPULET_DERIVED_SPEEDUP[spec.name] if speedup is None else speedup
        slices = [(FULL_SLICE, spec.compute_slices, spec.compute_slices)] + [
            (p.name, p.compute_slices, spec.compute_slices) for p in spec.profiles if not p.media_extensions
        ]
    if factor <= 0:
        raise ValueError(f"speed-up must be positive, got {factor:g}")
    out: list[GpuletDerivedProfile] = []
    for model in wanted:
        batches = sorted({b for m, b, _ in by_key if m == model})
        for slice_name, compute, total in slices:
            share = 100.0 if compute is None else 100.0 * compute / total
            partition = gpulet_partition_for(share)
            for batch in batches:
                measured = by_key.get((model, batch, partition))
                if measured is None:
                    continue
                latency = measured.latency_ms * (partition / share) / factor
                out.append(
                    GpuletDerivedProfile(
                        point=ProfilePoint(variant=model, device_type=device_type, slice=slice_name, batch=batch, latency_ms=latency),
                        model=model, partition_pct=partition, share_pct=share, compute_slices=compute, speedup=factor,
                    )
                )
    return out


def gpulet_profiles_derived(
    points: Iterable[GpuletPoint],
    gpu_model_name: str,
    speedup: float | None = None,
    *,
    models: Sequence[str] | None = None,
) -> list[ProfilePoint]:
    """`gpulet_profiles_derive` without the provenance: the profile points only."""
    return [d.point for d in gpulet_profiles_derive(points, gpu_model_name, speedup, models=models)]
