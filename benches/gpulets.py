#!/usr/bin/env python
"""gpulets (ATC'22) reproduced by analogy on engine/reference/data/gpulet (RTX 2080 Ti class GPU, 10 models): the
elastic partitioning scheduler with interference (`gpulets`, Algorithm 1 inside Algorithm 2) against the
exhaustive ideal partitioner, squishy bin packing (SBP) and greedy best-fit, at the scheduler level, as the
paper's §5.2 (Figures 16 and 17) and §3.2 do:

- scenarios: per model a rate from {0, 100, 200} req/s (all 3^10 - 1 = 59,048, or a seeded random sample:
  2,000 by default, 100 with --quick), 4 GPUs, SLOs from the paper's Table 3 by model family
  (engine/reference/gpulet_problem.py);
- schedulable: the share of scenarios each scheduler serves in full (the paper: gpulet+int schedules 2.6 %
  fewer of its 19,682 than the ideal);
- max schedulable rate: per scenario the largest factor s such that s x the rates is schedulable (bisection,
  12 steps; the ideal's by partitioning, pruned), as a fraction of the ideal's, averaged over the scenarios
  the ideal serves at any rate (the paper: gpulet+int 92.6 %);
- GPUs: how many GPUs Algorithm 2 takes, from one, against the fewest the ideal needs, for every scenario at
  3 x its rates (stated: at 1 x almost every scenario fits one GPU of this speed);
- the interference model's error on unseen pairs (as benches/gpulets_interference.py) and, for the
  ablation, how many of `gpulets (no int)`'s schedules miss an SLO once interference is predicted.

- simulated SLO-preserved max throughput (§5.2, Figure 13): on seven multi-model mixes (analogues of the
  paper's five scenarios of Table 4 and its two applications, by memory footprint; `SIM_MIXES`), equal
  Poisson rates per model, the largest total rate at which a policy's plan, replayed by the discrete-event
  simulator (engine/simulation/simulator.py: MPS partitions time-shared round-robin, Nexus batching,
  co-runners re-timed by interference), completes at least 99 % of requests within their SLO (bisection on
  the rate; a rate the policy reports unschedulable counts as a miss, as on the paper's testbed; every
  policy plans for `SIM_HEADROOM` = 1.1 x the rate it is then offered, stated below). The
  simulated GPUs slow down by the MEASURED co-run factors where engine/reference/data/gpulet has them (densenet121,
  resnet50, vgg19 next to five co-runners) and by the fitted model elsewhere, so `gpulets` meets its
  predictor's error and `gpulets (no int)` meets interference it did not plan for. `fleet` is Tessera's
  default planner (engine/solvers/fleet.py) as the control loop runs it: spare capacity "fill", so the
  whole fleet is used for headroom (model.py `_headroom_stage`); `fleet (idle)` the same model with the
  fewest GPUs instead (issue 42, item 1: ahead of SBP and best-fit on every mix, +61.7 % over SBP the
  target for the mean).

- fleets a whole-GPU plan serves (issue 39): `WHOLE_GPU_SCENARIOS` seeded scenarios of 3-6 models, each
  with a rate and either its Table 3 SLO or a tight one (twice a whole-GPU batch latency and a little more,
  as §5.1 sets the applications' SLOs: "doubling the longest model inference latency"), on the fewest GPUs
  (at least 2, at most 6) on which an independent oracle finds a whole-GPU plan: every GPU unsplit, no
  co-runner and no interference, each model's rate on whole GPUs at its best measured batch within the SLO,
  the rests grouped (every grouping tried) onto GPUs they time-share by the Section 2.2 rules, latencies
  read straight from inference.csv at its measured batches. Each planner (`sharing_plan_solve`, as `tessera
  plan solve` runs it) must serve every rate there; its plan is checked by the project's validator and
  against the MEASURED co-run latencies of interference.csv (each model's batch latency times the measured
  factor next to what runs beside it, the fitted model where nothing was measured): the largest excess of
  duty cycle + batch latency over the SLO, or of the batches over the round. The algorithms alone (without
  the planners' whole-GPU fallback) are counted too, and the issue's minimal case is run on its own.

    .venv/bin/python benches/gpulets.py            # about 10 minutes on 2 cores
    .venv/bin/python benches/gpulets.py --quick    # about 3 minutes (5 with --jobs 1)
    .venv/bin/python benches/gpulets.py --whole-gpu-only   # the whole-GPU sample alone, about 20 s
    options: --out DIR (default bench-results), --scenarios N, --all (every scenario), --seed N, --jobs N,
             --sim-seconds S (trace length per simulated rate; default 30, 6 with --quick), --mixes scen2,game,
             --whole-gpu-scenarios N (default 30, or --scenarios if fewer), --whole-gpu-only

Writes DIR/gpulets.csv (one row per scenario), DIR/gpulets_summary.csv, DIR/gpulets_throughput.csv (one row
per mix and policy), DIR/gpulets.png, and DIR/gpulets_whole_gpu.csv (one row per whole-GPU scenario) with
DIR/gpulets_whole_gpu.png.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, parallel_map, pyplot_load  # noqa: E402

from engine.plans.problem import Plan, Problem  # noqa: E402
from engine.plans.validate import plan_validate  # noqa: E402
from engine.reference.gpulet_problem import gpulet_mps_problem, gpulet_slo_ms  # noqa: E402
from engine.reference.profiles import reference_data_dir  # noqa: E402
from engine.sharing.latency import partition_latency_model_from_gpulet  # noqa: E402
from engine.sharing.partitions import mps_slice_percent  # noqa: E402
from engine.simulation.simulator import SimulationConfig, simulate  # noqa: E402
from engine.simulation.workload import arrivals_poisson  # noqa: E402
from engine.reference.profiles import gpulet_inference_read, gpulet_interference_read, gpulet_mem_util_read  # noqa: E402
from engine.sharing.interference import (  # noqa: E402
    INTERFERENCE_FORM_DEFAULT,
    InterferenceMeasured,
    interference_samples_build,
    interference_validate_by_pair,
)
from engine.sharing.scheduling import (  # noqa: E402
    SharingProblem,
    best_fit_schedule,
    elastic_partitioning_schedule,
    fixed_partitioning_schedule,
    gpu_scaling_schedule,
    ideal_partitionings,
    ideal_schedule,
    sbp_schedule,
    sharing_schedule_validate,
)
from engine.solvers.gpulets import interference_predictor_for, sharing_plan_solve, sharing_problem_from  # noqa: E402
from engine.solvers.solve import plan_solve  # noqa: E402

GPUS = 4
RATES = (0, 100, 200)
SCALE_STEPS = 12
GPU_COUNT_SCALE = 3.0
GPU_COUNT_LIMIT = 12
PAPER = {"ratio_gpulets": 0.926, "schedulable_fewer": 0.026, "over_sbp": 0.617, "over_best_fit": 0.812, "interference_gain": 0.075}
POLICIES = {
    "gpulets": elastic_partitioning_schedule,
    "gpulets (no int)": elastic_partitioning_schedule,
    "sbp": sbp_schedule,
    "best-fit": best_fit_schedule,
}

# Figure 13 by analogy: the paper's scenarios (Table 4: models grouped by memory footprint, < 1 GB,
# 1-2 GB, > 2 GB) and applications, mapped onto the shared data's models of the same footprint class.
SIM_MIXES: dict[str, tuple[str, ...]] = {
    "scen1 (mob,be | nas,goo)": ("mobilenet", "inception", "densenet121"),
    "scen2 (den | vgg)": ("densenet121", "vgg19"),
    "scen3 (mob | res | vgg)": ("mobilenet", "resnet50", "vgg19"),
    "scen4 (ssd | nas,den)": ("resnet101", "densenet169", "densenet121"),
    "scen5 (le | ssd,nas | vgg)": ("mobilenet", "resnet101", "densenet169", "vgg16"),
    "game (7 parallel models)": ("mobilenet", "inception", "resnet50", "resnet101", "densenet121"),
    "traffic (detect, recognise)": ("resnet152", "inception", "vgg16"),
}
SIM_POLICIES: dict[str, tuple[str, bool]] = {  # name -> (planner, plans with the interference model)
    "gpulets": ("gpulets", True), "gpulets (no int)": ("gpulets", False), "sbp": ("sbp", True), "best-fit": ("best-fit", True),
    # Tessera's default planner (issue 42, item 1), as the control loop runs it (spare capacity "fill":
    # the whole fleet, for headroom), and with spare capacity "idle" (the fewest GPUs, autoscaling's).
    "fleet": ("fleet", True), "fleet (idle)": ("fleet-idle", True),
}
# The fleet model's solve in the simulated part: its gap, and its limit (a plan per probed rate).
SIM_FLEET_GAP = 1e-3
SIM_FLEET_LIMIT_S = 30.0
SIM_MISS_LIMIT = 0.01  # the paper's "99 % of requests within the SLO"
# Every policy plans for this much more than it is then simulated at: the planners size each model's batch
# to rate x duty cycle, so a plan at exactly the offered rate runs its busiest partitions at 100 % load,
# where Poisson arrivals queue without bound (measured: 2-5 % of requests miss at any rate without it).
SIM_HEADROOM = 1.1
SIM_STEPS = 9

_BASE: dict[str, SharingProblem] = {}


def base_problems() -> dict[str, SharingProblem]:
    """The scheduler's problems, built once through the live planner's adapter (engine/solvers/gpulets.py)."""
    if not _BASE:
        models = sorted({p.model for p in gpulet_inference_read()})
        sharing, _ = sharing_problem_from(gpulet_mps_problem({m: 100.0 for m in models}, gpus=GPUS))
        assert sharing is not None and sharing.interference is not None
        _BASE["int"] = sharing
        _BASE["no int"] = sharing.without_interference()
    return _BASE


def scenarios_draw(n: int | None, seed: int, models: list[str]) -> list[dict[str, float]]:
    every = [r for r in itertools.product(RATES, repeat=len(models)) if any(r)]
    if n is not None and n < len(every):
        every = random.Random(seed).sample(every, n)
    return [dict(zip(models, map(float, r))) for r in every]


def _scaled(problem: SharingProblem, rates: dict[str, float], s: float) -> SharingProblem:
    return problem.with_rates({m: r * s for m, r in rates.items()})


def _max_scale(fits, lo: float = 0.0, hi: float | None = None) -> float:
    """The largest s with fits(s), by doubling then bisection (schedulability is taken as monotone in s)."""
    if hi is None:
        hi = max(1.0, 2 * lo)
        while fits(hi):
            lo, hi = hi, 2 * hi
            if hi > 1e4:
                return lo
    for _ in range(SCALE_STEPS):
        mid = (lo + hi) / 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _ideal_max_scale(problem: SharingProblem, rates: dict[str, float], floor: float) -> float:
    """The ideal's largest factor: the best over its partitionings, each bisected only if it beats the best
    so far (starting from `floor`, a factor some heuristic already reached on fixed partitions or 0)."""
    best = 0.0
    for layouts in ideal_partitionings(GPUS):
        def fits(s: float, layouts=layouts) -> bool:
            return fixed_partitioning_schedule(_scaled(problem, rates, s), layouts).schedulable

        probe = max(best, floor * 0.999) * (1 + 1e-3) if max(best, floor) > 0 else 1e-3
        if fits(probe):
            best = max(best, _max_scale(fits, lo=probe))
    return best


def scenario_run(task: tuple[int, dict[str, float]]) -> dict[str, Any]:
    index, rates = task
    problems = base_problems()
    row: dict[str, Any] = {"scenario": index, "rates": " ".join(str(int(rates[m])) for m in sorted(rates))}
    started = time.perf_counter()
    with_int = _scaled(problems["int"], rates, 1.0)
    for name, scheduler in POLICIES.items():
        problem = problems["no int" if name == "gpulets (no int)" else "int"]
        at_one = scheduler(_scaled(problem, rates, 1.0), GPUS)
        row[f"{name}: schedulable"] = int(at_one.schedulable)
        row[f"{name}: max scale"] = _max_scale(lambda s, p=problem, f=scheduler: f(_scaled(p, rates, s), GPUS).schedulable)
        if name == "gpulets (no int)":
            # The same schedule judged with the interference predicted: does it keep every SLO?
            row["gpulets (no int): misses an SLO"] = int(bool(sharing_schedule_validate(with_int, at_one)))
        else:
            row[f"{name}: invalid"] = int(bool(sharing_schedule_validate(with_int, at_one)))
    ideal_one = ideal_schedule(with_int, GPUS)
    row["ideal: schedulable"] = int(ideal_one.schedulable)
    row["ideal: invalid"] = int(bool(sharing_schedule_validate(with_int, ideal_one)))
    row["ideal: max scale"] = _ideal_max_scale(problems["int"], rates, 0.0)
    # GPU count at GPU_COUNT_SCALE x the rates: Algorithm 2 from one GPU, and the fewest the ideal needs.
    scaled = _scaled(problems["int"], rates, GPU_COUNT_SCALE)
    chosen = gpu_scaling_schedule(scaled, gpu_limit=GPU_COUNT_LIMIT, gpus_before=1)
    row["gpulets: gpus"] = chosen.gpus_used if chosen.schedulable else None
    row["ideal: gpus"] = next((n for n in range(1, min(GPU_COUNT_LIMIT, 6) + 1) if ideal_schedule(scaled, n).schedulable), None)
    row["seconds"] = time.perf_counter() - started
    return row


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = list(POLICIES) + ["ideal"]
    n = len(rows)
    served_by_ideal = [r for r in rows if r["ideal: max scale"] > 0]
    out = []
    for name in names:
        ratios = [min(r[f"{name}: max scale"] / r["ideal: max scale"], 10.0) for r in served_by_ideal]
        out.append({
            "policy": name,
            "scenarios": n,
            "schedulable": sum(r[f"{name}: schedulable"] for r in rows),
            "schedulable_share": sum(r[f"{name}: schedulable"] for r in rows) / n,
            "max_rate_vs_ideal_mean": statistics.fmean(ratios) if ratios else None,
            "max_rate_vs_ideal_p10": sorted(ratios)[len(ratios) // 10] if ratios else None,
            "mean_max_scale": statistics.fmean(r[f"{name}: max scale"] for r in rows),
            "invalid_schedules": sum(r.get(f"{name}: invalid", 0) for r in rows),
        })
    return out


def table(summary: list[dict[str, Any]], rows: list[dict[str, Any]], errors) -> list[str]:
    by = {s["policy"]: s for s in summary}
    ideal = by["ideal"]
    lines = [f"{'policy':<18} {'schedulable':>14} {'vs ideal':>9} {'max rate / ideal':>17} {'p10':>6} {'mean scale':>11} {'invalid':>8}",
             "-" * 90]
    for s in summary:
        fewer = (ideal["schedulable"] - s["schedulable"]) / s["scenarios"]
        lines.append(f"{s['policy']:<18} {s['schedulable']:>6} ({100 * s['schedulable_share']:5.1f} %) {100 * -fewer:>+8.1f}% "
                     f"{100 * (s['max_rate_vs_ideal_mean'] or 0):>16.1f}% {100 * (s['max_rate_vs_ideal_p10'] or 0):>5.1f}% "
                     f"{s['mean_max_scale']:>11.2f} {s['invalid_schedules']:>8}")
    g, sbp, bf, noint = by["gpulets"], by["sbp"], by["best-fit"], by["gpulets (no int)"]
    lines.append("")
    lines.append(f"gpulets max rate / ideal: {100 * g['max_rate_vs_ideal_mean']:.1f} %  (paper: {100 * PAPER['ratio_gpulets']:.1f} %)")
    lines.append(f"gpulets schedules {100 * (ideal['schedulable'] - g['schedulable']) / g['scenarios']:.1f} % fewer scenarios than the ideal "
                 f"(paper: {100 * PAPER['schedulable_fewer']:.1f} %)")
    lines.append(f"gpulets max rate over SBP: {100 * (g['mean_max_scale'] / sbp['mean_max_scale'] - 1):+.1f} %, over best-fit: "
                 f"{100 * (g['mean_max_scale'] / bf['mean_max_scale'] - 1):+.1f} % (mean scale, scheduler level; the paper's +61.7 % / "
                 f"+81.2 % are measured throughputs, Figure 13: simulated below)")
    misses = sum(r["gpulets (no int): misses an SLO"] for r in rows)
    lines.append(f"gpulets without the interference term: {100 * (noint['mean_max_scale'] / g['mean_max_scale'] - 1):+.1f} % max rate, but "
                 f"{misses} of {len(rows)} of its schedules at 1 x miss an SLO once interference is predicted")
    pairs = [(r["gpulets: gpus"], r["ideal: gpus"]) for r in rows if r["gpulets: gpus"] is not None and r["ideal: gpus"] is not None]
    if pairs:
        more = sum(1 for a, b in pairs if a > b)
        lines.append(f"GPUs at {GPU_COUNT_SCALE:g} x the rates: Algorithm 2 {statistics.fmean(a for a, _ in pairs):.2f}, ideal "
                     f"{statistics.fmean(b for _, b in pairs):.2f} on average; more than the ideal in {more} of {len(pairs)} scenarios")
    lines.append(f"interference model ({INTERFERENCE_FORM_DEFAULT}) on unseen pairs: p50 {100 * errors.p50:.1f} %, p90 {100 * errors.p90:.1f} %, "
                 f"p95 {100 * errors.p95:.1f} % (paper: 10.26 % at p90, 13.98 % at p95, on its own data)")
    return lines


def plot(summary: list[dict[str, Any]], rows: list[dict[str, Any]], throughput: list[dict[str, Any]], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (left, middle), (right, bottom) = axes
    throughput_plot(throughput, bottom)
    names = [s["policy"] for s in summary]
    left.bar(names, [100 * s["schedulable_share"] for s in summary], color=[f"C{i}" for i in range(len(names))])
    left.set_ylabel("scenarios schedulable (%)")
    left.tick_params(axis="x", rotation=20, labelsize=8)
    middle.bar(names, [100 * (s["max_rate_vs_ideal_mean"] or 0) for s in summary], color=[f"C{i}" for i in range(len(names))])
    middle.axhline(100 * PAPER["ratio_gpulets"], color="grey", linestyle=":", label="paper: gpulet+int 92.6 %")
    middle.set_ylabel("max schedulable rate / ideal's (%, mean)")
    middle.tick_params(axis="x", rotation=20, labelsize=8)
    middle.legend(fontsize=8)
    served = [r for r in rows if r["ideal: max scale"] > 0]
    for i, name in enumerate(names[:-1]):
        ratios = sorted(r[f"{name}: max scale"] / r["ideal: max scale"] for r in served)
        right.step([min(x, 1.5) for x in ratios], [(k + 1) / len(ratios) for k in range(len(ratios))], where="post", color=f"C{i}", label=name)
    right.set_xlabel("max schedulable rate / ideal's, per scenario")
    right.set_ylabel("fraction of scenarios")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    return figure_write(plt, fig, path, f"gpulets on engine/reference/data/gpulet: {len(rows)} rate scenarios, {GPUS} GPUs (benches/gpulets.py)")


_TRUTH: dict[tuple[str, ...], InterferenceMeasured] = {}


def _gpu_truth(problem: Problem) -> InterferenceMeasured:
    """What the simulated GPUs do: the measured co-runs, the problem's fitted model where none was measured."""
    variants = tuple(sorted(v.name for v in problem.variants))
    if variants not in _TRUTH:
        build = interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read())
        predictor = interference_predictor_for(problem, problem.devices[0].type, set(variants), [])
        _TRUTH[variants] = InterferenceMeasured(build.samples, fallback=predictor)
    return _TRUTH[variants]


