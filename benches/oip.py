#!/usr/bin/env python
"""NVIDIA's perf_analyzer against the demo's router over the Open Inference Protocol, over HTTP and over gRPC
(issues 21 and 38): the standard load generator of Triton users, unmodified, measures a Tessera fleet as it
would measure a Triton server. A script, not a test (the protocol is tested with tritonclient in
tests/workers/test_router_oip.py and test_router_grpc.py).

    make perf-analyzer                              # once: perf_analyzer in var/bench-peers/perf-analyzer
    .venv/bin/python benches/oip.py                 # full run (about 3 minutes on two cores)
    .venv/bin/python benches/oip.py --quick         # smoke run, about 1.5 minutes
    options: --out DIR (default bench-results), --perf-analyzer PATH, --concurrency 1,2,4,8, --window-ms MS

Writes DIR/oip.csv (one row per transport, tensor format and concurrency) and DIR/oip.png, and prints the
table and gRPC against HTTP (binary tensors) at each concurrency.

Setup (printed with the results):
- perf_analyzer: the binary tritonclient 2.41.0's manylinux wheel ships (the last wheel that carries it;
  PyPI's `perf-analyzer` package is a 2 KB placeholder), with libcudart from nvidia-cuda-runtime-cu12 and
  Debian's libb64-0d; it runs on the CPU. `make perf-analyzer` installs it.
- Fleet: `tessera demo` in a temporary directory (SQLite, simulated agents, its real CPU runtimes running
  onnxruntime), router on its own port. Model `tabular-cpu` (input [1, 8] FP32). perf_analyzer stops at
  its first failed request, and the demo's seeded SLO (20 ms, drop rule slo-2x) drops a few queries in ten
  thousand on two busy cores, so the bench first does what an operator would: sets the SLO policy to
  `--slo-ms` with the `deadline` drop rule, runs a plan for 500 requests/s, approves and applies it
  (REST API, an admin token from `tessera token create`), and waits for the router's new table. It then
  measures the variant the plan routes most weight to, by its number (`-x`), so the server statistics
  perf_analyzer reads are that variant's.
- For each transport and tensor format (HTTP binary: the binary tensor data extension; HTTP json: JSON
  tensors both ways; gRPC raw: `raw_input_contents`, `-i grpc`) and each concurrency: perf_analyzer's closed loop (`--concurrency-range C`), stabilised on the average latency,
  `--measurement-interval` windows; throughput and client-side p50/p99 latency from its CSV.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, fmt, pyplot_load  # noqa: E402

FIELDS = ["protocol", "format", "concurrency", "status", "throughput_per_s", "p50_ms", "p90_ms", "p99_ms", "server_queue_ms", "server_compute_ms", "error"]
DEFAULT_PA = REPO / "var" / "bench-peers" / "perf-analyzer" / "bin" / "perf_analyzer"
MODEL = "tabular-cpu"
READY_TIMEOUT_S = 240.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def demo_start(workdir: Path) -> tuple[subprocess.Popen, str, str, str]:
    """`tessera demo` in `workdir` (its own SQLite and data plane), until its router says the model is ready:
    (the process, the router's HTTP HOST:PORT, the control plane's URL, the router's gRPC HOST:PORT)."""
    port, router_port, grpc_port = _free_port(), _free_port(), _free_port()
    env = {**os.environ, "TESSERA_VAR_DIR": str(workdir), "TESSERA_ADMIN_PASSWORD": "Bench-oip-admin-1"}
    log = open(workdir / "demo.log", "w")
    proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "tessera"), "demo", "--port", str(port), "--router-port", str(router_port),
                             "--router-grpc-port", str(grpc_port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    router = f"127.0.0.1:{router_port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tessera demo exited ({proc.returncode}):\n{_tail(workdir / 'demo.log')}")
        status, _ = _get(f"http://{router}/v2/models/{MODEL}/ready")
        if status == 200:
            return proc, router, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
        time.sleep(1.0)
    demo_stop(proc, workdir)
    raise SystemExit(f"the demo's router did not get {MODEL} ready in {READY_TIMEOUT_S:.0f} s:\n{_tail(workdir / 'demo.log')}")


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def demo_stop(proc: subprocess.Popen, workdir: Path) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the demo drains its agents, which stop their runtimes
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Runtimes run in sessions of their own (they outlive an agent's restart by design): any the drain left.
    subprocess.run(["pkill", "-f", str(workdir)], check=False)


class ControlPlane:
    """The demo's REST API as an operator uses it (an admin token made with `tessera token create`)."""

    def __init__(self, url: str, workdir: Path) -> None:
        env = {**os.environ, "TESSERA_VAR_DIR": str(workdir)}
        out = subprocess.run([str(REPO / ".venv" / "bin" / "tessera"), "token", "create", "--user", "admin"], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True).stdout
        self.url, self.token = url, out.strip().splitlines()[-1].strip()

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}/api/v1/{path}", method=method, data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def job_wait(self, job: int, timeout_s: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            doc = self.call("GET", f"jobs/{job}/")
            if doc["status"] in ("succeeded", "failed"):
                return doc
            time.sleep(1.0)
        raise SystemExit(f"job {job} did not finish in {timeout_s:.0f} s")


