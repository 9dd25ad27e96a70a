"""The worker agent's device backends (workers/agent/backends).

One behavioural suite runs against both backends: `NvmlBackend` over the fake pynvml
(tests/workers/fake_pynvml.py, which follows NVML's semantics) and `SimulatedBackend`. Then what only one
of them does: NVML's pending MIG mode, catalogue disagreements, GPM and error mapping; the simulated
backend's spec, uuids and crash-safe state file. Last, a test that reads a real GPU through NVML, skipped
where there is none.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pynvml
import pytest

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import Placement, mig_layout_diff, placement_parse
from tests.gpu import gpu_absent_reason
from tests.workers.fake_pynvml import FakeGpu, FakeNvml
from workers.agent.backends import (
    BackendError,
    DeviceBackend,
    GpuInfo,
    MigInstanceInfo,
    backend_make,
    catalogue_compare,
    host_cpu_cores,
)
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.backends.simulated import SimulatedBackend, simulated_gpus_parse

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = mig_catalogue_load()
A100, H100, T4 = 0, 1, 2  # the GPUs of every harness, by index


def p(text: str) -> Placement:
    return placement_parse(text)


# --------------------------------------------------------------------------- the two backends


class NvmlHarness:
    """NvmlBackend over a fake NVML; the fake keeps the GPUs' state across backends, as GPUs do."""

    kind = "nvml"

    def __init__(self, tmp_path: Path) -> None:
        self.fake = FakeNvml([FakeGpu("A100-SXM4-40GB"), FakeGpu("H100-SXM5-80GB"), FakeGpu("Tesla T4")])

    def make(self) -> NvmlBackend:
        return NvmlBackend(nvml=self.fake)

    def activity_set(self, backend: DeviceBackend, index: int, placement: str, pct: float) -> None:
        self.fake.instance_activity_set(index, placement, gr_engine_active_pct=pct, memory_used_mb=1000.0)

    def busy_set(self, backend: DeviceBackend, index: int, pct: float) -> None:
        self.fake.gpu_activity_set(index, utilization_pct=pct)


class SimulatedHarness:
    """SimulatedBackend with a state file; a restart is a new backend on the same file."""

    kind = "simulated"

    def __init__(self, tmp_path: Path) -> None:
        self.state_file = tmp_path / "state" / "simulated-gpus.json"

    def make(self) -> SimulatedBackend:
        return SimulatedBackend(gpus="A100-SXM4-40GB, 1xH100-SXM5-80GB, T4", state_file=self.state_file, seed="t")

    def activity_set(self, backend: DeviceBackend, index: int, placement: str, pct: float) -> None:
        backend.set_load(index, placement, pct / 100.0)

    def busy_set(self, backend: DeviceBackend, index: int, pct: float) -> None:
        backend.set_load(index, None, pct / 100.0)


@pytest.fixture(params=[NvmlHarness, SimulatedHarness], ids=["nvml", "simulated"])
def harness(request, tmp_path):
    return request.param(tmp_path)


@pytest.fixture
def backend(harness):
    made = harness.make()
    yield made
    made.close()


@pytest.fixture
def a100_mig(backend):
    backend.mig_mode_set(A100, True)
    return backend


# --------------------------------------------------------------------------- the shared behaviour


def test_backend_follows_the_protocol(backend, harness):
    assert isinstance(backend, DeviceBackend)
    assert backend.name == harness.kind
    assert backend.cpu_cores() == host_cpu_cores() >= 1


def test_inventory_lists_every_gpu_with_mig_off(backend, harness):
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.model_name for g in gpus] == ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "Tesla T4"]
    assert [g.memory_mb for g in gpus] == [40960, 81559, 15360]
    assert [g.mig_capable for g in gpus] == [True, True, False]
    assert not any(g.mig_enabled or g.instances or g.placements for g in gpus)
    assert all(g.uuid.startswith("GPU-") for g in gpus) and len({g.uuid for g in gpus}) == 3
    assert all(g.simulated == (harness.kind == "simulated") for g in gpus)
    # The model names resolve in the catalogue, which is how the agent finds a GPU's MIG rules.
    assert CATALOGUE.gpu_model_find(gpus[A100].model_name).name == "A100-SXM4-40GB"