def _simulated_misses(mix: tuple[str, ...], rate: float, planner: str, plan_interference: bool, seconds: float, seed: int) -> tuple[float, int]:
    """The share of requests that miss their SLO (late or dropped) when every model of `mix` gets `rate`
    req/s, planned by `planner` (1.0 when it cannot schedule the rate), and the GPUs the plan uses."""
    rates = {m: rate for m in mix}
    truth_problem = gpulet_mps_problem(rates, gpus=GPUS)
    planned = {m: rate * SIM_HEADROOM for m in mix}
    plan_problem = gpulet_mps_problem(planned, gpus=GPUS, interference=plan_interference)
    if planner.startswith("fleet"):
        options = dataclasses.replace(plan_problem.options, mip_gap=SIM_FLEET_GAP, time_limit_s=SIM_FLEET_LIMIT_S, threads=1,
                                      spare_capacity="idle" if planner == "fleet-idle" else "fill")
        plan = plan_solve(dataclasses.replace(plan_problem, options=options), "fleet")
        planned_ok = plan.status in ("optimal", "feasible")
    else:
        plan = sharing_plan_solve(plan_problem, planner)
        planned_ok = plan.status == "feasible"
    if not planned_ok or any(v > 0 for v in plan.shortfall_rps.values()):
        return 1.0, 0
    trace = None
    for i, m in enumerate(mix):
        t = arrivals_poisson(rate, seconds, seed=seed * 1000 + i, application=m)
        trace = t if trace is None else trace.merge(t)
    config = SimulationConfig(batching="nexus", replan_interval_s=None, burst_factor=None, initial_demand="problem", seed=seed)
    result = simulate(truth_problem, trace, planner=lambda _p: plan, config=config, interference=_gpu_truth(truth_problem))
    return result.summary["slo_violation_ratio"], plan.gpus_used or 0


