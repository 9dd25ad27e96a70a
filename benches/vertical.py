#!/usr/bin/env python
"""Vertical scaling on CPU hosts (Razavi's thesis P2 Sponge and P4 Biscale): Sponge against a static
16-core instance and horizontal-only scaling on a trace with network dips; Biscale against FA2
(horizontal) and Sponge-extended (vertical) on bursty pipeline traces; Biscale's dynamic programmes
against the exact integer programme. Simulated (engine/simulation/vertical.py); a script, not a test (its
smoke run is tests/engine/test_vertical_bench_smoke.py).

    .venv/bin/python benches/vertical.py            # full run (a few minutes on two cores)
    .venv/bin/python benches/vertical.py --quick    # smoke run, well under 3 minutes
    options: --out DIR (default bench-results), --seeds N, --jobs N, --startup-s S, --resize-s S, --real-seconds S

Writes DIR/vertical.csv (one row per scenario, policy and seed), DIR/vertical_exact.csv (one row per
random pipeline: DP against IP) and DIR/vertical.png (cores and violations over time, needs matplotlib).

What the papers say: Sponge (§p2.4) "reduces the amount of allocated CPU by over 20 % while sacrificing
less than 0.3 % of SLO violations, compared to statically assigned 16-core instance", and FA2 violates
"roughly 5 %" where Sponge's violations are near zero (the issue's "15x fewer"). Biscale (§p4.6.1,
Figures P4.7-P4.9): 0.1 %, 0.5 % and 3.8 % of requests violated on its three pipelines, against 2.4 %,
6.5 % and 50.7 % for horizontal scaling (FA2) and 39.3 %, 72 % and 96.7 % for vertical scaling alone.

Set-up (printed with the results):
- Latency models l(b, c) = gamma*b/c + eps/c + delta*b + eta ms (P2.2 / P4.1) are stated stand-ins, not
  measurements of the thesis's models (which it only plots): Sponge's YOLOv5s-like detector
  (120, 20, 3, 8): 151 ms at b = c = 1, 20 ms on 16 cores; the video pipeline detect (60, 10, 2, 4) ->
  classify (30, 5, 1, 2); audio: asr (160, 30, 6, 10) -> sentiment (70, 15, 3, 5); NLP: langid
  (40, 10, 2, 4) -> translate (260, 40, 10, 15) -> classify (90, 20, 4, 6). Batches and cores 1..16.
- Sponge's workload: 20 requests/s (Poisson) of 200 KB images (log-normal sizes), SLO 750 ms, over a
  synthetic per-second bandwidth trace (engine/vertical/workload.py: a two-state Markov chain, 40 Mbit/s
  with dips to 4 Mbit/s, 20 ms round trip); each request's budget is the SLO less its transfer time.
  Requests whose transfer alone took the SLO are late on arrival for every policy; the table counts them
  apart ("late on arrival") and compares the rest.
- Biscale's workloads: a synthetic bursty trace per pipeline in the shape of the thesis's Twitter
  excerpts (`bursty_rates`: steady, a sharp rise, a swinging peak, a slow return), rates scaled per
  pipeline as the thesis scales them (video 10 -> 45, audio 5 -> 22, NLP 2 -> 12 requests/s); SLO three
  times the pipeline's b = c = 1 latency (§p4.6).
- Mechanics: new instances serve after --startup-s (default 5 s; the thesis: 5-6 s), an in-place resize
  takes --resize-s (default 0.05 s; the thesis: under 100 ms; benches/resize.py measures Tessera's); every
  policy re-decides each second; queues are earliest-deadline-first and drop a request whose deadline has
  passed (the thesis's "1x SLO" rule); cores are counted as allocated (starting instances included).
- Policies: `sponge` (engine/vertical/controller.py, Algorithm 2 each second on the budgets seen, as published:
  shrinks at once), `sponge-events` (Tessera's fast loop, as the agent runs it: the same each second with the
  agent's shrink dwell of 5 intervals, plus `sponge_pressure_step` on every arrival between seconds, which
  grows at once where the size held now would make a request late; issue 42),
  `static-16` / `static-8` (one instance; the batch Algorithm 2 picks for it at the SLO, kept),
  `horizontal` (one-core instances by Algorithm 4, i.e. FA2's DP, started cold), `horizontal-1.5` (the same
  sized for 1.5x the predicted peak: about biscale-dwell's cores, the comparison at equal cost), `vertical`
  (Algorithm 3 with one instance per stage: Sponge extended to pipelines, as the thesis's baseline), `biscale`
  (engine/vertical/biscale.py's controller, as published: back to one-core instances as soon as enough are
  ready), `biscale-dwell` (the same with the agent's shrink dwell of 5 intervals per stage; issue 42). The
  scaling policies size for max(recent peak, Holt forecast) of the rate (the thesis: an LSTM's predicted
  peak) times a headroom of 1.25, all alike but `horizontal-1.5`.
- The real run (`real`): the demo's CPU-heavy classifier (controlplane/demo_models.py, about 5 ms a row on one
  core) in a real runtime process under the real agent (a desired-state file, no control plane), behind a
  router, driven by workers/loadgen.py: 30 requests/s with a burst to 150 for a quarter of the run, SLO
  60 ms less a synthetic network (20 KB payloads, 2 ms round trip, dips); `sponge` resizes it in place
  by the agent's fast loop (its l(b, c) fitted to profiles measured here at 1 and 2 threads),
  `static-1` and `static-max` keep one core and all of this machine's. The same two cores also run the
  router and the sender.
- Exactness: random chains of 1-3 stages (batches and cores up to 4 or 8, SLO 1.2-3x the b = c = 1
  latency, 2-60 requests/s); Algorithm 3 against P4.6 with n = 1 and Algorithm 4 against P4.6 with c = 1,
  both solved by HiGHS on the same 1 ms slots.
"""
from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, fmt, parallel_map, pyplot_load, ratio  # noqa: E402

