"""Device backends of the worker agent: which GPUs the host has, their MIG instances, their telemetry.

The agent reconciles MIG layouts and reports devices through one interface, `DeviceBackend`, so the
same reconciliation code runs on real GPUs and on declared ones:

- ``nvml`` (`NvmlBackend`, backends/nvml.py): real GPUs through NVML (the ``pynvml`` module of
  nvidia-ml-py), the library nvidia-smi itself is built on;
- ``simulated`` (`SimulatedBackend`, backends/simulated.py): GPUs declared on the command line
  (``"2xA100-SXM4-40GB"``), with the MIG rules of the catalogue, every record labelled simulated, so a
  fleet can be rehearsed on machines without GPUs.

MPS (issue 17, gpulets): a GPU is partitioned with MIG or with MPS, never both. `mps_mode_set` starts or
stops the GPU's MPS control daemon (backends/mps.py on real GPUs; state only on simulated ones), and
`mps_environment` is what a runtime process on one of its partitions gets in its environment
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and the daemon's pipe and log directories).

Placements are written as the planning engine writes them (``Placement("3g.20gb", 4)``, the start counted
in memory slices as ``nvidia-smi mig -lgipp`` prints it), so a layout read from a backend feeds
`mig_layout_diff` directly. CPUs are always real: both backends count the cores this process may use.

Errors the agent should log and report (a refused placement, a MIG mode change that needs a GPU reset,
NVML failing) are `BackendError`; programming errors stay ValueError/TypeError.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.geometry.catalogue import (
    NVML_ORIGIN_LABEL,
    CatalogueError,
    GpuModelSpec,
    MigCatalogue,
    gpu_model_from_nvml,
    mig_catalogue_load,
)
from engine.geometry.layout import Placement, placement_parse

__all__ = [
    "BACKEND_NAMES",
    "BackendError",
    "DeviceBackend",
    "GpuInfo",
    "GpuTelemetry",
    "MigInstanceInfo",
    "MigInstanceTelemetry",
    "backend_make",
    "catalogue_compare",
    "gpu_model_of",
    "host_cpu_cores",
    "placement_coerce",
]

BACKEND_NAMES = ("nvml", "simulated")


class BackendError(RuntimeError):
    """A device operation failed in a way the agent should log and report (it carries NVML's own error
    text where there is one); the agent keeps running and retries on its next pass."""


@dataclass(frozen=True)
class MigInstanceInfo:
    """One MIG instance: a GPU instance at `placement` and the compute instance that spans it.

    `uuid` is the MIG device's ``MIG-…`` UUID (what ``CUDA_VISIBLE_DEVICES`` takes); it exists only once
    the compute instance does, so a GPU instance left without one (an agent killed between the two
    creations) has ``uuid == ""`` and ``compute_instance_id is None``.
    """

    placement: Placement
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the agent reports it (docs/dataplane.md, "Actual state", an accelerator).

    `model_name` is the name NVML reports ("NVIDIA A100-SXM4-40GB"); the catalogue resolves it.
    `placements` maps each GPU instance profile to the starts NVML reports as possible on an empty GPU,
    for the cross-check against the catalogue (`catalogue_compare`); NVML reports profiles only while MIG
    is enabled, so it is ``{}`` otherwise. `nvml_profiles` is NVML's whole profile table then (name, id,
    memory and compute slices, MiB, starts, instances: what a GPU the catalogue lacks is planned from) and
    `pci_device_id` the board's PCI device id ("0x20B010DE", mig-parted's device-filter form; "" unknown).
    """

    index: int
    uuid: str
    model_name: str
    memory_mb: int
    mig_capable: bool = False
    mig_enabled: bool = False
    instances: tuple[MigInstanceInfo, ...] = ()
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)
    simulated: bool = False
    mps_enabled: bool = False  # the GPU's MPS control daemon runs (simulated: the mode is set)
    pci_device_id: str = ""
    nvml_profiles: tuple[dict[str, Any], ...] = ()

    @property
    def layout(self) -> tuple[Placement, ...]:
        """The instances' placements, sorted: the ``current`` of `mig_layout_diff`."""
        return tuple(sorted(instance.placement for instance in self.instances))

    def instance_at(self, placement: Placement) -> MigInstanceInfo | None:
        return next((i for i in self.instances if i.placement == placement), None)


