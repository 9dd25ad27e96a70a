#!/usr/bin/env python
"""The data plane's overhead: a query through the router and a runtime process against a bare
`onnxruntime.InferenceSession.run` of the same model on the same CPU. No paper figure: Proteus (ASPLOS'24
§6.8) reports only its request router's table lookup, under 1 ms; the targets are the issue's. A script,
not a test (its smoke run is tests/workers/test_bench_dataplane_smoke.py).

    .venv/bin/python benches/dataplane.py            # full run (about 40 s on two cores)
    .venv/bin/python benches/dataplane.py --quick    # smoke run, about 10 s
    .venv/bin/python benches/dataplane.py --peers var/bench-peers   # and MLServer, Ray Serve, Triton beside it
    options: --out DIR (default bench-results), --batches 1,8,32, --requests N, --duration S,
             --clients C, --threads T, --seed S, --batching-max M, --peers DIR (`make bench-peers` makes it)

Writes DIR/dataplane.csv (one row per batch size) and DIR/dataplane.png (needs matplotlib).

Setup (printed with the results):
- Models (`--models`, both by default, measured in the same run): MLPs with ReLU, FP32, weights from a
  fixed seed, built with onnx.helper. "small" is 256 -> 512 -> 512 -> 10 (about 0.03 ms at batch 1 on one
  thread: the data plane's own cost dominates, the worst case); "large" is 1024 -> 4096 -> 4096 -> 1000
  (about 25 M weights, a few ms at batch 8: the scale of a small vision or ranking model).
- Bare: `InferenceSession.run` in this process, `T` intra-op threads (default 1), inter-op 1.
- Router path: the runtime is the real `python -m workers.runtime.server` (same model, same threads,
  batching policy `fixed` with size 1 so it runs each request alone, at the request's own batch size, as
  bare does; drop rule "never"), the router the real `python -m workers.router` (uvicorn, httptools,
  uvloop) on a one-route table; each in its own process. The client is this process.
- Requests: KServe v2 with the binary tensor extension for the input and the outputs (a `[batch, 256]`
  FP32 tensor), so that the path measured is the data plane's, not JSON's number formatting.
- Latency: one keep-alive connection, one request at a time; the request's bytes are built once, and the
  time is taken from before `sendall` to the last byte of the response (`time.perf_counter_ns`), so it
  includes the client's own send, receive and parse of the response head (a few microseconds). Added
  latency = the router path's percentile minus bare's same percentile.
- Throughput: `C` keep-alive connections (default 8) in one epoll loop, closed loop (each sends its next
  request when its answer arrives) for `S` seconds, against bare running back to back for `S` seconds.
  Rows (batch x requests) per second; ratio = router path / bare. Every process shares the same cores.
- Throughput again with the runtime's batching on (policy max-delay without delay, up to `M` requests,
  default 4, per model run): what the data plane gets when it may batch requests; bare still runs one
  request at a time, so this ratio is not the like-for-like one the verdict uses.
- CPU per request (user + system, every thread) of the runtime, the router and the client during the
  throughput runs, and a contention probe (bare ORT timed while another process spins): on a machine whose
  "cores" share one (hyperthreads, an overcommitted VM) every microsecond of router/runtime CPU comes
  out of the model's time, which bounds the ratio whatever the data plane does.
- Targets (the issue): added p99 <= 0.5 ms at batch 1; throughput >= 90 % of bare at batch >= 8.
- Peers (`--peers DIR`, issue 22 section 2): the same model served by MLServer (a custom onnxruntime
  runtime), Ray Serve (one replica) and Triton Inference Server's core through PyTriton (dynamic batching
  off), each from its own venv under DIR (benches/peers/), one at a time after Tessera's rows, with the
  same client, connections and durations; Tessera's router path is measured again over OIP JSON (what
  every peer speaks) and binary (Tessera and Triton). Latency up to 1,000 requests per row. Writes
  OUT/dataplane_peers.csv; the table gives each figure as a multiple of bare onnxruntime's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from _common import PNG_SKIPPED, csv_rows_write, figure_write, fmt, pyplot_load  # noqa: E402
from workers.wire import request_encode  # noqa: E402

TARGET_ADDED_P99_MS = 0.5
TARGET_RATIO = 0.9
APPLICATION = "bench-mlp"
MODELS = {"small": (256, 512, 512, 10), "large": (1024, 4096, 4096, 1000)}
# Serving systems users would pick instead (issue 22 section 2), each in its own venv under --peers (see
# benches/peers/README.md): name -> (venv folder, server script, wire formats it speaks over HTTP).
PEERS = {
    "MLServer": ("mlserver", "mlserver_onnx.py", ("json",)),  # its REST front end refuses the binary extension
    "Ray Serve": ("ray", "ray_serve_onnx.py", ("json",)),
    "Triton (PyTriton)": ("pytriton", "pytriton_onnx.py", ("json", "binary")),
}
PEER_PATH = "/v2/models/mlp/infer"
PEER_FIELDS = ("model", "system", "wire", "batch", "requests", "p50_ms", "p99_ms", "rows_per_s", "errors", "bare_p50_ms", "bare_p99_ms",
               "bare_rows_per_s", "p50_x_bare", "p99_x_bare", "throughput_x_bare")
CSV_FIELDS = (
    "model", "batch", "requests", "bare_p50_ms", "bare_p99_ms", "router_p50_ms", "router_p99_ms", "added_p50_ms", "added_p99_ms",
    "target_added_p99_ms", "clients", "duration_s", "bare_rows_per_s", "router_rows_per_s", "throughput_ratio", "target_ratio",
    "errors", "verdict", "bare_ms_per_request", "runtime_cpu_us_per_request", "router_cpu_us_per_request", "client_cpu_us_per_request",
    "contention_factor", "batching_max", "batching_rows_per_s", "batching_ratio", "batching_requests_per_run",
)


# --------------------------------------------------------------------------- the model


def mlp_bytes(seed: int, sizes: tuple[int, ...] = (256, 512, 512, 10)) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = numpy_helper.from_array((rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array((rng.normal(size=n_out) * 0.01).astype(np.float32), f"b{i}")
        inits += [w, b]
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], ["y" if last else f"a{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
            x = f"h{i}"
    graph = helper.make_graph(nodes, "bench_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", sizes[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", sizes[-1]])], inits)
    model = helper.make_model(graph, producer_name="tessera-bench", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def bare_session(model: bytes, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- processes


def wait_file(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2]} exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        time.sleep(0.02)
    raise RuntimeError(f"{proc.args} did not become ready in {timeout_s} s")


NO_BATCHING = {"policy": "fixed", "params": {"size": 1}, "drop_rule": "never", "queue_order": "fifo", "slo_ms": 10_000.0}


def runtime_counters(endpoint: str) -> dict[str, int]:
    """The runtime's counters since it started (its `health` frame): served, batches, ..."""
    from workers.agent.supervisor import frame_call

    header, _body = frame_call(endpoint, {"op": "health", "id": 1})
    return header["counters"]


