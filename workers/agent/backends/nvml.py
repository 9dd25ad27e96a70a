"""Real GPUs through NVML (``pynvml``, from nvidia-ml-py): inventory, MIG instances, telemetry.

How NVML is used, and why:

- Profiles. NVML names GPU instance profiles by enum (``NVML_GPU_INSTANCE_PROFILE_*``); asking for an
  enum's profile info gives the profile's *id*, the "ID" column of ``nvidia-smi mig -lgip`` that the
  catalogue stores as ``profile_id``. Every other MIG call takes that id. Ids are per GPU model (14 is
  2g.10gb on A100, 1g.6gb on A30), so the GPU's catalogue model is found first (by NVML's name, else by
  the board's PCI device id); a profile is then matched by the name NVML gives it (a board's other name,
  such as early GB200's 7g.189gb, resolves to the catalogue's), else by id, so placements read the way
  the planner writes them; a profile the catalogue does not know keeps NVML's own name. NVML describes
  profiles only while MIG is enabled, and the description does not change while the mode lasts, so it is
  read once per GPU and MIG mode. The whole table is reported (`GpuInfo.nvml_profiles`): a GPU the
  catalogue lacks is planned from it.
- Placements. ``nvmlDeviceGetGpuInstancePossiblePlacements`` lists every legal ``{start, size}`` of a
  profile regardless of what is already on the GPU; that is what `GpuInfo.placements` reports and what
  `catalogue_disagreements` compares with the catalogue. Instances are created at an explicit placement
  (``nvmlDeviceCreateGpuInstanceWithPlacement``), never wherever NVML would put them, because the
  planner's layouts name starts.
- One compute instance per GPU instance, the full-size one (what ``nvidia-smi mig -cgi … -C`` makes):
  its MIG device, named by a ``MIG-…`` UUID, is what a runtime gets in ``CUDA_VISIBLE_DEVICES``.
- ctypes conventions. pynvml declares no argtypes, so pointers are passed explicitly (``byref``) and
  lists come back through arrays the caller allocates, as the C API expects.
- Activity. NVML reports no utilisation on a MIG-enabled GPU; per-instance activity comes from GPM
  (``nvmlGpmMigSampleGet``; on a GPU without MIG, ``nvmlGpmSampleGet``), computed between two samples
  (Hopper and newer): graphics activity, SMs busy, warp occupancy, HMMA tensor activity and DRAM
  bandwidth, in one ``nvmlGpmMetricsGet`` (`_GPM_METRICS`). Where GPM is missing, or NVML does not
  compute one of them, the backend reports None, never an estimate.

- MPS (issue 17). NVML has no MPS switch: MPS mode is the GPU's MPS control daemon running
  (backends/mps.py), one per GPU under `mps_dir`, refused while MIG is enabled (a GPU is partitioned one
  way), and a partition is a runtime process started with the daemon's environment.

MIG management needs root (NVML answers NO_PERMISSION otherwise); errors become `BackendError` with
NVML's own error name, and the refusals the agent meets in practice (an illegal start, an overlap, a
mode change pending a GPU reset) get a sentence of their own.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine.geometry.catalogue import GpuModelSpec, MigCatalogue, mig_catalogue_load, pci_device_id_format
from engine.geometry.layout import Placement, mig_layout_validate

from . import (
    BackendError,
    GpuInfo,
    GpuTelemetry,
    MigInstanceInfo,
    MigInstanceTelemetry,
    catalogue_compare,
    host_cpu_cores,
    placement_coerce,
)
from .mps import MPS_CONTROL, MpsControl

__all__ = ["NvmlBackend"]

_MIB = 1024 * 1024
_T = TypeVar("_T")
# Telemetry field <- NVML GPM metric (NVML API reference, "GPM Enums", nvmlGpmMetricId_t), each 0..100 %
# and the counterpart of the DCGM profiling field the exporter names (DCGM user guide, "Profiling Metrics"):
# GRAPHICS_UTIL ~ GR_ENGINE_ACTIVE, SM_UTIL ~ SM_ACTIVE, SM_OCCUPANCY ~ SM_OCCUPANCY,
# HMMA_TENSOR_UTIL ~ PIPE_TENSOR_ACTIVE (DCGM's "tensor (HMMA) pipe"), DRAM_BW_UTIL ~ DRAM_ACTIVE.
_GPM_METRICS = (
    ("gr_engine_active_pct", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL"),
    ("dram_active_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_NO_ACTIVITY: dict[str, float | None] = {name: None for name, _ in _GPM_METRICS}


@dataclass(frozen=True)
class _Profile:
    """A GPU instance profile as NVML describes it on one GPU."""

    name: str  # the catalogue's name for this profile id, else NVML's
    profile_id: int
    nvml_name: str | None  # from the v2 profile info ("MIG 3g.20gb" -> "3g.20gb"), None on old drivers
    compute_slices: int
    instance_count: int
    placements: tuple[tuple[int, int], ...]  # every possible (start, size), in memory slices
    memory_mb: int = 0

    def as_report(self) -> dict[str, Any]:
        """The profile as the agent reports it (`GpuInfo.nvml_profiles`)."""
        sizes = {size for _, size in self.placements}
        return {
            "name": self.name, "profile_id": self.profile_id, "memory_slices": max(sizes),
            "compute_slices": self.compute_slices, "memory_mb": self.memory_mb, "starts": list(self.starts),
            "max_count": self.instance_count,
        }

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(sorted(start for start, _ in self.placements))

    def size_at(self, start: int) -> int | None:
        return next((size for s, size in self.placements if s == start), None)


@dataclass(frozen=True)
class _GpuInstance:
    """A GPU instance found on the device, with the handle NVML gave for it."""

    placement: Placement
    handle: Any
    gpu_instance_id: int
    size: int

    def slices(self) -> set[int]:
        return set(range(self.placement.start, self.placement.start + self.size))


@dataclass(frozen=True)
class _MigDevice:
    compute_instance_id: int
    uuid: str
    handle: Any


class NvmlBackend:
    """GPUs through NVML. `nvml` is the pynvml module (a fake one in tests); `catalogue` the MIG
    catalogue profiles are named and compared with; `mps_dir` where the GPUs' MPS control daemons keep
    their pipes and logs (None: no MPS on this host) and `mps_control` the control program. NVML is
    initialised here and shut down by `close()`."""

    name = "nvml"

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        catalogue: MigCatalogue | None = None,
        mps_dir: Path | str | None = None,
        mps_control: str = MPS_CONTROL,
    ) -> None:
        self._mps = MpsControl(mps_dir, mps_control) if mps_dir is not None else None
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
                raise BackendError("the nvml backend needs nvidia-ml-py (module pynvml)") from exc
        self._nvml = nvml
        self._catalogue = catalogue if catalogue is not None else mig_catalogue_load()
        # NVML itself is thread-safe; the lock guards this object's caches and keeps a check-then-create
        # sequence (overlap check, then create) from interleaving with another thread's.
        self._lock = threading.RLock()
        self._profiles: dict[str, dict[str, _Profile]] = {}  # GPU uuid -> profiles (while MIG is on)
        self._gpm_support: dict[str, bool] = {}
        # (GPU uuid, GPU instance id, placement), or (GPU uuid, -1, None) for a whole GPU -> the last GPM sample
        self._gpm_samples: dict[tuple[str, int, Placement | None], Any] = {}
        self._driver_version: str | None = None
        self._closed = False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendError(f"cannot initialise NVML (is the NVIDIA driver loaded?): {self._text(exc)}") from exc

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the interface

    def gpus(self) -> list[GpuInfo]:
        with self._lock, self._reported("reading the GPUs"):
            return [self._gpu_info(index) for index in range(self._nvml.nvmlDeviceGetCount())]

    def cpu_cores(self) -> int:
        return host_cpu_cores()

    def mig_mode_set(self, index: int, enabled: bool) -> None:
        nvml = self._nvml
        word = "enabled" if enabled else "disabled"
        with self._lock, self._reported(f"gpu{index}: setting MIG mode {word}"):
            handle = self._handle(index)
            name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
            capable, current, pending = self._mig_mode(handle)
            if not capable:
                raise BackendError(f"gpu{index} ({name}) does not support MIG")
            if current == enabled and pending == enabled:
                return
            if enabled and self._mps is not None and self._mps.running(index):
                raise BackendError(f"gpu{index} ({name}): cannot enable MIG while MPS is on; disable MPS first")
            if current and not enabled:
                instances = self._gpu_instances(handle, self._profile_table(uuid, name, handle))
                if instances:
                    listed = ", ".join(str(gi.placement) for gi in instances)
                    raise BackendError(
                        f"gpu{index}: cannot disable MIG while it has instances ({listed}); destroy them first"
                    )
            status = nvml.nvmlDeviceSetMigMode(
                handle, nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
            )
            self._forget_gpu(uuid)
            # NVML may unbind or reset the device to apply the mode: ask for a fresh handle.
            _, current, pending = self._mig_mode(self._handle(index))
            if current != enabled:
                raise BackendError(
                    f"gpu{index} ({name}): MIG mode change to {word} is pending: it takes effect only "
                    f"after a GPU reset (nvidia-smi --gpu-reset -i {index}, or a reboot where resets are "
                    f"not allowed, e.g. GPU pass-through); NVML activation status: {self._code_text(status)}"
                )

    def mps_mode_set(self, index: int, enabled: bool) -> None:
        mps = self._mps_control()
        word = "enabling" if enabled else "disabling"
        with self._lock, self._reported(f"gpu{index}: {word} MPS"):
            handle = self._handle(index)
            if not enabled:
                mps.stop(index)
                return
            _capable, current, pending = self._mig_mode(handle)
            if current or pending:
                raise BackendError(
                    f"gpu{index} ({self._nvml.nvmlDeviceGetName(handle)}): cannot enable MPS while MIG is enabled"
                    f"{'' if current else ' (pending a GPU reset)'}; disable MIG first"
                )
            mps.start(index, self._nvml.nvmlDeviceGetUUID(handle))

    def mps_environment(self, index: int, percent: int) -> dict[str, str]:
        mps = self._mps_control()
        with self._lock, self._reported(f"gpu{index}: MPS environment"):
            handle = self._handle(index)
            if not mps.running(index):
                raise BackendError(f"gpu{index}: MPS is not enabled (its control daemon does not run)")
            return mps.client_environment(index, percent, self._nvml.nvmlDeviceGetUUID(handle))

    def mps_daemon(self, index: int) -> str | None:
        return self._mps.daemon_id(index) if self._mps is not None else None

    def _mps_control(self) -> MpsControl:
        if self._mps is None:
            raise BackendError("MPS is not set up on this host (the nvml backend was given no MPS directory)")
        return self._mps

    def mig_instance_create(self, index: int, placement: Placement | str) -> MigInstanceInfo:
        placement = placement_coerce(placement)
        nvml = self._nvml
        with self._lock, self._reported(f"gpu{index}: creating {placement}"):
            handle, name, uuid = self._mig_gpu(index)
            table = self._profile_table(uuid, name, handle)
            profile = _profile_lookup(table, placement.profile)
            if profile is None:
                raise BackendError(
                    f"gpu{index}: cannot create {placement}: profile {placement.profile} does not exist on "
                    f"{name} (NVML reports: {', '.join(sorted(table)) or 'none'})"
                )
            placement = Placement(profile.name, placement.start)
            size = profile.size_at(placement.start)
            if size is None:
                legal = ", ".join(map(str, profile.starts))
                raise BackendError(
                    f"gpu{index}: cannot create {placement}: start {placement.start} is not a legal start "
                    f"for {profile.name} on {name} (NVML reports starts {legal})"
                )
            existing = self._gpu_instances(handle, table)
            same = next((gi for gi in existing if gi.placement == placement), None)
            if same is not None:
                return self._compute_instance_ensure(index, handle, same)
            wanted = set(range(placement.start, placement.start + size))
            for other in existing:
                shared = sorted(wanted & other.slices())
                if shared:
                    raise BackendError(
                        f"gpu{index}: cannot create {placement}: {placement} overlaps {other.placement} "
                        f"on {_slices_text(shared)}"
                    )
            request = nvml.c_nvmlGpuInstancePlacement_t()
            request.start, request.size = placement.start, size
            try:
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.profile_id, ctypes.byref(request))
            except nvml.NVMLError as exc:
                raise BackendError(self._create_refusal(index, name, placement, existing, exc)) from exc
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            created = _GpuInstance(placement, gi, int(info.id), int(info.placement.size))
            try:
                return self._compute_instance_ensure(index, handle, created)
            except BackendError:
                # A GPU instance without its compute instance serves nothing: do not leave it behind.
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlGpuInstanceDestroy(gi)
                raise

    def mig_instance_destroy(self, index: int, placement: Placement | str) -> None:
        placement = placement_coerce(placement)
        nvml = self._nvml
        with self._lock, self._reported(f"gpu{index}: destroying {placement}"):
            handle = self._handle(index)
            name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
            _, enabled, _ = self._mig_mode(handle)
            if not enabled:
                return  # no MIG, no instances: nothing to destroy
            table = self._profile_table(uuid, name, handle)
            profile = _profile_lookup(table, placement.profile)
            if profile is None:
                return  # a profile the GPU does not offer cannot have an instance
            placement = Placement(profile.name, placement.start)
            gi = next((g for g in self._gpu_instances(handle, table) if g.placement == placement), None)
            if gi is None:
                return
            try:
                for ci in self._compute_instances(gi.handle):
                    nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(gi.handle)
            except nvml.NVMLError as exc:
                if self._is(exc, "NVML_ERROR_IN_USE"):
                    raise BackendError(
                        f"gpu{index}: cannot destroy {placement}: it is in use (a process still runs on it; "
                        f"stop it first): {self._text(exc)}"
                    ) from exc
                raise
            self._gpm_forget({key for key in self._gpm_samples if key[0] == uuid and key[2] == placement})

    def telemetry(self) -> list[GpuTelemetry]:
        nvml = self._nvml
        with self._lock, self._reported("reading telemetry"):
            samples: list[GpuTelemetry] = []
            live: set[tuple[str, int, Placement | None]] = set()
            driver_version = self._driver()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                _, enabled, _ = self._mig_mode(handle)
                power_mw = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
                instances: tuple[MigInstanceTelemetry, ...] = ()
                utilization = None
                activity = _NO_ACTIVITY
                if enabled:
                    instances = self._instances_telemetry(uuid, handle, live)
                else:
                    rates = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
                    utilization = None if rates is None else float(rates.gpu)
                    activity = self._gpm_activity(uuid, handle, None, live)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                temperature = self._optional(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
                pci = self._optional(lambda: nvml.nvmlDeviceGetPciInfo(handle))
                samples.append(GpuTelemetry(
                    index=index,
                    uuid=uuid,
                    utilization_pct=utilization,
                    memory_used_mb=memory.used / _MIB,
                    memory_free_mb=memory.free / _MIB,
                    power_w=None if power_mw is None else power_mw / 1000.0,
                    temperature_c=None if temperature is None else float(temperature),
                    simulated=False,
                    instances=instances,
                    pci_bus_id="" if pci is None else _c_text(pci.busId),
                    driver_version=driver_version,
                    **activity,
                ))
            self._gpm_forget(set(self._gpm_samples) - live)  # instances (or whole-GPU modes) gone since the last call
            return samples

    def _driver(self) -> str:
        """The driver's version (""  where NVML does not say), read once: it cannot change under a loaded NVML."""
        if self._driver_version is None:
            version = self._optional(self._nvml.nvmlSystemGetDriverVersion)
            self._driver_version = "" if version is None else _c_text(version)
        return self._driver_version

    def catalogue_disagreements(self) -> list[str]:
        with self._lock, self._reported("comparing MIG profiles with the catalogue"):
            lines: list[str] = []
            for index in range(self._nvml.nvmlDeviceGetCount()):
                gpu = self._gpu_info(index)
                lines.extend(catalogue_compare(gpu, self._catalogue))
                model = self._catalogue_model(gpu.model_name, self._handle(index))
                if model is None or not gpu.mig_enabled:
                    continue
                # What the starts alone do not show: the slices a placement takes, and the profile's name.
                for profile in sorted(self._profiles.get(gpu.uuid, {}).values(), key=lambda p: p.name):
                    spec = model.profile_find(profile.name)
                    if spec is None:
                        continue
                    sizes = sorted({size for _, size in profile.placements})
                    if sizes != [spec.memory_slices]:
                        lines.append(
                            f"gpu{index} {profile.name}: NVML reports placements of {sizes} memory slices, "
                            f"the catalogue {spec.memory_slices}"
                        )
                    if profile.nvml_name and profile.nvml_name != spec.name and profile.nvml_name not in spec.aliases:
                        lines.append(
                            f"gpu{index} {profile.name}: NVML names profile id {profile.profile_id} "
                            f"{profile.nvml_name!r}, the catalogue {spec.name!r}"
                        )
                    if spec.profile_id is not None and spec.profile_id != profile.profile_id:
                        lines.append(
                            f"gpu{index} {profile.name}: NVML gives it profile id {profile.profile_id}, "
                            f"the catalogue {spec.profile_id}"
                        )
                    if spec.max_count != profile.instance_count:
                        lines.append(
                            f"gpu{index} {profile.name}: NVML allows {profile.instance_count} instance(s), "
                            f"the catalogue {spec.max_count}"
                        )
            return lines

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._gpm_forget(set(self._gpm_samples))
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # ------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _reported(self, what: str) -> Iterator[None]:
        """NVML errors inside become BackendError naming the operation."""
        if self._closed:
            raise BackendError(f"{what}: the nvml backend is closed")
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise BackendError(f"{what}: {self._text(exc)}") from exc

    def _is(self, exc: BaseException, code_name: str) -> bool:
        return getattr(exc, "value", None) == getattr(self._nvml, code_name)

    def _text(self, exc: BaseException) -> str:
        kind = type(exc).__name__.removeprefix("NVMLError_")
        text = f"{exc} (NVML {kind})"
        if self._is(exc, "NVML_ERROR_NO_PERMISSION"):
            text += "; MIG management and instance listing need root"
        return text

    def _code_text(self, code: int) -> str:
        if code == getattr(self._nvml, "NVML_SUCCESS", 0):
            return "success"
        return self._text(self._nvml.NVMLError(code))

    def _optional(self, read: Callable[[], _T]) -> _T | None:
        """A reading some GPUs do not offer: None where NVML says it is not supported."""
        try:
            return read()
        except self._nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED") or self._is(exc, "NVML_ERROR_NO_DATA"):
                return None
            raise

    def _create_refusal(
        self, index: int, name: str, placement: Placement, existing: list[_GpuInstance], exc: BaseException
    ) -> str:
        text = f"gpu{index}: cannot create {placement}: "
        if self._is(exc, "NVML_ERROR_INSUFFICIENT_RESOURCES"):
            text += (
                "NVML has no room for it (an overlap, or the profile's instances, compute slices or "
                "media engines are used up)"
            )
        elif self._is(exc, "NVML_ERROR_INVALID_ARGUMENT"):
            text += "NVML rejects the placement as invalid"
        else:
            text += "NVML refused"
        layout = [gi.placement for gi in existing]
        text += f"; instances now: {', '.join(map(str, layout)) or 'none'}; {self._text(exc)}"
        model = self._catalogue.gpu_model_find(name)
        if model is not None:
            verdict = mig_layout_validate(model, [*layout, placement])
            if not verdict.valid:
                text += f"; the catalogue agrees: {verdict.reason}"
        return text

    # ------------------------------------------------------------------ devices

    def _handle(self, index: int) -> Any:
        count = self._nvml.nvmlDeviceGetCount()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise BackendError(f"no gpu{index} on this host (NVML sees {count} GPU(s))")
        return self._nvml.nvmlDeviceGetHandleByIndex(index)

    def _mig_mode(self, handle: Any) -> tuple[bool, bool, bool]:
        """(MIG capable, current mode enabled, pending mode enabled)."""
        nvml = self._nvml
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return False, False, False
            raise
        enable = nvml.NVML_DEVICE_MIG_ENABLE
        return True, current == enable, pending == enable

    def _mig_gpu(self, index: int) -> tuple[Any, str, str]:
        """Handle, name and uuid of a GPU that has MIG enabled now (else BackendError)."""
        nvml = self._nvml
        handle = self._handle(index)
        name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
        capable, enabled, pending = self._mig_mode(handle)
        if not capable:
            raise BackendError(f"gpu{index} ({name}) does not support MIG")
        if not enabled:
            hint = " (enabling is pending a GPU reset)" if pending else ""
            raise BackendError(f"gpu{index} ({name}): MIG is not enabled{hint}")
        return handle, name, uuid

    def _gpu_info(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name, uuid = nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetUUID(handle)
        capable, enabled, _ = self._mig_mode(handle)
        instances: tuple[MigInstanceInfo, ...] = ()
        placements: dict[str, tuple[int, ...]] = {}
        profiles: tuple[dict[str, Any], ...] = ()
        if enabled:
            table = self._profile_table(uuid, name, handle)
            placements = {profile.name: profile.starts for profile in table.values()}
            profiles = tuple(profile.as_report() for profile in sorted(table.values(), key=lambda p: p.profile_id))
            migs = self._mig_devices(handle)
            instances = tuple(
                _instance_info(gi, migs.get(gi.gpu_instance_id)) for gi in self._gpu_instances(handle, table)
            )
        else:
            self._forget_gpu(uuid)
        return GpuInfo(
            index=index,
            uuid=uuid,
            model_name=name,
            memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB),
            mig_capable=capable,
            mig_enabled=enabled,
            instances=instances,
            placements=placements,
            simulated=False,
            mps_enabled=self._mps is not None and self._mps.running(index),
            pci_device_id=self._pci_device_id(handle),
            nvml_profiles=profiles,
        )

    def _forget_gpu(self, uuid: str) -> None:
        self._profiles.pop(uuid, None)
        self._gpm_support.pop(uuid, None)

    # ------------------------------------------------------------------ MIG profiles and instances

    def _profile_table(self, uuid: str, model_name: str, handle: Any) -> dict[str, _Profile]:
        """The GPU instance profiles NVML offers on this GPU, by name (MIG must be enabled)."""
        cached = self._profiles.get(uuid)
        if cached is not None:
            return cached
        nvml = self._nvml
        model = self._catalogue_model(model_name, handle)
        table: dict[str, _Profile] = {}
        seen: set[int] = set()
        for enum in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._profile_query(nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, enum)
            if info is None or info.id in seen:
                continue
            seen.add(info.id)
            placements = self._possible_placements(handle, info.id)
            if not placements:
                continue
            nvml_name = _nvml_profile_name(getattr(info, "name", b""))
            spec = None
            if model is not None:
                spec = (model.profile_find(nvml_name) if nvml_name else None) or model.profile_by_id(int(info.id))
            # nvidia-smi's naming ("<compute>g.<memory>gb") is the last resort for a nameless profile.
            if spec is not None:
                name = spec.name
            else:
                name = nvml_name or f"{info.sliceCount}g.{round(info.memorySizeMB / 1024)}gb"
            table[name] = _Profile(
                name=name,
                profile_id=int(info.id),
                nvml_name=nvml_name,
                compute_slices=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                placements=placements,
                memory_mb=int(getattr(info, "memorySizeMB", 0)),
            )
        self._profiles[uuid] = table
        return table

    def _catalogue_model(self, model_name: str, handle: Any) -> GpuModelSpec | None:
        """The GPU's catalogue model: by NVML's name, else by the board's PCI device id."""
        return self._catalogue.gpu_model_find(model_name) or (
            self._catalogue.gpu_model_find_by_pci(self._pci_device_id(handle)) if self._pci_device_id(handle) else None
        )

    def _pci_device_id(self, handle: Any) -> str:
        """The board's PCI device id, "0x20B010DE" ("" where NVML does not say)."""
        info = self._optional(lambda: self._nvml.nvmlDeviceGetPciInfo(handle))
        device_id = int(getattr(info, "pciDeviceId", 0) or 0) if info is not None else 0
        return pci_device_id_format(device_id) if device_id else ""

    def _profile_query(self, query: Callable[..., Any], *args: Any) -> Any | None:
        """A GPU or compute instance profile's info, None where it is not offered. pynvml asks for the
        v2 structure (with the profile's name); drivers without it get the v1 question."""
        nvml = self._nvml
        try:
            return query(*args)
        except nvml.NVMLError as exc:
            error = exc
        if self._is(error, "NVML_ERROR_FUNCTION_NOT_FOUND"):
            try:
                return query(*args, version=1)
            except nvml.NVMLError as exc:
                error = exc
        if self._is(error, "NVML_ERROR_NOT_SUPPORTED") or self._is(error, "NVML_ERROR_INVALID_ARGUMENT"):
            return None
        raise error

    def _possible_placements(self, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        nvml = self._nvml
        count = ctypes.c_uint(0)
        try:
            # A NULL array asks for the count, then an array of that size gets the placements.
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
            if count.value == 0:
                return ()
            array = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        except nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                return ()
            raise
        return tuple(sorted((int(p.start), int(p.size)) for p in array[: count.value]))

    def _gpu_instances(self, handle: Any, table: dict[str, _Profile]) -> list[_GpuInstance]:
        nvml = self._nvml
        found: list[_GpuInstance] = []
        for profile in table.values():
            # NVML fills a caller-allocated array, which must hold every instance the profile allows.
            array = (nvml.c_nvmlGpuInstance_t * max(profile.instance_count, len(profile.placements), 1))()
            count = ctypes.c_uint(0)
            nvml.nvmlDeviceGetGpuInstances(handle, profile.profile_id, array, ctypes.byref(count))
            for k in range(count.value):
                info = nvml.nvmlGpuInstanceGetInfo(array[k])
                found.append(_GpuInstance(
                    placement=Placement(profile.name, int(info.placement.start)),
                    handle=array[k],
                    gpu_instance_id=int(info.id),
                    size=int(info.placement.size),
                ))
        return sorted(found, key=lambda gi: gi.placement)

    def _mig_devices(self, handle: Any) -> dict[int, _MigDevice]:
        """MIG devices (compute instances with a UUID) by GPU instance id; the lowest compute instance id
        stands for a GPU instance that has several."""
        nvml = self._nvml
        found: dict[int, _MigDevice] = {}
        count = self._optional(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
        for k in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except nvml.NVMLError as exc:
                if self._is(exc, "NVML_ERROR_NOT_FOUND") or self._is(exc, "NVML_ERROR_INVALID_ARGUMENT"):
                    continue  # no MIG device at this index
                raise
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
            if gi_id not in found or ci_id < found[gi_id].compute_instance_id:
                found[gi_id] = _MigDevice(ci_id, nvml.nvmlDeviceGetUUID(mig), mig)
        return found

    def _compute_profiles(self, gi_handle: Any) -> list[Any]:
        """Compute instance profiles the GPU instance offers, one per profile id, by enum order."""
        nvml = self._nvml
        found: list[Any] = []
        for enum in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            info = self._profile_query(
                nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi_handle, enum, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            if info is not None and all(info.id != other.id for other in found):
                found.append(info)
        return found

    def _compute_instances(self, gi_handle: Any) -> list[Any]:
        nvml = self._nvml
        handles: list[Any] = []
        for info in self._compute_profiles(gi_handle):
            array = (nvml.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(0)
            nvml.nvmlGpuInstanceGetComputeInstances(gi_handle, info.id, array, ctypes.byref(count))
            handles.extend(array[k] for k in range(count.value))
        return handles

    def _compute_instance_ensure(self, index: int, handle: Any, gi: _GpuInstance) -> MigInstanceInfo:
        """The instance's info, creating its full-size compute instance if it has none yet (a fresh GPU
        instance, or one an agent killed mid-creation left behind)."""
        nvml = self._nvml
        mig = self._mig_devices(handle).get(gi.gpu_instance_id)
        if mig is not None:
            return _instance_info(gi, mig)
        profiles = self._compute_profiles(gi.handle)
        if not profiles:
            raise BackendError(f"gpu{index}: {gi.placement}: NVML offers no compute instance profile for it")
        # The largest profile spans the whole GPU instance; on a tie the first (standard) enum wins.
        full = max(profiles, key=lambda info: int(info.sliceCount))
        try:
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi.handle, full.id)
        except nvml.NVMLError as exc:
            raise BackendError(
                f"gpu{index}: cannot create the compute instance of {gi.placement}: {self._text(exc)}"
            ) from exc
        ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        mig = self._mig_devices(handle).get(gi.gpu_instance_id)
        return MigInstanceInfo(
            placement=gi.placement,
            uuid=mig.uuid if mig is not None else "",
            gpu_instance_id=gi.gpu_instance_id,
            compute_instance_id=ci_id,
        )

    # ------------------------------------------------------------------ activity

    def _instances_telemetry(
        self, uuid: str, handle: Any, live: set[tuple[str, int, Placement | None]]
    ) -> tuple[MigInstanceTelemetry, ...]:
        nvml = self._nvml
        table = self._profile_table(uuid, nvml.nvmlDeviceGetName(handle), handle)
        migs = self._mig_devices(handle)
        rows = []
        for gi in self._gpu_instances(handle, table):
            mig = migs.get(gi.gpu_instance_id)
            info = None
            if mig is not None:
                info = self._optional(lambda: nvml.nvmlDeviceGetMemoryInfo(mig.handle))
            rows.append(MigInstanceTelemetry(
                placement=gi.placement,
                uuid=mig.uuid if mig is not None else "",
                memory_used_mb=None if info is None else info.used / _MIB,
                memory_free_mb=None if info is None else info.free / _MIB,
                **self._gpm_activity(uuid, handle, gi, live),
            ))
        return tuple(rows)

    def _gpm_supported(self, uuid: str, handle: Any) -> bool:
        if uuid not in self._gpm_support:
            nvml = self._nvml
            query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
            supported = False
            if query is not None:
                try:
                    supported = bool(query(handle).isSupportedDevice)
                except nvml.NVMLError:
                    supported = False
            self._gpm_support[uuid] = supported
        return self._gpm_support[uuid]

    def _gpm_activity(
        self, uuid: str, handle: Any, gi: _GpuInstance | None, live: set[tuple[str, int, Placement | None]]
    ) -> dict[str, float | None]:
        """GPM's activity figures (`_GPM_METRICS`) of a GPU instance, or of the whole GPU when `gi` is None,
        since the previous call: all None the first time and where GPM is missing, one None where NVML
        does not compute that metric. GPM metrics are computed between two samples, so one is kept per
        instance (or GPU) from one telemetry call to the next."""
        if not self._gpm_supported(uuid, handle):
            return _NO_ACTIVITY
        nvml = self._nvml
        # GPU instance ids are reused: the placement tells instances apart.
        key = (uuid, -1, None) if gi is None else (uuid, gi.gpu_instance_id, gi.placement)
        live.add(key)
        sample = nvml.nvmlGpmSampleAlloc()
        try:
            if gi is None:
                nvml.nvmlGpmSampleGet(handle, sample)
            else:
                nvml.nvmlGpmMigSampleGet(handle, gi.gpu_instance_id, sample)
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(sample)
            return _NO_ACTIVITY
        previous = self._gpm_samples.get(key)
        self._gpm_samples[key] = sample
        if previous is None:
            return _NO_ACTIVITY
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS)
            request.sample1, request.sample2 = previous, sample
            for k, (_, metric_id) in enumerate(_GPM_METRICS):
                request.metrics[k].metricId = getattr(nvml, metric_id)
            try:
                nvml.nvmlGpmMetricsGet(request)
            except nvml.NVMLError:
                return _NO_ACTIVITY
            return {
                name: float(request.metrics[k].value) if request.metrics[k].nvmlReturn == nvml.NVML_SUCCESS else None
                for k, (name, _) in enumerate(_GPM_METRICS)
            }
        finally:
            nvml.nvmlGpmSampleFree(previous)

    def _gpm_forget(self, keys: set[tuple[str, int, Placement | None]]) -> None:
        for key in keys:
            sample = self._gpm_samples.pop(key, None)
            if sample is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlGpmSampleFree(sample)


def _profile_lookup(table: dict[str, _Profile], name: str) -> _Profile | None:
    key = name.strip().lower().removeprefix("mig ").strip()
    # By the catalogue's name, else by the board's own (early GB200 boards call 7g.186gb 7g.189gb).
    return table.get(name) or table.get(key) or next((p for p in table.values() if p.nvml_name == key), None)


def _nvml_profile_name(raw: bytes | str) -> str | None:
    # The v2 profile info names profiles as nvidia-smi prints them: "MIG 3g.20gb".
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    text = text.strip()
    if text[:4].lower() == "mig ":
        text = text[4:].strip()
    return text.lower() or None


def _instance_info(gi: _GpuInstance, mig: _MigDevice | None) -> MigInstanceInfo:
    return MigInstanceInfo(
        placement=gi.placement,
        uuid=mig.uuid if mig is not None else "",
        gpu_instance_id=gi.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id if mig is not None else None,
    )


def _c_text(raw: bytes | str) -> str:
    """A C string from pynvml (bytes in structures, str from its decorated getters) as text."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _slices_text(slices: list[int]) -> str:
    if len(slices) == 1:
        return f"memory slice {slices[0]}"
    return f"memory slices {slices[0]}-{slices[-1]}"