from engine.simulation.vertical import (BiscalePolicy, HorizontalPolicy, SpongeExtendedPolicy, SpongePolicy, StaticPolicy,  # noqa: E402
                                        VerticalRequest, bursty_rates, requests_from_rates, vertical_simulate)
from engine.vertical.biscale import BiscaleProblem, BiscaleStage, biscale_horizontal_solve, biscale_ip_solve, biscale_vertical_solve  # noqa: E402
from engine.vertical.controller import SHRINK_AFTER_INTERVALS  # noqa: E402
from engine.vertical.sponge import VerticalLatency, sponge_brute_force  # noqa: E402
from engine.vertical.workload import bandwidth_trace, requests_with_budgets  # noqa: E402

HEADROOM = 1.25
# The horizontal baseline sized for 1.5x the predicted peak instead of 1.25x: about the cores Biscale with the
# shrink dwell holds, so that its gain is also seen at equal cost, not only against the thesis's baselines.
EQUAL_CORES_HEADROOM = 1.5
SPONGE_MODEL = BiscaleStage("detector", VerticalLatency(120.0, 20.0, 3.0, 8.0))
SPONGE_SLO_MS = 750.0
SPONGE_RATE = 20.0
PIPELINES: dict[str, tuple[tuple[BiscaleStage, ...], float, float]] = {  # name: (stages, base rps, peak rps)
    "video": ((BiscaleStage("detect", VerticalLatency(60.0, 10.0, 2.0, 4.0)), BiscaleStage("classify", VerticalLatency(30.0, 5.0, 1.0, 2.0))), 10.0, 45.0),
    "audio": ((BiscaleStage("asr", VerticalLatency(160.0, 30.0, 6.0, 10.0)), BiscaleStage("sentiment", VerticalLatency(70.0, 15.0, 3.0, 5.0))), 5.0, 22.0),
    "nlp": ((BiscaleStage("langid", VerticalLatency(40.0, 10.0, 2.0, 4.0)), BiscaleStage("translate", VerticalLatency(260.0, 40.0, 10.0, 15.0)),
             BiscaleStage("classify", VerticalLatency(90.0, 20.0, 4.0, 6.0))), 2.0, 12.0),
}
FIELDS = ["scenario", "policy", "seed", "seconds", "requests", "late_on_arrival", "violations", "violation_rate", "violations_servable",
          "servable_violation_rate", "dropped", "mean_cores", "p99_ms", "resizes", "starts", "runtime_s", "errors"]
