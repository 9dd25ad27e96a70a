#!/usr/bin/env python
"""Proteus (ASPLOS'24) §6.4 "Adaptive Batching", Figure 6, reproduced in spirit: SLO violation ratio of
Proteus's adaptive batching (§5) against Clipper's AIMD and Nexus's early-drop batching, under uniform,
Poisson and Gamma (shape 0.05) arrivals at the same load. A script, not a test (its smoke run is
tests/engine/test_repro_benches_smoke.py).

    .venv/bin/python benches/batching.py            # full run (about two minutes on two cores)
    .venv/bin/python benches/batching.py --quick    # smoke run, a few seconds
    options: --out DIR (default bench-results), --seed S, --duration S, --loads 0.5,0.8,0.95, --jobs N

Writes DIR/batching.csv (one row per simulation) and DIR/batching.png (needs matplotlib).

What the paper says (§6.4, docs/references.md). Each batching algorithm runs on top
of the same Proteus allocation, on synthetic traces of constant load with uniform, Poisson and Gamma
(shape 0.05) inter-arrivals. All three do well on uniform arrivals; on Poisson and Gamma Proteus has 2-4x
fewer SLO violations (Figure 6's caption): Nexus about 2-3x more, which §6.4 puts down to Nexus being
work-conserving, and Clipper's AIMD 3.8-4x more, being reactive. Where the artefact (UMass-LIDS/Proteus,
core/predictor.py) differs from Tessera's policies it is said in the output.

Setup (all of it printed with the results):
- Fleet: `generate.proteus_sized_problem` at Proteus's own size (40 devices of 4 types: RTX 2080 Ti,
  A100-SXM4-40GB, H100-SXM5-80GB, 16-core CPUs; 46 variants; 9 applications; load 0.7; seed 0). Profiles
  come from the gpulets measurements in engine/reference/data/gpulet (derived for the other GPUs, see
  engine/reference/profiles.py). --quick: 8 devices, 20 variants, 4 applications.
- One static plan: the `proteus` planner on the problem's demand, applied at time 0; re-planning and the
  burst trigger are off, so every batching policy serves on exactly the same instances with the same
  routing weights. Figure 6 isolates batching; a closed loop would add re-planning noise to the comparison.
- Traffic: one independent arrival process per application at `load` x its planned demand (so every
  instance is offered `load` x what the plan assigned it): uniform, Poisson, or Gamma inter-arrivals with
  shape 0.05 (CV 4.5, the Proteus micro-burst setting), `workload.arrivals_*`.
- Simulator: weighted routing, FIFO queues, the default drop rule ("deadline": a query that cannot finish
  even alone is dropped), policies from batching.py with their default parameters (AIMD starts at batch 1,
  +1 / x0.9; Nexus's window is the plan's batch).

Two factors are crossed with the figure's own axes because they decide its shape (see the notes printed
at the end): `profiles` raw (as generated) or monotone (each latency curve made non-decreasing in the batch
size, a running maximum over the profiled points), and the service-time noise sigma (0.05, the simulator's
default, or 0: deterministic service as in the Proteus artefact's simulator).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, fmt, monotone_profiles, parallel_map, pyplot_load, ratio  # noqa: E402

from engine.plans.problem import Plan, Problem  # noqa: E402
from engine.reference.generate import proteus_sized_problem  # noqa: E402
from engine.reference.profiles import reference_data_dir  # noqa: E402
from engine.simulation.simulator import ON_TIME, SimulationConfig, simulate  # noqa: E402
from engine.simulation.workload import Trace, arrivals_gamma, arrivals_poisson, arrivals_uniform  # noqa: E402
from engine.solvers.solve import plan_solve  # noqa: E402

FULL_FLEET = {"n_devices": 40, "n_device_types": 4, "n_variants": 46, "n_applications": 9}
QUICK_FLEET = {"n_devices": 8, "n_device_types": 4, "n_variants": 20, "n_applications": 4}
ARRIVALS = ("uniform", "poisson", "gamma")
POLICIES = ("proteus", "aimd", "nexus", "quantile")  # quantile: Tessera's tail-timed variant of Proteus's rule (issue 22, section 1)
GAMMA_SHAPE = 0.05
PROFILE_MODES = ("raw", "monotone")
NOISES = (0.05, 0.0)
PAPER = "Proteus (ASPLOS'24) §6.4, Figure 6: proteus 2-4x fewer SLO violations than AIMD (3.8-4x) and Nexus (2-3x) on Poisson and Gamma"

CSV_FIELDS = (
    "profiles", "noise_sigma", "load", "arrival", "batching", "queries", "on_time", "late", "dropped_expired",
    "dropped_no_capacity", "dropped_unfinished", "slo_violation_ratio", "baseline_over_proteus", "mean_batch",
    "mean_utilisation", "latency_p99_ms", "effective_accuracy", "wall_s", "queries_batch1", "violations_batch1",
)


# --------------------------------------------------------------------------- inputs




def non_monotone_curves(problem: Problem) -> tuple[int, int]:
    """(curves with a latency that drops as the batch grows, all curves) over the problem's profiles."""
    groups: dict[tuple[str, str, str], list] = defaultdict(list)
    for point in problem.profiles:
        groups[(point.variant, point.device_type, point.slice)].append(point)
    bad = 0
    for points in groups.values():
        lat = [p.latency_ms for p in sorted(points, key=lambda p: p.batch)]
        bad += any(b < a for a, b in zip(lat, lat[1:]))
    return bad, len(groups)