def throughput_run(task: tuple[str, str, float, int]) -> dict[str, Any]:
    """One mix and policy: the largest total rate with at most SIM_MISS_LIMIT of requests missing their SLO
    (doubling from 50 req/s per model, then bisection; misses are taken as monotone in the rate)."""
    mix_name, policy, seconds, seed = task
    mix = SIM_MIXES[mix_name]
    planner, plan_interference = SIM_POLICIES[policy]
    started = time.perf_counter()
    cache: dict[float, tuple[float, int]] = {}

    def ok(rate: float) -> bool:
        if rate not in cache:
            cache[rate] = _simulated_misses(mix, rate, planner, plan_interference, seconds, seed)
        return cache[rate][0] <= SIM_MISS_LIMIT

    lo, hi = 0.0, 50.0
    while ok(hi) and hi < 1e5:
        lo, hi = hi, hi * 2
    for _ in range(SIM_STEPS):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    ramp = lo
    # Misses are not monotone in the rate: a planner that packs the fewest GPUs can miss at one rate and
    # keep every SLO at a higher one, where it takes another GPU. Probe above the ramp's end for that.
    for factor in (1.25, 1.5, 2.0, 3.0):
        if ok(ramp * factor):
            lo = max(lo, ramp * factor)
    best = cache.get(lo, (None, None))
    return {"mix": mix_name, "policy": policy, "models": len(mix), "max_rate_per_model": ramp, "max_throughput_rps": ramp * len(mix),
            "misses_at_max": cache.get(ramp, (None, None))[0], "gpus_at_max": cache.get(ramp, (None, None))[1],
            "best_passing_throughput_rps": lo * len(mix), "gpus_at_best": best[1], "simulations": len(cache),
            "seconds": time.perf_counter() - started}