def test_enabling_mig_reports_the_catalogue_placements(backend):
    backend.mig_mode_set(A100, True)
    backend.mig_mode_set(A100, True)  # already enabled: nothing to do
    gpu = backend.gpus()[A100]
    assert gpu.mig_enabled and gpu.instances == ()
    model = CATALOGUE.gpu_model_get("A100-SXM4-40GB")
    assert gpu.placements == {profile.name: profile.starts for profile in model.profiles}
    assert catalogue_compare(gpu) == []
    assert backend.catalogue_disagreements() == []


def test_create_at_legal_placements_lists_instances_with_uuids(a100_mig):
    first = a100_mig.mig_instance_create(A100, p("4g.20gb@0"))
    second = a100_mig.mig_instance_create(A100, "3g.20gb@4")  # text works too
    assert isinstance(first, MigInstanceInfo)
    assert (first.placement, second.placement) == (p("4g.20gb@0"), p("3g.20gb@4"))
    gpu = a100_mig.gpus()[A100]
    assert gpu.layout == (p("4g.20gb@0"), p("3g.20gb@4"))
    assert set(gpu.instances) == {first, second}
    assert all(i.uuid.startswith("MIG-") and i.compute_instance_id is not None for i in gpu.instances)
    assert first.uuid != second.uuid and first.gpu_instance_id != second.gpu_instance_id
    assert gpu.instance_at(p("3g.20gb@4")) == second and gpu.instance_at(p("3g.20gb@0")) is None
    # The layout read back feeds the planner's diff: nothing to do when it is the target.
    diff = mig_layout_diff("A100-SXM4-40GB", gpu.layout, ["4g.20gb@0", "3g.20gb@4"])
    assert diff.operations == ()


def test_seven_small_instances_fill_the_gpu_with_distinct_ids(a100_mig):
    made = [a100_mig.mig_instance_create(A100, Placement("1g.5gb", start)) for start in range(7)]
    assert len({i.uuid for i in made}) == 7 and len({i.gpu_instance_id for i in made}) == 7
    with pytest.raises(BackendError, match="1g.5gb@7"):
        a100_mig.mig_instance_create(A100, Placement("1g.5gb", 7))  # no such start: the 8th slice is not a 1g


def test_overlap_is_refused_with_a_clear_error(a100_mig):
    a100_mig.mig_instance_create(A100, p("4g.20gb@0"))
    with pytest.raises(BackendError, match=r"gpu0: cannot create 2g\.10gb@2: .*overlaps.*memory slices 2-3"):
        a100_mig.mig_instance_create(A100, p("2g.10gb@2"))
    assert a100_mig.gpus()[A100].layout == (p("4g.20gb@0"),)


def test_illegal_start_is_refused(a100_mig):
    with pytest.raises(BackendError, match=r"start 2 is not a legal start for 3g\.20gb.*0, 4"):
        a100_mig.mig_instance_create(A100, p("3g.20gb@2"))
    assert a100_mig.gpus()[A100].instances == ()


def test_profile_of_another_model_is_refused(a100_mig):
    with pytest.raises(BackendError, match=r"3g\.40gb.*does not exist"):
        a100_mig.mig_instance_create(A100, p("3g.40gb@0"))  # an H100 / A100-80GB profile


def test_create_needs_mig_enabled(backend):
    with pytest.raises(BackendError, match="MIG is not enabled"):
        backend.mig_instance_create(H100, p("3g.40gb@4"))
    with pytest.raises(BackendError, match="does not support MIG"):
        backend.mig_instance_create(T4, p("1g.5gb@0"))


def test_creating_an_existing_instance_returns_it(a100_mig):
    first = a100_mig.mig_instance_create(A100, p("3g.20gb@4"))
    again = a100_mig.mig_instance_create(A100, p("3g.20gb@4"))
    assert again == first
    assert len(a100_mig.gpus()[A100].instances) == 1


