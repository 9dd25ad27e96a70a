"""A fake `pynvml` that follows NVML's semantics, to test the nvml backend on machines without a GPU.

`FakeNvml(gpus=[FakeGpu("A100-SXM4-40GB"), ...])` stands in for the ``pynvml`` module
(``NvmlBackend(nvml=fake)``). What it keeps from the real thing:

- pynvml's calling conventions: handles are opaque ctypes pointers (a new pointer object per call, as
  pynvml returns), lists come back through caller-allocated ctypes arrays and ``byref`` counts, and
  structures go in by pointer (pynvml declares no argtypes, so a structure passed by value would reach
  the C library as garbage: the fake raises TypeError for it);
- pynvml's own structures, constants and error classes (from the installed nvidia-ml-py), so what the
  backend hands the fake is what it would hand the library; a pynvml function the fake does not
  implement raises AttributeError instead of reaching the real library;
- NVML's rules, from the NVML API reference: every call but nvmlInit fails with UNINITIALIZED before
  nvmlInit; nvmlDeviceGetMigMode is NOT_SUPPORTED on GPUs without MIG; a MIG mode change may stay
  pending until a GPU reset (the activation status says RESET_REQUIRED); profile info, placements and
  instances are NOT_SUPPORTED while MIG is off; GPU instances exist only at the profile's possible
  placements (INVALID_ARGUMENT elsewhere) and INSUFFICIENT_RESOURCES on an overlap, past the profile's
  instance count, past the compute slices or with a second media-extension instance; destroying a GPU
  instance that still has compute instances is IN_USE; GPU instance ids are the lowest free ones (NVML
  reuses them), MIG device UUIDs are never reused; whole-GPU utilisation is NOT_SUPPORTED under MIG; GPM
  (per-instance or whole-GPU activity) exists on Hopper and newer only, needs two samples of the same
  instance or GPU, and answers each requested metric with its own return code (NOT_SUPPORTED for one the
  GPU does not compute, `FakeGpu.gpm_metrics_missing`); a GPU reset applies a pending MIG mode and loses
  every MIG instance.

Profiles, ids and placements come from the MIG catalogue; `FakeGpu.placements_override` and
`profile_names_override` make the "hardware" disagree with it. Tests drive activity with
`instance_activity_set` / `gpu_activity_set` (GPM figures by their telemetry names, `GPM_METRICS`), press
the reset button with `gpu_reset`, and make the next call of a function fail with `fail_next`.
"""
from __future__ import annotations

import ctypes
import functools
import uuid as uuid_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml as _pynvml

from engine.geometry.catalogue import GpuModelSpec, MigProfileSpec, mig_catalogue_load
from engine.geometry.layout import placement_parse

__all__ = ["FakeGpu", "FakeNvml"]

_MIB = 1024 * 1024
NVMLError = _pynvml.NVMLError

# GPUs without MIG the fake can hold: NVML name -> memory (MiB).
NON_MIG_GPUS = {"Tesla T4": 15360, "NVIDIA L4": 23034}