def start_dataplane(workdir: Path, model_path: Path, threads: int, profile: list[dict], max_batch: int = 1,
                    batching: dict | None = None) -> tuple[list[subprocess.Popen], str]:
    spec = {
        "key": "cpu0/0", "application": APPLICATION, "variant": "mlp", "artifact_path": str(model_path),
        "simulated": False, "cpu_threads": threads, "max_batch": max_batch, "instance": "bench/cpu0/0",
        "batching": batching or NO_BATCHING, "profile": profile,
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    for name in ("runtime.ready", "router.ready"):
        (workdir / name).unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), TESSERA_LOG_LEVEL="WARNING")
    runtime = subprocess.Popen([sys.executable, "-m", "workers.runtime.server", "--spec", str(workdir / "spec.json"),
                                "--listen", "127.0.0.1:0", "--ready-file", str(workdir / "runtime.ready")],
                               cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs = [runtime]
    try:
        endpoint = wait_file(workdir / "runtime.ready", runtime)
        tables = [{"id": 1, "application": APPLICATION, "version": 1, "active": True, "slo_ms": 10_000.0, "drop_rule": "never",
                   "routes": [{"instance": "bench/cpu0/0", "variant": spec["variant"], "weight": 1.0, "endpoint": endpoint, "state": "ready"}]}]
        (workdir / "tables.json").write_text(json.dumps(tables))
        router = subprocess.Popen([sys.executable, "-m", "workers.router", "--tables", str(workdir / "tables.json"),
                                   "--listen", "127.0.0.1:0", "--ready-file", str(workdir / "router.ready"), "--name", "bench"],
                                  cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(router)
        url = wait_file(workdir / "router.ready", router)
    except BaseException:
        stop(procs)
        raise
    return procs, url


def stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in reversed(procs):
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def contention_factor(session, x: np.ndarray, n: int) -> float:
    """How much slower bare ORT runs while one other process spins on Python (1.0: a free core for it;
    about 2: the "cores" share one, as hyperthreads or an overcommitted VM do). The router path always
    shares the CPUs with the router and the client, so this bounds what its throughput can be."""
    alone = float(np.median(latency_bare(session, x, n, 20)))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = float(np.median(latency_bare(session, x, n, 20)))
    finally:
        spinner.kill()
        spinner.wait()
    return busy / alone


# --------------------------------------------------------------------------- the client


def http_request(host: str, port: int, x: np.ndarray, *, path: str = f"/v1/infer/{APPLICATION}", wire: str = "binary") -> bytes:
    """The bytes of one Open Inference Protocol request: with the binary tensor extension for the input and
    the outputs ("binary"), or all JSON ("json", what every peer speaks)."""
    if wire == "json":
        body, _ = request_encode({"x": x})
        head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        return head.encode() + body
    body, header_length = request_encode({"x": x}, binary=True, binary_outputs=True)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class _Reader:
    """Reads HTTP/1.1 responses (Content-Length framed) off one keep-alive connection."""

    __slots__ = ("sock", "buf", "need", "status")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.need = -1  # total bytes of the current response, once its head is in
        self.status = 0

    def feed(self) -> bool:
        """Read what is there; True when a whole response is in (it is then consumed)."""
        chunk = self.sock.recv(262144)
        if not chunk:
            raise ConnectionError("the router closed the connection")
        self.buf += chunk
        return self._complete()

    def _complete(self) -> bool:
        buf = self.buf
        if self.need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = buf[:end].lower()
            self.status = int(buf[9:12])
            if b"transfer-encoding: chunked" in head:  # Ray Serve's proxy streams its answers
                return self._chunked(end + 4)
            i = head.find(b"\r\ncontent-length:")  # at a line's start: not Inference-Header-Content-Length's tail
            if i >= 0:
                i += 2
            length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None]) if i >= 0 else 0
            self.need = end + 4 + length
        if len(buf) < self.need:
            return False
        self.buf = buf[self.need:]
        self.need = -1
        return True

    def _chunked(self, at: int) -> bool:
        """A chunked body from `at`: True (consumed) once its last, empty chunk is in."""
        buf = self.buf
        while True:
            line_end = buf.find(b"\r\n", at)
            if line_end < 0:
                return False
            size = int(buf[at:line_end].split(b";")[0], 16)
            at = line_end + 2 + size + 2  # the chunk and its CRLF
            if len(buf) < at:
                return False
            if size == 0:
                self.buf = buf[at:]
                return True


def connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def latency_router(host: str, port: int, request: bytes, n: int, warmup: int) -> tuple[np.ndarray, int]:
    sock = connect(host, port)
    reader = _Reader(sock)
    times = np.empty(n, dtype=np.int64)
    errors = 0
    clock = time.perf_counter_ns
    try:
        for i in range(warmup + n):
            t = clock()
            sock.sendall(request)
            while not reader.feed():
                pass
            dt = clock() - t
            if reader.status != 200:
                errors += 1
            if i >= warmup:
                times[i - warmup] = dt
    finally:
        sock.close()
    return times / 1e6, errors


def latency_bare(session, x: np.ndarray, n: int, warmup: int) -> np.ndarray:
    times = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    feed = {"x": x}
    run = session.run
    for i in range(warmup + n):
        t = clock()
        run(None, feed)
        dt = clock() - t
        if i >= warmup:
            times[i - warmup] = dt
    return times / 1e6


def throughput_router(host: str, port: int, request: bytes, clients: int, duration_s: float) -> tuple[int, float, int]:
    """Closed loop on `clients` connections for `duration_s`: (responses, seconds, errors)."""
    poller = select.epoll()
    readers: dict[int, _Reader] = {}
    socks = []
    try:
        for _ in range(clients):
            sock = connect(host, port)  # blocking: recv is only called when epoll says there is data
            socks.append(sock)
            readers[sock.fileno()] = _Reader(sock)
            poller.register(sock.fileno(), select.EPOLLIN)
        done = errors = 0
        start = time.perf_counter()
        end = start + duration_s
        for sock in socks:
            sock.sendall(request)
        outstanding = clients
        stopping = False
        while outstanding:
            for fd, _ev in poller.poll(1.0):
                reader = readers[fd]
                if not reader.feed():
                    continue
                done += 1
                if reader.status != 200:
                    errors += 1
                if not stopping and time.perf_counter() >= end:
                    stopping = True
                if stopping:
                    outstanding -= 1
                else:
                    reader.sock.sendall(request)
        elapsed = time.perf_counter() - start
    finally:
        poller.close()
        for sock in socks:
            sock.close()
    return done, elapsed, errors


