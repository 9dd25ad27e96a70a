"""The agent on MPS GPUs (issue 17, gpulets): desired-state checks, the MPS control daemon (a fake control
program standing for nvidia-cuda-mps-control), the backends' MPS mode and environment, one runtime process
per partition with a partition spec, reorganisation that starts the new partitions before the old ones stop,
and the actual-state report. The reconciler is driven with a recording supervisor (what it was asked to start,
with which spec and environment, in which order); one test runs real partition runtime processes."""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.geometry.names import mps_percent
from tests.workers.fake_pynvml import FakeGpu, FakeNvml
from workers.agent.agent import Agent
from workers.agent.backends import BackendError
from workers.agent.backends.mps import MPS_PID_FILE, MpsControl
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.desired import DesiredStateError, desired_state_parse, runtime_key_parse
from workers.agent.main import CRASH_ENV
from workers.agent.reconcile import Reconciler, partition_record_key, partition_record_parse
from workers.agent.supervisor import RuntimeProcess, RuntimeSupervisor, _alive, frame_call
from workers.runtime.session import CPU_STANDS_IN_ENV

BATCHING = {"policy": "proteus", "params": {}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 100.0}
PROFILE = [{"batch": 1, "latency_ms": 2.0}, {"batch": 4, "latency_ms": 5.0}]


@pytest.fixture(autouse=True)
def _cpu_stands_in_for_the_fake_gpus(monkeypatch) -> None:
    """The runtimes here are real (onnxruntime) on GPUs a fake NVML declares: the CPU stands in, declared so
    (workers/runtime/session.py), and the runtimes the agent starts inherit it."""
    monkeypatch.setenv(CPU_STANDS_IN_ENV, "1")


def model(key: str, variant: str, *, duty: float | None = 40.0, variant_id: int = 1, **extra: Any) -> dict:
    doc = {
        "key": key, "device": key.split("/")[0], "application": f"app-{variant}",
        "variant": {"id": variant_id, "name": variant, "artifact": None}, "max_batch": 4, "batching": BATCHING,
        "profile": PROFILE, "mps_percent": int(key.split("/")[1][3:].split("@")[0]), "duty_cycle_ms": duty,
    }
    doc.update(extra)
    return doc


def mps_doc(version: int, layout: list[str], runtimes: list[dict], *, host: str = "sim-mps-01") -> dict:
    return {"host": host, "version": version, "gpus": [{"index": 0, "mig_enabled": False, "mps_enabled": True, "mps_layout": layout}],
            "runtimes": runtimes}


V1 = mps_doc(1, ["mps60@0", "mps40@1"], [
    model("gpu0/mps60@0/0", "resnet50", turn_ms=12.5), model("gpu0/mps60@0/1", "bert", variant_id=2),
    model("gpu0/mps40@1/0", "mobilenet", variant_id=3),
])
# Reorganised: 50 + 50, the models moved around.
V2 = mps_doc(2, ["mps50@0", "mps50@1"], [
    model("gpu0/mps50@0/0", "resnet50"), model("gpu0/mps50@1/0", "bert", variant_id=2), model("gpu0/mps50@1/1", "mobilenet", variant_id=3),
])


# --------------------------------------------------------------------------- desired state


def test_desired_state_groups_the_models_of_a_partition() -> None:
    desired = desired_state_parse(V1)
    gpu = desired.gpu(0)
    assert gpu.mps_enabled and gpu.mps_layout == ((60, 0), (40, 1)) and gpu.mps_placements == ("mps60@0", "mps40@1")
    assert desired.process_runtimes == ()
    partitions = desired.partitions()
    assert [(p.key, p.percent, p.index, p.duty_cycle_ms, [r.key for r in p.runtimes]) for p in partitions] == [
        ("gpu0/mps40@1", 40, 1, 40.0, ["gpu0/mps40@1/0"]),
        ("gpu0/mps60@0", 60, 0, 40.0, ["gpu0/mps60@0/0", "gpu0/mps60@0/1"]),
    ]
    runtime = desired.runtime("gpu0/mps60@0/1")
    assert runtime.mps_percent == 60 and runtime.partition_key == "gpu0/mps60@0" and runtime.placement is None
    # The key is not fed to the MIG placement parser: no MIG placement, the model's slot.
    assert runtime_key_parse("gpu0/mps60@0/1") == ("gpu", 0, None, 1)
    # Any change to any model of a partition changes the partition's fingerprint, and only that partition's.
    changed = copy.deepcopy(V1)
    changed["runtimes"][1]["max_batch"] = 2
    after = {p.key: p.fingerprint for p in desired_state_parse(changed).partitions()}
    before = {p.key: p.fingerprint for p in partitions}
    assert after["gpu0/mps60@0"] != before["gpu0/mps60@0"] and after["gpu0/mps40@1"] == before["gpu0/mps40@1"]
    # A duty cycle may be null (a partition with one model), and mps_percent may be left out (it is the key's).
    doc = mps_doc(3, ["mps100@0"], [model("gpu0/mps100@0/0", "resnet50", duty=None)])
    del doc["runtimes"][0]["mps_percent"]
    assert desired_state_parse(doc).runtime("gpu0/mps100@0/0").mps_percent == 100


def broken(change) -> dict:
    doc = copy.deepcopy(V1)
    change(doc)
    return doc