def slo_relax(api: ControlPlane, router: str, *, slo_ms: float, demand_rps: float) -> None:
    """As an operator would: the application's SLO policy set to `slo_ms` with the `deadline` drop rule, a plan
    run for `demand_rps`, approved and applied, until the router's table says so. perf_analyzer stops at its
    first failed request, and the demo's seeded 20 ms with slo-2x drops a few queries on two busy cores."""
    policy = next(p for p in api.call("GET", "slo-policies/?limit=100")["results"] if p["display"].startswith(f"{MODEL}:"))
    api.call("PATCH", f"slo-policies/{policy['id']}/", {"latency_p99_ms": slo_ms, "drop_rule": "deadline"})
    job = api.call("POST", "plan-runs/", {"demand": {MODEL: demand_rps}})["id"]
    if api.job_wait(job)["status"] != "succeeded":
        raise SystemExit(f"the plan run (job {job}) failed")
    plan = api.call("GET", f"plans/?job={job}")["results"][0]
    api.call("POST", f"plans/{plan['id']}/approve/")
    rollout = api.call("POST", f"plans/{plan['id']}/apply/")["id"]
    if api.job_wait(rollout)["status"] != "succeeded":
        raise SystemExit(f"the rollout of plan {plan['id']} (job {rollout}) failed")
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        status, body = _get(f"http://{router}/v1/routing-tables")
        table = next((t for t in json.loads(body)["tables"] if t["application"] == MODEL), None) if status == 200 else None
        if table and table["slo_ms"] == slo_ms and any(r["state"] == "ready" and r["endpoint"] for r in table["routes"]):
            return
        time.sleep(1.0)
    raise SystemExit(f"the router did not get {MODEL}'s new table in 120 s")


def transports(router: str, grpc_router: str) -> list[tuple[str, str, str]]:
    """(protocol, tensor format, address) measured, in order."""
    return [("http", "binary", router), ("http", "json", router), ("grpc", "raw", grpc_router)]


def perf_analyzer_env(binary: Path) -> dict[str, str]:
    """libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel in the same venv (perf_analyzer links it even
    on a machine without a GPU)."""
    libs = sorted(binary.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ)
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libs[0]), env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    return env


def perf_analyzer_shape(config: dict) -> list[str]:
    """One row of 8 features per request: with a batching configuration (max_batch_size > 0) perf_analyzer
    adds the batch axis itself (`-b 1`) and `--shape` leaves it out, as Triton's configurations do."""
    return ["--shape", "input:8", "-b", "1"] if config.get("max_batch_size", 0) > 0 else ["--shape", "input:1,8"]