def test_destroy_is_idempotent(a100_mig):
    a100_mig.mig_instance_create(A100, p("4g.20gb@0"))
    kept = a100_mig.mig_instance_create(A100, p("3g.20gb@4"))
    a100_mig.mig_instance_destroy(A100, p("4g.20gb@0"))
    a100_mig.mig_instance_destroy(A100, p("4g.20gb@0"))  # already gone
    a100_mig.mig_instance_destroy(A100, p("2g.10gb@2"))  # never existed
    a100_mig.mig_instance_destroy(H100, p("3g.40gb@0"))  # MIG off there
    a100_mig.mig_instance_destroy(T4, p("1g.5gb@0"))  # no MIG at all
    assert a100_mig.gpus()[A100].instances == (kept,)
    # The freed slices take a new instance.
    a100_mig.mig_instance_create(A100, p("2g.10gb@2"))
    assert a100_mig.gpus()[A100].layout == (p("2g.10gb@2"), p("3g.20gb@4"))


def test_instances_survive_an_agent_restart(harness, backend):
    backend.mig_mode_set(A100, True)
    backend.mig_mode_set(H100, True)
    made = backend.mig_instance_create(A100, p("3g.20gb@4"))
    on_h100 = backend.mig_instance_create(H100, p("7g.80gb@0"))
    before = backend.gpus()
    backend.close()
    backend.close()  # closing twice is harmless
    restarted = harness.make()
    try:
        after = restarted.gpus()
        assert after == before
        assert after[A100].instances == (made,) and after[H100].instances == (on_h100,)
        # The restarted agent carries on: destroy what the previous one made, create anew.
        restarted.mig_instance_destroy(A100, p("3g.20gb@4"))
        assert restarted.mig_instance_create(A100, p("3g.20gb@0")).uuid != made.uuid
    finally:
        restarted.close()


def test_disabling_mig_needs_the_instances_gone(a100_mig):
    a100_mig.mig_instance_create(A100, p("1g.5gb@3"))
    with pytest.raises(BackendError, match=r"cannot disable MIG.*1g\.5gb@3.*destroy them first"):
        a100_mig.mig_mode_set(A100, False)
    a100_mig.mig_instance_destroy(A100, p("1g.5gb@3"))
    a100_mig.mig_mode_set(A100, False)
    gpu = a100_mig.gpus()[A100]
    assert not gpu.mig_enabled and gpu.placements == {}


def test_gpu_without_mig_refuses_mig_mode(backend):
    with pytest.raises(BackendError, match=r"gpu2 \(Tesla T4\) does not support MIG"):
        backend.mig_mode_set(T4, True)


def test_unknown_gpu_is_a_backend_error(backend):
    with pytest.raises(BackendError, match="no gpu7"):
        backend.mig_mode_set(7, True)
    with pytest.raises(BackendError, match="no gpu7"):
        backend.mig_instance_create(7, p("1g.5gb@0"))


def test_telemetry_shape(harness, backend):
    backend.mig_mode_set(H100, True)
    instance = backend.mig_instance_create(H100, p("3g.40gb@4"))
    harness.activity_set(backend, H100, "3g.40gb@4", 64.0)
    harness.busy_set(backend, T4, 30.0)
    backend.telemetry()  # activity is measured between two samples
    samples = backend.telemetry()
    assert [t.index for t in samples] == [0, 1, 2]
    assert [t.uuid for t in samples] == [g.uuid for g in backend.gpus()]
    assert all(t.simulated == (harness.kind == "simulated") for t in samples)
    h100, t4 = samples[H100], samples[T4]
    assert h100.utilization_pct is None  # NVML gives no whole-GPU utilisation under MIG
    (row,) = h100.instances
    assert (row.placement, row.uuid) == (instance.placement, instance.uuid)
    assert row.gr_engine_active_pct == pytest.approx(64.0)
    assert row.memory_used_mb is not None and row.memory_used_mb > 0
    assert h100.memory_used_mb >= row.memory_used_mb
    assert t4.utilization_pct == pytest.approx(30.0) and t4.instances == ()
    assert all(t.power_w is None or t.power_w > 0 for t in samples)
    assert all(isinstance(t.memory_used_mb, float) for t in samples)


# --------------------------------------------------------------------------- the pure comparison


def _gpu(placements: dict[str, tuple[int, ...]], model: str = "NVIDIA A100-SXM4-40GB", capable: bool = True) -> GpuInfo:
    return GpuInfo(index=0, uuid="GPU-x", model_name=model, memory_mb=40960, mig_capable=capable,
                   mig_enabled=bool(placements), placements=placements)