@pytest.mark.parametrize("change, message", [
    (lambda d: d["gpus"][0].update(mig_enabled=True), "cannot both be true"),
    (lambda d: d["gpus"][0].update(mps_enabled=False), "MPS partitions need mps_enabled: true"),
    (lambda d: d["gpus"][0].update(mps_enabled="yes"), r"mps_enabled: expected true or false"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps60@0", "mps50@1"]), "add up to 110 %"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps40@0", "mps60@1"]), "largest first"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps60@1", "mps40@0"]), r"indices must be 0..1 in order"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps60@0", "mps40@2"]), r"indices must be 0..1 in order"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps0@0"]), r"mps_layout\[0\]: 'mps0@0' is not an MPS partition"),
    (lambda d: d["gpus"][0].update(mps_layout="mps60@0"), "expected a list of partitions"),
    (lambda d: d["gpus"][0].update(mps_layout=["mps60@0"]), r"partition mps40@1 is not in gpu0's mps_layout \(mps60@0\)"),
    (lambda d: d["runtimes"][0].update(mps_percent=50), "mps_percent 50 does not match key 'gpu0/mps60@0/0'"),
    (lambda d: d["runtimes"][1].update(duty_cycle_ms=25.0), "a partition has one duty cycle"),
    (lambda d: d["runtimes"][1].update(duty_cycle_ms=-1), r"duty_cycle_ms: expected a number of milliseconds > 0"),
    (lambda d: d["runtimes"][1].update(turn_ms=0), r"turn_ms: expected a number of milliseconds > 0"),
    (lambda d: d["runtimes"][1].update(turn_ms="5"), r"turn_ms: expected a number of milliseconds > 0"),
    (lambda d: d["runtimes"][0].update(placement="3g.20gb@0"), "does not match key"),
    (lambda d: d["runtimes"][0].update(key="gpu0/mps60@0"), "an MPS partition's own key"),
    (lambda d: d["runtimes"][0].update(key="gpu0/3g.20gb@0/1"), "a slot .* is only for models in an MPS partition"),
    (lambda d: d["runtimes"][0].update(key="gpu0/mps060@0/0"), "not an MPS partition placement"),
    (lambda d: d.update(gpus=[]), "does not list with mps_enabled: true"),
    (lambda d: d["runtimes"].append({**model("gpu0/mps60@0/0", "x"), "key": "gpu0", "mps_percent": None, "duty_cycle_ms": None}),
     "a whole-GPU runtime on a GPU in MPS mode"),
])
def test_desired_state_refuses_malformed_mps_documents(change, message) -> None:
    desired_state_parse(V1)
    with pytest.raises(DesiredStateError, match=message):
        desired_state_parse(broken(change))


def test_mps_fields_are_for_mps_runtimes_only() -> None:
    doc = {"host": "h", "version": 1, "gpus": [{"index": 0, "mig_enabled": False}],
           "runtimes": [{**model("gpu0/mps60@0/0", "x"), "key": "gpu0", "duty_cycle_ms": None}]}
    with pytest.raises(DesiredStateError, match="mps_percent is for models in an MPS partition only"):
        desired_state_parse(doc)
    doc["runtimes"][0].update(mps_percent=None, duty_cycle_ms=10.0)
    with pytest.raises(DesiredStateError, match="duty_cycle_ms is for models in an MPS partition only"):
        desired_state_parse(doc)
    doc["runtimes"][0].update(duty_cycle_ms=None, turn_ms=3.0)
    with pytest.raises(DesiredStateError, match="turn_ms is for models in an MPS partition only"):
        desired_state_parse(doc)
    doc["runtimes"][0]["turn_ms"] = None
    assert desired_state_parse(doc).runtime("gpu0").mps_percent is None


# --------------------------------------------------------------------------- the MPS control daemon

FAKE_CONTROL = r'''#!{python}
"""A fake nvidia-cuda-mps-control: records argv, CUDA_* environment and input; `-d` daemonises a sleeping
process and writes its pid file in the pipe directory, as the real daemon does; `quit` ends it."""
import json, os, subprocess, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
daemon = "-d" in sys.argv[1:]
stdin = "" if daemon else sys.stdin.read()
with open({record!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": stdin,
                        "env": {{k: v for k, v in os.environ.items() if k.startswith("CUDA_")}}}}) + "\n")
pid_file = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
if daemon:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon is already running")
        sys.exit(1)
    child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
elif stdin.strip() == "quit":
    os.kill(int(open(pid_file).read()), 15)
'''


class FakeControl:
    def __init__(self, tmp_path: Path) -> None:
        self.record = tmp_path / "mps-control-calls.jsonl"
        self.path = tmp_path / "fake-mps-control"
        self.path.write_text(FAKE_CONTROL.format(python=sys.executable, record=str(self.record)))
        self.path.chmod(0o755)
        self.root = tmp_path / "mps"

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.record.read_text().splitlines()] if self.record.exists() else []

    def kill_daemons(self) -> None:
        for pid_file in self.root.glob(f"gpu*/pipe/{MPS_PID_FILE}"):
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fake_control(tmp_path):
    control = FakeControl(tmp_path)
    yield control
    control.kill_daemons()