def throughput_table(rows: list[dict[str, Any]]) -> list[str]:
    policies = list(SIM_POLICIES)
    by = {(r["mix"], r["policy"]): r for r in rows}
    lines = ["", f"Simulated SLO-preserved max throughput (req/s, <= {100 * SIM_MISS_LIMIT:g} % of requests late or dropped; Figure 13 by analogy;",
             "ramp: the rate raised until misses pass the limit, as the paper measures; in brackets the best passing rate above it)",
             f"{'mix':<30}" + "".join(f"{p:>20}" for p in policies), "-" * (30 + 20 * len(policies))]
    mixes = [m for m in SIM_MIXES if (m, policies[0]) in by]
    for mix in mixes:
        lines.append(f"{mix:<30}" + "".join(f"{by[(mix, p)]['max_throughput_rps']:>11.0f} ({by[(mix, p)]['best_passing_throughput_rps']:>5.0f})"
                                             for p in policies))

    def gain(a: str, b: str, key: str) -> float:
        ratios = [by[(m, a)][key] / by[(m, b)][key] for m in mixes if by[(m, b)][key] > 0]
        return statistics.fmean(ratios) - 1 if ratios else float("nan")

    for key, label in (("max_throughput_rps", "ramp"), ("best_passing_throughput_rps", "best passing")):
        lines.append(f"{label}: gpulets over SBP {100 * gain('gpulets', 'sbp', key):+.1f} % (paper +{100 * PAPER['over_sbp']:.1f} %), over best-fit "
                     f"{100 * gain('gpulets', 'best-fit', key):+.1f} % (paper +{100 * PAPER['over_best_fit']:.1f} %), interference term "
                     f"{100 * gain('gpulets', 'gpulets (no int)', key):+.1f} % (paper +{100 * PAPER['interference_gain']:.1f} %); mean of per-mix ratios")
        if "fleet" in policies:
            lines.append(f"{label}: fleet (the default) over SBP {100 * gain('fleet', 'sbp', key):+.1f} % (target +{100 * PAPER['over_sbp']:.1f} %), "
                         f"over best-fit {100 * gain('fleet', 'best-fit', key):+.1f} %, over gpulets {100 * gain('fleet', 'gpulets', key):+.1f} %, "
                         f"over itself with spare capacity idle {100 * gain('fleet', 'fleet (idle)', key):+.1f} %")
    if "fleet" in policies:
        behind = [m.split(" ")[0] for m in mixes
                  if by[(m, "fleet")]["max_throughput_rps"] <= max(by[(m, p)]["max_throughput_rps"] for p in ("sbp", "best-fit"))]
        lines.append(f"fleet ahead of SBP and best-fit (ramp) on {len(mixes) - len(behind)} of {len(mixes)} mixes"
                     + (f"; not on {', '.join(behind)}" if behind else ""))
    lines.append(f"(every policy plans for {SIM_HEADROOM:g} x the offered rate; GPUs slow down by the measured co-runs, the fitted model elsewhere)")
    return lines


