#!/usr/bin/env python
"""In-place vertical scaling of a CPU runtime (issue 19; Sponge, Razavi's thesis P2 §p2.3, which resizes a
running instance instead of starting one): what a `resize` costs against starting a new runtime instance,
and whether anything is lost while the cores change under load. A script, not a test (the runtime's resize
is tested in tests/workers/test_resize.py).

    .venv/bin/python benches/resize.py            # full run (about 20 s on two cores)
    .venv/bin/python benches/resize.py --quick    # smoke run, under 10 s
    options: --out DIR (default bench-results), --reps N, --load-s S, --clients C, --hidden H

Writes DIR/resize.csv (one row per measurement) and prints the table.

Setup (printed with the results):
- Model: an MLP 256 -> H -> H -> 10 with ReLU (H = 1024 by default: about 1.3 M FP32 weights), built here
  with onnx.helper, weights from a fixed seed; the runtime checks its sha256 as in production.
- Runtime: the real `python -m workers.runtime.server` on a CPU spec (key cpu0/0) with a `vertical` block
  (Sponge's latency model; the batching policy plans with l(b, c), so a resize builds and warms a session
  and measures nothing), batching policy `fixed` size 1, drop rule "never", max_batch 4.
- (a) Resize: the runtime's own `resize_ms` (frame received to the swap, the new session built and warm,
  the threads pinned) and the client's round trip. Cold: no session for the new core count is cached (a
  fresh runtime started at 1 core resized to 2, and one started at 2 resized to 1); warm: it is (the same
  runtime resized back and forth). Medians over `--reps` repetitions (and for warm, two resizes each).
- (b) Start: spawning `python -m workers.runtime.server` until its ready file holds the endpoint (what
  the agent waits for before a new instance serves), and until it answers its first query; the same
  spawns as (a)'s cold runtimes. Ratio = start / resize.
- (c) Under load: `C` closed-loop clients (each sends its next query when its answer comes), every query
  with a 30 s deadline, while the runtime is resized 1 <-> 2 cores (pinned to CPUs of their own where the
  machine has two) every 0.2 s for `S` seconds; lost = queries not answered 200 (failed, dropped,
  refused, or never answered), which must be 0.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import csv_rows_write, fmt  # noqa: E402

from workers.runtime.vertical import process_cpus  # noqa: E402
from workers.wire import FrameParser, frame_pack, request_encode  # noqa: E402

FIELDS = ["measure", "transition", "state", "samples", "median_ms", "min_ms", "max_ms", "client_median_ms", "queries", "lost",
          "resizes", "ratio_start_over_resize"]
READY_TIMEOUT_S = 120.0


def mlp_bytes(hidden: int, seed: int = 0) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    sizes = [256, hidden, hidden, 10]
    nodes, inits, x = [], [], "x"
    for i in range(len(sizes) - 1):
        inits.append(numpy_helper.from_array((rng.normal(size=(sizes[i], sizes[i + 1])) / np.sqrt(sizes[i])).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(np.zeros(sizes[i + 1], np.float32), f"b{i}"))
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], ["y" if last else f"a{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
            x = f"h{i}"
    graph = helper.make_graph(nodes, "resize_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, producer_name="tessera-bench", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


class Client:
    """One frame connection, requests answered by id."""

    def __init__(self, endpoint: str, timeout_s: float = 60.0) -> None:
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.parser = FrameParser()
        self.answers: dict[Any, dict] = {}

    def call(self, header: dict, body: bytes = b"") -> dict:
        self.sock.sendall(frame_pack(header, body))
        while header.get("id") not in self.answers:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the runtime closed the connection")
            for head, _body in self.parser.feed(data):
                self.answers[head.get("id")] = head
        return self.answers.pop(header.get("id"))

    def close(self) -> None:
        self.sock.close()


def call(endpoint: str, header: dict, body: bytes = b"") -> dict:
    client = Client(endpoint)
    try:
        return client.call(header, body)
    finally:
        client.close()


class Runtime:
    def __init__(self, spec: dict, workdir: Path, name: str) -> None:
        self.spec_path, self.ready = workdir / f"{name}.json", workdir / f"{name}.ready"
        self.spec_path.write_text(json.dumps(spec))
        self.log = open(workdir / f"{name}.log", "wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "workers.runtime.server", "--spec", str(self.spec_path), "--listen", "127.0.0.1:0",
                                      "--ready-file", str(self.ready)], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(REPO)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (self.ready.exists() and self.ready.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"runtime {name} did not start: {(workdir / f'{name}.log').read_text()[-2000:]}")
            time.sleep(0.002)
        self.ready_ms = (time.perf_counter() - self.started) * 1000.0
        self.endpoint = self.ready.read_text().strip()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def infer_header(i: int) -> dict:
    return {"op": "infer", "id": i, "deadline_ms": 30_000.0, "content_type": "application/octet-stream"}


def resize(endpoint: str, cores: int, cpus: list[int] | None = None) -> tuple[dict, float]:
    frame: dict[str, Any] = {"op": "resize", "id": "r", "cores": cores}
    if cpus is not None:
        frame["cpus"] = cpus
    started = time.perf_counter()
    reply = call(endpoint, frame)
    if reply.get("status") != 200:
        raise RuntimeError(f"resize to {cores} failed: {reply}")
    return reply, (time.perf_counter() - started) * 1000.0


def summary(values: list[float]) -> dict[str, Any]:
    return {"samples": len(values), "median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions, 4 s of load: a smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each cold measurement (default 7; 3 with --quick)")
    parser.add_argument("--load-s", type=float, default=None, help="seconds of load for (c) (default 15; 4 with --quick)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    load_s = args.load_s or (4.0 if args.quick else 15.0)
    args.out.mkdir(parents=True, exist_ok=True)
    cpus = sorted(process_cpus() or set(range(os.cpu_count() or 1)))
    pin = cpus[:2] if len(cpus) >= 2 else None

    workdir = Path(tempfile.mkdtemp(prefix="tessera-resize-"))
    data = mlp_bytes(args.hidden)
    model_path = workdir / "mlp.onnx"
    model_path.write_bytes(data)

    def spec(cores: int) -> dict:
        return {"key": "cpu0/0", "application": "bench", "variant": f"mlp{args.hidden}", "artifact_path": str(model_path),
                "sha256": hashlib.sha256(data).hexdigest(), "cpu_threads": cores, "max_batch": 4, "instance": "bench/cpu0/0",
                "cpu_oversubscribe": len(cpus) < 2,  # a one-CPU machine can still run the 2-core side of the bench
                "batching": {"policy": "fixed", "params": {"size": 1}, "drop_rule": "never", "queue_order": "fifo", "slo_ms": 30_000.0},
                "profile": [{"batch": 1, "latency_ms": 1.0}, {"batch": 4, "latency_ms": 3.0}],
                "vertical": {"policy": "sponge", "model": {"gamma1": 1.0, "eps1": 0.5, "delta1": 0.1, "eta1": 0.2}, "min_cores": 1, "max_cores": 2}}

    body = request_encode({"x": np.ones((1, 256), np.float32)}, binary=True)
    body, header_length = body
    query = {**infer_header(0), "header_length": header_length}

    runtime_ms: dict[tuple[str, str], list[float]] = {}
    client_ms: dict[tuple[str, str], list[float]] = {}
    ready_ms, first_ms = [], []

    def record(transition: str, state: str, reply: dict, rtt: float) -> None:
        runtime_ms.setdefault((transition, state), []).append(float(reply["resize_ms"]))
        client_ms.setdefault((transition, state), []).append(rtt)
        assert reply["prepared"] is (state == "warm"), reply

    # (a) and (b): cold and warm resizes, and the starts of the runtimes they ran on.
    for rep in range(reps):
        for start, other in ((1, 2), (2, 1)):
            rt = Runtime(spec(start), workdir, f"rt{rep}-{start}")
            try:
                ready_ms.append(rt.ready_ms)
                answer = call(rt.endpoint, query, body)
                assert answer["status"] == 200, answer
                first_ms.append((time.perf_counter() - rt.started) * 1000.0)
                reply, rtt = resize(rt.endpoint, other)
                record(f"{start}->{other}", "cold", reply, rtt)
                for _ in range(2):
                    reply, rtt = resize(rt.endpoint, start)
                    record(f"{other}->{start}", "warm", reply, rtt)
                    reply, rtt = resize(rt.endpoint, other)
                    record(f"{start}->{other}", "warm", reply, rtt)
                assert call(rt.endpoint, {**query, "id": 1}, body)["status"] == 200
            finally:
                rt.stop()

    # (c) back and forth under a closed-loop load.
    rt = Runtime(spec(1), workdir, "load")
    statuses: list[Any] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client_loop(n: int) -> None:
        client = Client(rt.endpoint)
        i = n * 10_000_000
        try:
            while not stop.is_set():
                try:
                    status = client.call({**query, "id": i}, body).get("status")
                except OSError as exc:
                    status = f"{type(exc).__name__}"
                with lock:
                    statuses.append(status)
                i += 1
        finally:
            client.close()

    load_resizes, load_resize_ms = 0, []
    try:
        threads = [threading.Thread(target=client_loop, args=(n,), daemon=True) for n in range(args.clients)]
        for t in threads:
            t.start()
        ends = time.monotonic() + load_s
        cores = 1
        while time.monotonic() < ends:
            time.sleep(0.2)
            cores = 3 - cores
            reply, _rtt = resize(rt.endpoint, cores, (pin[:cores] if pin else None))
            load_resizes += 1
            load_resize_ms.append(float(reply["resize_ms"]))
        stop.set()
        for t in threads:
            t.join(60)
        health = call(rt.endpoint, {"op": "health", "id": "h"})
    finally:
        rt.stop()
    counters = health["counters"]
    lost = sum(1 for s in statuses if s != 200)
    lost_runtime = counters["failed"] + counters["dropped"]

    start_median = statistics.median(ready_ms)
    rows: list[dict[str, Any]] = []
    for (transition, state), values in sorted(runtime_ms.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row = {"measure": "resize", "transition": transition, "state": state, **summary(values),
               "client_median_ms": statistics.median(client_ms[(transition, state)])}
        row["ratio_start_over_resize"] = start_median / row["median_ms"] if row["median_ms"] > 0 else None
        rows.append(row)
    rows.append({"measure": "start", "transition": "spawn->ready", "state": "new", **summary(ready_ms)})
    rows.append({"measure": "start", "transition": "spawn->first answer", "state": "new", **summary(first_ms)})
    rows.append({"measure": "load", "transition": "1<->2 every 0.2 s", "state": "mixed", **summary(load_resize_ms),
                 "queries": len(statuses), "lost": lost + lost_runtime, "resizes": load_resizes})
    path = csv_rows_write(args.out / "resize.csv", rows, FIELDS)

    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:  # pragma: no cover
        ort_version = "?"
    print(f"In-place resize of a CPU runtime vs a new instance (benches/resize.py{' --quick' if args.quick else ''})")
    print(f"  machine: {platform.machine()}, {len(cpus)} CPUs usable ({platform.processor() or platform.system()}), Python {platform.python_version()}, "
          f"onnxruntime {ort_version}")
    print(f"  model: MLP 256 -> {args.hidden} -> {args.hidden} -> 10 ({(256 * args.hidden + args.hidden * args.hidden + args.hidden * 10) / 1e6:.2f} M weights), "
          f"{reps} repetitions; resize_ms is the runtime's (frame to swap), client the round trip")
    print()
    print(f"  {'measure':<8} {'transition':<22} {'state':<6} {'n':>3} {'median ms':>10} {'min':>8} {'max':>8} {'client ms':>10} {'start/resize':>12}")
    for r in rows[:-1]:
        ratio = r.get("ratio_start_over_resize")
        print(f"  {r['measure']:<8} {r['transition']:<22} {r['state']:<6} {r['samples']:>3} {fmt(r['median_ms'], '10.2f')} "
              f"{fmt(r['min_ms'], '8.2f')} {fmt(r['max_ms'], '8.2f')} {fmt(r.get('client_median_ms'), '.2f'):>10} "
              f"{(format(ratio, '11.0f') + 'x') if ratio is not None else format('-', '>12')}")
    load = rows[-1]
    print()
    print(f"  under load ({args.clients} closed-loop clients, {load_s:g} s, {load_resizes} resizes 1<->2 cores"
          f"{', pinned to ' + str(pin) if pin else ''}): {len(statuses)} queries, {lost} not answered 200, "
          f"runtime failed {counters['failed']} dropped {counters['dropped']}; resize median {load['median_ms']:.2f} ms")
    print(f"  verdict: {'no query lost' if load['lost'] == 0 else 'QUERIES LOST'} while resizing; a warm resize is "
          f"{start_median / statistics.median(v for (t, s), vs in runtime_ms.items() if s == 'warm' for v in vs):.0f}x faster than a new instance, "
          f"a cold one {start_median / statistics.median(v for (t, s), vs in runtime_ms.items() if s == 'cold' for v in vs):.0f}x")
    print(f"wrote {path}")
    return 0 if load["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