def throughput_bare(session, x: np.ndarray, duration_s: float) -> tuple[int, float]:
    feed = {"x": x}
    run = session.run
    n = 0
    start = time.perf_counter()
    end = start + duration_s
    while True:
        run(None, feed)
        n += 1
        if n % 8 == 0 and time.perf_counter() >= end:
            break
    return n, time.perf_counter() - start


# --------------------------------------------------------------------------- peers


def peer_start(peers_dir: Path, name: str, workdir: Path, model_path: Path, threads: int) -> tuple[subprocess.Popen, str] | None:
    """Start peer `name`'s server from its venv (None when that venv is not there); (process, base URL)."""
    folder, script, _wires = PEERS[name]
    python = peers_dir / folder / "bin" / "python"
    if not python.exists():
        return None
    ready = workdir / f"{folder}.ready"
    ready.unlink(missing_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (workdir / f"{folder}.log").open("w")
    proc = subprocess.Popen([str(python), str(REPO / "benches" / "peers" / script), "--model", str(model_path), "--port", str(port),
                             "--threads", str(threads), "--ready-file", str(ready)],
                            cwd=workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180  # Ray starts its cluster first
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            return proc, ready.read_text().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    peer_stop(proc)
    print(f"  {name}: did not start; its log ({workdir / f'{folder}.log'}):\n" + (workdir / f"{folder}.log").read_text()[-1500:])
    return None


def peer_stop(proc: subprocess.Popen) -> None:
    """A peer's whole process group (Ray's raylets, Triton's server and proxy backends)."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def system_measure(args: argparse.Namespace, system: str, url: str, path: str, wires: tuple[str, ...], inputs: dict[int, np.ndarray],
                   bare: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """One serving system, each wire format and batch size: latency (one connection, sequential) and
    closed-loop throughput with the same client as Tessera's rows, against bare onnxruntime's figures."""
    host, _, port_text = url.removeprefix("http://").rpartition(":")
    port = int(port_text)
    rows = []
    for wire in wires:
        for b in args.batches:
            request = http_request(host, port, inputs[b], path=path, wire=wire)
            n = min(args.requests, 1000)
            latency_router(host, port, request, 20, 5)  # warm the connection and the server
            times, errors = latency_router(host, port, request, n, max(20, n // 10))
            throughput_router(host, port, request, args.clients, min(0.3, args.duration))  # warm-up
            done, seconds, t_errors = throughput_router(host, port, request, args.clients, args.duration)
            p50, p99 = np.percentile(times, [50, 99])
            rows_per_s = done * b / seconds
            ref = bare[b]
            rows.append({"model": args.model, "system": system, "wire": wire, "batch": b, "requests": n, "p50_ms": float(p50),
                         "p99_ms": float(p99), "rows_per_s": rows_per_s, "errors": errors + t_errors, "bare_p50_ms": ref["p50"],
                         "bare_p99_ms": ref["p99"], "bare_rows_per_s": ref["rows_per_s"], "p50_x_bare": float(p50) / ref["p50"],
                         "p99_x_bare": float(p99) / ref["p99"], "throughput_x_bare": rows_per_s / ref["rows_per_s"]})
        print(f"  {args.model}: {system} over {wire}: done", flush=True)
    return rows


# --------------------------------------------------------------------------- the run


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    model = mlp_bytes(args.seed, args.sizes)
    session = bare_session(model, args.threads)
    rng = np.random.default_rng(args.seed)
    inputs = {b: rng.normal(size=(b, args.sizes[0])).astype(np.float32) for b in args.batches}
    # The runtime's latency profile (what a batching policy sees, per query; "fixed" and "max-delay" with no
    # delay hardly use it): the smallest request's latency per query in the batch.
    one = float(np.median(latency_bare(session, inputs[min(inputs)], 20, 5)))
    profile = [{"batch": 1, "latency_ms": one}, {"batch": 8, "latency_ms": 8 * one}]
    rows = []
    info: dict[str, Any] = {"contention": contention_factor(session, inputs[max(inputs)], 100 if args.quick else 400)}
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        workdir = Path(tmp)
        model_path = workdir / "mlp.onnx"
        model_path.write_bytes(model)
        procs, url = start_dataplane(workdir, model_path, args.threads, profile)
        info["pids"] = [p.pid for p in procs]
        host, _, port_text = url.removeprefix("http://").rpartition(":")
        port = int(port_text)
        try:
            for b in args.batches:
                x = inputs[b]
                request = http_request(host, port, x)
                # Big models: about 8 s of bare runs per batch size, at least 300 samples (p99 needs them).
                estimate_ms = float(np.median(latency_bare(session, x, 10, 2)))
                n = max(300, min(args.requests, int(8000.0 / max(estimate_ms, 1e-3))))
                warmup = max(20, n // 10)
                bare = latency_bare(session, x, n, warmup)
                routed, errors = latency_router(host, port, request, n, warmup)
                bare_done, bare_s = throughput_bare(session, x, args.duration)
                cpu0 = [process_cpu_s(p.pid) for p in procs] + [self_cpu_s()]
                done, seconds, t_errors = throughput_router(host, port, request, args.clients, args.duration)
                cpu1 = [process_cpu_s(p.pid) for p in procs] + [self_cpu_s()]
                per_request_us = [(b1 - b0) / max(done, 1) * 1e6 for b0, b1 in zip(cpu0, cpu1)]
                bare_p50, bare_p99 = np.percentile(bare, [50, 99])
                r_p50, r_p99 = np.percentile(routed, [50, 99])
                bare_rps = bare_done * b / bare_s
                router_rps = done * b / seconds
                row = {
                    "model": args.model, "batch": b, "requests": n, "bare_p50_ms": float(bare_p50), "bare_p99_ms": float(bare_p99),
                    "router_p50_ms": float(r_p50), "router_p99_ms": float(r_p99), "added_p50_ms": float(r_p50 - bare_p50),
                    "added_p99_ms": float(r_p99 - bare_p99), "clients": args.clients, "duration_s": args.duration,
                    "bare_rows_per_s": bare_rps, "router_rows_per_s": router_rps, "throughput_ratio": router_rps / bare_rps,
                    "errors": errors + t_errors, "bare_ms_per_request": bare_s / bare_done * 1000.0,
                    "runtime_cpu_us_per_request": per_request_us[0], "router_cpu_us_per_request": per_request_us[1],
                    "client_cpu_us_per_request": per_request_us[2],
                    "target_added_p99_ms": TARGET_ADDED_P99_MS if b == 1 else "",
                    "target_ratio": TARGET_RATIO if b >= 8 else "",
                }
                verdicts = []
                if b == 1:
                    verdicts.append("p99 " + ("meets" if row["added_p99_ms"] <= TARGET_ADDED_P99_MS else "MISSES"))
                if b >= 8:
                    verdicts.append("throughput " + ("meets" if row["throughput_ratio"] >= TARGET_RATIO else "MISSES"))
                row["verdict"] = "; ".join(verdicts) or "-"
                row["contention_factor"] = info["contention"]
                row["batching_max"] = args.batching_max
                rows.append(row)
                print(f"  {args.model} batch {b}: done", flush=True)
            if args.peers:  # Tessera beside its peers: the same client, both wire formats
                bare = {r["batch"]: {"p50": r["bare_p50_ms"], "p99": r["bare_p99_ms"], "rows_per_s": r["bare_rows_per_s"]} for r in rows}
                info.setdefault("peers", []).extend(
                    system_measure(args, "Tessera", url, f"/v1/infer/{APPLICATION}", ("json", "binary"), inputs, bare))
        finally:
            stop(procs)
        for name in PEERS if args.peers else ():
            started = peer_start(args.peers, name, workdir, model_path, args.threads)
            if started is None:
                continue
            proc, peer_url = started
            try:
                info["peers"].extend(system_measure(args, name, peer_url, PEER_PATH, PEERS[name][2], inputs, bare))
            finally:
                peer_stop(proc)
        # The same path with the runtime's batching on: up to BATCHING_MAX requests per model run.
        if args.batching_max > 1:
            batching = {"policy": "max-delay", "params": {"max_queue_delay_ms": 0.0}, "drop_rule": "never", "queue_order": "fifo",
                        "slo_ms": 10_000.0}
            procs, url = start_dataplane(workdir, model_path, args.threads, profile, max_batch=args.batching_max, batching=batching)
            host, _, port_text = url.removeprefix("http://").rpartition(":")
            endpoint = (workdir / "runtime.ready").read_text().strip()
            try:
                for row in rows:
                    b = row["batch"]
                    request = http_request(host, int(port_text), inputs[b])
                    throughput_router(host, int(port_text), request, args.clients, min(0.3, args.duration))  # warm-up
                    before = runtime_counters(endpoint)
                    done, seconds, t_errors = throughput_router(host, int(port_text), request, args.clients, args.duration)
                    after = runtime_counters(endpoint)
                    # Requests per model run under load: the batches the policy still forms (a lone query at an
                    # idle instance runs without the thread hop; this shows batching is not starved by it).
                    row["batching_requests_per_run"] = (after["served"] - before["served"]) / max(1, after["batches"] - before["batches"])
                    row["batching_rows_per_s"] = done * b / seconds
                    row["batching_ratio"] = row["batching_rows_per_s"] / row["bare_rows_per_s"]
                    row["errors"] += t_errors
                print("  runtime batching: done", flush=True)
            finally:
                stop(procs)
    return rows, info


def report(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    head = (f"{'model':<6}{'batch':>5} {'bare p50':>9} {'bare p99':>9} {'router p50':>10} {'router p99':>10} {'added p50':>9} {'added p99':>9}"
            f" {'bare rows/s':>12} {'router rows/s':>13} {'ratio':>6}  verdict (targets: added p99 <= {TARGET_ADDED_P99_MS} ms at batch 1;"
            f" ratio >= {TARGET_RATIO:.0%} at batch >= 8)")
    lines = ["", "latencies in ms; added = router path percentile - bare percentile", head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:<6}{r['batch']:>5} {r['bare_p50_ms']:>9.3f} {r['bare_p99_ms']:>9.3f} {r['router_p50_ms']:>10.3f} {r['router_p99_ms']:>10.3f}"
            f" {r['added_p50_ms']:>9.3f} {r['added_p99_ms']:>9.3f} {r['bare_rows_per_s']:>12,.0f} {r['router_rows_per_s']:>13,.0f}"
            f" {fmt(r['throughput_ratio'], '.2f'):>6}  {r['verdict']}" + (f"  ({r['errors']} errors!)" if r["errors"] else ""))
    if rows and "batching_ratio" in rows[0]:
        lines += ["", f"With the runtime's batching on (max-delay, no delay, up to {rows[0]['batching_max']} requests per model run;"
                  " bare still runs one request at a time):"]
        for r in rows:
            lines.append(f"{r['model']:<6}{r['batch']:>5} {r['batching_rows_per_s']:>12,.0f} rows/s  ratio {r['batching_ratio']:.2f}"
                         f"  {r['batching_requests_per_run']:.2f} requests per model run")
    lines += ["", "CPU per request in the throughput runs (us; user + system, all threads): where the router path's time goes",
              f"{'model':<6}{'batch':>5} {'bare ORT':>9} {'runtime':>9} {'router':>9} {'client':>9} {'overhead':>9}  (overhead = runtime - bare ORT + router + client)"]
    for r in rows:
        ort_us = r["bare_ms_per_request"] * 1000.0
        overhead = r["runtime_cpu_us_per_request"] - ort_us + r["router_cpu_us_per_request"] + r["client_cpu_us_per_request"]
        lines.append(f"{r['model']:<6}{r['batch']:>5} {ort_us:>9.0f} {r['runtime_cpu_us_per_request']:>9.0f} {r['router_cpu_us_per_request']:>9.0f}"
                     f" {r['client_cpu_us_per_request']:>9.0f} {overhead:>9.0f}")
    peers = info.get("peers") or []
    if peers:
        lines += ["", "Side by side with the serving systems users would pick instead (same model, same client, same cores, one run;"
                  " x bare = the system's figure / bare onnxruntime's):",
                  f"{'model':<6}{'system':<19}{'wire':<7}{'batch':>5} {'p50 ms':>8} {'p99 ms':>8} {'rows/s':>10} {'p50 x bare':>10}"
                  f" {'p99 x bare':>10} {'rows/s x bare':>13}"]
        for r in peers:
            lines.append(f"{r['model']:<6}{r['system']:<19}{r['wire']:<7}{r['batch']:>5} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}"
                         f" {r['rows_per_s']:>10,.0f} {r['p50_x_bare']:>10.2f} {r['p99_x_bare']:>10.2f} {r['throughput_x_bare']:>13.2f}"
                         + (f"  ({r['errors']} errors!)" if r["errors"] else ""))
    c = info["contention"]
    lines += ["", f"CPU contention: bare ORT runs {c:.2f}x slower while one other process spins "
              + ("(the CPUs behave as ONE core shared by every process: the router path's own CPU comes straight out of ORT's;"
                 " throughput >= 90 % of bare would need the overhead above to be under ~10 % of the bare ORT time)" if c > 1.5 else
                 "(the processes have cores of their own)")]
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"{r['model']}\nb{r['batch']}" for r in rows]
    xs = np.arange(len(rows))
    ax1.bar(xs - 0.2, [r["added_p50_ms"] for r in rows], 0.4, label="added p50", color="#729ECE")
    ax1.bar(xs + 0.2, [r["added_p99_ms"] for r in rows], 0.4, label="added p99", color="#ED665D")
    ax1.axhline(TARGET_ADDED_P99_MS, color="k", ls="--", lw=0.8, label=f"target p99 at batch 1 ({TARGET_ADDED_P99_MS} ms)")
    ax1.set_xticks(xs, labels)
    ax1.set_xlabel("model, batch")
    ax1.set_ylabel("ms added by router + runtime")
    ax1.set_ylim(0, max([TARGET_ADDED_P99_MS] + [r["added_p99_ms"] for r in rows]) * 1.45)
    ax1.legend(fontsize=8, loc="upper left", ncol=2)
    batching = "batching_ratio" in rows[0]
    width = 0.4 if batching else 0.5
    ax2.bar(xs - (0.2 if batching else 0), [r["throughput_ratio"] for r in rows], width, color="#67BF5C", label="one request per model run")
    if batching:
        ax2.bar(xs + 0.2, [r["batching_ratio"] for r in rows], width, color="#AD8BC9",
                label=f"runtime batching (up to {rows[0]['batching_max']} requests)")
    ax2.axhline(TARGET_RATIO, color="k", ls="--", lw=0.8, label=f"target at batch >= 8 ({TARGET_RATIO:.0%})")
    ax2.set_xticks(xs, labels)
    ax2.set_xlabel("model, batch")
    ax2.set_ylabel("throughput, router path / bare")
    ax2.set_ylim(0, 1.3)
    ax2.legend(fontsize=8, loc="upper left")
    return figure_write(plt, fig, path, "Tessera data plane overhead: router + runtime vs bare onnxruntime (MLPs, CPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few requests, short throughput runs: a smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--batches", type=str, default="1,8,32")
    parser.add_argument("--requests", type=int, default=None, help="latency samples per batch size (default 3000; 200 with --quick)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per throughput run (default 3; 0.5 with --quick)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent connections in the throughput runs")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (bare and runtime alike)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", type=str, default="small,large", help=f"which MLPs to measure: {', '.join(MODELS)}")
    parser.add_argument("--peers", type=Path, default=None,
                        help="also serve the model with MLServer, Ray Serve and Triton (PyTriton) from their venvs in this folder"
                             " (benches/peers/README.md; `make bench-peers` makes var/bench-peers)")
    parser.add_argument("--batching-max", type=int, default=4,
                        help="also measure throughput with the runtime batching up to this many requests per run (1: skip)")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.requests = args.requests or (200 if args.quick else 3000)
    args.duration = args.duration or (0.5 if args.quick else 3.0)

    t_start = time.perf_counter()
    import onnxruntime

    print("Data plane overhead (benches/dataplane.py)" + (" --quick smoke run" if args.quick else ""))
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models: unknown {unknown}; known: {', '.join(MODELS)}")
    print("Models: " + "; ".join(f"{m}: MLP {' -> '.join(map(str, MODELS[m]))}" for m in models) + " (ReLU), FP32, seed", args.seed, "| onnxruntime", onnxruntime.__version__,
          f"| {args.threads} intra-op thread(s), inter-op 1, CPUExecutionProvider")
    print("Router path: client (this process) -HTTP/1.1 keep-alive-> router process (uvicorn+httptools+uvloop)"
          " -frames/TCP-> runtime process (workers.runtime.server, batching 'fixed' size 1: each request runs alone)")
    print("Requests: KServe v2 binary tensor extension, input [batch, width] FP32, binary outputs.")
    print(f"Latency client: one keep-alive raw socket, pre-built request bytes, sequential; up to {args.requests} timed requests per batch (at least 300, about 8 s of bare runs on big models)"
          " after a warm-up; time = sendall .. last response byte (perf_counter_ns), so it includes the client's own send/recv/parse.")
    print(f"Throughput: {args.clients} keep-alive connections in one epoll loop, closed loop, {args.duration:g} s per run; bare runs back to back.")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s) shared by client, router and runtime;"
          f" Python {platform.python_version()}")
    if args.peers is not None and not args.peers.is_dir():
        parser.error(f"--peers: no folder {args.peers} (benches/peers/README.md says how to make it)")
    args.peers = args.peers.resolve() if args.peers is not None else None
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    peers: list[dict[str, Any]] = []
    for model in models:
        args.model, args.sizes = model, MODELS[model]
        model_rows, info = measure(args)
        rows += model_rows
        peers += info.get("peers", [])
    info["peers"] = peers
    for line in report(rows, info):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = csv_rows_write(args.out / "dataplane.csv", rows, CSV_FIELDS)
    print(f"wrote {csv_path} ({len(rows)} rows) in {time.perf_counter() - t_start:.1f} s")
    if peers:
        print(f"wrote {csv_rows_write(args.out / 'dataplane_peers.csv', peers, PEER_FIELDS)} ({len(peers)} rows)")
    print(plot(rows, args.out / "dataplane.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