def test_mps_control_starts_and_stops_one_daemon_per_gpu(fake_control, monkeypatch) -> None:
    mps = MpsControl(fake_control.root, str(fake_control.path), timeout_s=10.0)
    assert not mps.running(0)
    mps.start(0, "GPU-aaaa")
    mps.start(0, "GPU-aaaa")  # already running: not started twice
    mps.start(1, "GPU-bbbb")
    assert mps.running(0) and mps.running(1) and mps.pid(0) != mps.pid(1)
    calls = fake_control.calls()
    assert [c["argv"] for c in calls] == [["-d"], ["-d"]]
    assert calls[0]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa" and calls[1]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    assert calls[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(fake_control.root / "gpu0" / "pipe")
    assert calls[0]["env"]["CUDA_MPS_LOG_DIRECTORY"] == str(fake_control.root / "gpu0" / "log")
    assert mps.client_environment(1, 40, "GPU-bbbb") == {
        "CUDA_VISIBLE_DEVICES": "GPU-bbbb", "CUDA_MPS_PIPE_DIRECTORY": str(fake_control.root / "gpu1" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(fake_control.root / "gpu1" / "log"), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
    }
    pid0 = mps.pid(0)
    mps.stop(0)
    assert not mps.running(0) and not _alive(pid0) and mps.running(1)
    quit_call = fake_control.calls()[-1]
    assert quit_call["argv"] == [] and quit_call["stdin"] == "quit\n"
    assert quit_call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(fake_control.root / "gpu0" / "pipe")  # reaches GPU 0's daemon
    mps.stop(0)  # not running: nothing sent
    assert len(fake_control.calls()) == 3
    # A control program that fails says so, with its output; a missing one too.
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(BackendError, match="exited with 1: An instance of this daemon is already running"):
        mps.start(0, "GPU-aaaa")
    with pytest.raises(BackendError, match="is not installed"):
        MpsControl(fake_control.root, str(fake_control.root / "nowhere")).start(0, "GPU-aaaa")
    with pytest.raises(ValueError, match="1..100"):
        mps.client_environment(1, 0, "GPU-bbbb")


def test_nvml_backend_runs_the_mps_daemon_and_refuses_mps_under_mig(fake_control) -> None:
    fake = FakeNvml([FakeGpu("A100-SXM4-40GB", mig_enabled=True), "Tesla T4"])
    with NvmlBackend(nvml=fake, mps_dir=fake_control.root, mps_control=str(fake_control.path)) as backend:
        with pytest.raises(BackendError, match="cannot enable MPS while MIG is enabled"):
            backend.mps_mode_set(0, True)
        with pytest.raises(BackendError, match="MPS is not enabled"):
            backend.mps_environment(1, 50)
        backend.mps_mode_set(1, True)
        gpus = backend.gpus()
        assert [g.mps_enabled for g in gpus] == [False, True]
        uuid = gpus[1].uuid
        assert fake_control.calls()[0]["env"]["CUDA_VISIBLE_DEVICES"] == uuid  # the daemon sees that GPU only
        env = backend.mps_environment(1, 50)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["CUDA_VISIBLE_DEVICES"] == uuid
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(fake_control.root / "gpu1" / "pipe")
        backend.mps_mode_set(1, False)
        assert not backend.gpus()[1].mps_enabled
        assert fake_control.calls()[-1]["stdin"] == "quit\n"
    with NvmlBackend(nvml=fake) as no_mps:  # no MPS directory given: refused, not guessed
        with pytest.raises(BackendError, match="MPS is not set up"):
            no_mps.mps_mode_set(1, True)
        assert not no_mps.gpus()[1].mps_enabled


def test_nvml_backend_refuses_mig_while_mps_is_on(fake_control) -> None:
    fake = FakeNvml(["A100-SXM4-40GB"])
    with NvmlBackend(nvml=fake, mps_dir=fake_control.root, mps_control=str(fake_control.path)) as backend:
        backend.mps_mode_set(0, True)
        with pytest.raises(BackendError, match="cannot enable MIG while MPS is on"):
            backend.mig_mode_set(0, True)
        backend.mps_mode_set(0, False)
        backend.mig_mode_set(0, True)
        assert backend.gpus()[0].mig_enabled


def test_simulated_backend_keeps_mps_mode_as_state(tmp_path) -> None:
    state = tmp_path / "simulated-gpus.json"
    backend = SimulatedBackend(gpus="2xRTX-2080Ti,1xA100-SXM4-40GB", state_file=state, seed="m")
    gpus = backend.gpus()
    assert [g.model_name for g in gpus] == ["NVIDIA GeForce RTX 2080 Ti"] * 2 + ["NVIDIA A100-SXM4-40GB"]
    assert not gpus[0].mig_capable and all(g.simulated and not g.mps_enabled for g in gpus)
    backend.mps_mode_set(0, True)
    assert backend.mps_environment(0, 60) == {"CUDA_VISIBLE_DEVICES": "", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60"}
    with pytest.raises(BackendError, match="MPS is not enabled"):
        backend.mps_environment(1, 60)
    backend.mig_mode_set(2, True)
    with pytest.raises(BackendError, match="cannot enable MPS while MIG is enabled"):
        backend.mps_mode_set(2, True)
    backend.mig_mode_set(2, False)
    backend.mps_mode_set(2, True)
    with pytest.raises(BackendError, match="cannot enable MIG while MPS is on"):
        backend.mig_mode_set(2, True)
    # A restarted agent finds the MPS modes it set.
    again = SimulatedBackend(gpus="2xRTX-2080Ti,1xA100-SXM4-40GB", state_file=state, seed="m")
    assert [g.mps_enabled for g in again.gpus()] == [True, False, True]
    # A state file written before MPS existed reads as MPS off.
    data = json.loads(state.read_text())
    for gpu in data["gpus"]:
        del gpu["mps_enabled"]
    state.write_text(json.dumps(data))
    assert not any(g.mps_enabled for g in SimulatedBackend(gpus="2xRTX-2080Ti,1xA100-SXM4-40GB", state_file=state, seed="m").gpus())


# --------------------------------------------------------------------------- reconcile, with a recording supervisor


class RecordingSupervisor:
    """Stands for RuntimeSupervisor: records what it is asked to start (spec and environment) and every
    start, readiness, drain and stop in `events`, in order; its 'processes' are records only."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, RuntimeProcess] = {}
        self.events: list[tuple[str, str]] = []
        self.started: list[tuple[str, dict, dict]] = []
        self.calls: list[tuple[str, str, str | None]] = []

    def observe(self) -> dict[str, RuntimeProcess]:
        return dict(self.records)

    def start(self, *, key: str, fingerprint: str, spec: dict, env: dict | None = None, ready_timeout_s: float = 60.0,
              mps_daemon: str = "") -> RuntimeProcess:
        n = len(self.started)
        spec_path = self.dir / f"{n}.spec"
        spec_path.write_text(json.dumps(spec))
        self.events.append(("start", key))
        record = RuntimeProcess(key=key, fingerprint=fingerprint, spec_path=str(spec_path), ready_file="", log_path="",
                                pid=10_000 + n, endpoint=f"tcp://127.0.0.1:{20_000 + n}", started_at=time.time() + n, mps_daemon=mps_daemon)
        self.records[key] = record
        self.started.append((key, spec, dict(env or {})))
        self.events.append(("ready", key))
        return record

    def call(self, record: RuntimeProcess, op: str, timeout_s: float = 2.0, *, key: str | None = None) -> dict:
        self.calls.append((op, record.key, key))
        return {"status": 200, "stats": {"busy_ms": 100.0, "served": 3}} if op == "stats" else {"status": 200}

    def drain(self, record: RuntimeProcess, timeout_s: float) -> bool:
        self.events.append(("drain", record.key))
        return True

    def stop(self, record: RuntimeProcess, *, drain_timeout_s: float = 10.0) -> None:
        self.events.append(("stop", record.key))
        self.records.pop(record.key, None)

    def stop_all(self, *, drain_timeout_s: float = 0.0) -> None:
        for record in list(self.records.values()):
            self.stop(record)


def reconciler_for(backend, supervisor: RecordingSupervisor) -> tuple[Reconciler, list]:
    ops: list = []
    return Reconciler(backend=backend, supervisor=supervisor, artifact_fetch=lambda a: Path("/nonexistent"), on_operation=ops.append), ops


def partition_of(record_key: str) -> str:
    parsed = partition_record_parse(record_key)
    return parsed[0] if parsed else record_key


def test_one_process_per_partition_with_the_partition_spec_and_the_mps_environment(tmp_path, fake_control) -> None:
    fake = FakeNvml(["Tesla T4"])
    backend = NvmlBackend(nvml=fake, mps_dir=fake_control.root, mps_control=str(fake_control.path))
    supervisor = RecordingSupervisor(tmp_path / "runtimes")
    reconciler, ops = reconciler_for(backend, supervisor)
    doc = copy.deepcopy(V1)
    for runtime in doc["runtimes"]:  # real GPUs compute: every model has an artifact
        runtime["variant"]["artifact"] = {"id": 9, "sha256": "0" * 64, "download": "/api/v1/artifacts/9/download/"}
    desired = desired_state_parse(doc)
    result = reconciler.reconcile(desired)
    assert result.converged, result.errors
    uuid = backend.gpus()[0].uuid
    # The daemon first, then one process per partition (never one per model).
    assert [(op.action, op.target, op.outcome) for op in ops] == [
        ("mps.mode", "gpu0", "ok"), ("runtime.start", "gpu0/mps40@1", "ok"), ("runtime.start", "gpu0/mps60@0", "ok")]
    assert [c["argv"] for c in fake_control.calls()] == [["-d"]]
    assert sorted(partition_of(k) for k in supervisor.records) == ["gpu0/mps40@1", "gpu0/mps60@0"]
    started = {partition_of(key): (spec, env) for key, spec, env in supervisor.started}
    spec, env = started["gpu0/mps60@0"]
    assert env == {"CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60",
                   "CUDA_MPS_PIPE_DIRECTORY": str(fake_control.root / "gpu0" / "pipe"),
                   "CUDA_MPS_LOG_DIRECTORY": str(fake_control.root / "gpu0" / "log")}
    assert started["gpu0/mps40@1"][1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert {k: spec[k] for k in ("key", "partition_percent", "duty_cycle_ms", "device_uuid", "instance")} == {
        "key": "gpu0/mps60@0", "partition_percent": 60, "duty_cycle_ms": 40.0, "device_uuid": uuid, "instance": "sim-mps-01/gpu0/mps60@0"}
    assert [(m["key"], m["instance"], m["variant"], m["simulated"], m["device_uuid"], m["artifact_path"]) for m in spec["models"]] == [
        ("gpu0/mps60@0/0", "sim-mps-01/gpu0/mps60@0/0", "resnet50", False, uuid, "/nonexistent"),
        ("gpu0/mps60@0/1", "sim-mps-01/gpu0/mps60@0/1", "bert", False, uuid, "/nonexistent"),
    ]
    # Each model spec is the single-model spec the agent builds for any runtime, with its turn in the
    # partition's round (the plan's, else null: the runtime takes its profile at max_batch).
    assert set(spec["models"][0]) == {"key", "application", "variant", "variant_id", "artifact_path", "sha256", "simulated", "device_uuid",
                                      "cpu_threads", "max_batch", "batching", "profile", "instance", "turn_ms"}
    assert [m["turn_ms"] for m in spec["models"]] == [12.5, None]
    assert ("health", partition_record_key("gpu0/mps60@0", desired.partition("gpu0/mps60@0").fingerprint), None) in supervisor.calls
    # Converged: nothing to do on the next pass.
    ops.clear()
    assert reconciler.reconcile(desired).converged and ops == []

    # MPS off (the GPU serves one model whole): the whole-GPU runtime starts first, the partitions stop,
    # and the daemon is stopped after the last of them.
    off = {"host": "sim-mps-01", "version": 2, "gpus": [{"index": 0, "mig_enabled": False, "mps_enabled": False, "mps_layout": []}],
           "runtimes": [{**doc["runtimes"][0], "key": "gpu0", "mps_percent": None, "duty_cycle_ms": None, "turn_ms": None}]}
    result = reconciler.reconcile(desired_state_parse(off))
    assert result.converged, result.errors
    actions = [(op.action, op.target) for op in ops]
    assert actions == [("runtime.start", "gpu0"),
                       ("runtime.drain", "gpu0/mps40@1"), ("runtime.stop", "gpu0/mps40@1"),
                       ("runtime.drain", "gpu0/mps60@0"), ("runtime.stop", "gpu0/mps60@0"),
                       ("mps.mode", "gpu0")]
    assert fake_control.calls()[-1]["stdin"] == "quit\n" and not backend.gpus()[0].mps_enabled
    assert supervisor.started[-1][2] == {"CUDA_VISIBLE_DEVICES": uuid}  # not an MPS client
    backend.close()


def test_reorganisation_starts_the_new_partitions_before_the_old_ones_stop(tmp_path) -> None:
    backend = SimulatedBackend(gpus="1xRTX-2080Ti", seed="r")
    supervisor = RecordingSupervisor(tmp_path / "runtimes")
    reconciler, ops = reconciler_for(backend, supervisor)
    assert reconciler.reconcile(desired_state_parse(V1)).converged
    v1_records = set(supervisor.records)
    supervisor.events.clear()

    result = reconciler.reconcile(desired_state_parse(V2))
    assert result.converged, result.errors
    events = [(what, partition_of(key)) for what, key in supervisor.events]
    new_ready = [events.index(("ready", key)) for key in ("gpu0/mps50@0", "gpu0/mps50@1")]
    old_drained = [events.index(("drain", key)) for key in ("gpu0/mps60@0", "gpu0/mps40@1")]
    assert max(new_ready) < min(old_drained), events  # serving never stops: 60+40+50+50 % meanwhile
    assert set(supervisor.records).isdisjoint(v1_records)
    assert sorted(partition_of(k) for k in supervisor.records) == ["gpu0/mps50@0", "gpu0/mps50@1"]
    env = {partition_of(key): env for key, _spec, env in supervisor.started}
    assert env["gpu0/mps50@1"] == {"CUDA_VISIBLE_DEVICES": "", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}  # simulated: no GPU
    specs = {partition_of(key): spec for key, spec, _env in supervisor.started}
    assert [m["key"] for m in specs["gpu0/mps50@1"]["models"]] == ["gpu0/mps50@1/0", "gpu0/mps50@1/1"]
    assert all(m["simulated"] for m in specs["gpu0/mps50@1"]["models"])

    # One model of a partition changes (same partition key): a new process for that partition, ready before
    # the old one with the same key is stopped; the other partition is left alone.
    v3 = copy.deepcopy(V2)
    v3["version"] = 3
    v3["runtimes"][2]["max_batch"] = 2
    kept = next(k for k in supervisor.records if partition_of(k) == "gpu0/mps50@0")
    old = next(k for k in supervisor.records if partition_of(k) == "gpu0/mps50@1")
    supervisor.events.clear()
    assert reconciler.reconcile(desired_state_parse(v3)).converged
    new = next(k for k in supervisor.records if partition_of(k) == "gpu0/mps50@1")
    assert new != old and kept in supervisor.records
    assert supervisor.events == [("start", new), ("ready", new), ("drain", old), ("stop", old)]


def test_a_mig_gpu_moves_to_mps_mig_off_first(tmp_path) -> None:
    backend = SimulatedBackend(gpus="1xA100-SXM4-40GB", seed="x")
    supervisor = RecordingSupervisor(tmp_path / "runtimes")
    reconciler, ops = reconciler_for(backend, supervisor)
    mig = {"host": "h", "version": 1, "gpus": [{"index": 0, "mig_enabled": True, "layout": ["7g.40gb@0"]}],
           "runtimes": [{**model("gpu0/mps60@0/0", "resnet50"), "key": "gpu0/7g.40gb@0", "mps_percent": None, "duty_cycle_ms": None}]}
    assert reconciler.reconcile(desired_state_parse(mig)).converged
    ops.clear()
    mps = mps_doc(2, ["mps100@0"], [model("gpu0/mps100@0/0", "resnet50", duty=None)], host="h")
    result = reconciler.reconcile(desired_state_parse(mps))
    assert result.converged, result.errors
    assert [(op.action, op.target) for op in ops] == [
        ("runtime.drain", "gpu0/7g.40gb@0"), ("runtime.stop", "gpu0/7g.40gb@0"), ("mig.destroy", "gpu0/7g.40gb@0"),
        ("mig.mode", "gpu0"), ("mps.mode", "gpu0"), ("runtime.start", "gpu0/mps100@0")]
    gpu = backend.gpus()[0]
    assert gpu.mps_enabled and not gpu.mig_enabled
    # And back to MIG: the partition and the daemon go before MIG is enabled.
    ops.clear()
    assert reconciler.reconcile(desired_state_parse(dict(mig, version=3))).converged
    actions = [(op.action, op.target) for op in ops]
    assert actions.index(("runtime.stop", "gpu0/mps100@0")) < actions.index(("mps.mode", "gpu0")) < actions.index(("mig.mode", "gpu0"))


def test_a_partition_that_fails_to_start_is_retried_and_reported_per_model(tmp_path) -> None:
    backend = SimulatedBackend(gpus="1xRTX-2080Ti", seed="f")
    supervisor = RecordingSupervisor(tmp_path / "runtimes")

    def refuse(**kwargs):
        raise RuntimeError("no room")

    supervisor.start = refuse  # type: ignore[method-assign]
    reconciler, ops = reconciler_for(backend, supervisor)
    result = reconciler.reconcile(desired_state_parse(V1))
    assert not result.converged
    assert "gpu0/mps60@0/0: no room" in result.errors and "gpu0/mps60@0/1: no room" in result.errors
    assert ("runtime.start", "gpu0/mps60@0", "failed") in [(op.action, op.target, op.outcome) for op in ops]
    again = reconciler.reconcile(desired_state_parse(V1))
    assert any(e.startswith("gpu0/mps60@0/1: start failed 1x; retrying in") for e in again.errors)


# --------------------------------------------------------------------------- the agent's report


def test_the_agent_reports_each_model_at_its_partition_process(tmp_path) -> None:
    desired_file = tmp_path / "desired.json"
    desired_file.write_text(json.dumps(V1))
    agent = Agent(backend=SimulatedBackend(gpus="1xRTX-2080Ti", seed="a"), state_dir=tmp_path / "state", desired_file=desired_file)
    supervisor = RecordingSupervisor(tmp_path / "runtimes")
    agent.supervisor = agent.reconciler.supervisor = supervisor  # type: ignore[assignment]
    assert agent.step().converged
    assert agent.step() is None  # converged: no pass needed
    report = agent.actual_state()
    gpu = report["accelerators"][0]
    assert gpu["mps_enabled"] is True and gpu["mps_partitions"] == [{"percent": 60, "index": 0}, {"percent": 40, "index": 1}]
    endpoints = {partition_of(k): r.endpoint for k, r in supervisor.records.items()}
    assert [(r["key"], r["application"], r["variant"], r["state"], r["endpoint"], r["simulated"]) for r in report["runtimes"]] == [
        ("gpu0/mps40@1/0", "app-mobilenet", 3, "ready", endpoints["gpu0/mps40@1"], True),
        ("gpu0/mps60@0/0", "app-resnet50", 1, "ready", endpoints["gpu0/mps60@0"], True),
        ("gpu0/mps60@0/1", "app-bert", 2, "ready", endpoints["gpu0/mps60@0"], True),
    ]
    # Stats are asked per model (the frame carries its key); the GPU's load is the partitions' busy time weighted by their shares.
    payload = agent.metrics_tick(1.0)
    assert sorted(s["key"] for s in payload["runtimes"]) == ["gpu0/mps40@1/0", "gpu0/mps60@0/0", "gpu0/mps60@0/1"]
    assert sorted(key for op, _record, key in supervisor.calls if op == "stats") == ["gpu0/mps40@1/0", "gpu0/mps60@0/0", "gpu0/mps60@0/1"]
    assert payload["gpus"][0]["utilization_pct"] == pytest.approx(100 * (0.1 * 0.6 * 2 + 0.1 * 0.4))

    # While a partition is replaced, its model is reported once, served by the process the desired state
    # wants; the models a partition no longer has are reported by what the old process serves.
    v2 = copy.deepcopy(V1)
    v2["version"] = 2
    v2["runtimes"][1].update(application="app-gpt", variant={"id": 7, "name": "gpt", "artifact": None})
    desired_file.write_text(json.dumps(v2))
    agent.desired_read()
    old = {r["key"]: (r["application"], r["variant"]) for r in agent.actual_state()["runtimes"]}
    assert old["gpu0/mps60@0/1"] == ("app-bert", 2)  # not yet the model wanted next
    assert agent.step().converged
    new = {r["key"]: (r["application"], r["variant"], r["endpoint"]) for r in agent.actual_state()["runtimes"]}
    endpoint = next(r.endpoint for k, r in supervisor.records.items() if partition_of(k) == "gpu0/mps60@0")
    assert new["gpu0/mps60@0/1"] == ("app-gpt", 7, endpoint) and new["gpu0/mps60@0/0"][2] == endpoint
    # A desired model whose partition does not run is reported failed, with the reason.
    supervisor.records.pop(next(k for k in supervisor.records if partition_of(k) == "gpu0/mps40@1"))
    agent.last_result.errors.append("gpu0/mps40@1/0: no room")
    failed = {r["key"]: (r["state"], r["error"]) for r in agent.actual_state()["runtimes"] if r["state"] != "ready"}
    assert failed == {"gpu0/mps40@1/0": ("failed", "gpu0/mps40@1/0: no room")}
    assert agent.actual_state()["accelerators"][0]["mps_partitions"] == [{"percent": 60, "index": 0}]


# --------------------------------------------------------------------------- real partition runtime processes


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_real_partition_processes_serve_through_a_reorganisation(tmp_path) -> None:
    """Real runtime processes (simulated sessions) on a simulated RTX 2080 Ti: one per partition, started with
    the partition's share in CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; when the layout changes, every model of the
    new layout answers from its new process before the first old process is drained."""
    desired_file = tmp_path / "desired.json"
    desired_file.write_text(json.dumps(V1))
    seen_at_first_drain: dict[str, int] = {}
    agent: Agent | None = None

    def on_operation(op) -> None:
        if op.action == "runtime.drain" and not seen_at_first_drain and agent is not None and agent._desired.version == 2:
            for record_key, record in agent.supervisor.observe().items():
                parsed = partition_record_parse(record_key)
                partition = agent._desired.partition(parsed[0]) if parsed else None
                if partition is not None and partition.fingerprint == parsed[1]:
                    for runtime in partition.runtimes:
                        seen_at_first_drain[runtime.key] = frame_call(record.endpoint, {"op": "health", "key": runtime.key})[0]["status"]

    agent = Agent(backend=SimulatedBackend(gpus="1xRTX-2080Ti", seed="e2e"), state_dir=tmp_path / "state",
                  desired_file=desired_file, drain_timeout_s=2.0, on_operation=on_operation)
    try:
        result = agent.step()
        assert result.converged, result.errors
        running = agent.supervisor.observe()
        assert sorted(partition_of(k) for k in running) == ["gpu0/mps40@1", "gpu0/mps60@0"]
        for record_key, record in running.items():
            percent = str(mps_percent(partition_of(record_key)))
            assert environ_of(record.pid)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
            health = agent.supervisor.call(record, "health")
            assert health["status"] == 200 and health["partition_percent"] == int(percent)
        record = next(r for k, r in running.items() if partition_of(k) == "gpu0/mps60@0")
        health = agent.supervisor.call(record, "health", key="gpu0/mps60@0/1")
        assert (health["status"], health["variant"], health["instance"]) == (200, "bert", "sim-mps-01/gpu0/mps60@0/1")
        old_pids = [r.pid for r in running.values()]

        desired_file.write_text(json.dumps(V2))
        result = agent.step()
        assert result.converged, result.errors
        assert seen_at_first_drain == {"gpu0/mps50@0/0": 200, "gpu0/mps50@1/0": 200, "gpu0/mps50@1/1": 200}
        assert not any(_alive(pid) for pid in old_pids)
        running = agent.supervisor.observe()
        assert sorted(partition_of(k) for k in running) == ["gpu0/mps50@0", "gpu0/mps50@1"]
        assert sorted(pid for pid, _cmd in agent.supervisor._processes_under_state_dir()) == sorted(r.pid for r in running.values())
        report = agent.actual_state()
        assert [r["key"] for r in report["runtimes"]] == ["gpu0/mps50@0/0", "gpu0/mps50@1/0", "gpu0/mps50@1/1"]
        assert report["accelerators"][0]["mps_partitions"] == [{"percent": 50, "index": 0}, {"percent": 50, "index": 1}]
    finally:
        RuntimeSupervisor(tmp_path / "state").stop_all()


def run_agent(state_dir: Path, desired: Path, crash_after: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(CRASH_ENV, None)
    if crash_after is not None:
        env[CRASH_ENV] = str(crash_after)
    cmd = [sys.executable, "-m", "controlplane.cli", "agent", "--backend", "simulated", "--simulate", "1xRTX-2080Ti",
           "--state-dir", str(state_dir), "--desired-file", str(desired), "--once", "--loglevel", "WARNING"]
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=180)


def test_agent_killed_during_a_reorganisation_converges(tmp_path) -> None:
    """Killed after any operation of a reorganisation (new partitions started, old ones not yet stopped), the
    restarted agent finds the processes by their records and finishes: the new layout's processes only."""
    desired = tmp_path / "v.json"
    v2_partitions = sorted({p.key: p.fingerprint for p in desired_state_parse(V2).partitions()}.items())
    # start mps50@0, start mps50@1, drain + stop mps40@1, drain + stop mps60@0: six operations.
    for crash_after in range(1, 6):
        state = tmp_path / f"crash-{crash_after}"
        try:
            desired.write_text(json.dumps(V1))
            assert run_agent(state, desired).returncode == 0
            desired.write_text(json.dumps(V2))
            killed = run_agent(state, desired, crash_after=crash_after)
            assert killed.returncode == -9, f"crash after {crash_after}: {killed.returncode} {killed.stderr[-500:]}"
            recovered = run_agent(state, desired)
            assert recovered.returncode == 0, recovered.stderr
            supervisor = RuntimeSupervisor(state)
            running = supervisor.observe()
            assert sorted(partition_record_parse(k) for k in running) == v2_partitions, crash_after
            assert sorted(pid for pid, _cmd in supervisor._processes_under_state_dir()) == sorted(r.pid for r in running.values())
        finally:
            RuntimeSupervisor(state).stop_all()


# --------------------------------------------------------------------------- MPS daemons watched, and stopped at exit (issue 44)


def test_mps_control_does_not_take_a_reused_pid_for_its_daemon(fake_control) -> None:
    """A daemon killed with its container leaves its pid file; the next PID namespace hands the number out again.
    The daemon's identity (PID and start time) is kept when it starts, so another process under that PID is not it."""
    mps = MpsControl(fake_control.root, str(fake_control.path), timeout_s=10.0)
    mps.start(0, "GPU-aaaa")
    first = mps.daemon_id(0)
    assert first is not None and first.startswith(f"{mps.pid(0)}@")
    os.kill(mps.pid(0), signal.SIGKILL)
    stand_in = subprocess.Popen(["sleep", "60"])  # a live process that the stale pid file will name
    try:
        (mps.pipe_dir(0) / MPS_PID_FILE).write_text(str(stand_in.pid))
        (fake_control.root / "gpu0" / "daemon.id").write_text(f"{stand_in.pid}@1\n")  # what was kept: another start time
        assert mps.daemon_id(0) is None and not mps.running(0)
        mps.start(0, "GPU-aaaa")  # so it is started again, and is another daemon
        assert mps.running(0) and mps.daemon_id(0) not in (None, first) and mps.pid(0) != stand_in.pid
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.fixture
def computing_v1(tmp_path) -> Path:
    """V1 with a real ONNX model behind every model (real GPUs compute), as a desired-state file."""
    from tests.onnx_builders import onnx_mlp_bytes
    import hashlib

    data = onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=5)
    model_path = tmp_path / "mlp.onnx"
    model_path.write_bytes(data)
    doc = copy.deepcopy(V1)
    for runtime in doc["runtimes"]:
        runtime["variant"]["artifact"] = {"id": 9, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data), "download": str(model_path)}
    path = tmp_path / "desired.json"
    path.write_text(json.dumps(doc))
    return path