def test_catalogue_compare():
    model = CATALOGUE.gpu_model_get("A100-SXM4-40GB")
    agreeing = {profile.name: profile.starts for profile in model.profiles}
    assert catalogue_compare(_gpu(agreeing)) == []
    assert catalogue_compare(_gpu({})) == []  # MIG off: nothing reported, nothing to compare
    assert catalogue_compare(_gpu({"3g.20gb": (4,)}, model="Tesla T4", capable=False)) == []

    assert catalogue_compare(_gpu({**agreeing, "3g.20gb": (4, 0)})) == []  # the order does not matter
    differing = {**agreeing, "3g.20gb": (4,)}
    assert catalogue_compare(_gpu(differing)) == ["gpu0 3g.20gb: NVML reports starts [4], the catalogue [0, 4]"]

    missing = {name: starts for name, starts in agreeing.items() if name != "1g.5gb+me"}
    extra = {**agreeing, "1g.5gb+gfx": (0, 1)}
    assert catalogue_compare(_gpu(missing)) == [
        "gpu0 1g.5gb+me: the catalogue lists starts [0, 1, 2, 3, 4, 5, 6], NVML does not report the profile"
    ]
    assert catalogue_compare(_gpu(extra)) == [
        "gpu0 1g.5gb+gfx: NVML reports starts [0, 1], the catalogue does not list the profile for A100-SXM4-40GB"
    ]
    (line,) = catalogue_compare(_gpu({"1g.5gb": (0,)}, model="NVIDIA A800 40GB PCIe"))
    assert line.startswith("gpu0 NVIDIA A800 40GB PCIe: NVML reports MIG profiles ['1g.5gb'], but the catalogue does not know")


# --------------------------------------------------------------------------- NVML only


def nvml_backend(*gpus: FakeGpu | str) -> tuple[FakeNvml, NvmlBackend]:
    fake = FakeNvml(list(gpus))
    return fake, NvmlBackend(nvml=fake)


def test_nvml_pending_mig_mode_change_asks_for_a_reset():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", reset_required=True))
    with pytest.raises(BackendError, match=r"gpu0 .*MIG mode change to enabled is pending.*GPU reset.*ResetRequired"):
        backend.mig_mode_set(0, True)
    assert not backend.gpus()[0].mig_enabled
    with pytest.raises(BackendError, match="pending a GPU reset"):
        backend.mig_instance_create(0, p("7g.40gb@0"))
    fake.gpu_reset(0)  # the operator resets the GPU: the pending mode takes effect
    assert backend.gpus()[0].mig_enabled
    backend.mig_mode_set(0, True)  # nothing left to do
    backend.mig_instance_create(0, p("7g.40gb@0"))
    backend.close()


def test_nvml_reports_catalogue_disagreements():
    fake, backend = nvml_backend(
        FakeGpu("A100-SXM4-40GB", mig_enabled=True, placements_override={"3g.20gb": [4]}),
        FakeGpu("H100-SXM5-80GB", mig_enabled=True, placements_override={"1g.20gb": [(0, 1), (2, 1)]},
                profile_names_override={"2g.20gb": "2g.24gb"}),
        FakeGpu("A100-SXM4-80GB"),  # MIG off: nothing to compare
    )
    assert backend.gpus()[0].placements["3g.20gb"] == (4,)
    assert backend.catalogue_disagreements() == [
        "gpu0 3g.20gb: NVML reports starts [4], the catalogue [0, 4]",
        "gpu1 1g.20gb: NVML reports starts [0, 2], the catalogue [0, 2, 4, 6]",
        "gpu1 1g.20gb: NVML reports placements of [1] memory slices, the catalogue 2",
        "gpu1 2g.20gb: NVML names profile id 14 '2g.24gb', the catalogue '2g.20gb'",
    ]
    # The hardware has the last word on what it accepts.
    with pytest.raises(BackendError, match=r"start 0 is not a legal start for 3g\.20gb .*NVML reports starts 4"):
        backend.mig_instance_create(0, p("3g.20gb@0"))
    backend.mig_instance_create(0, p("3g.20gb@4"))
    backend.close()


