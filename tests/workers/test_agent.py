"""The worker agent on its own (no control plane: a desired-state file): it converges a simulated GPU and
the real CPU to a desired state with real runtime processes, reconfigures partially (what stays keeps
serving, same process), never leaves a runtime on a destroyed instance, and converges after being killed
between any two of its steps."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.fake_pynvml import FakeGpu, FakeNvml
from workers.agent.agent import Agent
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.desired import DesiredStateError, desired_state_parse
from workers.agent.main import CRASH_ENV
from workers.agent.supervisor import RuntimeSupervisor, _alive

PROFILE = [{"batch": 1, "latency_ms": 1.0}, {"batch": 8, "latency_ms": 4.0}]
BATCHING = {"policy": "proteus", "params": {}, "drop_rule": "deadline", "queue_order": "fifo", "slo_ms": 50.0}
ROOT = Path(__file__).resolve().parents[2]


def gpu_runtime(placement: str, variant: str) -> dict:
    return {
        "key": f"gpu0/{placement}", "device": "gpu0", "placement": placement, "cpu_threads": None,
        "application": "classify", "variant": {"id": 1, "name": variant, "artifact": None},
        "max_batch": 8, "batching": BATCHING, "profile": PROFILE,
    }


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> tuple[Path, str]:
    data = onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=3)
    path = tmp_path_factory.mktemp("models") / "mlp.onnx"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def cpu_runtime(model_file: tuple[Path, str]) -> dict:
    path, sha = model_file
    return {
        "key": "cpu0/0", "device": "cpu0", "placement": None, "cpu_threads": 1, "application": "tabular",
        "variant": {"id": 2, "name": "mlp", "artifact": {"id": 1, "sha256": sha, "size_bytes": path.stat().st_size, "download": str(path)}},
        "max_batch": 8, "batching": BATCHING, "profile": PROFILE,
    }


def version_1(model_file) -> dict:
    return {
        "host": "test", "version": 1,
        "gpus": [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@0", "3g.20gb@4"]}],
        "runtimes": [gpu_runtime("3g.20gb@0", "small"), gpu_runtime("3g.20gb@4", "large"), cpu_runtime(model_file)],
    }


def version_2(model_file) -> dict:
    # 3g.20gb@0 and its runtime stay; 3g.20gb@4 is split into 2g.10gb@4 + 1g.5gb@6.
    return {
        "host": "test", "version": 2,
        "gpus": [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@0", "2g.10gb@4", "1g.5gb@6"]}],
        "runtimes": [gpu_runtime("3g.20gb@0", "small"), gpu_runtime("2g.10gb@4", "medium"), cpu_runtime(model_file)],
    }


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def layout_of(backend) -> list[str]:
    return sorted(str(i.placement) for i in backend.gpus()[0].instances)


@pytest.fixture
def agent_factory(tmp_path):
    made: list[Agent] = []

    def make(desired: Path) -> Agent:
        backend = SimulatedBackend(gpus="1xA100-SXM4-40GB", state_file=tmp_path / "state" / "simulated-gpus.json")
        agent = Agent(backend=backend, state_dir=tmp_path / "state", desired_file=desired, drain_timeout_s=2.0)
        made.append(agent)
        return agent

    yield make
    RuntimeSupervisor(tmp_path / "state").stop_all()


def test_desired_state_refuses_malformed_documents(model_file) -> None:
    doc = version_1(model_file)
    desired_state_parse(doc)
    bad = json.loads(json.dumps(doc))
    bad["runtimes"][0]["key"], bad["runtimes"][0]["placement"] = "gpu0/2g.10gb@2", "2g.10gb@2"  # not in the layout
    with pytest.raises(DesiredStateError, match="not in gpu0's layout"):
        desired_state_parse(bad)
    bad["runtimes"][0]["placement"] = "3g.20gb@0"
    with pytest.raises(DesiredStateError, match="does not match key"):
        desired_state_parse(bad)
    bad = json.loads(json.dumps(doc))
    bad["runtimes"][2]["variant"]["artifact"] = None
    with pytest.raises(DesiredStateError, match="needs the variant's artifact"):
        desired_state_parse(bad)
    bad = json.loads(json.dumps(doc))
    bad["gpus"][0]["mig_enabled"] = False
    with pytest.raises(DesiredStateError, match="mig_enabled"):
        desired_state_parse(bad)


def test_agent_converges_and_reconfigures_partially(tmp_path, agent_factory, model_file) -> None:
    desired = write(tmp_path / "desired.json", version_1(model_file))
    agent = agent_factory(desired)
    result = agent.step()
    assert result is not None and result.converged, result.errors
    assert layout_of(agent.backend) == ["3g.20gb@0", "3g.20gb@4"]
    running = agent.supervisor.observe()
    assert sorted(running) == ["cpu0/0", "gpu0/3g.20gb@0", "gpu0/3g.20gb@4"]
    for record in running.values():
        assert agent.supervisor.call(record, "health")["status"] == 200
    kept_pid = running["gpu0/3g.20gb@0"].pid
    gone_pid = running["gpu0/3g.20gb@4"].pid

    # Nothing to do on the next pass: no operation at all.
    ops_before = len(agent._operations)
    assert agent.step() is None
    assert len(agent._operations) == ops_before

    write(desired, version_2(model_file))
    result = agent.step()
    assert result is not None and result.converged, result.errors
    assert layout_of(agent.backend) == ["1g.5gb@6", "2g.10gb@4", "3g.20gb@0"]
    running = agent.supervisor.observe()
    assert sorted(running) == ["cpu0/0", "gpu0/2g.10gb@4", "gpu0/3g.20gb@0"]
    assert running["gpu0/3g.20gb@0"].pid == kept_pid  # unchanged instance: same process, kept serving
    assert not _alive(gone_pid)
    actions = [(op.action, op.target) for op in agent._operations[ops_before:]]
    # The runtime on 3g.20gb@4 is drained and stopped before its instance is destroyed.
    assert actions.index(("runtime.stop", "gpu0/3g.20gb@4")) < actions.index(("mig.destroy", "gpu0/3g.20gb@4"))
    assert ("mig.create", "gpu0/2g.10gb@4") in actions and ("mig.create", "gpu0/1g.5gb@6") in actions
    assert not any(target == "gpu0/3g.20gb@0" for _action, target in actions)

    report = agent.actual_state()
    assert report["desired_version"] == 2 and report["backend"] == "simulated"
    states = {r["key"]: (r["state"], r["simulated"]) for r in report["runtimes"]}
    assert states == {"cpu0/0": ("ready", False), "gpu0/2g.10gb@4": ("ready", True), "gpu0/3g.20gb@0": ("ready", True)}


def test_make_before_break_starts_new_capacity_first(tmp_path, agent_factory, model_file) -> None:
    doc = version_1(model_file)
    doc["gpus"][0]["layout"] = ["3g.20gb@0"]
    doc["runtimes"] = [gpu_runtime("3g.20gb@0", "small"), cpu_runtime(model_file)]
    desired = write(tmp_path / "desired.json", doc)
    agent = agent_factory(desired)
    assert agent.step().converged
    # Move the variant from 3g.20gb@0 to a new instance at 4: the new one serves before the old one goes.
    doc = dict(doc, version=2)
    doc["gpus"] = [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@4"]}]
    doc["runtimes"] = [gpu_runtime("3g.20gb@4", "small"), cpu_runtime(model_file)]
    write(desired, doc)
    ops_before = len(agent._operations)
    assert agent.step().converged
    actions = [(op.action, op.target) for op in agent._operations[ops_before:]]
    assert actions.index(("runtime.start", "gpu0/3g.20gb@4")) < actions.index(("runtime.drain", "gpu0/3g.20gb@0"))
    assert layout_of(agent.backend) == ["3g.20gb@4"]


def run_agent(state_dir: Path, desired: Path, crash_after: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(CRASH_ENV, None)
    if crash_after is not None:
        env[CRASH_ENV] = str(crash_after)
    cmd = [sys.executable, "-m", "controlplane.cli", "agent", "--backend", "simulated", "--simulate", "1xA100-SXM4-40GB",
           "--state-dir", str(state_dir), "--desired-file", str(desired), "--once", "--loglevel", "WARNING"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def converged_to(state_dir: Path, doc: dict) -> None:
    seed = zlib.crc32(str(state_dir.resolve()).encode())  # as `tessera agent` seeds its simulated GPUs
    backend = SimulatedBackend(gpus="1xA100-SXM4-40GB", state_file=state_dir / "simulated-gpus.json", seed=seed)
    assert layout_of(backend) == sorted(doc["gpus"][0]["layout"])
    supervisor = RuntimeSupervisor(state_dir)
    running = supervisor.observe()
    assert sorted(running) == sorted(r["key"] for r in doc["runtimes"])
    for record in running.values():
        assert _alive(record.pid) and supervisor.call(record, "health")["status"] == 200
    # No runtime process of this state directory other than the recorded ones (no orphans).
    assert sorted(pid for pid, _cmd in supervisor._processes_under_state_dir()) == sorted(r.pid for r in running.values())


def test_agent_killed_between_any_two_steps_converges(tmp_path, model_file) -> None:
    v1, v2 = version_1(model_file), version_2(model_file)
    # How many operations the v1 -> v2 change takes, measured on an uninterrupted run.
    probe = tmp_path / "probe"
    assert run_agent(probe, write(tmp_path / "probe.json", v1)).returncode == 0
    converged_to(probe, v1)
    done = run_agent(probe, write(tmp_path / "probe.json", v2))
    assert done.returncode == 0, done.stderr
    converged_to(probe, v2)
    RuntimeSupervisor(probe).stop_all()
    steps = 6  # drain + stop the runtime on 3g.20gb@4, destroy it, create 2g.10gb@4 and 1g.5gb@6, start one runtime
    try:
        for crash_after in range(1, steps):
            state = tmp_path / f"crash-{crash_after}"
            assert run_agent(state, write(tmp_path / "v.json", v1)).returncode == 0
            killed = run_agent(state, write(tmp_path / "v.json", v2), crash_after=crash_after)
            assert killed.returncode == -9, f"crash after {crash_after}: {killed.returncode} {killed.stderr[-500:]}"
            recovered = run_agent(state, tmp_path / "v.json")
            assert recovered.returncode == 0, recovered.stderr
            converged_to(state, v2)
            RuntimeSupervisor(state).stop_all()
    finally:
        for state in tmp_path.glob("crash-*"):
            RuntimeSupervisor(state).stop_all()


def test_a_runtime_reports_the_model_it_serves_not_the_one_wanted_next(tmp_path, agent_factory, model_file) -> None:
    """Until its replacement runs, a slot whose desired model changed is reported with the model its process
    serves: the control plane must not publish a route for the new model to the old process."""
    doc = version_1(model_file)
    doc["gpus"][0]["layout"] = ["3g.20gb@0"]
    doc["runtimes"] = [gpu_runtime("3g.20gb@0", "small"), cpu_runtime(model_file)]
    desired = write(tmp_path / "desired.json", doc)
    agent = agent_factory(desired)
    assert agent.step().converged
    served = lambda: {r["key"]: (r["application"], r["variant"]) for r in agent.actual_state()["runtimes"]}  # noqa: E731
    assert served()["gpu0/3g.20gb@0"] == ("classify", 1)

    moved = gpu_runtime("3g.20gb@0", "large")
    moved.update(application="detect", variant={"id": 2, "name": "large", "artifact": None})
    write(desired, dict(doc, version=2, runtimes=[moved, cpu_runtime(model_file)]))
    agent.desired_read()  # the new desired state is known, not yet reconciled
    assert served()["gpu0/3g.20gb@0"] == ("classify", 1)
    assert agent.step().converged
    assert served()["gpu0/3g.20gb@0"] == ("detect", 2)


def test_a_runtime_that_cannot_start_leaves_the_host_settled_not_stuck(tmp_path, agent_factory, model_file) -> None:
    """Issue 38: a runtime whose model does not load kept its host from converging, and the rollout then
    undid every application's change. The agent reaches the rest (GPU layout, other runtimes), reports the
    runtime failed with why, calls the version settled (Host.settled_version: the rollout goes on without
    it), not converged, and keeps retrying it."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    doc = version_1(model_file)
    doc["runtimes"][2]["variant"]["artifact"] = {"id": 9, "sha256": hashlib.sha256(broken.read_bytes()).hexdigest(),
                                                 "size_bytes": broken.stat().st_size, "download": str(broken)}
    agent = agent_factory(write(tmp_path / "desired.json", doc))
    result = agent.step()
    assert result is not None and not result.converged and result.settled, result.errors
    assert set(result.failed_starts) == {"cpu0/0"} and result.failed_starts["cpu0/0"]
    assert layout_of(agent.backend) == ["3g.20gb@0", "3g.20gb@4"]
    assert sorted(agent.supervisor.observe()) == ["gpu0/3g.20gb@0", "gpu0/3g.20gb@4"]  # the others run
    report = agent.actual_state()
    assert report["settled_version"] == 1 and report["desired_version"] is None
    (failed,) = [r for r in report["runtimes"] if r["state"] == "failed"]
    assert failed["key"] == "cpu0/0" and failed["application"] == "tabular" and failed["error"].startswith("cpu0/0:")
    # A GPU that cannot reach its layout is not "settled": that is the host's failure, not one model's.
    from workers.agent.reconcile import ReconcileResult

    assert not ReconcileResult(version=1, converged=False, errors=["gpu0: layout not reached"], failed_starts={"cpu0/0": "x"}).settled