def throughput_plot(rows: list[dict[str, Any]], axis) -> None:
    policies = list(SIM_POLICIES)
    by = {(r["mix"], r["policy"]): r for r in rows}
    mixes = [m for m in SIM_MIXES if (m, policies[0]) in by]
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        axis.bar([x + i * width for x in range(len(mixes))], [by[(m, policy)]["max_throughput_rps"] for m in mixes], width, label=policy, color=f"C{i}")
    axis.set_xticks([x + 0.4 - width / 2 for x in range(len(mixes))])
    axis.set_xticklabels([m.split(" ")[0] for m in mixes], fontsize=8)
    axis.set_ylabel("SLO-preserved max throughput (req/s, simulated)")
    axis.legend(fontsize=8)


# --------------------------------------------------------------------------- fleets a whole-GPU plan serves (issue 39)

WHOLE_GPU_SCENARIOS = 30
WHOLE_GPU_PLANNERS = ("gpulets", "best-fit", "sbp")
WHOLE_GPU_ALGORITHMS = {  # the schedulers alone, without the planners' whole-GPU fallback
    "gpulets": lambda sharing, gpus: gpu_scaling_schedule(sharing, gpu_limit=gpus, gpus_before=0),
    "best-fit": best_fit_schedule,
}
# The minimal case: resnet101 alone at 80 req/s, SLO 20.34 ms, 2 GPUs; one whole GPU at batch 1
# serves it (9.11 ms a batch, a round of 11.23 ms).
WHOLE_GPU_MINIMAL = ({"resnet101": 80.0}, {"resnet101": 20.34}, 2)