def test_nvml_refusal_is_a_backend_error_with_nvml_text():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    backend.mig_instance_create(0, p("4g.20gb@0"))
    # NVML refuses what the backend's own checks let through (another process took the slices, say).
    fake.fail_next("nvmlDeviceCreateGpuInstanceWithPlacement", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    refusal = r"cannot create 3g\.20gb@4: NVML has no room.*instances now: 4g\.20gb@0.*InsufficientResources"
    with pytest.raises(BackendError, match=refusal):
        backend.mig_instance_create(0, p("3g.20gb@4"))
    assert fake.layout(0) == ["4g.20gb@0"]
    backend.close()


def test_nvml_failed_compute_instance_leaves_no_gpu_instance_behind():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    fake.fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(BackendError, match=r"compute instance of 3g\.20gb@4"):
        backend.mig_instance_create(0, p("3g.20gb@4"))
    assert fake.layout(0) == [] and backend.gpus()[0].instances == ()
    backend.close()


def test_nvml_completes_a_gpu_instance_left_without_compute_instance():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    # An agent killed between the two creations leaves a bare GPU instance behind.
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 4, 4
    fake.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, pynvml.byref(placement))  # 9: 3g.20gb
    (bare,) = backend.gpus()[0].instances
    assert (bare.placement, bare.uuid, bare.compute_instance_id) == (p("3g.20gb@4"), "", None)
    completed = backend.mig_instance_create(0, p("3g.20gb@4"))
    assert completed.uuid.startswith("MIG-") and completed.compute_instance_id == 0
    assert completed.gpu_instance_id == bare.gpu_instance_id
    assert fake.compute_instance_count(0, "3g.20gb@4") == 1
    backend.mig_instance_destroy(0, p("3g.20gb@4"))  # compute instance first, then the GPU instance
    assert fake.layout(0) == []
    backend.close()


def test_nvml_in_use_instance_is_reported():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    backend.mig_instance_create(0, p("7g.40gb@0"))
    fake.fail_next("nvmlComputeInstanceDestroy", pynvml.NVML_ERROR_IN_USE)  # a CUDA process runs there
    with pytest.raises(BackendError, match=r"cannot destroy 7g\.40gb@0: it is in use"):
        backend.mig_instance_destroy(0, p("7g.40gb@0"))
    assert fake.layout(0) == ["7g.40gb@0"]
    backend.close()


def test_nvml_without_gpm_reports_no_instance_activity():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))  # Ampere: no GPM
    backend.mig_instance_create(0, p("3g.20gb@0"))
    fake.instance_activity_set(0, "3g.20gb@0", gr_engine_active_pct=80.0, memory_used_mb=512.0)
    for _ in range(3):
        (sample,) = backend.telemetry()
        (row,) = sample.instances
        assert row.gr_engine_active_pct is None and row.memory_used_mb == pytest.approx(512.0)
    backend.close()


def test_nvml_gpm_samples_follow_the_instances():
    fake, backend = nvml_backend(FakeGpu("H100-SXM5-80GB", mig_enabled=True))
    backend.mig_instance_create(0, p("4g.40gb@0"))
    fake.instance_activity_set(0, "4g.40gb@0", gr_engine_active_pct=25.0)
    assert backend.telemetry()[0].instances[0].gr_engine_active_pct is None  # one sample so far
    assert backend.telemetry()[0].instances[0].gr_engine_active_pct == pytest.approx(25.0)
    # The GPU instance id is reused by the next instance: its first reading starts afresh.
    backend.mig_instance_destroy(0, p("4g.40gb@0"))
    backend.mig_instance_create(0, p("3g.40gb@4"))
    fake.instance_activity_set(0, "3g.40gb@4", gr_engine_active_pct=90.0)
    assert backend.telemetry()[0].instances[0].gr_engine_active_pct is None
    assert backend.telemetry()[0].instances[0].gr_engine_active_pct == pytest.approx(90.0)
    backend.close()
    assert fake.calls.count("nvmlGpmSampleAlloc") == fake.calls.count("nvmlGpmSampleFree")


def test_nvml_power_and_utilisation_come_from_nvml():
    fake, backend = nvml_backend("Tesla T4")
    fake.gpu_activity_set(0, utilization_pct=42.0, power_w=55.5, memory_used_mb=2048.0)
    (sample,) = backend.telemetry()
    assert (sample.utilization_pct, sample.power_w, sample.memory_used_mb) == (42.0, 55.5, 2048.0)
    backend.close()


