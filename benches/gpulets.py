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
  predictor's error and `gpulets (no int)` meets interference it did not plan for.

    .venv/bin/python benches/gpulets.py            # about 10 minutes on 2 cores
    .venv/bin/python benches/gpulets.py --quick    # under 3 minutes
    options: --out DIR (default bench-results), --scenarios N, --all (every scenario), --seed N, --jobs N,
             --sim-seconds S (trace length per simulated rate; default 30, 6 with --quick), --mixes scen2,game

Writes DIR/gpulets.csv (one row per scenario), DIR/gpulets_summary.csv, DIR/gpulets_throughput.csv (one row
per mix and policy) and DIR/gpulets.png.
"""
from __future__ import annotations

import argparse
import itertools
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

from engine.plans.problem import Problem  # noqa: E402
from engine.reference.gpulet_problem import gpulet_mps_problem  # noqa: E402
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
}
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
    plan = sharing_plan_solve(plan_problem, planner)
    if plan.status != "feasible" or any(v > 0 for v in plan.shortfall_rps.values()):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--scenarios", type=int, default=2000)
    parser.add_argument("--all", action="store_true", help="every one of the 3^10 - 1 scenarios (hours)")
    parser.add_argument("--quick", action="store_true", help="100 scenarios and 6 s traces (under 3 minutes: 148-159 s on 2 idle cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sim-seconds", type=float, default=None, help="trace length per simulated rate (default 30, 6 with --quick)")
    parser.add_argument("--mixes", default=None, help="simulate only these mixes: comma-separated name prefixes, e.g. scen2,game")
    args = parser.parse_args(argv)
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
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