def _whole_gpu_latencies() -> dict[str, dict[int, float]]:
    """model -> measured batch -> latency (ms) on 100 % of the GPU, straight from inference.csv (valid rows)."""
    found: dict[str, dict[int, float]] = {}
    with (reference_data_dir() / "gpulet" / "inference.csv").open(newline="") as fh:
        for row in csv.reader(fh):
            if row and len(row) >= 8 and row[2].strip() == "100" and row[7].strip() == "1":
                found.setdefault(row[0].strip(), {})[int(row[1])] = float(row[6]) * 1000.0
    return found


WHOLE = _whole_gpu_latencies()


def whole_gpu_capacity(model: str, slo_ms: float) -> float:
    """A model alone on a whole GPU: d + L <= SLO and L <= d, so 2 L(b) <= SLO and rate <= b / L(b); the
    best over the measured batches (req/s; 0 when none fits)."""
    return max((b * 1000.0 / ms for b, ms in WHOLE[model].items() if 2 * ms <= slo_ms * (1 + 1e-9)), default=0.0)


def _group_fits(group: list[str], rates: dict[str, float], slos: dict[str, float]) -> bool:
    """The models of `group` time-share one whole GPU in rounds of d ms: each runs a measured batch covering
    a round's arrivals (the fastest such), the batches fit the round and d + L_m <= SLO_m. Between two
    rounds at which some batch must grow (d = b / rate) the batches are fixed, and the shortest round that
    holds them, max(start, their sum), is the best there: each such interval is tried."""
    steps = sorted({b * 1000.0 / rates[m] for m in group for b in WHOLE[m]})
    low = 0.0
    for high in steps:
        latencies = []
        for m in group:
            need = rates[m] * high / 1000.0
            ms = min((v for b, v in WHOLE[m].items() if b >= need * (1 - 1e-12)), default=None)
            if ms is None:
                return False  # longer rounds need larger batches still
            latencies.append((m, ms))
        d = max(low, sum(ms for _, ms in latencies))
        if d <= high and all(d + ms <= slos[m] * (1 + 1e-9) for m, ms in latencies):
            return True
        low = high
    return False


def _set_partitions(items: list[str]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        for i in range(len(partition)):
            yield partition[:i] + [[first] + partition[i]] + partition[i + 1:]
        yield [[first]] + partition


def whole_gpu_oracle(rates: dict[str, float], slos: dict[str, float]) -> int | None:
    """The fewest whole GPUs of a whole-GPU plan (None: none exists of this form): each model fills whole GPUs
    at its capacity, and what is left of the rates is grouped (every grouping tried) onto GPUs that
    time-share it. Written apart from the planners: it reads the measurements itself and shares no code."""
    dedicated, rest = 0, {}
    for m, rate in rates.items():
        if rate <= 0:
            continue
        cap = whole_gpu_capacity(m, slos[m])
        if cap <= 0:
            return None
        full = math.floor(rate / cap * (1 + 1e-12))
        dedicated += full
        if rate - full * cap > 1e-6:
            rest[m] = rate - full * cap
    best = None
    for groups in _set_partitions(sorted(rest)):
        if (best is None or len(groups) < best) and all(_group_fits(g, rest, slos) for g in groups):
            best = len(groups)
    if rest and best is None:
        return None
    return dedicated + (best or 0)


def whole_gpu_scenarios_draw(n: int, seed: int) -> list[tuple[dict[str, float], dict[str, float], int]]:
    """`n` seeded scenarios (rates, SLOs, GPUs): 3-6 models, each with its Table 3 SLO or (half of them) a
    tight one, 2 x its whole-GPU latency at batch 1, 2 or 4, x 1.02-1.3; rates 5-120 % of a whole GPU's
    capacity; kept when the oracle finds a whole-GPU plan on at most 6 GPUs, on max(2, that many) GPUs."""
    rng = random.Random(seed)
    models = sorted(WHOLE)
    out = []
    while len(out) < n:
        chosen = rng.sample(models, rng.randint(3, 6))
        slos = {}
        for m in chosen:
            if rng.random() < 0.5:
                slos[m] = gpulet_slo_ms(m)
            else:
                batch = rng.choice([1, 2, 4])
                slos[m] = round(2 * WHOLE[m][batch] * rng.uniform(1.02, 1.3), 2)
        rates = {m: round(whole_gpu_capacity(m, slos[m]) * rng.uniform(0.05, 1.2), 1) for m in chosen}
        need = whole_gpu_oracle(rates, slos)
        if need is None or need > 6:
            continue
        out.append((rates, slos, max(2, need)))
    return out


_SAMPLES: list = []


def measured_corun_excess(problem: Problem, plan: Plan) -> float:
    """The plan on the MEASURED co-run latencies: per MPS partition, each model's batch latency times the
    measured factor next to the models of the GPU's other partition (the worst of them; the fitted model
    where the co-location was not measured), then the largest excess of duty cycle + latency over the
    round budget (the SLO at the default budget fraction) and of the batches over the round: > 0 means an
    SLO missed on the measurements. -1 for a plan without instances."""
    if not _SAMPLES:
        _SAMPLES.extend(interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read()).samples)
    fitted = interference_predictor_for(problem, problem.devices[0].type, {v.name for v in problem.variants}, [], measured=[])
    truth = InterferenceMeasured(_SAMPLES, fallback=fitted)
    latency = _LATENCY.setdefault("model", partition_latency_model_from_gpulet(gpulet_inference_read()))
    budget = {a.name: 2 * problem.options.latency_budget_fraction * a.slo_ms for a in problem.applications}
    app_of = {v.name: v.application for v in problem.variants}
    partitions: dict[tuple[str, int | None], list] = {}
    for inst in plan.instances:
        partitions.setdefault((inst.device, inst.start), []).append(inst)
    worst = -1.0
    for (device, start), members in partitions.items():
        beside = [j for (d, s), others in partitions.items() if d == device and s != start for j in others]
        total = 0.0
        for inst in members:
            percent = mps_slice_percent(inst.slice)
            factor = max([1.0] + [truth.factor(inst.variant, inst.batch, percent, j.variant, j.batch, mps_slice_percent(j.slice)) for j in beside])
            ms = latency.latency_ms(inst.variant, inst.batch, percent) * factor
            total += ms
            worst = max(worst, (inst.duty_cycle_ms + ms) / budget[app_of[inst.variant]] - 1)
        worst = max(worst, total / members[0].duty_cycle_ms - 1)
    return worst