def perf_analyzer_run(binary: Path, router: str, version: str, *, protocol: str, tensor_format: str, concurrency: int, window_ms: int,
                      workdir: Path, shape: list[str]) -> dict[str, Any]:
    """One perf_analyzer measurement: `protocol` http (tensor_format binary or json) or grpc (raw contents)."""
    report = workdir / f"pa-{protocol}-{tensor_format}-{concurrency}.csv"
    formats = ["--input-tensor-format", tensor_format, "--output-tensor-format", tensor_format] if protocol == "http" else []
    cmd = [str(binary), "-m", MODEL, "-x", version, "-u", router, "-i", protocol, *shape,
           "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
           "--stability-percentage", "30", *formats, "-f", str(report)]
    proc = subprocess.run(cmd, env=perf_analyzer_env(binary), capture_output=True, text=True, timeout=max(120, window_ms // 100))
    row: dict[str, Any] = {"protocol": protocol, "format": tensor_format, "concurrency": concurrency}
    if proc.returncode != 0 or not report.exists():
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        row.update(status="failed", error=(lines[-1] if lines else f"exit {proc.returncode}")[:200])
        return row
    with report.open() as f:
        measured = next(csv.DictReader(f))
    us = lambda key: int(measured[key]) / 1000.0  # noqa: E731 - perf_analyzer writes microseconds
    row.update(status="ok", throughput_per_s=float(measured["Inferences/Second"]), p50_ms=us("p50 latency"),
               p90_ms=us("p90 latency"), p99_ms=us("p99 latency"), server_queue_ms=us("Server Queue"),
               server_compute_ms=us("Server Compute Infer"), error="")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_PA)
    parser.add_argument("--concurrency", default=None, help="comma-separated levels (default 1,2,4,8; --quick: 1,4)")
    parser.add_argument("--window-ms", type=int, default=None, help="measurement window (default 3000; --quick: 1500)")
    parser.add_argument("--slo-ms", type=float, default=500.0, help="the SLO the bench sets on the model before measuring [500]")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not args.perf_analyzer.exists():
        raise SystemExit(f"perf_analyzer not found at {args.perf_analyzer}: run `make perf-analyzer` (and `apt-get install libb64-0d`)")
    levels = [int(c) for c in (args.concurrency or ("1,4" if args.quick else "1,2,4,8")).split(",")]
    window_ms = args.window_ms or (1500 if args.quick else 3000)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tessera-oip-bench-") as tmp:
        workdir = Path(tmp)
        started = time.monotonic()
        proc, router, url, grpc_router = demo_start(workdir)
        try:
            print(f"demo ready in {time.monotonic() - started:.0f} s; router {router}; relaxing {MODEL}'s SLO to {args.slo_ms:g} ms "
                  f"(drop rule deadline) through a plan, as an operator would")
            slo_relax(ControlPlane(url, workdir), router, slo_ms=args.slo_ms, demand_rps=500.0)
            status, body = _get(f"http://{router}/v1/routing-tables")
            table = next(t for t in json.loads(body)["tables"] if t["application"] == MODEL)
            weights: dict[str, float] = {}
            for r in table["routes"]:
                weights[r["variant"]] = weights.get(r["variant"], 0.0) + r["weight"]
            variant = max(weights, key=weights.get)
            version = str(table["model"]["versions"][variant]["id"])
            print(f"plan applied: {MODEL} routed to {', '.join(f'{v} {w:.2f}' for v, w in weights.items())}; measuring version "
                  f"{variant} (number {version}) in {time.monotonic() - started:.0f} s")
            status, body = _get(f"http://{router}/v2/models/{MODEL}/versions/{version}/config")
            shape = perf_analyzer_shape(json.loads(body) if status == 200 else {})
            time.sleep(5.0)  # the rollout's runtimes warm up
            for protocol, tensor_format, address in transports(router, grpc_router):
                for concurrency in levels:
                    row = perf_analyzer_run(args.perf_analyzer, address, version, protocol=protocol, tensor_format=tensor_format,
                                            concurrency=concurrency, window_ms=window_ms, workdir=workdir, shape=shape)
                    rows.append(row)
                    print(f"  {protocol:4} {tensor_format:6} c={concurrency}: {row['status']} {fmt(row.get('throughput_per_s'), '.0f')}/s "
                          f"p50 {fmt(row.get('p50_ms'), '.2f')} ms p99 {fmt(row.get('p99_ms'), '.2f')} ms {row.get('error', '')}")
            status, body = _get(f"http://{router}/v2/models/{MODEL}/versions/{version}/stats")
            stats = json.loads(body)["model_stats"] if status == 200 else []
        finally:
            demo_stop(proc, workdir)
    path = csv_rows_write(args.out / "oip.csv", rows, FIELDS)
    print(f"\nperf_analyzer against `tessera demo`'s router, model {MODEL} version {variant}, SLO {args.slo_ms:g} ms "
          f"({platform.machine()}, {os.cpu_count()} CPUs, {window_ms} ms windows)")
    print(f"{'protocol':8} {'format':8} {'conc':>4} {'status':7} {'infer/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'queue ms':>8} {'compute ms':>10}")
    for r in rows:
        print(f"{r['protocol']:8} {r['format']:8} {r['concurrency']:>4} {r['status']:7} {fmt(r.get('throughput_per_s'), '8.0f')} "
              f"{fmt(r.get('p50_ms'), '7.2f')} {fmt(r.get('p90_ms'), '7.2f')} {fmt(r.get('p99_ms'), '7.2f')} "
              f"{fmt(r.get('server_queue_ms'), '8.2f')} {fmt(r.get('server_compute_ms'), '10.2f')}  {r.get('error', '')}")
    print("\ngRPC against HTTP (binary tensors), side by side in this run")
    print(f"{'conc':>4} {'http infer/s':>12} {'grpc infer/s':>12} {'ratio':>6} {'http p99 ms':>11} {'grpc p99 ms':>11} {'ratio':>6}")
    for concurrency in levels:
        http = next((r for r in rows if r["protocol"] == "http" and r["format"] == "binary" and r["concurrency"] == concurrency), {})
        grpc = next((r for r in rows if r["protocol"] == "grpc" and r["concurrency"] == concurrency), {})
        if http.get("status") == "ok" and grpc.get("status") == "ok":
            print(f"{concurrency:>4} {http['throughput_per_s']:12.0f} {grpc['throughput_per_s']:12.0f} {grpc['throughput_per_s'] / http['throughput_per_s']:6.2f} "
                  f"{http['p99_ms']:11.2f} {grpc['p99_ms']:11.2f} {grpc['p99_ms'] / http['p99_ms']:6.2f}")
        else:
            print(f"{concurrency:>4} (a measurement failed: http {http.get('status')}, grpc {grpc.get('status')})")
    for s in stats:
        success = s["inference_stats"]["success"]
        print(f"router statistics (the protocol's stats extension): version {s['version']}: {success['count']} answered, "
              f"{s['inference_stats']['fail']['count']} failed")
    print(f"wrote {path}")
    plt = pyplot_load()
    if plt is None:
        print(PNG_SKIPPED.format(name="oip.png"))
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for (protocol, tensor_format, _address), marker in zip(transports(router, grpc_router), ("o", "s", "^")):
        ok = [r for r in rows if r["protocol"] == protocol and r["format"] == tensor_format and r["status"] == "ok"]
        ax.plot([r["throughput_per_s"] for r in ok], [r["p99_ms"] for r in ok], marker=marker, label=f"{protocol}, {tensor_format} tensors")
        for r in ok:
            ax.annotate(f"c={r['concurrency']}", (r["throughput_per_s"], r["p99_ms"]), fontsize=7)
    ax.set_xlabel("inferences / s (perf_analyzer)")
    ax.set_ylabel("p99 latency (ms, client side)")
    ax.legend()
    print(figure_write(plt, fig, args.out / "oip.png", f"perf_analyzer on the demo's router ({MODEL}/{variant})"))


if __name__ == "__main__":
    main()