@dataclass(frozen=True)
class MigInstanceTelemetry:
    """Activity of one MIG instance. `gr_engine_active_pct` follows DCGM's GR_ENGINE_ACTIVE (as a
    percentage); None where the hardware cannot measure it (NVML's GPM needs Hopper or newer), never a
    made-up number. So do the other profiling figures, each DCGM's field of the same name as a percentage:
    `sm_active_pct` (SM_ACTIVE), `sm_occupancy_pct` (SM_OCCUPANCY), `tensor_active_pct`
    (PIPE_TENSOR_ACTIVE), `dram_active_pct` (DRAM_ACTIVE)."""

    placement: Placement
    uuid: str
    gr_engine_active_pct: float | None
    memory_used_mb: float | None
    memory_free_mb: float | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None


@dataclass(frozen=True)
class GpuTelemetry:
    """One GPU's sample for the metrics post. `utilization_pct` is None on a MIG-enabled GPU: NVML does
    not report whole-GPU utilisation there, only per-instance activity (`instances`). The profiling
    figures (`gr_engine_active_pct` and the rest, as on `MigInstanceTelemetry`) are the whole GPU's, read
    only while MIG is off; `pci_bus_id` ("00000000:07:00.0", NVML's form) and `driver_version` are ""
    where there is no such thing (simulated GPUs)."""

    index: int
    uuid: str
    utilization_pct: float | None
    memory_used_mb: float
    power_w: float | None
    simulated: bool
    instances: tuple[MigInstanceTelemetry, ...] = ()
    memory_free_mb: float | None = None
    temperature_c: float | None = None
    gr_engine_active_pct: float | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None
    pci_bus_id: str = ""
    driver_version: str = ""


@runtime_checkable
class DeviceBackend(Protocol):
    """What the agent needs from the devices of its host."""

    name: str  # "nvml" | "simulated"

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, by index, with its MIG mode and instances as they are now."""
        ...

    def cpu_cores(self) -> int:
        """CPU cores this process may run on (CPUs are real on every backend)."""
        ...

    def mig_mode_set(self, index: int, enabled: bool) -> None:
        """Enable or disable MIG. Refused (BackendError) while instances exist when disabling, on GPUs
        without MIG, and, on real GPUs, when the change stays pending until a GPU reset."""
        ...

    def mig_instance_create(self, index: int, placement: Placement) -> MigInstanceInfo:
        """Create the GPU instance at exactly `placement` and one compute instance spanning it. Creating
        an instance that already exists returns it (completing its compute instance if it has none), so
        an agent restarted mid-operation can simply retry."""
        ...

    def mig_instance_destroy(self, index: int, placement: Placement) -> None:
        """Destroy the instance's compute instances, then the GPU instance. Destroying an absent
        instance is a no-op, so the agent may retry after a crash."""
        ...

    def mps_mode_set(self, index: int, enabled: bool) -> None:
        """Put the GPU in MPS mode (start its MPS control daemon) or take it out (stop the daemon).
        Idempotent. Refused (BackendError) while MIG is enabled, and when the daemon does not start or
        stop."""
        ...

    def mps_daemon(self, index: int) -> str | None:
        """Which MPS control daemon serves the GPU now: on real GPUs its identity (PID and start time, so a
        daemon started again is another one), on simulated GPUs "simulated" while MPS mode is on; None when
        none runs. The agent records it with every partition process it starts, and notices a daemon that
        died (None) or was replaced (another identity) after convergence."""
        ...

    def mps_environment(self, index: int, percent: int) -> dict[str, str]:
        """The environment of a runtime process on a partition of `percent` % of the GPU's SMs:
        ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_VISIBLE_DEVICES`` and, on real GPUs, the GPU's
        daemon's ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``. BackendError when the GPU is
        not in MPS mode."""
        ...

    def telemetry(self) -> list[GpuTelemetry]:
        ...

    def catalogue_disagreements(self) -> list[str]:
        """Human-readable lines where the hardware's MIG profiles differ from the catalogue."""
        ...

    def close(self) -> None:
        ...