def test_an_agent_that_keeps_mig_modes_refuses_to_switch_one_and_changes_nothing(tmp_path, model_file) -> None:
    """`tessera agent --keep-mig-modes` (issue 45: the lent H200's MIG mode must stay as it is; on fleets whose MIG
    modes NVIDIA's mig-manager owns): a desired state that turns MIG on is refused for that GPU, said so, and NVML
    is never asked to switch; the rest of the desired state (the CPU runtime) is still applied."""
    nvml = FakeNvml([FakeGpu("A100-SXM4-40GB")])
    backend = NvmlBackend(nvml=nvml, mps_dir=tmp_path / "mps")
    desired = write(tmp_path / "desired.json", {**version_1(model_file), "runtimes": [cpu_runtime(model_file)]})
    agent = Agent(backend=backend, state_dir=tmp_path / "state", desired_file=desired, drain_timeout_s=2.0, keep_mig_modes=True)
    try:
        result = agent.step()
        assert result is not None and not result.converged
        assert any("turns MIG on, and this agent keeps MIG modes as they are (--keep-mig-modes)" in e for e in result.errors), result.errors
        assert backend.gpus()[0].mig_enabled is False and "nvmlDeviceSetMigMode" not in nvml.calls
        assert not any(op.action == "mig.mode" for op in agent._operations)
        assert sorted(agent.supervisor.observe()) == ["cpu0/0"]
    finally:
        RuntimeSupervisor(tmp_path / "state").stop_all()
