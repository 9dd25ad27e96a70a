#!/usr/bin/env python
"""Pipelines (Razavi's thesis): FA2 (P1 §p1.6, Figure P1.12) against the exact optimum and the baselines,
on the thesis's own application (the ten DNNs and six execution paths of Table P1.3 with their SLAs,
steady request rates of 6 to 60 per second); fa2's exact mode and FA2's dynamic programme against a
brute-force optimum of P1.3 on random profiled chains, forks, joins and DAGs; and IPA (P3 §p3.4-3.5): its
solve time up to 10 stages of 10 variants (Fig. P3.13), equality with brute force on small pipelines, the
cost-accuracy frontier as its weights move, and FA2-low / FA2-high beside it. A script, not a test (its
smoke run is tests/engine/test_pipelines_bench_smoke.py).

    .venv/bin/python benches/pipelines.py            # full run (about a minute and a half on two cores)
    .venv/bin/python benches/pipelines.py --quick    # smoke run, a few seconds
    options: --out DIR (default bench-results), --seeds N, --device cpu|gpu|both, --jobs N, --slot-ms S

Writes DIR/pipelines.csv (FA2: one row per instance and solver), DIR/pipelines_simulated.csv (each plan
served in the pipeline simulator), DIR/pipelines_exact.csv (one row per random pipeline, headroom and
solver, against brute force), DIR/pipelines_ipa.csv (IPA: one row per solve) and DIR/pipelines.png (needs
matplotlib).

What the paper says (§p1.6.2, steady workload): "InferLine [...] needs on average 19 % (and up to 48 %)
more computational resources when compared with FA2 [...] DS2 [...] requires on average 26 % (and up to
62 %) more [...] FA2 performs close to the optimal (produced by Gurobi solver) where the match to optimal
decisions is over 96.8 %."

Set-up (printed with the results):
- Instances: `engine.reference.pipelines.fa2_table_p13_problem` at total rates 6, 12, ..., 60 requests/s
  split evenly over the six paths; the DNNs' latency profiles are stated (the thesis only plots them: each
  path's SLA is five times its batch-1 latency, the thesis's own rule), seed 0 the nominal profiles and
  every further seed perturbs each DNN's batch-1 latency by up to +-30 % and its batch curve.
- Solvers, all on the same problem: `fa2` (graph transformation and the dynamic programme over 1 ms slots,
  engine/pipelines/fa2.py), `milp` (the integer programme P1.3 solved exactly by HiGHS, the thesis's Gurobi
  optimum), `inferline` (greedy batch increase, DNN by DNN), `ds2` (batch 1). Every plan is checked by
  engine/pipelines/validate.py on the continuous latency model.
- "Matches the optimum": FA2 needs as many instances as the MILP's optimum (the objective the thesis
  minimises); "same decisions": every DNN's batch and instance count equal too.
- Simulated: each solver's plan for the nominal profiles, made for the rate (headroom 1) or 1.25x it, is
  served at the rate by engine/simulation/pipeline.py (per-stage central queues with the `fixed` batching
  policy at the plan's batch, 5 % log-normal service noise, Poisson arrivals per path, queries past their
  deadline dropped at the next stage as IPA §p3.4.5 does); and on a varying trace, every path's rate
  swinging +-35 % around the planned-for mean in 2-minute waves, plans made for 1.25x or 1.5x the mean.
- Against brute force: `engine.pipelines.brute.profiled_pipeline_random`, seeded chains (2-5 stages),
  forks, joins and DAGs whose stages are profiled at batches 1, 2, 4, 8 (CPU-like curves with noise; batches
  up to 8), each path's rate 5-60 requests/s and its SLO 1.5-5x its batch-1 latency; each stage's model
  built as the fleet planner builds it (`stage_latency_bound`). `p13_brute_force` enumerates every batch
  of every stage on the profiled latencies (linear between profiled batches, as the validators read them)
  and is the optimum; `milp` is fa2's exact mode (P1.3 with HiGHS, engine/pipelines/exact.py), `fa2` its
  dynamic programme on the paper's model; at headroom 1 and the fleet's default 1.25.
- IPA: `engine.reference.pipelines.ipa_random_pipeline` (stated: variant m of a stage is about 1 + m times
  slower, takes 1 + m cores, is 0.1 m more accurate), alpha 20, beta 0.02 (the thesis sets them per
  pipeline), batches up to 16; `ipa` solves P3.10 exactly by its dynamic programme over the stages
  (engine/pipelines/ipa.py); at 10 x 10 the full run also times `ipa-milp`, the same optimum found with
  HiGHS along the cost-accuracy frontier (one thread; the method before); brute force enumerates every
  (variant, batch) per stage.
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, parallel_map, pyplot_load  # noqa: E402

from engine.pipelines.baselines import ds2_solve, inferline_solve  # noqa: E402
from engine.pipelines.brute import SHAPES, p13_brute_force, profiled_pipeline_random  # noqa: E402
from engine.pipelines.exact import pipeline_milp_solve  # noqa: E402
from engine.pipelines.fa2 import fa2_solve  # noqa: E402
from engine.pipelines.ipa import (  # noqa: E402
    IpaPipeline,
    ipa_brute_force,
    ipa_fixed_variant_solve,
    ipa_milp_solve,
    ipa_plan_validate,
    ipa_solve,
)
from engine.pipelines.validate import pipeline_plan_validate  # noqa: E402
from engine.plans.problem import SolveOptions  # noqa: E402
from engine.reference.pipelines import fa2_table_p13_problem, ipa_random_pipeline  # noqa: E402
from engine.simulation.pipeline import PipelineSimulationConfig, pipeline_simulate  # noqa: E402

SOLVERS = ("fa2", "milp", "inferline", "ds2")
FIELDS = ("device", "rate_rps", "seed", "solver", "status", "instances", "objective", "runtime_ms", "valid", "violations",
          "equal_instances", "same_decisions", "extra_vs_fa2")
SIM_FIELDS = ("device", "trace", "rate_rps", "headroom", "solver", "instances", "violation_ratio", "worst_path", "worst_path_violation_ratio",
              "dropped", "late", "arrivals", "path_violation_ratios")
# The varying trace: every path's rate swings +-35 % around its mean over 2-minute waves (a diurnal pattern
# compressed), so a plan sized for 1.25x the mean is short at the crests.
VARYING_AMPLITUDE, VARYING_PERIOD_S = 0.35, 120.0


def varying_scale(t: float) -> float:
    return 1.0 + VARYING_AMPLITUDE * math.sin(2 * math.pi * t / VARYING_PERIOD_S)
IPA_FIELDS = ("part", "stages", "variants", "seed", "solver", "alpha", "beta", "status", "pas", "cores", "objective", "runtime_s", "valid",
              "steps", "equal_to_brute_force")  # steps: ipa's largest set of partial plans, ipa-milp's frontier steps
EXACT_FIELDS = ("shape", "seed", "headroom", "solver", "status", "instances", "optimum", "excess", "objective", "optimum_objective", "valid",
                "runtime_ms")
PAPER = {"inferline_mean": 0.19, "inferline_max": 0.48, "ds2_mean": 0.26, "ds2_max": 0.62, "fa2_match": 0.968}


def instance_run(task: tuple[str, float, int, float]) -> list[dict[str, Any]]:
    """Every solver on one instance; one row each."""
    device, rate, seed, slot_ms = task
    problem = fa2_table_p13_problem(rate, device=device, seed=None if seed == 0 else seed)
    options = SolveOptions(time_limit_s=60.0, threads=1)
    plans = {
        "fa2": fa2_solve(problem, slot_ms=slot_ms),
        "milp": pipeline_milp_solve(problem, time_limit_s=60.0, options=options),
        "inferline": inferline_solve(problem),
        "ds2": ds2_solve(problem),
    }
    optimum, fa2 = plans["milp"], plans["fa2"]
    rows = []
    for name in SOLVERS:
        plan = plans[name]
        violations = pipeline_plan_validate(problem, plan) if plan.decisions else [plan.status]
        rows.append({
            "device": device, "rate_rps": rate, "seed": seed, "solver": name, "status": plan.status,
            "instances": plan.instances if plan.decisions else None, "objective": plan.objective,
            "runtime_ms": plan.runtime_s * 1000.0, "valid": not violations, "violations": "; ".join(violations)[:300],
            "equal_instances": bool(plan.decisions and optimum.decisions and plan.instances == optimum.instances),
            "same_decisions": bool(plan.decisions and dict(plan.decisions) == dict(optimum.decisions)),
            "extra_vs_fa2": (plan.instances / fa2.instances - 1.0) if plan.decisions and fa2.decisions else None,
        })
    return rows


def summarise(rows: list[dict[str, Any]], device: str) -> dict[str, Any]:
    mine = [r for r in rows if r["device"] == device]
    by = {name: [r for r in mine if r["solver"] == name] for name in SOLVERS}
    out: dict[str, Any] = {"device": device, "instances": len(by["fa2"])}
    out["invalid"] = {name: sum(1 for r in rs if not r["valid"]) for name, rs in by.items()}
    out["fa2_match"] = sum(r["equal_instances"] for r in by["fa2"]) / len(by["fa2"])
    out["fa2_same"] = sum(r["same_decisions"] for r in by["fa2"]) / len(by["fa2"])
    for name in ("inferline", "ds2", "milp"):
        extra = [r["extra_vs_fa2"] for r in by[name] if r["extra_vs_fa2"] is not None]
        out[f"{name}_mean"] = statistics.fmean(extra) if extra else None
        out[f"{name}_max"] = max(extra) if extra else None
    for name in ("fa2", "milp"):
        times = [r["runtime_ms"] for r in by[name]]
        out[f"{name}_ms_mean"], out[f"{name}_ms_max"] = statistics.fmean(times), max(times)
    return out


def table_print(summary: dict[str, Any]) -> None:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.1f} %"

    print(f"\n{summary['device'].upper()}: {summary['instances']} instances; invalid plans per solver: {summary['invalid']}")
    print(f"{'figure':<52} {'measured':>12} {'paper':>10}  verdict")
    rows = [
        ("FA2 needs as many instances as the optimum", f"{100 * summary['fa2_match']:.1f} %", f"{100 * PAPER['fa2_match']:.1f} %",
         "met" if summary["fa2_match"] >= PAPER["fa2_match"] else "below"),
        ("FA2's every decision equal to the optimum's", f"{100 * summary['fa2_same']:.1f} %", "", ""),
        ("InferLine's instances vs FA2, mean", pct(summary["inferline_mean"]), "+19 %", ""),
        ("InferLine's instances vs FA2, max", pct(summary["inferline_max"]), "+48 %", ""),
        ("DS2's instances vs FA2, mean", pct(summary["ds2_mean"]), "+26 %", ""),
        ("DS2's instances vs FA2, max", pct(summary["ds2_max"]), "+62 %", ""),
        ("the optimum's instances vs FA2, mean", pct(summary["milp_mean"]), "", ""),
        ("FA2 decision time, mean / max", f"{summary['fa2_ms_mean']:.1f} / {summary['fa2_ms_max']:.1f} ms", "", ""),
        ("MILP (HiGHS, 1 thread) time, mean / max", f"{summary['milp_ms_mean']:.1f} / {summary['milp_ms_max']:.1f} ms", "", ""),
    ]
    for label, measured, paper, verdict in rows:
        print(f"{label:<52} {measured:>12} {paper:>10}  {verdict}")


def simulated_run(task: tuple[str, float, float, str, float, str]) -> dict[str, Any]:
    """One plan (made for rate x headroom) served in the pipeline simulator at the rate itself ("poisson"),
    or at a rate swinging around it ("varying": `varying_scale`)."""
    device, rate, headroom, solver, duration, trace = task
    problem = fa2_table_p13_problem(rate, device=device)
    planned = fa2_table_p13_problem(rate * headroom, device=device)
    plan = {"fa2": fa2_solve, "milp": pipeline_milp_solve, "inferline": inferline_solve, "ds2": ds2_solve}[solver](planned)
    row = {"device": device, "trace": trace, "rate_rps": rate, "headroom": headroom, "solver": solver,
           "instances": plan.instances if plan.decisions else None}
    if not plan.decisions:
        return row
    config = PipelineSimulationConfig(duration_s=duration, seed=7, rate_scale=varying_scale if trace == "varying" else None)
    result = pipeline_simulate(problem, plan, config)
    worst = max(result.paths.values(), key=lambda o: o.violation_ratio)
    row.update(violation_ratio=result.violation_ratio, worst_path=worst.path, worst_path_violation_ratio=worst.violation_ratio,
               dropped=sum(o.dropped for o in result.paths.values()), late=sum(o.late for o in result.paths.values()),
               arrivals=sum(o.arrivals for o in result.paths.values()),
               path_violation_ratios=" ".join(f"{name}:{o.violation_ratio:.4f}" for name, o in sorted(result.paths.items())))
    return row


def simulated_print(rows: list[dict[str, Any]], duration: float) -> None:
    print(f"\nSimulated end to end ({duration:g} s of Poisson arrivals per setting, engine/simulation/pipeline.py; plans made for"
          f" rate x headroom; 'varying': every path's rate swings +-{VARYING_AMPLITUDE:.0%} around it over {VARYING_PERIOD_S:g} s waves;"
          " SLO violations = (late + dropped) / arrivals, worst path in brackets)")
    solvers = ("fa2", "milp", "inferline", "ds2")
    print(f"{'device':<6} {'trace':<8} {'rate':>5} {'headroom':>8}  " + "  ".join(f"{name:>24}" for name in solvers))
    for key in sorted({(r["device"], r["trace"], r["rate_rps"], r["headroom"]) for r in rows}):
        cells = []
        for name in solvers:
            r = next(r for r in rows if (r["device"], r["trace"], r["rate_rps"], r["headroom"], r["solver"]) == (*key, name))
            cells.append("no plan" if r.get("violation_ratio") is None else
                         f"{r['instances']} inst {100 * r['violation_ratio']:5.2f}% ({100 * r['worst_path_violation_ratio']:.1f}%)")
        print(f"{key[0]:<6} {key[1]:<8} {key[2]:>5g} {key[3]:>8g}  " + "  ".join(f"{c:>24}" for c in cells))


def exact_run(task: tuple[str, int, float]) -> list[dict[str, Any]]:
    """fa2's exact mode (`milp`) and FA2's dynamic programme (`fa2`) on one random profiled pipeline, each
    against the brute-force optimum of P1.3 on the profiled latencies."""
    shape, seed, headroom = task
    pipeline = profiled_pipeline_random(seed, shape, headroom=headroom)
    optimum = p13_brute_force(pipeline)
    problem = pipeline.problem()
    rows = []
    for name, plan in (("milp", pipeline_milp_solve(problem, options=SolveOptions(threads=1))), ("fa2", fa2_solve(problem))):
        rows.append({
            "shape": shape, "seed": seed, "headroom": headroom, "solver": name, "status": plan.status,
            "instances": plan.instances if plan.decisions else None, "optimum": optimum.instances if optimum else None,
            "excess": (plan.instances / optimum.instances - 1.0) if plan.decisions and optimum else None,
            "objective": plan.objective, "optimum_objective": optimum.objective if optimum else None,
            "valid": not plan.decisions or not pipeline_plan_validate(problem, plan), "runtime_ms": plan.runtime_s * 1000.0,
        })
    return rows


def exact_print(rows: list[dict[str, Any]]) -> None:
    print("\nAgainst a brute-force optimum of P1.3 on the profiled latencies (random chains, forks, joins, DAGs; "
          "engine/pipelines/brute.py)")
    print(f"{'solver':<24} {'headroom':>8} {'pipelines':>9} {'above optimum':>13} {'mean excess':>11} {'max excess':>10}  statuses")
    for name, label in (("milp", "fa2 exact (P1.3, HiGHS)"), ("fa2", "fa2 DP (paper's model)")):
        for headroom in sorted({r["headroom"] for r in rows}):
            mine = [r for r in rows if r["solver"] == name and r["headroom"] == headroom and r["excess"] is not None]
            above = [r for r in mine if r["excess"] > 1e-12]
            statuses = {}
            for r in rows:
                if r["solver"] == name and r["headroom"] == headroom:
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            print(f"{label:<24} {headroom:>8g} {len(mine):>9} {len(above):>13} {100 * statistics.fmean([r['excess'] for r in mine]):>10.1f}% "
                  f"{100 * max([r['excess'] for r in mine], default=0):>9.1f}%  {statuses}")
    exact = [r for r in rows if r["solver"] == "milp" and r["excess"] is not None]
    print(f"fa2 exact equals the brute-force optimum: {sum(abs(r['objective'] - r['optimum_objective']) < 1e-9 for r in exact)} of {len(exact)}")


def ipa_run(task: tuple[str, int, int, int, float]) -> list[dict[str, Any]]:
    """One IPA measurement: "scale" (solve time at a size), "brute" (equal to enumeration), "sweep" (one
    alpha on a fixed pipeline), "baselines" (FA2-low / FA2-high / IPA)."""
    part, stages, variants, seed, alpha = task
    options = SolveOptions(threads=1)
    pipeline = ipa_random_pipeline(seed, stages, variants, max_batch=6 if part == "brute" else 16)
    if part == "sweep":
        pipeline = IpaPipeline(pipeline.name, pipeline.stages, pipeline.slo_ms, pipeline.rate_rps, alpha=alpha, beta=0.05)
    plans = [ipa_solve(pipeline, time_limit_s=120.0, options=options)]
    if part == "scale-milp":
        plans.append(ipa_milp_solve(pipeline, time_limit_s=120.0, options=options))
    if part == "brute":
        plans.append(ipa_brute_force(pipeline))
    if part == "baselines":
        plans += [ipa_fixed_variant_solve(pipeline, "low"), ipa_fixed_variant_solve(pipeline, "high")]
    rows = []
    for plan in plans:
        valid = not plan.choices or not ipa_plan_validate(pipeline, plan)
        words = plan.notes[0].split() if plan.notes else []
        steps = (int(words[0]) if plan.solver == "ipa-milp" and "steps" in words else
                 int(words[words.index("most") + 1]) if plan.solver == "ipa" and "Pareto-optimal" in words else None)
        rows.append({"part": part, "stages": stages, "variants": variants, "seed": seed, "solver": plan.solver, "alpha": pipeline.alpha,
                     "beta": pipeline.beta, "status": plan.status, "pas": plan.pas, "cores": plan.cores, "objective": plan.objective,
                     "runtime_s": plan.runtime_s, "valid": valid, "steps": steps,
                     "equal_to_brute_force": None if part not in ("brute", "scale-milp") else (plans[0].status == plans[1].status and (
                         plans[0].objective is None or abs(plans[0].objective - plans[1].objective) < 1e-6))})
    return rows


def ipa_print(rows: list[dict[str, Any]]) -> None:
    print("\nIPA")
    print(f"{'stages x variants':<18} {'solver':<9} {'solves':>6} {'optimal':>8} {'time mean s':>12} {'time max s':>11} {'partial plans / steps':>22}  target")
    scale = [r for r in rows if r["part"] in ("scale", "scale-milp")]
    for size in sorted({(r["stages"], r["variants"]) for r in scale}):
        for solver in ("ipa", "ipa-milp"):
            mine = [r for r in scale if (r["stages"], r["variants"]) == size and r["solver"] == solver]
            if not mine:
                continue
            times = [r["runtime_s"] for r in mine]
            target = ""
            if size == (10, 10):
                target = f"paper: under 2 s; {'met' if max(times) < 2 else f'missed ({max(times) / 2:.1f}x)'}"
            print(f"{size[0]:>2} x {size[1]:<13} {solver:<9} {len(mine):>6} {sum(r['status'] == 'optimal' for r in mine):>8} "
                  f"{statistics.fmean(times):>12.2f} {max(times):>11.2f} {statistics.fmean([r['steps'] or 0 for r in mine]):>22.1f}  {target}")
    walked = [r for r in rows if r["part"] == "scale-milp" and r["solver"] == "ipa"]
    if walked:
        print(f"ipa's dynamic programme equals the MILP frontier walk: {sum(bool(r['equal_to_brute_force']) for r in walked)} of {len(walked)} "
              f"10 x 10 pipelines")
    brute = [r for r in rows if r["part"] == "brute" and r["solver"] == "ipa"]
    if brute:
        print(f"equal to brute force: {sum(bool(r['equal_to_brute_force']) for r in brute)} of {len(brute)} small pipelines (1-3 stages, 1-3 variants, batches to 6)")
    sweep = sorted((r for r in rows if r["part"] == "sweep"), key=lambda r: r["alpha"])
    if sweep:
        monotone = all(a["pas"] <= b["pas"] + 1e-12 and a["cores"] <= b["cores"] for a, b in zip(sweep, sweep[1:]))
        print("alpha sweep (beta 0.05, one 4 x 4 pipeline): " + ", ".join(f"alpha {r['alpha']:g}: PAS {r['pas']:.3f} / {r['cores']} cores" for r in sweep)
              + f"; {'monotone along the frontier' if monotone else 'NOT MONOTONE'}")
    base = [r for r in rows if r["part"] == "baselines"]
    if base:
        names = ("fa2-low", "ipa", "fa2-high")
        seeds = sorted({r["seed"] for r in base})
        infeasible = {name: sum(1 for r in base if r["solver"] == name and r["status"] == "infeasible") for name in names}
        common = [seed for seed in seeds if all(r["status"] != "infeasible" for r in base if r["seed"] == seed)]
        line = f"FA2-low / IPA / FA2-high on {len(seeds)} pipelines: no plan on {infeasible['fa2-low']} / {infeasible['ipa']} / {infeasible['fa2-high']}"
        if common:
            line += f"; where all three plan ({len(common)}), mean PAS / cores: " + "; ".join(
                f"{name} {statistics.fmean([r['pas'] for r in base if r['solver'] == name and r['seed'] in common]):.3f} / "
                f"{statistics.fmean([r['cores'] for r in base if r['solver'] == name and r['seed'] in common]):.1f}" for name in names)
        print(line)


def figure(rows: list[dict[str, Any]], devices: list[str], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    fig, axes = plt.subplots(1, len(devices), figsize=(5.5 * len(devices), 3.8), squeeze=False)
    for ax, device in zip(axes[0], devices):
        for name, style in zip(SOLVERS, ("o-", "k--", "s-", "^-")):
            rates = sorted({r["rate_rps"] for r in rows if r["device"] == device})
            means = [statistics.fmean([r["instances"] for r in rows if r["device"] == device and r["solver"] == name
                                       and r["rate_rps"] == rate and r["instances"] is not None] or [float("nan")]) for rate in rates]
            ax.plot(rates, means, style, label=name, markersize=4)
        ax.set_xlabel("requests/s (all paths)")
        ax.set_ylabel("instances (mean over seeds)")
        ax.set_title(f"Table P1.3 application, {device}")
        ax.legend(fontsize=8)
    return figure_write(plt, fig, path, "FA2 against the optimum, InferLine and DS2 (Razavi thesis Fig. P1.12 setting)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rates, 2 seeds, CPU only: a smoke run")
    parser.add_argument("--seeds", type=int, default=10, help="instances per rate (seed 0: the nominal profiles)")
    parser.add_argument("--device", choices=("cpu", "gpu", "both"), default="both")
    parser.add_argument("--slot-ms", type=float, default=1.0, help="FA2's time slot (the thesis: 1 ms)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.slot_ms <= 0 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1 and --slot-ms > 0")
    devices = ["cpu"] if args.quick else (["cpu", "gpu"] if args.device == "both" else [args.device])
    rates = [6.0, 30.0, 60.0] if args.quick else [float(r) for r in range(6, 61, 6)]
    seeds = range(2 if args.quick else args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    print(__doc__.split("Set-up (printed with the results):")[1].strip())
    print(f"\nMachine: {platform.machine()}, Python {platform.python_version()}; {len(devices) * len(rates) * len(seeds)} instances, "
          f"{args.jobs} jobs, FA2 slots {args.slot_ms:g} ms")
    started = time.perf_counter()
    tasks = [(device, rate, seed, args.slot_ms) for device in devices for rate in rates for seed in seeds]
    rows = [row for rs in parallel_map(instance_run, tasks, args.jobs) for row in rs]
    for device in devices:
        table_print(summarise(rows, device))
    duration = 30.0 if args.quick else 300.0
    sim_tasks = [(device, rate, headroom, solver, duration, "poisson") for device in (["gpu"] if args.quick else ["cpu", "gpu"])
                 for rate in ([36.0] if args.quick else [12.0, 36.0, 60.0]) for headroom in (1.0, 1.25) for solver in SOLVERS]
    sim_tasks += [(device, 36.0, headroom, solver, max(duration, VARYING_PERIOD_S / 2), "varying")
                  for device in (["gpu"] if args.quick else ["cpu", "gpu"]) for headroom in ((1.25,) if args.quick else (1.25, 1.5))
                  for solver in SOLVERS]
    sim_rows = parallel_map(simulated_run, sim_tasks, args.jobs)
    simulated_print(sim_rows, duration)
    exact_tasks = [(shape, seed, headroom) for headroom in (1.0, 1.25) for shape in SHAPES for seed in range(3 if args.quick else 25)]
    exact_rows = [row for rs in parallel_map(exact_run, exact_tasks, args.jobs) for row in rs]
    exact_print(exact_rows)
    sizes = [(2, 2), (4, 4), (10, 10)] if args.quick else [(2, 2), (4, 4), (6, 6), (8, 8), (10, 10)]
    ipa_seeds = range(1 if args.quick else 3)
    # The MILP frontier walk (the method before) takes 8-20 s a solve at 10 x 10: the full run only.
    ipa_tasks = [("scale-milp" if (n, m) == (10, 10) and not args.quick else "scale", n, m, seed, 20.0) for n, m in sizes for seed in ipa_seeds]
    ipa_tasks += [("brute", 1 + i % 3, 1 + (i // 3) % 3, 100 + i, 20.0) for i in range(6 if args.quick else 27)]
    ipa_tasks += [("sweep", 4, 4, 3, alpha) for alpha in ((0.0, 2.0, 50.0) if args.quick else (0.0, 0.5, 1, 2, 5, 10, 50, 200))]
    ipa_tasks += [("baselines", 4, 4, 200 + seed, 20.0) for seed in range(1 if args.quick else 5)]
    ipa_rows = [row for rs in parallel_map(ipa_run, ipa_tasks, args.jobs) for row in rs]
    ipa_print(ipa_rows)
    print(f"\nwrote {csv_rows_write(args.out / 'pipelines.csv', rows, FIELDS)}, "
          f"{csv_rows_write(args.out / 'pipelines_simulated.csv', sim_rows, SIM_FIELDS)}, "
          f"{csv_rows_write(args.out / 'pipelines_exact.csv', exact_rows, EXACT_FIELDS)} and "
          f"{csv_rows_write(args.out / 'pipelines_ipa.csv', ipa_rows, IPA_FIELDS)} in {time.perf_counter() - started:.1f} s")
    print(figure(rows, devices, args.out / "pipelines.png"))
    bad = ([r for r in rows if r["solver"] in ("fa2", "milp") and not r["valid"]] + [r for r in ipa_rows if not r["valid"]]
           + [r for r in exact_rows if not r["valid"]])
    if bad:
        print(f"INVALID PLANS: {len(bad)} (see the CSV's violations column)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