def host_cpu_cores() -> int:
    """Cores this process may run on: its affinity mask (what a container or taskset allows), else the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def placement_coerce(placement: Placement | str) -> Placement:
    """A `Placement`, from itself or from its text (``"3g.20gb@4"``)."""
    if isinstance(placement, Placement):
        return placement
    if isinstance(placement, str):
        return placement_parse(placement)
    raise TypeError(f"a placement must be a Placement or 'profile@start' text, got {placement!r}")


def catalogue_compare(gpu: GpuInfo, catalogue: MigCatalogue | None = None) -> list[str]:
    """Where the profiles and starts NVML reports for `gpu` differ from the MIG catalogue, one line each.

    The planner places instances with the catalogue; if the hardware disagrees (a driver that adds or
    drops a profile, a catalogue entry copied wrong), the agent reports it instead of failing later on a
    refused placement. Nothing is compared for GPUs without MIG or while MIG is off (NVML reports no
    profiles then).
    """
    if not gpu.mig_capable or not gpu.placements:
        return []
    catalogue = catalogue if catalogue is not None else mig_catalogue_load()
    where = f"gpu{gpu.index}"
    model = catalogue.gpu_model_find(gpu.model_name)
    if model is None and gpu.pci_device_id:
        model = catalogue.gpu_model_find_by_pci(gpu.pci_device_id)
    if model is None:
        board = f" (PCI device id {gpu.pci_device_id})" if gpu.pci_device_id else ""
        return [
            f"{where} {gpu.model_name}{board}: NVML reports MIG profiles {sorted(gpu.placements)}, but the "
            f"catalogue does not know this model (known: {', '.join(catalogue.gpu_model_names)}); it is planned "
            f"from NVML's profile table ({NVML_ORIGIN_LABEL})"
        ]
    lines = []
    for profile in model.profiles:
        reported = gpu.placements.get(profile.name)
        if reported is None:
            lines.append(
                f"{where} {profile.name}: the catalogue lists starts {list(profile.starts)}, "
                "NVML does not report the profile"
            )
        elif tuple(sorted(reported)) != profile.starts:
            lines.append(
                f"{where} {profile.name}: NVML reports starts {sorted(reported)}, "
                f"the catalogue {list(profile.starts)}"
            )
    for name in sorted(set(gpu.placements) - set(model.profile_names)):
        lines.append(
            f"{where} {name}: NVML reports starts {sorted(gpu.placements[name])}, "
            f"the catalogue does not list the profile for {model.name}"
        )
    return lines


def gpu_model_of(gpu: GpuInfo, catalogue: MigCatalogue | None = None) -> GpuModelSpec | None:
    """The MIG model of `gpu`: the catalogue's (by NVML's name, else by the board's PCI device id), else
    one described from the NVML profile table the GPU reports (labelled "from NVML, not in the
    catalogue"), else None (no MIG, or MIG off on a GPU the catalogue lacks)."""
    catalogue = catalogue if catalogue is not None else mig_catalogue_load()
    model = catalogue.gpu_model_find(gpu.model_name)
    if model is None and gpu.pci_device_id:
        model = catalogue.gpu_model_find_by_pci(gpu.pci_device_id)
    if model is None and gpu.nvml_profiles:
        try:
            model = gpu_model_from_nvml(gpu.model_name, gpu.memory_mb, gpu.nvml_profiles)
        except CatalogueError:
            return None
    return model


def backend_make(name: str, **options: Any) -> DeviceBackend:
    """The backend called `name` ("nvml" or "simulated"), built with `options` (see each class)."""
    if name == "nvml":
        from .nvml import NvmlBackend

        return NvmlBackend(**options)
    if name == "simulated":
        from .simulated import SimulatedBackend

        return SimulatedBackend(**options)
    raise ValueError(f"unknown device backend {name!r} (known: {', '.join(BACKEND_NAMES)})")