EXACT_FIELDS = ["seed", "stages", "rate_rps", "slo_ms", "vertical_dp", "vertical_ip", "horizontal_dp", "horizontal_ip", "joint_ip",
                "vertical_equal", "horizontal_equal", "dp_ms", "ip_ms"]


def pipeline_slo(stages: tuple[BiscaleStage, ...]) -> float:
    return 3.0 * sum(s.latency.l(1, 1) for s in stages)


def _row(scenario: str, policy: str, seed: int, seconds: int, run, late_on_arrival: int, started: float) -> dict[str, Any]:
    import numpy as np

    servable = run.requests - late_on_arrival
    return {"scenario": scenario, "policy": policy, "seed": seed, "seconds": seconds, "requests": run.requests, "late_on_arrival": late_on_arrival,
            "violations": run.violations, "violation_rate": run.violation_rate, "violations_servable": run.violations - late_on_arrival,
            "servable_violation_rate": (run.violations - late_on_arrival) / servable if servable else 0.0, "dropped": run.dropped,
            "mean_cores": run.mean_cores, "p99_ms": float(np.percentile(run.latencies_ms, 99)) if len(run.latencies_ms) else None,
            "resizes": run.resizes, "starts": run.starts, "runtime_s": time.perf_counter() - started, "series": run.per_second}


def sponge_run(task: tuple[str, int, int, float, float]) -> dict[str, Any]:
    policy_name, seed, seconds, startup_s, resize_s = task
    started = time.perf_counter()
    bandwidth = bandwidth_trace(seconds, seed=seed)
    budgeted = requests_with_budgets(bandwidth, rate_rps=SPONGE_RATE, slo_ms=SPONGE_SLO_MS, seed=seed)
    requests = [VerticalRequest(r.arrival_s, r.arrival_s + r.remaining_ms / 1000.0) for r in budgeted]
    late_on_arrival = sum(1 for r in budgeted if r.remaining_ms <= 0)
    stage = SPONGE_MODEL
    if policy_name.startswith("static-"):
        cores = int(policy_name.split("-")[1])
        batch = sponge_brute_force(stage.latency, [SPONGE_SLO_MS], SPONGE_RATE, max_cores=cores).batch
        policy, initial = StaticPolicy(cores, batch), (1, cores, batch)
    elif policy_name == "sponge":
        policy, initial = SpongePolicy(stage, headroom=HEADROOM), (1, 4, 1)
    elif policy_name == "sponge-events":
        policy, initial = SpongePolicy(stage, headroom=HEADROOM, events=True, shrink_after=SHRINK_AFTER_INTERVALS), (1, 4, 1)
    else:
        first = biscale_horizontal_solve(BiscaleProblem((stage,), SPONGE_SLO_MS, SPONGE_RATE * HEADROOM)).decisions[stage.name]
        policy, initial = HorizontalPolicy((stage,), SPONGE_SLO_MS, headroom=HEADROOM), (first.instances, 1, first.batch)
    run = vertical_simulate((stage,), requests, policy, initial={stage.name: initial}, startup_s=startup_s, resize_s=resize_s, duration_s=seconds)
    return _row("sponge", policy_name, seed, seconds, run, late_on_arrival, started)


def biscale_run(task: tuple[str, str, int, int, float, float]) -> dict[str, Any]:
    scenario, policy_name, seed, seconds, startup_s, resize_s = task
    started = time.perf_counter()
    stages, base, peak = PIPELINES[scenario]
    slo = pipeline_slo(stages)
    requests = requests_from_rates(bursty_rates(seconds, base_rps=base, peak_rps=peak, seed=seed), slo_ms=slo, seed=seed)
    policy = {"horizontal": lambda: HorizontalPolicy(stages, slo, headroom=HEADROOM),
              "horizontal-1.5": lambda: HorizontalPolicy(stages, slo, headroom=EQUAL_CORES_HEADROOM), "vertical": lambda: SpongeExtendedPolicy(stages, slo, headroom=HEADROOM),
              "biscale": lambda: BiscalePolicy(stages, slo, headroom=HEADROOM),
              "biscale-dwell": lambda: BiscalePolicy(stages, slo, headroom=HEADROOM, shrink_after=SHRINK_AFTER_INTERVALS)}[policy_name]()
    run = vertical_simulate(stages, requests, policy, initial={s.name: (1, 1, 1) for s in stages}, startup_s=startup_s, resize_s=resize_s,
                            duration_s=seconds)
    return _row(scenario, policy_name, seed, seconds, run, 0, started)