def traffic(problem: Problem, kind: str, load: float, duration_s: float, seed: int) -> Trace:
    """One independent process of `kind` per application at `load` x its demand, merged."""
    merged: Trace | None = None
    for i, app in enumerate(problem.applications):
        rate = load * app.demand_rps
        if rate <= 0:
            continue
        s = seed * 1000 + i
        if kind == "uniform":
            part = arrivals_uniform(rate, duration_s, s, app.name)
        elif kind == "poisson":
            part = arrivals_poisson(rate, duration_s, s, app.name)
        else:
            part = arrivals_gamma(rate, duration_s, GAMMA_SHAPE, s, app.name)
        merged = part if merged is None else merged.merge(part)
    assert merged is not None
    return merged


# --------------------------------------------------------------------------- runs

# Filled before the worker pool forks, so the workers inherit it instead of unpickling it per task.
CONTEXT: dict[str, Any] = {}


def run_one(task: tuple[str, float, float, str, str]) -> dict[str, Any]:
    profiles, sigma, load, arrival, batching = task
    problem: Problem = CONTEXT["problems"][profiles]
    plan: Plan = CONTEXT["plans"][profiles]
    trace: Trace = CONTEXT["traces"][(load, arrival)]
    config = SimulationConfig(batching=batching, noise_sigma=sigma, seed=CONTEXT["seed"], initial_demand="problem",
                              replan_interval_s=None, burst_factor=None)
    result = simulate(problem, trace, planner=lambda p, plan=plan: plan, config=config)
    s = result.summary
    # Where the violations fall: at instances whose plan batch is 1 a batching policy has no choice to make
    # (one query per batch, served in deadline order; dropping a head frees one query's time for one other).
    single = {x["index"] for x in result.instances if x["max_batch"] == 1}
    at_single = np.isin(result.queries["instance"], list(single))
    violated = result.queries["outcome"] != ON_TIME
    return {
        "profiles": profiles, "noise_sigma": sigma, "load": load, "arrival": arrival, "batching": batching,
        "queries": s["queries"], "on_time": s["on_time"], "late": s["late"], "dropped_expired": s["dropped_expired"],
        "dropped_no_capacity": s["dropped_no_capacity"], "dropped_unfinished": s["dropped_unfinished"],
        "slo_violation_ratio": s["slo_violation_ratio"], "mean_batch": s["mean_batch"],
        "mean_utilisation": s["mean_utilisation"], "latency_p99_ms": s["latency_p99_ms"],
        "effective_accuracy": s["effective_accuracy"], "wall_s": s["wall_s"],
        "queries_batch1": int(at_single.sum()), "violations_batch1": int((at_single & violated).sum()),
    }