# NVML_COMPUTE_INSTANCE_PROFILE_* enum -> compute slices, for the standard profiles.
_CI_PROFILE_SLICES = {
    _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
_SMS_PER_SLICE = 14  # illustrative: 98 SMs over 7 slices, as on A100

# GPM figures the fake keeps, by the backend's telemetry name -> NVML GPM metric id.
GPM_METRICS = {
    "gr_engine_active_pct": _pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_active_pct": _pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy_pct": _pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active_pct": _pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    "dram_active_pct": _pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}
DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = 12040  # what driver 550.54.15 reports: CUDA 12.4, as major * 1000 + minor * 10
# Compute capability by catalogue model prefix (NVIDIA's CUDA GPUs table); the first prefix that matches.
_COMPUTE_CAPABILITY = (("GB300", (10, 3)), ("B300", (10, 3)), ("GB200", (10, 0)), ("B200", (10, 0)), ("RTX-PRO", (12, 0)),
                       ("GH200", (9, 0)), ("H", (9, 0)), ("A", (8, 0)), ("NVIDIA L4", (8, 9)), ("Tesla T4", (7, 5)),
                       ("RTX-2080", (7, 5)))


def _gi_profile_enum(profile: MigProfileSpec, model: GpuModelSpec) -> int:
    """The NVML_GPU_INSTANCE_PROFILE_* enum of a catalogue profile (nvml.h: REV1 carries the media
    extensions, ALL_ME all media engines, NO_ME none, GFX graphics; REV2 is the 1g on two memory slices)."""
    by_kind = {
        "me": {1: "1_SLICE_REV1", 2: "2_SLICE_REV1"}, "me.all": {1: "1_SLICE_ALL_ME", 2: "2_SLICE_ALL_ME"},
        "gfx": {1: "1_SLICE_GFX", 2: "2_SLICE_GFX", 3: "3_SLICE_GFX", 4: "4_SLICE_GFX"},
        "-me": {1: "1_SLICE_NO_ME", 2: "2_SLICE_NO_ME"},
    }
    kind = "-me" if profile.media_engines_none else next(iter(profile.attributes), None)
    if kind is not None:
        return getattr(_pynvml, f"NVML_GPU_INSTANCE_PROFILE_{by_kind[kind][profile.compute_slices]}")
    if profile.compute_slices == 1 and profile.memory_slices == 2 and model.memory_slices == 8:
        return _pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2  # 1g.10gb on A100-40GB
    return {
        1: _pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        2: _pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        3: _pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: _pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        6: _pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
        7: _pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        8: _pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    }[profile.compute_slices]


def _fail(code: int) -> None:
    raise NVMLError(code)


def _out(ref: Any) -> Any:
    """The object behind a ``byref(x)`` or ``pointer(x)`` argument."""
    if hasattr(ref, "_obj"):  # ctypes.byref
        return ref._obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    raise TypeError(f"expected ctypes.byref(...) or a pointer, got {type(ref).__name__}")


def _gpm_figures(figures: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(figures) - set(GPM_METRICS))
    if unknown:
        raise TypeError(f"unknown GPM figures {unknown} (known: {sorted(GPM_METRICS)})")
    return {name: float(value) for name, value in figures.items() if value is not None}


def _address(handle: Any) -> int | None:
    if not isinstance(handle, ctypes._Pointer):
        raise TypeError(f"expected an NVML handle (a ctypes pointer), got {type(handle).__name__}")
    return ctypes.cast(handle, ctypes.c_void_p).value


# --------------------------------------------------------------------------- configuration


@dataclass
class FakeGpu:
    """One GPU of the fake. `model` is a catalogue model ("A100-SXM4-40GB") or a GPU without MIG
    ("Tesla T4")."""

    model: str
    mig_enabled: bool = False
    # MIG mode changes stay pending until gpu_reset() (pass-through VMs, a GPU that cannot be unbound).
    reset_required: bool = False
    # profile name -> the placements NVML reports instead of the catalogue's: starts, or (start, size).
    placements_override: dict[str, Sequence[int] | Sequence[tuple[int, int]]] = field(default_factory=dict)
    # profile name -> the name the v2 profile info gives it instead.
    profile_names_override: dict[str, str] = field(default_factory=dict)
    gpm_supported: bool | None = None  # default: as NVML, Hopper (H100, H200) and newer only
    # GPM metric names (GPM_METRICS keys) this GPU does not compute: NOT_SUPPORTED for that metric alone.
    gpm_metrics_missing: tuple[str, ...] = ()
    utilization_pct: float = 0.0
    power_w: float = 60.0
    memory_used_mb: float = 0.0
    temperature_c: int = 40
    # the whole GPU's GPM figures (read while MIG is off), by GPM_METRICS name
    activity: dict[str, float] = field(default_factory=dict)
    # A MIG GPU the catalogue lacks: its profiles, as the "hardware" has them (`model` is then its NVML name).
    spec: GpuModelSpec | None = None
    pci_device_id: int | None = None  # default: the catalogue model's first board, else 0 (unknown)


# --------------------------------------------------------------------------- NVML objects


class _Obj:
    """Something a handle points at: a ctypes structure whose address is the handle."""

    struct_type: type = _pynvml.struct_c_nvmlDevice_t
    pointer_type: type = _pynvml.c_nvmlDevice_t

    def __init__(self) -> None:
        self._struct = self.struct_type()

    @property
    def address(self) -> int:
        return ctypes.addressof(self._struct)

    def handle(self) -> Any:
        return self.pointer_type(self._struct)


@dataclass(frozen=True)
class _FakeProfile:
    enum: int
    spec: MigProfileSpec
    placements: tuple[tuple[int, int], ...]
    nvml_name: str

    @property
    def profile_id(self) -> int:
        # A profile whose id the catalogue does not know gets one past NVML's enums, as real ids are not enums.
        return self.spec.profile_id if self.spec.profile_id is not None else 100 + self.enum


class _Device(_Obj):
    def __init__(self, index: int, config: FakeGpu) -> None:
        super().__init__()
        self.index = index
        self.config = config
        self.uuid = f"GPU-{uuid_module.UUID(int=0xFA4E << 64 | index)}"
        catalogue = mig_catalogue_load()
        self.spec = config.spec or catalogue.gpu_model_find(config.model)
        if config.spec is not None:
            self.name, self.memory_mb = config.model, config.spec.memory_mib
        elif self.spec is not None:
            self.name = next((n for n in self.spec.nvml_names if n.startswith("NVIDIA")), self.spec.name)
            self.memory_mb = self.spec.memory_mib
        elif config.model in NON_MIG_GPUS:
            self.name, self.memory_mb = config.model, NON_MIG_GPUS[config.model]
        else:
            raise ValueError(f"the fake knows no GPU {config.model!r}")
        self.mig_current = self.mig_pending = bool(config.mig_enabled and self.spec is not None)
        self.gpu_instances: dict[int, _GpuInstance] = {}
        self.profiles: dict[int, _FakeProfile] = {}  # by enum
        if self.spec is not None:
            for profile in self.spec.profiles:
                override = config.placements_override.get(profile.name)
                if override is None:
                    placements = tuple((s, profile.memory_slices) for s in profile.starts)
                else:
                    placements = tuple(
                        (int(p[0]), int(p[1])) if isinstance(p, (tuple, list)) else (int(p), profile.memory_slices)
                        for p in override
                    )
                nvml_name = config.profile_names_override.get(profile.name, profile.name)
                enum = _gi_profile_enum(profile, self.spec)
                self.profiles[enum] = _FakeProfile(enum, profile, placements, f"MIG {nvml_name}")
        hopper = self.spec is not None and self.spec.name.startswith(("H100", "H200"))
        self.gpm_supported = hopper if config.gpm_supported is None else config.gpm_supported
        self.pci_bus_id = f"00000000:{0x07 + index:02X}:00.0"  # NVML's domain:bus:device.function
        boards = self.spec.pci_device_ids if self.spec is not None else ()
        self.pci_device_id = config.pci_device_id if config.pci_device_id is not None else (boards[0] if boards else 0)

    def profile_by_id(self, profile_id: int) -> _FakeProfile | None:
        return next((p for p in self.profiles.values() if p.profile_id == profile_id), None)

    def mig_devices(self) -> list[_MigDevice]:
        """MIG devices in the order NVML indexes them (here: by GPU then compute instance id)."""
        return [
            ci.mig
            for gi in sorted(self.gpu_instances.values(), key=lambda g: g.gi_id)
            for ci in sorted(gi.compute_instances.values(), key=lambda c: c.ci_id)
        ]


class _GpuInstance(_Obj):
    struct_type = _pynvml.struct_c_nvmlGpuInstance_t
    pointer_type = _pynvml.c_nvmlGpuInstance_t

    def __init__(self, device: _Device, gi_id: int, profile: _FakeProfile, start: int, size: int) -> None:
        super().__init__()
        self.device, self.gi_id, self.profile, self.start, self.size = device, gi_id, profile, start, size
        self.compute_instances: dict[int, _ComputeInstance] = {}
        self.activity: dict[str, float] = {}  # GPM figures by GPM_METRICS name; unset ones read 0
        self.memory_used_mb = 0.0

    @property
    def placement_text(self) -> str:
        return f"{self.profile.spec.name}@{self.start}"

    def slices(self) -> set[int]:
        return set(range(self.start, self.start + self.size))


class _ComputeInstance(_Obj):
    struct_type = _pynvml.struct_c_nvmlComputeInstance_t
    pointer_type = _pynvml.c_nvmlComputeInstance_t

    def __init__(self, gi: _GpuInstance, ci_id: int, profile_enum: int, slices: int, start: int, uuid: str) -> None:
        super().__init__()
        self.gi, self.ci_id, self.profile_enum, self.slices, self.start = gi, ci_id, profile_enum, slices, start
        self.mig = _MigDevice(self, uuid)


class _MigDevice(_Obj):
    def __init__(self, ci: _ComputeInstance, uuid: str) -> None:
        super().__init__()
        self.ci, self.uuid = ci, uuid


class _GpmSample(_Obj):
    struct_type = _pynvml.struct_c_nvmlGpmSample_t
    pointer_type = _pynvml.c_nvmlGpmSample_t

    def __init__(self) -> None:
        super().__init__()
        # (device index, gi id or -1 for the whole GPU, sequence, GPM figures at the time)
        self.taken: tuple[int, int, int, dict[str, float]] | None = None


def _api(fn: Callable) -> Callable:
    """An NVML entry point: injected failures first, then UNINITIALIZED before nvmlInit."""

    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(fn.__name__)
        injected = self._fail_next.pop(fn.__name__, None)
        if injected is not None:
            _fail(injected)
        if fn.__name__ not in ("nvmlInit", "nvmlShutdown") and self._init_count == 0:
            _fail(_pynvml.NVML_ERROR_UNINITIALIZED)
        return fn(self, *args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- the module


class FakeNvml:
    """The fake ``pynvml`` module. Its state (MIG modes, instances) lives as long as the object, like a
    GPU's across agent restarts: hand the same object to successive backends."""

    def __init__(self, gpus: Sequence[FakeGpu | str] = (), *, driver_version: str = DRIVER_VERSION) -> None:
        self.driver_version = driver_version
        self.devices = [_Device(i, g if isinstance(g, FakeGpu) else FakeGpu(g)) for i, g in enumerate(gpus)]
        self.calls: list[str] = []
        self._init_count = 0
        self._fail_next: dict[str, int] = {}
        self._objects: dict[int, _Obj] = {d.address: d for d in self.devices}
        self._retired: list[_Obj] = []  # destroyed objects stay allocated, so no new one reuses an address
        self._mig_uuids = 0
        self._gpm_sequence = 0

    def __getattr__(self, name: str) -> Any:
        # Constants, structures and error classes are pynvml's; its functions are not.
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(_pynvml, name)
        if name.startswith("nvml") and callable(value):
            raise AttributeError(f"the fake pynvml does not implement {name}")
        return value

    # ------------------------------------------------------------------ test controls

    @property
    def initialised(self) -> int:
        """How many nvmlInit calls have not been matched by nvmlShutdown."""
        return self._init_count

    def fail_next(self, function: str, code: int) -> None:
        """Make the next call of `function` fail with NVML error `code`."""
        self._fail_next[function] = code

    def gpu_reset(self, index: int) -> None:
        """A GPU reset: the pending MIG mode takes effect and every MIG instance is gone."""
        device = self.devices[index]
        for gi in list(device.gpu_instances.values()):
            for ci in list(gi.compute_instances.values()):
                self._retire(ci.mig)
                self._retire(ci)
            self._retire(gi)
        device.gpu_instances.clear()
        device.mig_current = device.mig_pending

    def gpu_activity_set(
        self, index: int, *, utilization_pct: float | None = None, power_w: float | None = None,
        memory_used_mb: float | None = None, temperature_c: int | None = None, **gpm: float,
    ) -> None:
        """The whole GPU's readings; `gpm`: GPM figures by GPM_METRICS name."""
        config = self.devices[index].config
        if utilization_pct is not None:
            config.utilization_pct = utilization_pct
        if power_w is not None:
            config.power_w = power_w
        if memory_used_mb is not None:
            config.memory_used_mb = memory_used_mb
        if temperature_c is not None:
            config.temperature_c = temperature_c
        config.activity.update(_gpm_figures(gpm))

    def instance_activity_set(
        self, index: int, placement: str, *, memory_used_mb: float | None = None, **gpm: float,
    ) -> None:
        """A MIG instance's readings; `gpm`: GPM figures by GPM_METRICS name (gr_engine_active_pct, ...)."""
        gi = self._gi_at(index, str(placement_parse(str(placement))))
        gi.activity.update(_gpm_figures(gpm))
        if memory_used_mb is not None:
            gi.memory_used_mb = memory_used_mb

    def layout(self, index: int) -> list[str]:
        """The GPU instances of GPU `index`, as ``profile@start``, sorted by start."""
        instances = sorted(self.devices[index].gpu_instances.values(), key=lambda g: (g.start, g.placement_text))
        return [gi.placement_text for gi in instances]

    def compute_instance_count(self, index: int, placement: str) -> int:
        return len(self._gi_at(index, str(placement_parse(placement))).compute_instances)

    def _gi_at(self, index: int, placement_text: str) -> _GpuInstance:
        for gi in self.devices[index].gpu_instances.values():
            if gi.placement_text == placement_text:
                return gi
        raise KeyError(f"no GPU instance {placement_text} on gpu{index}")

    # ------------------------------------------------------------------ object bookkeeping

    def _register(self, obj: _Obj) -> _Obj:
        self._objects[obj.address] = obj
        return obj

    def _retire(self, obj: _Obj) -> None:
        self._objects.pop(obj.address, None)
        self._retired.append(obj)

    def _resolve(self, handle: Any, kind: type) -> Any:
        obj = self._objects.get(_address(handle))
        if not isinstance(obj, kind):
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)  # stale, NULL or of another kind
        return obj

    def _parent(self, handle: Any) -> _Device:
        """A physical GPU's handle (MIG device handles are refused where NVML wants the parent)."""
        return self._resolve(handle, _Device)

    def _mig_on(self, device: _Device) -> None:
        if device.spec is None or not device.mig_current:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)

    # ------------------------------------------------------------------ init

    @_api
    def nvmlInit(self) -> None:
        self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:
        # NVML reports nothing when shut down more often than initialised.
        self._init_count = max(0, self._init_count - 1)

    # ------------------------------------------------------------------ devices

    @_api
    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.devices):
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index].handle()

    @_api
    def nvmlDeviceGetName(self, handle: Any) -> str:
        obj = self._resolve(handle, (_Device, _MigDevice))
        if isinstance(obj, _MigDevice):
            return f"{obj.ci.gi.device.name} MIG {obj.ci.gi.profile.spec.name}"
        return obj.name

    @_api
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._resolve(handle, (_Device, _MigDevice)).uuid

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        obj = self._resolve(handle, (_Device, _MigDevice))
        if isinstance(obj, _MigDevice):
            gi = obj.ci.gi
            total = gi.device.memory_mb * gi.size / gi.device.spec.memory_slices
            used = gi.memory_used_mb
        else:
            total = obj.memory_mb
            used = obj.config.memory_used_mb + sum(gi.memory_used_mb for gi in obj.gpu_instances.values())
        memory = _pynvml.c_nvmlMemory_t()
        memory.total, memory.used = int(total * _MIB), int(used * _MIB)
        memory.free = memory.total - memory.used
        return memory

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        obj = self._resolve(handle, (_Device, _MigDevice))
        if isinstance(obj, _MigDevice) or obj.mig_current:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)  # no whole-GPU utilisation under MIG
        rates = _pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = int(round(obj.config.utilization_pct)), 0
        return rates

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(round(self._parent(handle).config.power_w * 1000))  # milliwatts

    @_api
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != _pynvml.NVML_TEMPERATURE_GPU:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)  # the GPU die is the only sensor NVML defines
        return int(self._parent(handle).config.temperature_c)

    @_api
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = _pynvml.nvmlPciInfo_t()
        info.busId = self._parent(handle).pci_bus_id.encode()  # bytes in the structure, as pynvml returns it
        info.pciDeviceId = self._parent(handle).pci_device_id
        return info

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version  # pynvml decodes this one to str

    @_api
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return CUDA_DRIVER_VERSION

    @_api
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        model = self._parent(handle).config.model
        return next(cc for prefix, cc in _COMPUTE_CAPABILITY if model.startswith(prefix))

    # ------------------------------------------------------------------ MIG mode

    @_api
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        device = self._parent(handle)
        if device.spec is None:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [int(device.mig_current), int(device.mig_pending)]

    @_api
    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Returns the activation status, as pynvml does (it does not raise for it)."""
        device = self._parent(handle)
        if device.spec is None:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (_pynvml.NVML_DEVICE_MIG_DISABLE, _pynvml.NVML_DEVICE_MIG_ENABLE):
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device.mig_pending = bool(mode)
        if device.mig_current == device.mig_pending:
            return _pynvml.NVML_SUCCESS
        if device.gpu_instances:
            return _pynvml.NVML_ERROR_IN_USE  # cannot unbind a GPU whose instances are in use
        if device.config.reset_required:
            return _pynvml.NVML_ERROR_RESET_REQUIRED
        device.mig_current = device.mig_pending
        return _pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ GPU instance profiles

    @_api
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        device = self._parent(handle)
        if not 0 <= profile < _pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT or version not in (1, 2):
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._mig_on(device)
        fake = device.profiles.get(profile)
        if fake is None:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = fake.spec
        info = _pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else _pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id = spec.profile_id
        info.isP2pSupported = 0
        info.sliceCount = spec.compute_slices
        info.instanceCount = spec.max_count
        info.multiprocessorCount = spec.compute_slices * _SMS_PER_SLICE
        info.memorySizeMB = int(round((spec.memory_gib_lgip or spec.memory_gb) * 1024))
        if version == 2:
            info.name = fake.nvml_name.encode()
        return info

    @_api
    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profileId: int, placementsRef: Any,
                                                   countRef: Any) -> int:
        device = self._parent(handle)
        self._mig_on(device)
        profile = device.profile_by_id(profileId)
        if profile is None:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        count = _out(countRef)
        count.value = len(profile.placements)
        if placementsRef is None:  # a NULL array asks for the count only
            return _pynvml.NVML_SUCCESS
        if len(placementsRef) < len(profile.placements):
            _fail(_pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, (start, size) in enumerate(profile.placements):
            placementsRef[k].start, placementsRef[k].size = start, size
        return _pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ GPU instances

    @_api
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> Any:
        device = self._parent(handle)
        if isinstance(placement, ctypes.Structure):
            raise TypeError("pass the placement by reference (ctypes.byref): pynvml sets no argtypes")
        requested = _out(placement)
        self._mig_on(device)
        profile = device.profile_by_id(profileId)
        if profile is None:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        start, size = int(requested.start), int(requested.size)
        if (start, size) not in profile.placements:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        existing = list(device.gpu_instances.values())
        wanted = set(range(start, start + size))
        if (
            any(gi.slices() & wanted for gi in existing)
            or sum(gi.profile is profile for gi in existing) >= profile.spec.max_count
            or sum(gi.profile.spec.compute_slices for gi in existing) + profile.spec.compute_slices
            > device.spec.compute_slices
            or (profile.spec.media_extensions and any(gi.profile.spec.media_extensions for gi in existing))
        ):
            _fail(_pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in range(1, len(existing) + 2) if i not in device.gpu_instances)
        gi = _GpuInstance(device, gi_id, profile, start, size)
        device.gpu_instances[gi_id] = self._register(gi)
        return gi.handle()

    @_api
    def nvmlDeviceGetGpuInstances(self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        device = self._parent(handle)
        self._mig_on(device)
        profile = device.profile_by_id(profileId)
        if profile is None:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = sorted((gi for gi in device.gpu_instances.values() if gi.profile is profile), key=lambda g: g.gi_id)
        if len(gpuInstancesRef) < len(found):
            _fail(_pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, gi in enumerate(found):
            gpuInstancesRef[k] = gi.handle()
        _out(countRef).value = len(found)
        return _pynvml.NVML_SUCCESS

    @_api
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gi = self._resolve(gpuInstance, _GpuInstance)
        info = _pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = gi.device.handle()
        info.id = gi.gi_id
        info.profileId = gi.profile.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    @_api
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gi = self._resolve(gpuInstance, _GpuInstance)
        if gi.compute_instances:
            _fail(_pynvml.NVML_ERROR_IN_USE)  # compute instances are active on it
        del gi.device.gpu_instances[gi.gi_id]
        self._retire(gi)
        return _pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ compute instances

    @_api
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device: Any, profile: int, engProfile: int,
                                                     version: int = 2) -> Any:
        gi = self._resolve(device, _GpuInstance)  # pynvml calls the GPU instance "device" here
        if (
            not 0 <= profile < _pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
            or engProfile != _pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            or version not in (1, 2)
        ):
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_PROFILE_SLICES.get(profile)
        gi_slices = gi.profile.spec.compute_slices
        if slices is None or slices > gi_slices:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (
            _pynvml.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2
            else _pynvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi_slices // slices
        info.multiprocessorCount = slices * _SMS_PER_SLICE
        if version == 2:
            prefix = "" if slices == gi_slices else f"{slices}c."
            info.name = f"MIG {prefix}{gi.profile.spec.name}".encode()
        return info

    @_api
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gi = self._resolve(gpuInstance, _GpuInstance)
        slices = _CI_PROFILE_SLICES.get(profileId)
        gi_slices = gi.profile.spec.compute_slices
        if slices is None or slices > gi_slices:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        used = sum(ci.slices for ci in gi.compute_instances.values())
        if used + slices > gi_slices:
            _fail(_pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(len(gi.compute_instances) + 1) if i not in gi.compute_instances)
        self._mig_uuids += 1
        uuid = f"MIG-{uuid_module.UUID(int=0x3160 << 64 | self._mig_uuids)}"
        ci = _ComputeInstance(gi, ci_id, profileId, slices, used, uuid)
        gi.compute_instances[ci_id] = self._register(ci)
        self._register(ci.mig)
        return ci.handle()

    @_api
    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any,
                                           countRef: Any) -> int:
        gi = self._resolve(gpuInstance, _GpuInstance)
        if profileId not in _CI_PROFILE_SLICES:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = sorted((ci for ci in gi.compute_instances.values() if ci.profile_enum == profileId),
                       key=lambda c: c.ci_id)
        if len(computeInstancesRef) < len(found):
            _fail(_pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, ci in enumerate(found):
            computeInstancesRef[k] = ci.handle()
        _out(countRef).value = len(found)
        return _pynvml.NVML_SUCCESS

    @_api
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        ci = self._resolve(computeInstance, _ComputeInstance)
        info = _pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = ci.gi.device.handle()
        info.gpuInstance = ci.gi.handle()
        info.id = ci.ci_id
        info.profileId = ci.profile_enum
        info.placement.start, info.placement.size = ci.start, ci.slices
        return info

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    @_api
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        ci = self._resolve(computeInstance, _ComputeInstance)
        del ci.gi.compute_instances[ci.ci_id]
        self._retire(ci.mig)
        self._retire(ci)
        return _pynvml.NVML_SUCCESS

    # ------------------------------------------------------------------ MIG devices

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        device = self._parent(handle)
        if device.spec is None:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device.spec.compute_slices

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        parent = self._parent(device)
        self._mig_on(parent)
        if not 0 <= index < parent.spec.compute_slices:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        migs = parent.mig_devices()
        if index >= len(migs):
            _fail(_pynvml.NVML_ERROR_NOT_FOUND)
        return migs[index].handle()

    @_api
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._resolve(device, _MigDevice).ci.gi.gi_id

    @_api
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._resolve(device, _MigDevice).ci.ci_id

    # ------------------------------------------------------------------ GPM

    @_api
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        support = _pynvml.c_nvmlGpmSupport_t()
        support.version = _pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._parent(device).gpm_supported)
        return support

    @_api
    def nvmlGpmSampleAlloc(self) -> Any:
        return self._register(_GpmSample()).handle()

    @_api
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._retire(self._resolve(gpmSample, _GpmSample))

    @_api
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        parent = self._parent(device)
        sample = self._resolve(gpmSample, _GpmSample)
        if not parent.gpm_supported:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_sequence += 1
        sample.taken = (parent.index, -1, self._gpm_sequence, dict(parent.config.activity))
        return gpmSample

    @_api
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        parent = self._parent(device)
        sample = self._resolve(gpmSample, _GpmSample)
        if not parent.gpm_supported:
            _fail(_pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = parent.gpu_instances.get(gpuInstanceId)
        if gi is None:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_sequence += 1
        sample.taken = (parent.index, gi.gi_id, self._gpm_sequence, dict(gi.activity))
        return gpmSample

    @_api
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        if metricsGet.version != _pynvml.NVML_GPM_METRICS_GET_VERSION:
            _fail(_pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._resolve(metricsGet.sample1, _GpmSample).taken
        second = self._resolve(metricsGet.sample2, _GpmSample).taken
        # Two samples of the same instance, in order: the metric is what happened between them.
        if first is None or second is None or first[:2] != second[:2] or first[2] >= second[2]:
            _fail(_pynvml.NVML_ERROR_INVALID_ARGUMENT)
        missing = {GPM_METRICS[name] for name in self.devices[second[0]].config.gpm_metrics_missing}
        by_id = {metric_id: name for name, metric_id in GPM_METRICS.items()}
        for k in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[k]
            name = by_id.get(metric.metricId)
            if name is None or metric.metricId in missing:
                metric.value, metric.nvmlReturn = 0.0, _pynvml.NVML_ERROR_NOT_SUPPORTED
            else:  # what the instance did between the samples: the figures set before the second one
                metric.value, metric.nvmlReturn = second[3].get(name, 0.0), _pynvml.NVML_SUCCESS
        return metricsGet