def exact_run(seed: int) -> dict[str, Any]:
    rng = random.Random(1000 + seed)
    stages = tuple(BiscaleStage(f"s{i}", VerticalLatency(rng.uniform(5, 80), rng.uniform(0, 20), rng.uniform(0, 5), rng.uniform(0, 5)),
                                max_batch=rng.choice((4, 8)), max_cores=rng.choice((4, 8))) for i in range(rng.choice((1, 2, 3))))
    problem = BiscaleProblem(stages, round(sum(s.latency.l(1, 1) for s in stages) * rng.uniform(1.2, 3.0)), rng.uniform(2, 60))
    t0 = time.perf_counter()
    vertical, horizontal = biscale_vertical_solve(problem), biscale_horizontal_solve(problem)
    t1 = time.perf_counter()
    vertical_ip = biscale_ip_solve(problem, mode="vertical", slot_ms=1.0)
    horizontal_ip = biscale_ip_solve(problem, mode="horizontal", slot_ms=1.0)
    t2 = time.perf_counter()
    joint = biscale_ip_solve(problem, mode="joint")

    def cores(plan) -> int | None:
        return plan.cores if plan.status == "optimal" else None

    return {"seed": seed, "stages": len(stages), "rate_rps": problem.rate_rps, "slo_ms": problem.slo_ms, "vertical_dp": cores(vertical),
            "vertical_ip": cores(vertical_ip), "horizontal_dp": cores(horizontal), "horizontal_ip": cores(horizontal_ip), "joint_ip": cores(joint),
            "vertical_equal": cores(vertical) == cores(vertical_ip), "horizontal_equal": cores(horizontal) == cores(horizontal_ip),
            "dp_ms": (t1 - t0) * 1000.0, "ip_ms": (t2 - t1) * 1000.0}


# --------------------------------------------------------------------------- the real run

REAL_SLO_MS = 60.0
REAL_POLICIES = ("sponge", "static-1", "static-max")


def _real_model(workdir: Path) -> tuple[Path, str, VerticalLatency, list[dict[str, Any]]]:
    """The demo's CPU-heavy classifier (controlplane/demo_models.py: about 5 ms a row on one core), written to
    `workdir`, profiled here at one and two threads (workers.profiler), and P2.2 fitted to that."""
    import hashlib

    from controlplane.demo_models import CONV_PROFILE_BATCHES, demo_conv_model_build
    from engine.vertical.sponge import vertical_latency_fit
    from workers.profiler import profile_sweep

    model = demo_conv_model_build()
    path = workdir / "conv.onnx"
    path.write_bytes(model.onnx_bytes)
    points, one_core = [], []
    for threads in (1, 2):
        for row in profile_sweep(model.onnx_bytes, batch_sizes=CONV_PROFILE_BATCHES, cpu_threads=threads, min_time_s=0.2, min_iterations=10):
            points.append((row["batch_size"], threads, row["latency_p50_ms"]))
            if threads == 1:
                one_core.append({"batch": row["batch_size"], "latency_ms": row["latency_p50_ms"]})
    return path, hashlib.sha256(model.onnx_bytes).hexdigest(), vertical_latency_fit(points), one_core


