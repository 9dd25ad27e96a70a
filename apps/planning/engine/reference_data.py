"""Readers for the measured reference data in `shared/data` (see its README). Pure functions: the demo
seed, the planner's tests and the benchmarks read the same numbers through here."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class GpuletPoint:
    """One measurement: `model` alone on `partition_pct` percent of an RTX 2080 Ti (MPS) at `batch`."""

    model: str
    batch: int
    partition_pct: int
    throughput_rps: float
    latency_ms: float  # time for the whole batch


def shared_data_dir() -> Path:
    """`TESSERA_SHARED_DATA`, else the `shared/data` folder beside the repository (where CI puts it)."""
    configured = os.environ.get("TESSERA_SHARED_DATA")
    if configured:
        return Path(configured)
    repo = Path(__file__).resolve().parents[3]
    for candidate in (repo.parent / "shared" / "data", repo / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "Reference data not found: set TESSERA_SHARED_DATA to the shared/data folder "
        f"(looked in {repo.parent / 'shared' / 'data'} and {repo / 'shared' / 'data'})."
    )


def gpulet_inference_read(path: Path | None = None) -> list[GpuletPoint]:
    path = path or shared_data_dir() / "gpulet" / "inference.csv"
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