def partition_pids(agent: Agent) -> dict[str, int]:
    return {partition_of(k): r.pid for k, r in agent.supervisor.observe().items()}


def test_a_daemon_that_dies_after_convergence_is_reported_and_restored_with_its_partitions(tmp_path, fake_control, computing_v1, caplog) -> None:
    """Real partition processes on an MPS GPU (NVML faked, the fake control program standing for
    nvidia-cuda-mps-control): the daemon killed after convergence is noticed on the next poll, logged, its
    partitions' models reported failed, and the pass starts the daemon again and the partitions under it."""
    nvml = FakeNvml(["Tesla T4"])
    backend = NvmlBackend(nvml=nvml, mps_dir=fake_control.root, mps_control=str(fake_control.path))
    ops: list = []
    states_when_lost: dict[str, str] = {}
    agent: Agent | None = None

    def on_operation(op) -> None:
        ops.append(op)
        if op.action == "mps.daemon" and agent is not None:
            states_when_lost.update({r["key"]: r["state"] for r in agent.actual_state()["runtimes"]})

    agent = Agent(backend=backend, state_dir=tmp_path / "state", desired_file=computing_v1, drain_timeout_s=1.0, on_operation=on_operation)
    mps = MpsControl(fake_control.root, str(fake_control.path))
    try:
        result = agent.step()
        assert result.converged, result.errors
        daemon = mps.daemon_id(0)
        assert daemon is not None
        before = partition_pids(agent)
        assert sorted(before) == ["gpu0/mps40@1", "gpu0/mps60@0"]
        assert {r.mps_daemon for r in agent.supervisor.observe().values()} == {daemon}  # each recorded with its daemon
        assert agent.step() is None  # converged, daemon alive: nothing to do

        os.kill(mps.pid(0), signal.SIGKILL)
        wait_for_dead = time.monotonic() + 10
        while mps.running(0) and time.monotonic() < wait_for_dead:
            time.sleep(0.05)
        ops.clear()
        with caplog.at_level("WARNING", logger="tessera.agent"):
            result = agent.step()
        assert result is not None and result.converged, result and result.errors
        assert any("gpu0: the MPS control daemon" in m and "not running" in m for m in caplog.messages), caplog.messages
        # Reported before the repair: no query is routed to a partition whose MPS server is gone.
        assert states_when_lost == {"gpu0/mps40@1/0": "failed", "gpu0/mps60@0/0": "failed", "gpu0/mps60@0/1": "failed"}
        actions = [(op.action, op.target, op.outcome) for op in ops]
        assert actions[0] == ("mps.daemon", "gpu0", "failed")
        assert actions[1:5] == [("runtime.drain", "gpu0/mps40@1", actions[1][2]), ("runtime.stop", "gpu0/mps40@1", "ok"),
                                ("runtime.drain", "gpu0/mps60@0", actions[3][2]), ("runtime.stop", "gpu0/mps60@0", "ok")]
        assert actions[5:] == [("mps.mode", "gpu0", "ok"), ("runtime.start", "gpu0/mps40@1", "ok"), ("runtime.start", "gpu0/mps60@0", "ok")]
        restored = mps.daemon_id(0)
        assert restored not in (None, daemon)
        after = partition_pids(agent)
        assert sorted(after) == sorted(before) and not set(after.values()) & set(before.values())
        assert not any(_alive(pid) for pid in before.values())
        assert {r.mps_daemon for r in agent.supervisor.observe().values()} == {restored}
        assert all(environ_of(pid)["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.pipe_dir(0)) for pid in after.values())
        assert all(r["state"] == "ready" for r in agent.actual_state()["runtimes"])
        assert agent.step() is None  # converged again

        # A daemon replaced behind the agent's back (stopped and started by hand): its partitions connected to the
        # old one, so they are restarted under the new one.
        mps.stop(0)
        mps.start(0, backend.gpus()[0].uuid)
        replaced = mps.daemon_id(0)
        ops.clear()
        result = agent.step()
        assert result is not None and result.converged, result and result.errors
        assert [(op.action, op.outcome) for op in ops][0] == ("mps.daemon", "failed") and "which is gone" in ops[0].detail
        assert ("mps.mode", "gpu0", "ok") not in [(op.action, op.target, op.outcome) for op in ops]  # it runs: not started again
        assert {r.mps_daemon for r in agent.supervisor.observe().values()} == {replaced}
        assert [c["argv"] for c in fake_control.calls()].count(["-d"]) == 3
    finally:
        agent.stop(stop_runtimes=True)


def test_the_mps_daemons_stop_with_the_runtimes_and_outlive_an_agent_restart(tmp_path, fake_control, computing_v1) -> None:
    """An agent that exits to be restarted leaves its partition processes and their daemon serving (the next
    agent takes them over as they are); one that exits draining its runtimes stops the daemon after them."""
    nvml = FakeNvml(["Tesla T4"])
    mps = MpsControl(fake_control.root, str(fake_control.path))

    left_at_daemon_stop: list = []

    def agent_make(ops: list) -> Agent:
        def seen(op) -> None:
            ops.append(op)
            if op.action == "mps.mode" and op.detail.startswith("disabled"):
                left_at_daemon_stop.append(RuntimeSupervisor(tmp_path / "state")._processes_under_state_dir())

        backend = NvmlBackend(nvml=nvml, mps_dir=fake_control.root, mps_control=str(fake_control.path))
        return Agent(backend=backend, state_dir=tmp_path / "state", desired_file=computing_v1, drain_timeout_s=1.0, on_operation=seen)

    first_ops: list = []
    first = agent_make(first_ops)
    assert first.step().converged
    daemon, pids = mps.daemon_id(0), partition_pids(first)
    first.stop()  # a restart: runtimes keep serving, and so does their MPS daemon
    assert mps.daemon_id(0) == daemon and all(_alive(pid) for pid in pids.values())
    assert not [c for c in fake_control.calls() if c["stdin"] == "quit\n"]

    ops: list = []
    second = agent_make(ops)
    try:
        assert second.step().converged
        assert ops == [] and partition_pids(second) == pids and mps.daemon_id(0) == daemon  # taken over, nothing restarted
    finally:
        second.stop(stop_runtimes=True)  # a drain: runtimes first, then the daemon nothing needs any more
    actions = [(op.action, op.target, op.outcome) for op in ops]
    assert sorted(actions[:-1]) == sorted((action, partition, "ok") for partition in ("gpu0/mps40@1", "gpu0/mps60@0")
                                          for action in ("runtime.drain", "runtime.stop"))
    assert actions[-1] == ("mps.mode", "gpu0", "ok") and "agent stopped" in ops[-1].detail
    assert left_at_daemon_stop == [[]]  # the daemon went once no partition process was left
    assert not mps.running(0) and not _alive(int(daemon.split("@")[0]))
    assert fake_control.calls()[-1]["stdin"] == "quit\n"
    assert fake_control.calls()[-1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.pipe_dir(0))
    assert not any(_alive(pid) for pid in pids.values())
    assert RuntimeSupervisor(tmp_path / "state")._processes_under_state_dir() == []