def real_run(policy: str, *, seconds: float, workdir: Path, model: tuple, seed: int = 0) -> dict[str, Any]:
    """One policy for real on this machine: the agent (desired-state file, no control plane) runs the model
    in a runtime process, its fast loop resizing it under `sponge`; a router (static table) serves it; the
    load generator sends Poisson traffic with a burst, budgets from the synthetic bandwidth trace."""
    import json
    import os
    import threading

    import numpy as np

    from workers.agent.agent import Agent
    from workers.agent.backends.simulated import SimulatedBackend
    from workers.loadgen import load_budgets, load_run, load_schedule
    from workers.router.app import Router
    from workers.router.server import router_start_in_thread

    path, sha, fitted, one_core = model
    cores_here = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = cores_here if policy == "static-max" else 1
    runtime = {"key": "cpu0/0", "device": "cpu0", "placement": None, "cpu_threads": threads, "application": "tabular",
               "variant": {"id": 1, "name": "conv", "artifact": {"id": 1, "sha256": sha, "size_bytes": path.stat().st_size, "download": str(path)}},
               "max_batch": 16, "batching": {"policy": "proteus", "drop_rule": "deadline", "queue_order": "edf", "slo_ms": REAL_SLO_MS},
               "profile": one_core}
    if policy == "sponge":
        runtime["vertical"] = {"policy": "sponge", "model": {"gamma1": fitted.gamma1, "eps1": fitted.eps1, "delta1": fitted.delta1, "eta1": fitted.eta1},
                               "min_cores": 1, "max_cores": cores_here, "max_batch": 16}
    state = workdir / policy
    desired = state / "desired.json"
    state.mkdir(parents=True, exist_ok=True)
    desired.write_text(json.dumps({"host": "bench", "version": 1, "gpus": [], "runtimes": [runtime]}))
    agent = Agent(backend=SimulatedBackend(gpus="", state_file=state / "gpus.json"), state_dir=state / "agent", desired_file=desired,
                  vertical_s=1.0, drain_timeout_s=2.0)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    handle = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            record = agent.supervisor.running().get("cpu0/0")
            if record is not None and record.endpoint:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the runtime did not start")
        tables = [{"id": 1, "application": "tabular", "version": 1, "active": True, "slo_ms": REAL_SLO_MS, "drop_rule": "deadline",
                   "routes": [{"instance": "bench/cpu0/0", "variant": "conv", "weight": 1.0, "endpoint": record.endpoint, "state": "ready"}]}]
        router = Router(lambda: tables, None, refresh_s=1.0, name="bench")
        handle = router_start_in_thread(router)
        while router.refreshes == 0:
            time.sleep(0.05)
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32",
                                       "data": np.random.default_rng(seed).normal(size=8).round(3).tolist()}]}).encode()
        arrivals = load_schedule(rate_rps=30, duration_s=seconds, burst_at_s=0.4 * seconds, burst_for_s=0.25 * seconds, burst_rps=150, seed=seed)
        budgets = load_budgets(arrivals, slo_ms=REAL_SLO_MS, payload_kb=20, rtt_ms=2, seed=seed)
        samples: list[int] = []
        stop = threading.Event()

        def watch() -> None:  # the runtime's cores, as the fast loop last set them, every 0.2 s
            while not stop.wait(0.2):
                samples.append(int((agent.vertical.sizes.get("cpu0/0") or {}).get("cores") or threads))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.perf_counter()
        result = load_run(f"{handle.url}/v1/infer/tabular", body, arrivals, budgets, concurrency=64)
        stop.set()
        watcher.join()
        totals = result.totals
        late_on_arrival = int((budgets <= 0).sum())
        requests = len(arrivals)
        violations = totals["late"] + totals["expired"] + totals["errors"]
        return {"scenario": "real", "policy": policy, "seed": seed, "seconds": seconds, "requests": requests, "late_on_arrival": late_on_arrival,
                "violations": violations, "violation_rate": violations / requests if requests else 0.0,
                "violations_servable": violations - late_on_arrival,
                "servable_violation_rate": (violations - late_on_arrival) / max(1, requests - late_on_arrival), "dropped": totals["expired"],
                "mean_cores": float(np.mean(samples)) if samples else float(threads), "p99_ms": None, "errors": totals["errors"],
                "resizes": len([1 for op in agent._operations if op.action == "runtime.resize"]), "starts": 0,
                "runtime_s": time.perf_counter() - started, "series": []}
    finally:
        if handle is not None:
            handle.stop()
        agent.stop(stop_runtimes=True)
        thread.join(timeout=10)


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) if rows else float("nan")


