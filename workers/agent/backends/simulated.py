"""Declared GPUs for rehearsing a fleet without the hardware: ``--simulate "2xA100-SXM4-40GB"``.

A simulated GPU follows the MIG rules of the catalogue (the same `mig_layout_validate` the planner uses,
so a placement NVML would refuse is refused here too, with the reason), and every record it produces is
labelled ``simulated``. MIG mode changes take effect at once (there is no GPU to reset).

MPS mode (issue 17, gpulets) is state only: there is no control daemon to start, and a runtime process on
a partition gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (and an empty ``CUDA_VISIBLE_DEVICES``) like on a
real GPU, but serves a simulated session sleeping its profiled latency. A GPU without MIG (``2xRTX-2080Ti``,
the gpulets paper's GPU) is the usual MPS host; MIG GPUs may be put in MPS mode too, with MIG disabled.

With a `state_file`, the GPUs' state (MIG mode and instances) is written after every change, atomically
(a temporary file, fsync, then ``os.replace``), and read back at start: a real GPU keeps its MIG
instances when the agent dies, so a killed and restarted agent must find the instances it made before.

Telemetry is derived from a load the agent feeds (`set_load`, the fraction of the last interval a
runtime was busy): utilisation and graphics activity are that fraction, SM activity a fixed share of it,
memory and power grow with it. The SM, memory and power figures are illustrative, chosen to look
plausible on a dashboard; nothing is measured. Figures a simulation has nothing to derive from (SM
occupancy, tensor and DRAM activity, temperature, PCI bus id, driver version) are left out.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.geometry.catalogue import (
    PLAIN_GPU_MODELS,
    GpuModelSpec,
    MigCatalogue,
    mig_catalogue_load,
    pci_device_id_format,
    plain_gpu_model_find,
)
from engine.geometry.layout import Placement, mig_layout_validate, placement_parse

from . import (
    BackendError,
    GpuInfo,
    GpuTelemetry,
    MigInstanceInfo,
    MigInstanceTelemetry,
    host_cpu_cores,
    placement_coerce,
)

__all__ = ["SimulatedBackend", "simulated_gpus_parse"]

STATE_VERSION = 1

# GPUs without MIG that can be declared too (whole-GPU runtimes): the name NVML reports and the memory
# in MiB nvidia-smi prints for them.
# (engine.geometry.catalogue.PLAIN_GPU_MODELS; RTX-2080Ti is gpulets' GPU, engine.reference's GPULET_GPU_MODEL.)
_NON_MIG_MODELS: dict[str, tuple[str, int]] = {m.name: (m.nvml_names[0], m.memory_mib) for m in PLAIN_GPU_MODELS}

# Illustrative (idle W, full-load W) per model, near the boards' idle draw and power limits; only for
# plausible telemetry.
_POWER_W: dict[str, tuple[float, float]] = {
    "A100-SXM4-40GB": (55.0, 400.0),
    "A100-SXM4-80GB": (60.0, 400.0),
    "H100-SXM5-80GB": (70.0, 700.0),
    "H100-PCIE-80GB": (50.0, 350.0),
    "H200-141GB": (75.0, 700.0),
    "T4": (10.0, 70.0),
    "L4": (16.0, 72.0),
    "RTX-2080Ti": (20.0, 250.0),
}
_POWER_DEFAULT_W = (50.0, 300.0)
# Illustrative memory use of a slice: a context's reserve when idle, plus activations when busy.
_MEMORY_IDLE_FRACTION = 0.02
_MEMORY_BUSY_FRACTION = 0.5
# Illustrative: while a slice's graphics engine is active, its kernels keep most, not all, of its SMs busy
# (DCGM's SM_ACTIVE is at most GR_ENGINE_ACTIVE).
_SM_ACTIVE_SHARE = 0.8


@dataclass(frozen=True)
class _Model:
    """A GPU model that can be declared: its catalogue entry, or None for GPUs without MIG."""

    key: str  # catalogue model name, or a _NON_MIG_MODELS key
    nvml_name: str
    memory_mb: int
    spec: GpuModelSpec | None


@dataclass
class _Instance:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str


@dataclass
class _Gpu:
    index: int
    uuid: str
    model: _Model
    mig_enabled: bool = False
    instances: dict[Placement, _Instance] = field(default_factory=dict)
    created: int = 0  # instances ever created here: numbers the MIG uuids, so none is reused
    mps_enabled: bool = False


def simulated_gpus_parse(spec: str | Sequence[str], catalogue: MigCatalogue | None = None) -> list[_Model]:
    """``"2xA100-SXM4-40GB,1xH100-SXM5-80GB"`` (or a list of such items): one entry per GPU, in index
    order. Model names are the catalogue's, any of their NVML names, or a GPU without MIG (T4, L4,
    RTX-2080Ti)."""
    catalogue = catalogue if catalogue is not None else mig_catalogue_load()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    models: list[_Model] = []
    for raw in items:
        text = str(raw).strip()
        if not text:
            continue
        match = re.fullmatch(r"(?:(\d+)\s*[x×]\s*)?(.+)", text, flags=re.IGNORECASE)
        assert match is not None  # the pattern matches any non-empty text
        count = int(match[1]) if match[1] else 1
        if count < 1:
            raise ValueError(f"simulated GPUs {text!r}: the count must be at least 1")
        models.extend([_model_resolve(match[2].strip(), catalogue)] * count)
    return models


def _model_resolve(name: str, catalogue: MigCatalogue) -> _Model:
    spec = catalogue.gpu_model_find(name)
    if spec is not None:
        # Report the NVML name of the variant declared (A100 PCIe or SXM4), else the model's first.
        reported = [n for n in spec.nvml_names if n.upper().startswith("NVIDIA")] or [spec.name]
        nvml_name = next((n for n in reported if _name_fold(n) == _name_fold(name)), reported[0])
        return _Model(spec.name, nvml_name, spec.memory_mib, spec)
    folded = re.sub(r"^(NVIDIA|TESLA)[\s-]+", "", name.strip().upper())
    folded = re.sub(r"^(NVIDIA|TESLA)[\s-]+", "", folded)
    plain = plain_gpu_model_find(name)
    known_key = plain.name if plain is not None else next((k for k in _NON_MIG_MODELS if _name_squash(k) == _name_squash(folded)), None)
    if known_key is not None:
        nvml_name, memory_mb = _NON_MIG_MODELS[known_key]
        return _Model(known_key, nvml_name, memory_mb, None)
    known = [*catalogue.gpu_model_names, *(f"{k} (no MIG)" for k in _NON_MIG_MODELS)]
    raise ValueError(f"unknown GPU model {name!r} to simulate; known models: {', '.join(known)}")


class SimulatedBackend:
    """Declared GPUs (`gpus`, see `simulated_gpus_parse`; empty for a CPU-only host). `seed` goes into
    the uuids (``GPU-sim-<seed>-<index>``), so two simulated hosts given different seeds (their host
    names, say) never report the same uuid, and one host reports the same ones on every start."""

    name = "simulated"

    def __init__(
        self,
        gpus: str | Sequence[str] = "",
        state_file: str | Path | None = None,
        seed: int | str = 0,
        *,
        catalogue: MigCatalogue | None = None,
        cpu_cores: int | None = None,
    ) -> None:
        if cpu_cores is not None and (isinstance(cpu_cores, bool) or not isinstance(cpu_cores, int) or cpu_cores < 1):
            raise ValueError(f"cpu_cores must be an integer >= 1, got {cpu_cores!r}")
        # Declared CPU cores (a simulated host, as its GPUs are declared): what the agent registers and shares
        # among vertically scaled runtimes; None: the machine's own. Runtimes then run on the machine's real
        # CPUs, oversubscribed where the declared count is larger (the agent lets them: the host is simulated).
        self._cpu_cores = cpu_cores
        self._catalogue = catalogue if catalogue is not None else mig_catalogue_load()
        self._seed = re.sub(r"[^A-Za-z0-9]+", "-", str(seed)).strip("-") or "0"
        self._gpus = [
            _Gpu(index=i, uuid=f"GPU-sim-{self._seed}-{i}", model=model)
            for i, model in enumerate(simulated_gpus_parse(gpus, self._catalogue))
        ]
        self._state_file = Path(state_file) if state_file is not None else None
        self._loads: dict[tuple[int, Placement | None], float] = {}
        self._lock = threading.RLock()
        if self._state_file is not None and self._state_file.exists():
            self._state_load(self._state_file)

    def __enter__(self) -> SimulatedBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the interface

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return [self._gpu_info(gpu) for gpu in self._gpus]

    def cpu_cores(self) -> int:
        return self._cpu_cores if self._cpu_cores is not None else host_cpu_cores()

    def mig_mode_set(self, index: int, enabled: bool) -> None:
        with self._lock:
            gpu = self._gpu(index)
            if gpu.model.spec is None:
                raise BackendError(f"gpu{index} ({gpu.model.nvml_name}) does not support MIG")
            if gpu.mig_enabled == bool(enabled):
                return
            if enabled and gpu.mps_enabled:
                raise BackendError(f"gpu{index}: cannot enable MIG while MPS is on; disable MPS first")
            if not enabled and gpu.instances:
                listed = ", ".join(str(p) for p in sorted(gpu.instances))
                raise BackendError(
                    f"gpu{index}: cannot disable MIG while it has instances ({listed}); destroy them first"
                )
            with self._change(gpu):
                gpu.mig_enabled = bool(enabled)

    def mps_mode_set(self, index: int, enabled: bool) -> None:
        with self._lock:
            gpu = self._gpu(index)
            if gpu.mps_enabled == bool(enabled):
                return
            if enabled and gpu.mig_enabled:
                raise BackendError(f"gpu{index} ({gpu.model.nvml_name}): cannot enable MPS while MIG is enabled; disable MIG first")
            with self._change(gpu):
                gpu.mps_enabled = bool(enabled)

    def mps_daemon(self, index: int) -> str | None:
        with self._lock:
            return "simulated" if self._gpu(index).mps_enabled else None  # no daemon that could die

    def mps_environment(self, index: int, percent: int) -> dict[str, str]:
        if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
            raise ValueError(f"an MPS partition is 1..100 % of the GPU, got {percent!r}")
        with self._lock:
            gpu = self._gpu(index)
            if not gpu.mps_enabled:
                raise BackendError(f"gpu{index}: MPS is not enabled")
        # No daemon, so no pipe directory: the simulated runtime sees no GPU and only the partition's share.
        return {"CUDA_VISIBLE_DEVICES": "", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)}

    def mig_instance_create(self, index: int, placement: Placement | str) -> MigInstanceInfo:
        placement = placement_coerce(placement)
        with self._lock:
            gpu = self._gpu(index)
            spec = gpu.model.spec
            if spec is None:
                raise BackendError(f"gpu{index} ({gpu.model.nvml_name}) does not support MIG")
            if not gpu.mig_enabled:
                raise BackendError(f"gpu{index} ({gpu.model.nvml_name}): MIG is not enabled")
            profile = spec.profile_find(placement.profile)
            if profile is not None:
                placement = Placement(profile.name, placement.start)
                existing = gpu.instances.get(placement)
                if existing is not None:  # already there: creating it again is a no-op
                    return _instance_info(placement, existing)
            verdict = mig_layout_validate(spec, [*gpu.instances, placement])
            if not verdict.valid:
                raise BackendError(f"gpu{index}: cannot create {placement}: {verdict.reason}")
            used = {instance.gpu_instance_id for instance in gpu.instances.values()}
            with self._change(gpu):
                gpu.created += 1
                instance = _Instance(
                    # NVML reuses the ids of destroyed instances: the lowest free one, from 1.
                    gpu_instance_id=next(i for i in range(1, len(used) + 2) if i not in used),
                    compute_instance_id=0,
                    uuid=f"MIG-sim-{self._seed}-{index}-{gpu.created}",
                )
                gpu.instances[placement] = instance
            return _instance_info(placement, instance)

    def mig_instance_destroy(self, index: int, placement: Placement | str) -> None:
        placement = placement_coerce(placement)
        with self._lock:
            gpu = self._gpu(index)
            profile = gpu.model.spec.profile_find(placement.profile) if gpu.model.spec is not None else None
            if profile is None:
                return  # a profile the GPU does not offer cannot have an instance
            placement = Placement(profile.name, placement.start)
            if placement not in gpu.instances:
                return
            with self._change(gpu):
                del gpu.instances[placement]
            self._loads.pop((index, placement), None)

    def set_load(self, index: int, placement: Placement | str | None, busy_fraction: float) -> None:
        """Feed the telemetry: the fraction of the last interval the runtime on `placement` (None: the
        whole GPU) was busy, from 0 to 1."""
        busy = float(busy_fraction)
        if not 0.0 <= busy <= 1.0 or math.isnan(busy):
            raise ValueError(f"busy_fraction must be between 0 and 1, got {busy_fraction!r}")
        with self._lock:
            gpu = self._gpu(index)
            key = None if placement is None else placement_coerce(placement)
            if key is not None and gpu.model.spec is not None:
                profile = gpu.model.spec.profile_find(key.profile)
                key = Placement(profile.name, key.start) if profile is not None else key
            self._loads[(index, key)] = busy

    def telemetry(self) -> list[GpuTelemetry]:
        with self._lock:
            return [self._gpu_telemetry(gpu) for gpu in self._gpus]

    def catalogue_disagreements(self) -> list[str]:
        return []  # simulated GPUs follow the catalogue by construction

    def close(self) -> None:
        pass  # every change is on disk already

    # ------------------------------------------------------------------ records

    def _gpu(self, index: int) -> _Gpu:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise BackendError(f"no gpu{index} on this host ({len(self._gpus)} simulated GPU(s))")
        return self._gpus[index]

    def _gpu_info(self, gpu: _Gpu) -> GpuInfo:
        spec = gpu.model.spec
        return GpuInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            model_name=gpu.model.nvml_name,
            memory_mb=gpu.model.memory_mb,
            mig_capable=spec is not None,
            mig_enabled=gpu.mig_enabled,
            instances=tuple(_instance_info(p, gpu.instances[p]) for p in sorted(gpu.instances)),
            # What NVML would report: the catalogue's starts, and only while MIG is on.
            placements={p.name: p.starts for p in spec.profiles} if spec is not None and gpu.mig_enabled else {},
            simulated=True,
            mps_enabled=gpu.mps_enabled,
            pci_device_id=pci_device_id_format(spec.pci_device_ids[0]) if spec is not None and spec.pci_device_ids else "",
        )

    def _gpu_telemetry(self, gpu: _Gpu) -> GpuTelemetry:
        idle_w, full_w = _POWER_W.get(gpu.model.key, _POWER_DEFAULT_W)
        spec = gpu.model.spec
        if not gpu.mig_enabled or spec is None:
            busy = self._loads.get((gpu.index, None), 0.0)
            used_mb = _memory_used(gpu.model.memory_mb, busy)
            return GpuTelemetry(
                index=gpu.index,
                uuid=gpu.uuid,
                utilization_pct=100.0 * busy,
                memory_used_mb=used_mb,
                memory_free_mb=gpu.model.memory_mb - used_mb,
                power_w=idle_w + (full_w - idle_w) * busy,
                simulated=True,
                gr_engine_active_pct=100.0 * busy,
                sm_active_pct=100.0 * _SM_ACTIVE_SHARE * busy,
            )
        rows = []
        compute_busy = 0.0  # busy fraction of the whole GPU's SMs, for power
        for placement in sorted(gpu.instances):
            profile = spec.profile_get(placement.profile)
            busy = self._loads.get((gpu.index, placement), 0.0)
            capacity_mb = gpu.model.memory_mb * profile.memory_slices / spec.memory_slices
            used_mb = _memory_used(capacity_mb, busy)
            rows.append(MigInstanceTelemetry(
                placement=placement,
                uuid=gpu.instances[placement].uuid,
                gr_engine_active_pct=100.0 * busy,
                memory_used_mb=used_mb,
                memory_free_mb=capacity_mb - used_mb,
                sm_active_pct=100.0 * _SM_ACTIVE_SHARE * busy,
            ))
            compute_busy += busy * profile.compute_slices / spec.compute_slices
        used_mb = sum(row.memory_used_mb or 0.0 for row in rows)
        return GpuTelemetry(
            index=gpu.index,
            uuid=gpu.uuid,
            utilization_pct=None,  # as NVML: no whole-GPU utilisation under MIG
            memory_used_mb=used_mb,
            memory_free_mb=gpu.model.memory_mb - used_mb,
            power_w=idle_w + (full_w - idle_w) * compute_busy,
            simulated=True,
            instances=tuple(rows),
        )

    # ------------------------------------------------------------------ persistence

    @contextlib.contextmanager
    def _change(self, gpu: _Gpu):
        """Apply a change to `gpu` and persist it; if it cannot be written, undo it, so memory never
        holds a state a restart would not find."""
        before = dataclasses.replace(gpu, instances=dict(gpu.instances))
        yield
        try:
            self._state_save()
        except OSError as exc:
            self._gpus[gpu.index] = before
            raise BackendError(f"cannot save the simulated GPU state to {self._state_file}: {exc}") from exc

    def _state_data(self) -> dict:
        return {
            "version": STATE_VERSION,
            "gpus": [
                {
                    "index": gpu.index,
                    "model": gpu.model.key,
                    "uuid": gpu.uuid,
                    "mig_enabled": gpu.mig_enabled,
                    "mps_enabled": gpu.mps_enabled,
                    "created": gpu.created,
                    "instances": [
                        {
                            "placement": str(placement),
                            "gpu_instance_id": gpu.instances[placement].gpu_instance_id,
                            "compute_instance_id": gpu.instances[placement].compute_instance_id,
                            "uuid": gpu.instances[placement].uuid,
                        }
                        for placement in sorted(gpu.instances)
                    ],
                }
                for gpu in self._gpus
            ],
        }

    def _state_save(self) -> None:
        path = self._state_file
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(self._state_data(), out, indent=2, sort_keys=True)
                out.write("\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)  # readers see the old file or the new one, never half of one
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        # The rename itself is durable only once the directory is synced.
        with contextlib.suppress(OSError):
            directory = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def _state_load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot read the simulated GPU state {path}: {exc}") from exc
        try:
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            stored = [(g["model"], g["uuid"]) for g in data["gpus"]]
            declared = [(gpu.model.key, gpu.uuid) for gpu in self._gpus]
            if stored != declared:
                raise BackendError(
                    f"the simulated GPU state {path} is for GPUs {stored}, but this backend declares "
                    f"{declared}: declare the same GPUs and seed, or remove the file to start from fresh GPUs"
                )
            for gpu, raw in zip(self._gpus, data["gpus"]):
                instances = {
                    placement_parse(item["placement"]): _Instance(
                        int(item["gpu_instance_id"]), int(item["compute_instance_id"]), str(item["uuid"])
                    )
                    for item in raw["instances"]
                }
                if instances and (gpu.model.spec is None or not raw["mig_enabled"]):
                    raise ValueError(f"gpu{gpu.index} has instances without MIG")
                if gpu.model.spec is not None:
                    verdict = mig_layout_validate(gpu.model.spec, list(instances))
                    if not verdict.valid:
                        raise ValueError(f"gpu{gpu.index}: {verdict.reason}")
                gpu.mig_enabled = bool(raw["mig_enabled"])
                gpu.mps_enabled = bool(raw.get("mps_enabled", False))  # absent in files written before MPS
                if gpu.mig_enabled and gpu.mps_enabled:
                    raise ValueError(f"gpu{gpu.index} has both MIG and MPS enabled")
                gpu.created = int(raw["created"])
                gpu.instances = instances
        except BackendError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BackendError(f"the simulated GPU state {path} is malformed: {exc}") from exc


def _instance_info(placement: Placement, instance: _Instance) -> MigInstanceInfo:
    return MigInstanceInfo(
        placement=placement,
        uuid=instance.uuid,
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
    )


def _name_squash(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name).upper()


def _name_fold(name: str) -> str:
    return re.sub(r"[\s_\-]+", "-", name.strip().lower()).removeprefix("nvidia-")


def _memory_used(capacity_mb: float, busy: float) -> float:
    return capacity_mb * (_MEMORY_IDLE_FRACTION + _MEMORY_BUSY_FRACTION * busy)