_LATENCY: dict[str, Any] = {}


def whole_gpu_run(task: tuple[str, dict[str, float], dict[str, float], int]) -> dict[str, Any]:
    """One scenario: each planner as `tessera plan solve` runs it, and the algorithms alone."""
    label, rates, slos, gpus = task
    problem = gpulet_mps_problem(rates, gpus=gpus, slo_ms=slos)
    row: dict[str, Any] = {"scenario": label, "gpus": gpus, "models": len(rates), "oracle_gpus": whole_gpu_oracle(rates, slos),
                           "rates": " ".join(f"{m}={rates[m]:g}" for m in sorted(rates)),
                           "slos_ms": " ".join(f"{m}={slos[m]:g}" for m in sorted(rates))}
    for planner in WHOLE_GPU_PLANNERS:
        plan = sharing_plan_solve(problem, planner)
        short = sum(plan.shortfall_rps.values())
        row[f"{planner}: served all"] = int(short == 0)
        row[f"{planner}: shortfall rps"] = short
        row[f"{planner}: status"] = plan.status
        row[f"{planner}: valid"] = int(plan_validate(problem, plan).valid)
        row[f"{planner}: measured excess"] = measured_corun_excess(problem, plan) if plan.instances else None
        row[f"{planner}: whole-GPU fallback"] = int(any("whole-GPU plan" in n for n in plan.notes))
    sharing, _ = sharing_problem_from(problem)
    for name, scheduler in WHOLE_GPU_ALGORITHMS.items():
        row[f"{name} (algorithm alone): served all"] = int(scheduler(sharing, gpus).schedulable)
    return row


def whole_gpu_table(rows: list[dict[str, Any]], minimal: dict[str, Any]) -> list[str]:
    n = len(rows)
    lines = ["", f"Fleets a whole-GPU plan serves (issue 39): {n} seeded scenarios, 3-6 models, 2-6 GPUs, Table 3 and tight SLOs",
             f"{'planner':<28} {'serves every rate':>18} {'valid':>6} {'over an SLO on measured co-runs':>32} {'max excess':>11} {'fallback used':>14}",
             "-" * 114]
    for planner in WHOLE_GPU_PLANNERS:
        excess = [r[f"{planner}: measured excess"] for r in rows if r[f"{planner}: measured excess"] is not None]
        over = sum(1 for e in excess if e > 1e-9)
        lines.append(f"{planner:<28} {sum(r[f'{planner}: served all'] for r in rows):>12} of {n:<3} {sum(r[f'{planner}: valid'] for r in rows):>6} "
                     f"{over:>32} {100 * max(excess + [0.0]):>10.2f}% {sum(r[f'{planner}: whole-GPU fallback'] for r in rows):>14}")
    for name in WHOLE_GPU_ALGORITHMS:
        lines.append(f"{name + ' (algorithm alone)':<28} {sum(r[f'{name} (algorithm alone): served all'] for r in rows):>12} of {n:<3}")
    lines.append(f"minimal case (resnet101 80 req/s, SLO 20.34 ms, 2 GPUs): "
                 + ", ".join(f"{p} {'serves it' if minimal[f'{p}: served all'] else 'SHORT ' + format(minimal[f'{p}: shortfall rps'], 'g') + ' req/s'}"
                             for p in WHOLE_GPU_PLANNERS))
    return lines