def table_print(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Means over seeds per scenario and policy; returns them for the headline ratios."""
    means: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\n{'scenario':9} {'policy':13} {'requests':>9} {'late on arr.':>12} {'violations':>11} {'servable viol.':>15} {'mean cores':>11} "
          f"{'p99 ms':>8} {'resizes':>8} {'starts':>7}")
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        for policy in dict.fromkeys(r["policy"] for r in rows if r["scenario"] == scenario):
            group = [r for r in rows if r["scenario"] == scenario and r["policy"] == policy]
            m = {k: _mean(group, k) for k in ("requests", "late_on_arrival", "violation_rate", "servable_violation_rate", "mean_cores", "resizes", "starts")}
            m["p99_ms"] = statistics.fmean(r["p99_ms"] for r in group if r["p99_ms"] is not None) if any(r["p99_ms"] for r in group) else float("nan")
            means.setdefault(scenario, {})[policy] = m
            print(f"{scenario:9} {policy:13} {m['requests']:9.0f} {m['late_on_arrival']:12.0f} {100 * m['violation_rate']:10.3f}% "
                  f"{100 * m['servable_violation_rate']:14.3f}% {m['mean_cores']:11.2f} {fmt(m['p99_ms'], '8.0f')} {m['resizes']:8.0f} {m['starts']:7.0f}")
    return means


def headline_print(means: dict[str, dict[str, dict[str, float]]]) -> None:
    print("\nHeadline (means over seeds; ratios side by side in this run):")
    s = means.get("sponge")
    if s:
        for name, label in (("sponge", "Sponge"), ("sponge-events", "Sponge with events (Tessera's fast loop)")):
            if name not in s:
                continue
            saving = 1 - s[name]["mean_cores"] / s["static-16"]["mean_cores"]
            extra = s[name]["violation_rate"] - s["static-16"]["violation_rate"]
            fewer = ratio(s["horizontal"]["servable_violation_rate"], s[name]["servable_violation_rate"])
            print(f"- {label} vs static 16 cores: {100 * saving:.1f} % fewer cores (paper: over 20 %), {100 * extra:+.3f} points of violations "
                  f"(paper: under 0.3); vs horizontal-only: {fmt(fewer, '.1f')}x fewer violations among servable requests "
                  f"(paper: FA2 about 5 %, the issue: 15x)")
    r = means.get("real")
    if r:
        print(f"- Real run on this machine ({platform.machine()}): Sponge {100 * r['sponge']['violation_rate']:.2f} % violations at "
              f"{r['sponge']['mean_cores']:.2f} cores on average; static one core {100 * r['static-1']['violation_rate']:.2f} %, "
              f"static all cores ({r['static-max']['mean_cores']:.0f}) {100 * r['static-max']['violation_rate']:.2f} %")
    for scenario in PIPELINES:
        p = means.get(scenario)
        if not p:
            continue
        for name, label in (("biscale", "Biscale"), ("biscale-dwell", "Biscale with the shrink dwell")):
            if name not in p:
                continue
            b = p[name]["violation_rate"]
            print(f"- {label} on {scenario}: {100 * b:.3f} % violations at {p[name]['mean_cores']:.2f} cores; "
                  f"horizontal {100 * p['horizontal']['violation_rate']:.3f} % ({fmt(ratio(p['horizontal']['violation_rate'], b), '.1f')}x) "
                  f"at {p['horizontal']['mean_cores']:.2f}, vertical {100 * p['vertical']['violation_rate']:.3f} % "
                  f"({fmt(ratio(p['vertical']['violation_rate'], b), '.1f')}x) at {p['vertical']['mean_cores']:.2f} "
                  f"(paper: over 10x fewer than either); horizontal sized for 1.5x the peak {100 * p['horizontal-1.5']['violation_rate']:.3f} % "
                  f"({fmt(ratio(p['horizontal-1.5']['violation_rate'], b), '.1f')}x) at {p['horizontal-1.5']['mean_cores']:.2f}")


def exact_print(rows: list[dict[str, Any]]) -> None:
    n = len(rows)
    v = sum(r["vertical_equal"] for r in rows)
    h = sum(r["horizontal_equal"] for r in rows)
    joint_better = sum(1 for r in rows if r["joint_ip"] is not None and r["horizontal_ip"] is not None and r["joint_ip"] < min(
        x for x in (r["horizontal_ip"], r["vertical_ip"]) if x is not None))
    print(f"\nExactness on {n} random pipelines: Algorithm 3 equal to the IP (n = 1) on {v} of {n}, Algorithm 4 equal to the IP (c = 1) "
          f"on {h} of {n}; the joint P4.6 beats both on {joint_better}; DP {statistics.median(r['dp_ms'] for r in rows):.1f} ms, "
          f"IP {statistics.median(r['ip_ms'] for r in rows):.1f} ms (medians)")


def figure(rows: list[dict[str, Any]], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows if r["series"]))
    fig, axes = plt.subplots(2, len(scenarios), figsize=(4.2 * len(scenarios), 5.6), squeeze=False, sharex="col")
    for col, scenario in enumerate(scenarios):
        for policy in dict.fromkeys(r["policy"] for r in rows if r["scenario"] == scenario):
            run = next(r for r in rows if r["scenario"] == scenario and r["policy"] == policy and r["seed"] == 0)
            t = [p["t"] for p in run["series"]]
            axes[0][col].plot(t, [p["cores"] for p in run["series"]], label=policy, linewidth=1)
            axes[1][col].plot(t, [p["violations"] for p in run["series"]], label=policy, linewidth=1)
        axes[0][col].set_title(scenario)
        axes[0][col].set_ylabel("cores allocated")
        axes[1][col].set_ylabel("violations per second")
        axes[1][col].set_xlabel("seconds")
        axes[0][col].legend(fontsize=7)
    return figure_write(plt, fig, path, "Sponge and Biscale against their baselines (seed 0, simulated)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2-minute traces, one seed, 8 exactness instances: a smoke run")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--startup-s", type=float, default=5.0, help="seconds before a new instance serves")
    parser.add_argument("--resize-s", type=float, default=0.05, help="seconds an in-place resize takes")
    parser.add_argument("--real-seconds", type=float, default=None, help="length of each real run (default 60, quick 20; 0: no real run)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1 or args.startup_s < 0 or args.resize_s < 0:
        parser.error("--seeds and --jobs must be >= 1, --startup-s and --resize-s >= 0")
    seeds = range(1 if args.quick else args.seeds)
    sponge_seconds, pipeline_seconds = (120, 120) if args.quick else (600, 500)
    args.out.mkdir(parents=True, exist_ok=True)
    print(__doc__.split("Set-up (printed with the results):")[1].strip())
    print(f"\nMachine: {platform.machine()}, Python {platform.python_version()}; seeds {len(seeds)}, {args.jobs} jobs, "
          f"startup {args.startup_s:g} s, resize {args.resize_s:g} s")
    started = time.perf_counter()
    tasks_sponge = [(p, seed, sponge_seconds, args.startup_s, args.resize_s) for p in ("sponge", "sponge-events", "static-16", "static-8", "horizontal")
                    for seed in seeds]
    tasks_biscale = [(s, p, seed, pipeline_seconds, args.startup_s, args.resize_s) for s in PIPELINES
                     for p in ("biscale", "biscale-dwell", "horizontal", "horizontal-1.5", "vertical")
                     for seed in seeds]
    rows = parallel_map(sponge_run, tasks_sponge, args.jobs) + parallel_map(biscale_run, tasks_biscale, args.jobs)
    real_seconds = args.real_seconds if args.real_seconds is not None else (20.0 if args.quick else 60.0)
    if real_seconds > 0:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            model = _real_model(Path(tmp))
            print(f"\nReal run: the demo's CPU-heavy classifier, l(b, c) fitted here: {model[2]}; {real_seconds:g} s per policy")
            for policy in REAL_POLICIES:
                rows.append(real_run(policy, seconds=real_seconds, workdir=Path(tmp), model=model))
    means = table_print(rows)
    headline_print(means)
    exact_rows = parallel_map(exact_run, list(range(8 if args.quick else 40)), args.jobs)
    exact_print(exact_rows)
    print(f"\nwrote {csv_rows_write(args.out / 'vertical.csv', rows, FIELDS)} and {csv_rows_write(args.out / 'vertical_exact.csv', exact_rows, EXACT_FIELDS)} "
          f"in {time.perf_counter() - started:.1f} s")
    print(figure(rows, args.out / "vertical.png"))
    unequal = [r for r in exact_rows if not (r["vertical_equal"] and r["horizontal_equal"])]
    if unequal:
        print(f"DP AND IP DISAGREE on {len(unequal)} pipelines (see vertical_exact.csv)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