# --------------------------------------------------------------------------- reporting






def _cmp(x: float | None) -> str:
    """How proteus compares with one baseline, from x = baseline violations / proteus violations."""
    if x is None:
        return "none violate"
    if x >= 2:
        return ">= 2x fewer"
    if x > 1.05:
        return "fewer, < 2x"
    if x >= 1 / 1.05:
        return "about equal"
    return "MORE"


def report(rows: list[dict[str, Any]]) -> list[str]:
    by = {(r["profiles"], r["noise_sigma"], r["load"], r["arrival"], r["batching"]): r for r in rows}
    lines = [""]
    out = lines.append
    out("SLO violation ratio (late + dropped) / queries, per batching policy; x = baseline / proteus (> 1: proteus has fewer violations)")
    head = (f"{'profiles':<9} {'sigma':>5} {'load':>5} {'arrival':<8} {'proteus':>8} {'aimd':>8} {'nexus':>8} {'aimd x':>7} {'nexus x':>7}"
            f"  {'proteus late / dropped':>22}  {'batch p/a/n':<14}  {'quantile':>8} {'best/q':>6}  proteus vs (paper: >= 2x fewer than both on poisson, gamma)")
    out(head)
    out("-" * len(head))
    keys = sorted({k[:4] for k in by}, key=lambda k: (PROFILE_MODES.index(k[0]), -k[1], k[2], ARRIVALS.index(k[3])))
    for key in keys:
        p, a, n, qt = (by.get(key + (b,)) for b in POLICIES)
        if not (p and a and n and qt):
            continue
        rq = qt["slo_violation_ratio"]
        # Issue 22's goal for a new default: at least 2x fewer violations than the best of the three.
        best_over_q = ratio(min(p["slo_violation_ratio"], a["slo_violation_ratio"], n["slo_violation_ratio"]), rq)
        rp, ra, rn = p["slo_violation_ratio"], a["slo_violation_ratio"], n["slo_violation_ratio"]
        xa, xn = ratio(ra, rp), ratio(rn, rp)
        verdict = f"aimd: {_cmp(xa)}; nexus: {_cmp(xn)}"
        if key[3] == "uniform":
            verdict += " (paper: no claim)"
        elif xa is not None and xn is not None and xa >= 2 and xn >= 2:
            verdict += " -> MATCHES"
        else:
            verdict += " -> does not match"
        q = p["queries"] or 1
        out(f"{key[0]:<9} {key[1]:>5.2f} {key[2]:>5.2f} {key[3]:<8} {rp:>8.4f} {ra:>8.4f} {rn:>8.4f} {fmt(xa, '.2f'):>7} {fmt(xn, '.2f'):>7}"
            f"  {p['late'] / q:>10.4f} / {(p['queries'] - p['on_time'] - p['late']) / q:>9.4f}"
            f"  {fmt(p['mean_batch'], '.1f'):>4}/{fmt(a['mean_batch'], '.1f')}/{fmt(n['mean_batch'], '.1f'):<4}"
            f"  {rq:>8.4f} {fmt(best_over_q, '.2f'):>6}  {verdict}")
    out("")
    out("Where nexus's violations fall (issue 42's batching goal): the share at instances whose plan batch is 1, where a batching")
    out("policy has no choice to make, against the share of the queries those instances get")
    for key in keys:
        n = by.get(key + ("nexus",))
        if not n:
            continue
        violations = n["queries"] - n["on_time"]
        share = n["violations_batch1"] / violations if violations else 0.0
        out(f"{key[0]:<9} {key[1]:>5.2f} {key[2]:>5.2f} {key[3]:<8} {100 * share:5.1f} % of {violations} violations at batch-1 instances, "
            f"which get {100 * n['queries_batch1'] / max(1, n['queries']):.1f} % of the queries")
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    panels = sorted({(r["profiles"], r["noise_sigma"]) for r in rows}, key=lambda k: (PROFILE_MODES.index(k[0]), -k[1]))
    loads = sorted({r["load"] for r in rows})
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.9 * len(panels)), squeeze=False)
    by = {(r["profiles"], r["noise_sigma"], r["load"], r["arrival"], r["batching"]): r for r in rows}
    colors = {"proteus": "#67BF5C", "aimd": "#ED665D", "nexus": "#729ECE", "quantile": "#AD8BC9"}
    for ax, (profiles, sigma) in zip(axes[:, 0], panels):
        groups = [(load, arrival) for load in loads for arrival in ARRIVALS]
        width = 0.8 / len(POLICIES)
        for i, policy in enumerate(POLICIES):
            values = [by[(profiles, sigma, load, arrival, policy)]["slo_violation_ratio"] if (profiles, sigma, load, arrival, policy) in by else 0.0
                      for load, arrival in groups]
            ax.bar([g + i * width for g in range(len(groups))], [max(v, 1e-5) for v in values], width, label=policy, color=colors[policy])
        ax.set_xticks([g + width for g in range(len(groups))], [f"{arrival}\nload {load:g}" for load, arrival in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("SLO violation ratio")
        ax.set_title(f"profiles {profiles}, service-time noise sigma {sigma:g}", fontsize=9)
        ax.legend(fontsize=8, ncol=4)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Proteus Figure 6 in spirit: batching policies on one static proteus plan (profiles from engine/reference/data/gpulet)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


NOTES = """
Notes on the shape (read with the table):
- The artefact's baselines are not Tessera's. In UMass-LIDS/Proteus core/predictor.py, AIMD and Nexus are
  NOT work-conserving: they dispatch only once the queue holds a full batch (the AIMD cap, or the planned
  max batch), Nexus with a timer at head deadline - latency(max batch), and AIMD's timer callback does
  nothing. batching.py's AIMD and Nexus dispatch whatever is queued as soon as the instance is idle. A
  work-conserving policy never idles with work queued, so at high instance load it has more capacity than
  a policy that waits. The gap the paper reports is plausibly in good part the cost of the artefact
  baselines' waiting; the paper's text cannot settle it (§6.4 gives ratios, not when its baselines dispatch).
- Proteus's rule times every batch to end at the head query's deadline (wait until T_exp - T(q+1), run q,
  end at T_exp - (T(q+1) - T(q))). With a flat latency curve the margin is ~0, so ANY service-time noise
  makes about half of those batches late: compare the sigma 0.05 and sigma 0 rows (the artefact simulates
  deterministic latencies).
- Near capacity (load 0.95) batching.py's Proteus policy shrinks the batch so that the head still makes
  its deadline ("never let a query time out that could have been served"); the artefact's Proteus
  (`pop_while_first_expires`) instead DROPS heads that a batch of everything queued would make late, keeping the batch
  large, as Nexus does. Shrinking trades throughput for the head: once a backlog forms the mean batch falls
  (column "batch p/a/n"), capacity falls with it and the queue collapses into drops.
- Raw vs monotone profiles: with a latency curve that drops as the batch grows (T(2) < T(1)), Proteus waits
  until T_exp - T(2) and the simulator's "deadline" drop rule, which tests now + T(1) > deadline, then drops
  the head before the policy runs it: a simulator/batching bug, not a property of Proteus. On this fleet the
  two profile modes hardly differ, because the plan's instances batch 8-64 queries, beyond the flat part of
  the curves; the bug bites instances fed slowly enough that the queue holds 1-2 queries when the timer
  fires (benches/end_to_end.py's "monotone latency profiles" row).
"""


def header(args: argparse.Namespace, problem: Problem, plan: Plan, fleet: dict[str, int], traces: dict) -> list[str]:
    bad, total = non_monotone_curves(problem)
    utils = [i.assigned_rps / i.capacity_rps for i in plan.instances if i.capacity_rps > 0]
    n_queries = sorted({len(t) for t in traces.values()})
    return [
        "Proteus Figure 6 reproduction (benches/batching.py)" + (" --quick smoke run" if args.quick else ""),
        f"Reference data: {reference_data_dir() / 'gpulet'} (engine/reference/data/gpulet: RTX 2080 Ti under MPS, gpulets ATC'22 artefact);",
        "  other GPUs' profiles are DERIVED from it (engine.reference.profiles.gpulet_profiles_derive), CPU profiles are a stated synthetic model.",
        f"Fleet: proteus_sized_problem({', '.join(f'{k}={v}' for k, v in fleet.items())}, seed=0, load=0.7): "
        f"{problem.total_demand_rps:,.0f} q/s planned demand; {bad} of {total} latency curves decrease somewhere as the batch grows (raw).",
        f"Plan: ONE static proteus plan on that demand ({plan.status}, {len(plan.instances)} instances, effective accuracy "
        f"{plan.effective_accuracy:.4f}); planned instance load: mean {sum(utils) / len(utils):.2f}, "
        f"{sum(u > 0.99 for u in utils)} of {len(utils)} instances at >= 99 % of their capacity-model throughput.",
        "  Re-planning and the burst trigger are OFF (a single static plan): Figure 6 isolates batching, so every policy gets the same instances.",
        f"Traffic: per application an independent process at load x its planned demand; {args.duration:g} s per run "
        f"({n_queries[0]:,}..{n_queries[-1]:,} queries); gamma shape {GAMMA_SHAPE}; seed {args.seed}.",
        f"Simulator: weighted routing, FIFO, drop rule 'deadline', policies {', '.join(POLICIES)} with default parameters.",
        f"Paper: {PAPER} (cited in docs/references.md).",
        f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.jobs} worker process(es).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small fleet, short traces, one load: a smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=None, help="seconds of traffic per run (default 5; 1 with --quick)")
    parser.add_argument("--loads", type=str, default=None, help="offered / planned load, comma-separated (default 0.5,0.8,0.95; 0.9 with --quick)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    args = parser.parse_args(argv)
    args.duration = args.duration or (1.0 if args.quick else 5.0)
    loads = [float(x) for x in (args.loads or ("0.9" if args.quick else "0.5,0.8,0.95")).split(",")]
    fleet = QUICK_FLEET if args.quick else FULL_FLEET

    t_start = time.perf_counter()
    base = proteus_sized_problem(**fleet, seed=0, load=0.7)
    problems = {"raw": base, "monotone": monotone_profiles(base)}
    plans = {mode: plan_solve(problem, "proteus") for mode, problem in problems.items()}
    traces = {(load, arrival): traffic(base, arrival, load, args.duration, args.seed) for load in loads for arrival in ARRIVALS}
    CONTEXT.update(problems=problems, plans=plans, traces=traces, seed=args.seed)
    for line in header(args, base, plans["raw"], fleet, traces):
        print(line, flush=True)

    tasks = [(mode, sigma, load, arrival, policy) for mode in PROFILE_MODES for sigma in NOISES for load in loads
             for arrival in ARRIVALS for policy in POLICIES]
    # Workers inherit CONTEXT by forking; where fork is not available, run in this process.
    rows = parallel_map(run_one, tasks, args.jobs)
    proteus_ratio = {(r["profiles"], r["noise_sigma"], r["load"], r["arrival"]): r["slo_violation_ratio"] for r in rows if r["batching"] == "proteus"}
    for r in rows:
        p = proteus_ratio[(r["profiles"], r["noise_sigma"], r["load"], r["arrival"])]
        r["baseline_over_proteus"] = "" if r["batching"] == "proteus" else ratio(r["slo_violation_ratio"], p)

    for line in report(rows):
        print(line)
    print(NOTES)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = csv_rows_write(args.out / "batching.csv", rows, CSV_FIELDS)
    print(f"wrote {csv_path} ({len(rows)} rows) in {time.perf_counter() - t_start:.1f} s")
    print(plot(rows, args.out / "batching.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