def whole_gpu_plot(rows: list[dict[str, Any]], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [f"{p} (algorithm alone)" for p in WHOLE_GPU_ALGORITHMS] + list(WHOLE_GPU_PLANNERS)
    served = [sum(r[f"{name}: served all"] for r in rows) for name in names]
    left.bar(names, served, color=[f"C{i}" for i in range(len(names))])
    left.axhline(len(rows), color="grey", linestyle=":", label="every scenario (the oracle's)")
    left.set_ylabel("scenarios with every rate served")
    left.tick_params(axis="x", rotation=20, labelsize=8)
    left.legend(fontsize=8)
    for i, planner in enumerate(WHOLE_GPU_PLANNERS):
        excess = sorted(100 * r[f"{planner}: measured excess"] for r in rows if r[f"{planner}: measured excess"] is not None)
        right.step(excess, [(k + 1) / len(excess) for k in range(len(excess))], where="post", color=f"C{i + len(WHOLE_GPU_ALGORITHMS)}", label=planner)
    right.axvline(0, color="grey", linestyle=":")
    right.set_xlabel("largest (duty cycle + batch latency) / SLO - 1 on measured co-runs (%)")
    right.set_ylabel("fraction of plans")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    return figure_write(plt, fig, path, f"gpulets: {len(rows)} fleets a whole-GPU plan serves (benches/gpulets.py)")


def whole_gpu_section(n: int, seed: int, jobs: int, out: Path) -> list[dict[str, Any]]:
    scenarios = whole_gpu_scenarios_draw(n, seed)
    tasks = [(str(i), rates, slos, gpus) for i, (rates, slos, gpus) in enumerate(scenarios)]
    rows = parallel_map(whole_gpu_run, tasks, jobs)
    rates, slos, gpus = WHOLE_GPU_MINIMAL
    minimal = whole_gpu_run(("minimal", rates, slos, gpus))
    for line in whole_gpu_table(rows, minimal):
        print(line)
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {csv_rows_write(out / 'gpulets_whole_gpu.csv', rows + [minimal], list(rows[0]))}")
    print(whole_gpu_plot(rows, out / "gpulets_whole_gpu.png"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--scenarios", type=int, default=2000)
    parser.add_argument("--all", action="store_true", help="every one of the 3^10 - 1 scenarios (hours)")
    parser.add_argument("--quick", action="store_true", help="100 scenarios and 6 s traces (about 3 minutes on 2 idle cores; 301 s with --jobs 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sim-seconds", type=float, default=None, help="trace length per simulated rate (default 30, 6 with --quick)")
    parser.add_argument("--mixes", default=None, help="simulate only these mixes: comma-separated name prefixes, e.g. scen2,game")
    parser.add_argument("--whole-gpu-scenarios", type=int, default=None,
                        help=f"scenarios of the whole-GPU sample (default {WHOLE_GPU_SCENARIOS}, or --scenarios if that is fewer; 0 skips it)")
    parser.add_argument("--whole-gpu-only", action="store_true", help="run the whole-GPU sample alone")
    args = parser.parse_args(argv)
    if args.whole_gpu_scenarios is None:
        args.whole_gpu_scenarios = min(WHOLE_GPU_SCENARIOS, args.scenarios) if not args.whole_gpu_only else WHOLE_GPU_SCENARIOS
    if args.whole_gpu_scenarios < 0:
        parser.error("--whole-gpu-scenarios must be at least 0")
    if args.whole_gpu_only:
        started = time.perf_counter()
        whole_gpu_section(max(1, args.whole_gpu_scenarios), args.seed, args.jobs, args.out)
        print(f"done in {time.perf_counter() - started:.0f} s")
        return 0
    mixes = list(SIM_MIXES)
    if args.mixes is not None:
        prefixes = [p.strip() for p in args.mixes.split(",") if p.strip()]
        mixes = [m for m in SIM_MIXES if any(m.startswith(p) for p in prefixes)]
        unknown = [p for p in prefixes if not any(m.startswith(p) for m in SIM_MIXES)]
        if unknown or not mixes:
            parser.error(f"--mixes: no mix named {', '.join(unknown) or args.mixes!r}; mixes: {', '.join(m.split(' ')[0] for m in SIM_MIXES)}")
    if args.scenarios < 1:
        parser.error("--scenarios must be at least 1")
    sim_seconds = args.sim_seconds if args.sim_seconds is not None else (6.0 if args.quick else 30.0)
    if not sim_seconds > 0:
        parser.error("--sim-seconds must be > 0")
    started = time.perf_counter()
    problems = base_problems()
    models = [m.name for m in problems["int"].models]
    n = None if args.all else (100 if args.quick else args.scenarios)
    scenarios = scenarios_draw(n, args.seed, models)
    print(f"gpulets bench on engine/reference/data/gpulet: {len(scenarios)} rate scenarios over {{0, 100, 200}} req/s x {len(models)} models "
          f"({'all' if n is None else f'random sample, seed {args.seed}'}), {GPUS} GPUs, {args.jobs} job(s)")
    rows = parallel_map(scenario_run, list(enumerate(scenarios)), args.jobs)
    build = interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read())
    errors = interference_validate_by_pair(build.samples, form=INTERFERENCE_FORM_DEFAULT).validation
    summary = summarise(rows)
    for line in table(summary, rows, errors):
        print(line)
    throughput = parallel_map(throughput_run, [(m, p, sim_seconds, args.seed) for m in mixes for p in SIM_POLICIES], args.jobs)
    for line in throughput_table(throughput):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0])
    print(f"wrote {csv_rows_write(args.out / 'gpulets.csv', rows, fields)}")
    print(f"wrote {csv_rows_write(args.out / 'gpulets_summary.csv', summary, list(summary[0]))}")
    print(f"wrote {csv_rows_write(args.out / 'gpulets_throughput.csv', throughput, list(throughput[0]))}")
    print(plot(summary, rows, throughput, args.out / "gpulets.png"))
    if args.whole_gpu_scenarios:
        whole_gpu_section(args.whole_gpu_scenarios, args.seed, args.jobs, args.out)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