def test_nvml_permission_errors_say_root_is_needed():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    fake.fail_next("nvmlDeviceGetGpuInstances", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(BackendError, match="reading the GPUs: .*NoPermission.*need root"):
        backend.gpus()
    backend.close()


def test_nvml_drivers_without_named_profile_info_fall_back_to_v1():
    fake, backend = nvml_backend(FakeGpu("A100-SXM4-40GB", mig_enabled=True))
    # The first profile query finds no v2 entry point: that profile is read through the v1 structure.
    fake.fail_next("nvmlDeviceGetGpuInstanceProfileInfo", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    model = CATALOGUE.gpu_model_get("A100-SXM4-40GB")
    assert backend.gpus()[0].placements == {profile.name: profile.starts for profile in model.profiles}
    assert backend.catalogue_disagreements() == []
    backend.close()


def test_nvml_init_failure_and_close():
    fake = FakeNvml(["Tesla T4"])
    fake.fail_next("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendError, match="cannot initialise NVML.*DriverNotLoaded"):
        NvmlBackend(nvml=fake)
    with NvmlBackend(nvml=fake) as backend:
        assert fake.initialised == 1
        backend.gpus()
    assert fake.initialised == 0  # nvmlShutdown matched the nvmlInit
    with pytest.raises(BackendError, match="closed"):
        backend.gpus()


def test_fake_nvml_keeps_nvml_rules():
    """The fake itself, called as the backend would call pynvml: its refusals are NVML's."""
    fake = FakeNvml([FakeGpu("A100-SXM4-40GB"), "Tesla T4"])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    gpu, t4 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(t4)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # profiles only while MIG is on
        fake.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert fake.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert fake.nvmlDeviceGetMigMode(gpu) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetUtilizationRates(gpu)
    info = fake.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (9, 3, 2, "MIG 3g.20gb")

    def create(start: int, size: int, profile_id: int = 9):
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        return fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, profile_id, pynvml.byref(placement))

    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(2, 4)  # not a possible placement of 3g.20gb
    with pytest.raises(TypeError, match="byref"):
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, placement)
    first = create(0, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(2, 2, profile_id=14)  # 2g.10gb@2 overlaps 3g.20gb@0
    second = create(4, 4)
    ids = {fake.nvmlGpuInstanceGetInfo(h).id for h in (first, second)}
    assert len(ids) == 2
    ci_info = fake.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        first, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    ci = fake.nvmlGpuInstanceCreateComputeInstance(first, ci_info.id)
    with pytest.raises(pynvml.NVMLError_InUse):
        fake.nvmlGpuInstanceDestroy(first)
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert fake.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert fake.nvmlDeviceGetGpuInstanceId(mig) == fake.nvmlGpuInstanceGetInfo(first).id
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    fake.nvmlComputeInstanceDestroy(ci)
    fake.nvmlGpuInstanceDestroy(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlGpuInstanceDestroy(first)  # a stale handle
    with pytest.raises(AttributeError, match="does not implement nvmlDeviceCreateGpuInstance"):
        fake.nvmlDeviceCreateGpuInstance  # noqa: B018 - only explicit placements are faked
    assert fake.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE


# --------------------------------------------------------------------------- simulated only


def test_simulated_spec_parsing():
    models = simulated_gpus_parse("2xA100-SXM4-40GB,1xH100-SXM5-80GB")
    assert [m.key for m in models] == ["A100-SXM4-40GB", "A100-SXM4-40GB", "H100-SXM5-80GB"]
    assert [m.key for m in simulated_gpus_parse(["NVIDIA H200", "3 x t4"])] == ["H200-141GB", "T4", "T4", "T4"]
    assert simulated_gpus_parse("") == [] and simulated_gpus_parse(" , ") == []
    # A variant of a catalogue model is reported under its own NVML name.
    assert [m.nvml_name for m in simulated_gpus_parse("A100-PCIE-40GB,H100-PCIE-80GB")] == [
        "NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe",
    ]
    with pytest.raises(ValueError, match=r"unknown GPU model 'V100'.*known models: A100-SXM4-40GB.*T4 \(no MIG\)"):
        simulated_gpus_parse("1xV100")
    with pytest.raises(ValueError, match="at least 1"):
        simulated_gpus_parse("0xA100-SXM4-40GB")


def test_simulated_uuids_are_deterministic_and_seeded():
    one = SimulatedBackend(gpus="2xA100-SXM4-40GB", seed="sim-a100-01")
    two = SimulatedBackend(gpus="2xA100-SXM4-40GB", seed="sim-a100-01")
    other = SimulatedBackend(gpus="2xA100-SXM4-40GB", seed=7)
    assert [g.uuid for g in one.gpus()] == ["GPU-sim-sim-a100-01-0", "GPU-sim-sim-a100-01-1"]
    assert [g.uuid for g in other.gpus()] == ["GPU-sim-7-0", "GPU-sim-7-1"]
    for backend in (one, two):
        backend.mig_mode_set(1, True)
    assert one.mig_instance_create(1, p("2g.10gb@4")) == two.mig_instance_create(1, p("2g.10gb@4"))
    assert one.gpus()[1].instances[0].uuid == "MIG-sim-sim-a100-01-1-1"
    assert SimulatedBackend().gpus() == []  # a CPU-only host


def test_simulated_illegal_layouts_give_the_catalogue_reason():
    backend = SimulatedBackend(gpus="A100-SXM4-40GB")
    backend.mig_mode_set(0, True)
    backend.mig_instance_create(0, p("1g.5gb+me@0"))
    with pytest.raises(BackendError, match=r"at most one media-extension"):
        backend.mig_instance_create(0, p("1g.5gb+me@1"))
    backend.mig_instance_create(0, p("3g.20gb@4"))
    with pytest.raises(BackendError, match="compute slices sum to 8"):
        backend.mig_instance_create(0, p("4g.20gb@0"))  # 1 + 3 + 4 compute slices of 7


def test_simulated_state_file_is_written_atomically(tmp_path):
    state = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend(gpus="A100-SXM4-40GB,H100-SXM5-80GB", state_file=state, seed="h")
    assert not state.exists()  # nothing changed yet
    backend.mig_mode_set(0, True)
    backend.mig_instance_create(0, p("3g.20gb@4"))
    data = json.loads(state.read_text())
    assert data["gpus"][0]["mig_enabled"] is True and data["gpus"][1]["mig_enabled"] is False
    assert [i["placement"] for i in data["gpus"][0]["instances"]] == ["3g.20gb@4"]
    assert sorted(os.listdir(tmp_path)) == ["simulated-gpus.json"]  # no temporary file left behind


def test_simulated_state_file_must_match_the_declared_gpus(tmp_path):
    state = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend(gpus="A100-SXM4-40GB", state_file=state, seed="h")
    backend.mig_mode_set(0, True)
    with pytest.raises(BackendError, match="declare the same GPUs and seed, or remove the file"):
        SimulatedBackend(gpus="H100-SXM5-80GB", state_file=state, seed="h")
    with pytest.raises(BackendError, match="declare the same GPUs and seed"):
        SimulatedBackend(gpus="A100-SXM4-40GB", state_file=state, seed="other-host")
    state.write_text("{not json")
    with pytest.raises(BackendError, match="cannot read the simulated GPU state"):
        SimulatedBackend(gpus="A100-SXM4-40GB", state_file=state, seed="h")
    state.write_text(json.dumps({"version": 1, "gpus": [{
        "index": 0, "model": "A100-SXM4-40GB", "uuid": "GPU-sim-h-0", "mig_enabled": True, "created": 2,
        "instances": [{"placement": "4g.20gb@0", "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": "a"},
                      {"placement": "3g.20gb@0", "gpu_instance_id": 2, "compute_instance_id": 0, "uuid": "b"}],
    }]}))
    with pytest.raises(BackendError, match="malformed.*overlaps"):
        SimulatedBackend(gpus="A100-SXM4-40GB", state_file=state, seed="h")


def test_simulated_change_that_cannot_be_saved_is_undone(tmp_path):
    (tmp_path / "a-file").write_text("")
    backend = SimulatedBackend(gpus="A100-SXM4-40GB", state_file=tmp_path / "a-file" / "state.json")
    with pytest.raises(BackendError, match="cannot save the simulated GPU state"):
        backend.mig_mode_set(0, True)
    assert not backend.gpus()[0].mig_enabled  # memory never holds what a restart would not find


def test_simulated_state_survives_a_killed_agent(tmp_path):
    """A process that made an instance and died by SIGKILL, with no clean-up: the next one finds it."""
    state = tmp_path / "simulated-gpus.json"
    script = textwrap.dedent(f"""
        import os, signal
        from workers.agent.backends.simulated import SimulatedBackend
        backend = SimulatedBackend(gpus="A100-SXM4-40GB", state_file={str(state)!r}, seed="k")
        backend.mig_mode_set(0, True)
        made = backend.mig_instance_create(0, "4g.20gb@0")
        print(made.uuid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGKILL, run.stderr
    restarted = SimulatedBackend(gpus="A100-SXM4-40GB", state_file=state, seed="k")
    (instance,) = restarted.gpus()[0].instances
    assert (instance.placement, instance.uuid) == (p("4g.20gb@0"), run.stdout.strip())
    # Its successor numbers new instances after the ones the dead agent made.
    assert restarted.mig_instance_create(0, p("3g.20gb@4")).uuid == "MIG-sim-k-0-2"


def test_simulated_telemetry_follows_the_load():
    backend = SimulatedBackend(gpus="A100-SXM4-40GB,T4", seed="l")
    backend.mig_mode_set(0, True)
    backend.mig_instance_create(0, p("4g.20gb@0"))
    backend.mig_instance_create(0, p("3g.20gb@4"))
    idle = backend.telemetry()
    backend.set_load(0, "4g.20gb@0", 1.0)
    backend.set_load(0, p("3g.20gb@4"), 0.25)
    backend.set_load(1, None, 0.5)
    busy = backend.telemetry()
    assert [row.gr_engine_active_pct for row in busy[0].instances] == [100.0, 25.0]
    assert busy[0].utilization_pct is None and busy[1].utilization_pct == 50.0
    for before, after in zip(idle, busy):
        assert after.power_w > before.power_w and after.memory_used_mb > before.memory_used_mb
    assert busy[0].memory_used_mb == pytest.approx(sum(row.memory_used_mb for row in busy[0].instances))
    assert all(t.simulated for t in busy) and backend.catalogue_disagreements() == []
    # The load of a destroyed instance does not outlive it.
    backend.mig_instance_destroy(0, p("4g.20gb@0"))
    backend.mig_instance_create(0, p("4g.20gb@0"))
    assert backend.telemetry()[0].instances[0].gr_engine_active_pct == 0.0
    with pytest.raises(ValueError, match="between 0 and 1"):
        backend.set_load(0, None, 1.5)
    with pytest.raises(BackendError, match="no gpu5"):
        backend.set_load(5, None, 0.5)


# --------------------------------------------------------------------------- backend_make


def test_backend_make(tmp_path):
    simulated = backend_make("simulated", gpus="1xA100-SXM4-40GB", state_file=tmp_path / "s.json", seed="m")
    assert isinstance(simulated, SimulatedBackend) and len(simulated.gpus()) == 1
    fake = FakeNvml(["Tesla T4"])
    nvml = backend_make("nvml", nvml=fake)
    assert isinstance(nvml, NvmlBackend) and nvml.gpus()[0].model_name == "Tesla T4"
    nvml.close()
    with pytest.raises(ValueError, match="unknown device backend 'cuda'.*nvml, simulated"):
        backend_make("cuda")
    with pytest.raises(ValueError, match="unknown GPU model"):
        backend_make("simulated", gpus="1xA800")


# --------------------------------------------------------------------------- a real GPU


def test_real_nvml_reads_the_gpus_and_their_telemetry():
    """Against the machine's own NVML: inventory and telemetry only (changing MIG needs root and would
    disturb whatever runs there)."""
    reason = gpu_absent_reason()
    if reason is not None:
        pytest.skip(f"no GPU: {reason}")
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    with NvmlBackend() as backend:
        gpus = backend.gpus()
        assert len(gpus) == count
        assert all(g.uuid.startswith("GPU-") and g.memory_mb > 0 and not g.simulated for g in gpus)
        samples = backend.telemetry()
        assert [t.uuid for t in samples] == [g.uuid for g in gpus]
        for gpu, sample in zip(gpus, samples):
            assert 0 <= sample.memory_used_mb <= gpu.memory_mb
            if gpu.mig_enabled:
                assert sample.utilization_pct is None
                assert [i.placement for i in sample.instances] == [i.placement for i in gpu.instances]
            else:
                assert sample.utilization_pct is None or 0 <= sample.utilization_pct <= 100
        assert isinstance(backend.catalogue_disagreements(), list)
