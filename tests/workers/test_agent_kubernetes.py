"""The agent as Kubernetes runs it (deploy/kubernetes/base/agent.yaml), through restarts of its container
(issue 44).

Under Kubernetes every process the agent starts lives in its container: the container runtime tears the
container's PID namespace (and cgroup) down with it, so the runtimes cannot outlive a container restart as
they outlive a systemd restart (KillMode=process), and a new container cannot adopt them. What the manifest
promises instead (docs/dataplane.md, "Agent exits and restarts") is a drain and a restart:

- stopped (SIGTERM: a liveness failure, a pod deleted or updated), the agent reports its runtimes draining,
  waits for the routers to drop them, drains and stops them, and reports them stopped, within the pod's
  grace period;
- killed without one (an OOM kill, a crash), its runtimes die with it at once;
- either way the restarted container starts them again from the desired state, and reports the host not
  converged until they all run; no query routed meanwhile is answered wrongly: each is answered right, or
  refused (503 / 504; after a kill, also 502 for a query the dying runtime held).

The container is stood for by what makes one for processes: the agent is PID 1 of a PID namespace of its own
(`unshare --pid --fork --mount-proc`), so the kernel kills every process left in it when the agent exits, as
when a container's main process exits; a container restart is a new namespace. The container runs the
DaemonSet's own command (its shell wrapper, which reads the node's token from the Secret's mount) in the
container's environment (the manifest's variables and the image's PATH), with only these changed: the
Secret's mount and the hostPath are folders of the test, the metrics port a free one, the control plane the
test's live server, the pod's IP the loopback, and the backend `simulated` (there is no GPU here; the node is
the demo's CPU host, whose runtimes compute for real with onnxruntime)."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from apps.deployments.models import HostDesiredState, HostOperation, Runtime
from apps.inventory.models import Host
from apps.inventory.services import host_agent_token_rotate, router_credential_issue
from apps.registry.models import ModelVariant
from controlplane.demo import demo_seed
from tests.deploy.kustomize import render
from tests.waiting import wait_for
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
NODE = "sim-cpu-01"  # the node's name is its Host's name in Tessera
APPLICATION = "tabular-cpu"


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manifest_agent() -> tuple[dict, dict]:
    """The agent's pod spec and container, as the base renders them."""
    (daemonset,) = [r for r in render(ROOT / "deploy" / "kubernetes" / "base")
                    if r["kind"] == "DaemonSet" and r["metadata"]["name"] == "tessera-agent"]
    pod = daemonset["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the manifest's command no longer has {old!r} once: {text}"
    return text.replace(old, new)


class Container:
    """One run of the agent's container: PID 1 of its own PID namespace (see the module docstring)."""

    def __init__(self, script: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            # --kill-child: should the test itself die, the namespace goes with it.
            self.process = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "/bin/sh", "-c", script],
                                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.init_pid = wait_for(self._child, timeout_s=10, what="the container's PID 1")

    def _child(self) -> int | None:
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def stop(self, grace_s: float, while_waiting: Callable[[], None] = lambda: None) -> int:
        """What the kubelet does to stop a container: SIGTERM to its main process, SIGKILL after the grace period.
        Returns the exit status (an AssertionError if the grace period ran out); `while_waiting` is called every
        50 ms meanwhile."""
        os_kill(self.init_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the agent did not exit within the pod's grace period ({grace_s:g} s): {self.log_tail()}")
            while_waiting()
            time.sleep(0.05)
        return self.process.returncode

    def kill(self) -> None:
        """An OOM kill or a crash: the main process dies at once, and the kernel kills the rest of the container."""
        os_kill(self.init_pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def os_kill(pid: int, sig: int) -> None:
    import os

    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Answers:
    """Every query the sender made, in order: (phase, status, body)."""

    phase: str = "up"
    seen: list[tuple[str, int, dict]] = field(default_factory=list)

    def of(self, phase: str) -> list[tuple[int, dict]]:
        return [(status, body) for p, status, body in self.seen if p == phase]


def _sender(url: str, body: dict, answers: Answers, stop: threading.Event) -> None:
    with httpx.Client(timeout=30.0) as client:
        while not stop.is_set():
            try:
                response = client.post(url, json=body)
                answers.seen.append((answers.phase, response.status_code, response.json()))
            except (httpx.HTTPError, ValueError) as exc:  # the router never fails to answer: recorded, and the test fails
                answers.seen.append((answers.phase, 0, {"error": repr(exc)}))
            stop.wait(0.02)


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare(1) allowed to make PID namespaces (root, as CI runs)")
def test_the_agent_drains_and_restarts_with_its_container_as_the_manifest_runs_it(live_server, tmp_path) -> None:
    demo_seed(admin_password="Admin-demo-pass-1")
    host = Host.objects.get(name=NODE)
    version = HostDesiredState.objects.filter(host=host).latest("version").version
    desired_keys = sorted(r["key"] for r in HostDesiredState.objects.get(host=host, version=version).spec["runtimes"])

    # The manifest's container, and only the stand-ins the module docstring lists.
    pod, container = _manifest_agent()
    assert container["command"] == ["/bin/sh", "-c"] and pod["terminationGracePeriodSeconds"] == 60
    state_mount = next(m for m in container["volumeMounts"] if m["name"] == "state")
    state_volume = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state_volume["hostPath"]["path"] == state_mount["mountPath"]  # the node's folder: records and artifacts survive the container
    tokens_mount = next(m for m in container["volumeMounts"] if m["name"] == "tokens")
    tokens, state = tmp_path / "agent-tokens", tmp_path / "var-lib-tessera-agent"
    tokens.mkdir()
    (tokens / NODE).write_text(host_agent_token_rotate(host=host))
    script = container["args"][0]
    script = _replace_once(script, f'"{tokens_mount["mountPath"]}/$NODE_NAME"', f'"{tokens}/$NODE_NAME"')
    script = _replace_once(script, f"--state-dir {state_mount['mountPath']}", f"--state-dir {state}")
    script = _replace_once(script, "--backend nvml", "--backend simulated")
    metrics = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    script = _replace_once(script, f"--metrics-port {metrics}", f"--metrics-port {_free_port()}")
    assert "--stop-runtimes-on-exit" in script
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}  # the image's
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in source:
            env[var["name"]] = {"spec.nodeName": NODE, "status.podIP": "127.0.0.1"}[source["fieldRef"]["fieldPath"]]
        else:
            assert source["configMapKeyRef"]["key"] == "TESSERA_CONTROL_PLANE"
            env[var["name"]] = live_server.url

    # What a right answer is: onnxruntime's, on the artifact of the variant that answered.
    rows = np.random.default_rng(7).normal(size=(2, 8)).astype(np.float32)
    query = {"inputs": [{"name": "input", "shape": [2, 8], "datatype": "FP32", "data": rows.ravel().tolist()}]}
    expected = {}
    for variant in ModelVariant.objects.filter(application__name=APPLICATION).select_related("artifact"):
        session = ort.InferenceSession(variant.artifact.file.open("rb").read(), providers=["CPUExecutionProvider"])
        expected[variant.name] = session.run(None, {"input": rows})

    def runtimes() -> dict[str, tuple[str, str, str]]:
        return {r.key: (r.state, r.endpoint, r.error) for r in Runtime.objects.filter(host=host)}

    def converged_and_serving() -> bool:
        reported = runtimes()
        return (Host.objects.get(pk=host.pk).converged_version == version and sorted(reported) == desired_keys
                and all(state == "ready" for state, _e, _err in reported.values()))

    answers, stop_sending = Answers(), threading.Event()
    router, client = router_build(control_plane=live_server.url, token=router_credential_issue(name="k8s-test")[1])
    handle = router_start_in_thread(router)
    sender: threading.Thread | None = None
    current: Container | None = None

    def answered_since(count: int) -> bool:
        return any(status == 200 for _p, status, _b in answers.seen[count:])

    try:
        current = Container(script, env, tmp_path / "container-1.log")
        wait_for(converged_and_serving, timeout_s=120, what="the agent to converge")
        wait_for(lambda: router.refreshes > 1, what="the router's tables")
        sender = threading.Thread(target=_sender, args=(f"{handle.url}/v1/infer/{APPLICATION}", query, answers, stop_sending), daemon=True)
        sender.start()
        wait_for(lambda: answered_since(0), timeout_s=60, what="answers through the router")
        before_stop = {key: endpoint for key, (_s, endpoint, _e) in runtimes().items()}

        # 1. The kubelet stops the container (SIGTERM, then SIGKILL after terminationGracePeriodSeconds).
        answers.phase = "stopping"
        stopped_at = time.time()
        states_seen: set[str] = set()
        status = current.stop(grace_s=pod["terminationGracePeriodSeconds"],
                              while_waiting=lambda: states_seen.update(state for state, _e, _err in runtimes().values()))
        assert status == 0, current.log_tail()
        assert "draining" in states_seen, (states_seen, current.log_tail())  # withdrawn before they were drained
        reported = runtimes()
        assert sorted(reported) == desired_keys
        assert all(state == "failed" and "stopped with the agent" in error for state, _e, error in reported.values()), reported
        assert Host.objects.get(pk=host.pk).converged_version is None  # not converged: its runtimes do not run
        ops = HostOperation.objects.filter(host=host, at__gte=datetime.fromtimestamp(stopped_at - 1, tz=timezone.utc), outcome="ok")
        seen_ops = list(ops.values_list("action", "target", "detail"))
        assert set(ops.filter(action="runtime.drain").values_list("target", flat=True)) == set(desired_keys), seen_ops  # each drained, then stopped
        assert set(ops.filter(action="runtime.stop").values_list("target", flat=True)) == set(desired_keys), seen_ops
        for endpoint in before_stop.values():  # nothing of the container is left
            _host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()

        # 2. The container restarts: the runtimes come back, the host not converged until they all run.
        answers.phase = "restarting"
        count = len(answers.seen)
        samples: list[tuple[int | None, dict]] = []
        current = Container(script, env, tmp_path / "container-2.log")

        def sampled_until_serving() -> bool:
            samples.append((Host.objects.get(pk=host.pk).converged_version, runtimes()))
            return converged_and_serving()

        try:
            wait_for(sampled_until_serving, timeout_s=120, interval_s=0.05, what="the restarted agent to converge")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {samples[-1]}\n{current.log_tail()}") from None
        for converged, reported in samples:  # never converged while a runtime is down
            assert converged != version or all(state == "ready" for state, _e, _err in reported.values()), (converged, reported)
        assert samples[0][0] is None
        wait_for(lambda: answered_since(count), timeout_s=60, what="answers after the restart")

        # 3. The container is killed (an OOM kill, a crash): its runtimes die with it; the next one starts them again.
        answers.phase = "killed"
        before_kill = {key: endpoint for key, (_s, endpoint, _e) in runtimes().items()}
        current.kill()
        for endpoint in before_kill.values():
            _host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
        count = len(answers.seen)
        current = Container(script, env, tmp_path / "container-3.log")
        wait_for(converged_and_serving, timeout_s=120, what="the agent restarted after a kill to converge")
        wait_for(lambda: answered_since(count), timeout_s=60, what="answers after the kill")
        answers.phase = "up again"
        time.sleep(1.0)
    finally:
        stop_sending.set()
        if sender is not None:
            sender.join(timeout=30)
        if current is not None and current.process.poll() is None:
            current.stop(grace_s=60)
        handle.stop()
        client.close()

    # No query was answered wrongly: a 200 is onnxruntime's answer for the variant that gave it; anything else is a
    # refusal (no route, the deadline, and after the kill an upstream error for what the dying runtimes held).
    refusals: dict[str, dict[int, int]] = {}
    for phase, status, body in answers.seen:
        if status == 200:
            variant = body["parameters"]["variant"]
            for out, want in zip(body["outputs"], expected[variant], strict=True):
                np.testing.assert_allclose(np.asarray(out["data"], dtype=np.float64).reshape(want.shape), want, rtol=1e-5, atol=1e-6)
        else:
            refusals.setdefault(phase, {}).setdefault(status, 0)
            refusals[phase][status] += 1
    allowed = {"up": {503, 504}, "stopping": {503, 504}, "restarting": {503, 504}, "killed": {502, 503, 504}, "up again": {503, 504}}
    for phase, statuses in refusals.items():
        assert set(statuses) <= allowed[phase], (phase, statuses, [b for p, s, b in answers.seen if p == phase and s not in allowed[phase]][:3])
    assert sum(1 for _p, status, _b in answers.seen if status == 200) >= 10, refusals
