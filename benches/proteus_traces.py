#!/usr/bin/env python
"""Proteus (ASPLOS'24) on its own traces: Tessera beside the figures that Proteus's own simulator records
(engine/reference/data/proteus) on the paper's Twitter-shaped traces, cluster and profiles, read from a
checkout of the authors' artefact (github.com/UMass-LIDS/Proteus; engine/reference/proteus_artifact.py
converts it). A script, not a test (its smoke run is tests/engine/test_proteus_traces_bench.py).

    git clone https://github.com/UMass-LIDS/Proteus /path/to/proteus
    .venv/bin/python benches/proteus_traces.py --proteus /path/to/proteus            # full run, under a minute on 2 cores
    .venv/bin/python benches/proteus_traces.py --proteus /path/to/proteus --quick    # first 60 s of each trace
    options: --scenarios zipf,bursty,mnl --out DIR (default bench-results) --jobs N --seed S --write-inputs

Writes DIR/proteus_traces.csv (one row per scenario and system) and DIR/proteus_traces.png. With
--write-inputs also DIR/proteus/problem.json and DIR/proteus/<scenario>.csv, so any row can be replayed with
`tessera simulate --problem ... --trace ...` and the options the table prints.

Each scenario is replayed by Tessera's simulator (the `tessera simulate` engine), re-planning every 10 s
and on bursts, in these configurations:
- "proteus (a)": Tessera's `proteus` planner and batching under Proteus's own assumptions: models load in
  0 s, the planner plans for 1.05x the observed mean demand of the last 10 s, service times are the
  profiled p50s exactly (no noise), no cost for changing a variant, every device given a variant and a
  family's traffic spread evenly over its instances as the artefact does (`spare_capacity: artefact`,
  engine/solvers/spare.py).
- "(a), the artefact's batching": the same with the batching of the artefact's code rather than the paper's
  (`proteus-artefact`, engine/dataplane/batching.py: its wait timed to the batch the queue already fills, heads
  dropped when an arrival makes that batch too slow, sizes 1, 2, 4, 8) and its drop of queries older than
  twice the SLO (docs/fidelity-proteus.md, issue 41).
- "(a), its batching and routing": the same, each query also sent to one of its family's instances chosen
  uniformly whatever their capacities, as the artefact's executor does (`routing: even`).
- "(a), Tessera's spread": the same with `spare_capacity: fill`: idle devices filled, traffic spread to
  keep the busiest instance furthest below capacity at the MILP's accuracy (Tessera's default).
- "(a), idle devices": the same with `spare_capacity: idle`, the paper's Eq. (1) read literally (at most
  one variant per device, devices without traffic left idle): what Tessera did before.
- "tessera (b)": Tessera's defaults, with a 5 s model load and 5 % log-normal service-time noise: the
  `proteus` planner with spare capacity filled and a variant change costing 1e-4 of effective accuracy,
  Nexus's batching (DEFAULT_BATCHING_POLICY), re-plans sized for 1.2x the busiest second of the last 60 s.
- "(b), quantile batching": the same with `quantile` batching (Proteus's rule, its wait timed against the
  p99 of measured service time).
- "(b), previous defaults": the same fleet with Tessera's defaults before this bench: Proteus's batching,
  the last interval's mean demand, a variant change as a tie-break only (spare capacity filled).
Metrics are Proteus's (plotting/endtoend.py): with D queries that arrived, S answered (late ones included),
L answered after their deadline, SLO violation ratio = (D - S + L) / D, effective accuracy = mean accuracy
of the answered queries (normalised, best variant of a family = 100), throughput = S / trace seconds. The
"@1000ms" column counts as the artefact's code does, L being the answers later than 1000 ms rather than the
SLO (its recorded figures have L = 0; docs/fidelity-proteus.md, section 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, fmt, parallel_map, pyplot_load, ratio  # noqa: E402

from engine.plans.problem import Problem, problem_to_dict  # noqa: E402
from engine.reference.profiles import reference_data_dir  # noqa: E402
from engine.reference.proteus_artifact import (  # noqa: E402
    PROTEUS_SCENARIOS,
    ProteusArtefactError,
    proteus_problem,
    proteus_recorded_figures,
    proteus_trace,
)
from engine.simulation.simulator import LATE, ON_TIME, SimulationConfig, simulate  # noqa: E402
from engine.simulation.workload import Trace, trace_write  # noqa: E402

REPLAN_S = 10.0
# Tessera's defaults before this bench: Proteus's batching, planning for the last interval's mean demand,
# a variant change as a tie-break only.
PREVIOUS_CHANGE_PENALTY = 1e-6
QUICK_SECONDS = 60.0
# Goals of the issue: (a) within 1.3x of Proteus's violations and 0.5 points of its accuracy; (b) at most
# 0.5x its violations at equal or higher accuracy.
GOAL_A_VIOLATIONS, GOAL_A_ACCURACY_POINTS, GOAL_B_VIOLATIONS = 1.3, 0.5, 0.5
# Issue 41: a port with the artefact's own semantics lands within this band of its recorded violations.
GOAL_FAITHFUL = (0.77, 1.3)
# The artefact counts an answer late only past the END_REQUEST event's default deadline, 1000 ms, not the SLO
# (core/simulator.py; docs/fidelity-proteus.md, section 2).
ARTEFACT_LATE_MS = 1000.0
ARTEFACT_BATCHING_ROW = "(a), the artefact's batching"
ARTEFACT_ROUTING_ROW = "(a), its batching and routing"
# Rows whose answers between the SLO and 2x it the artefact would count on time: shown as it counts them.
ARTEFACT_COUNTED_ROWS = (ARTEFACT_BATCHING_ROW, ARTEFACT_ROUTING_ROW)


@dataclasses.dataclass(frozen=True)
class System:
    name: str
    planner: str
    config: SimulationConfig
    spare_capacity: str = "fill"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # problem option overrides
    cli: str = ""  # the `tessera simulate` options that reproduce it


def systems(seed: int) -> list[System]:
    # Proteus's simulator: its ILP plans for 1.05x the observed (EWMA) demand, models load in 0 s, service
    # times are exact, and its ILP has no cost for changing a device's variant.
    artefact = dict(batching="proteus", noise_sigma=0.0, reconfiguration_delay_s=0.0, demand_estimate="mean", demand_headroom=1.05,
                    replan_interval_s=REPLAN_S, seed=seed)
    return [
        System("proteus (a)", "proteus", SimulationConfig(**artefact), spare_capacity="artefact",
               options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli=f"--planner proteus --batching proteus --noise 0 --reconfig-delay 0 --demand-estimate mean --headroom 1.05 "
                   f"--replan-every {REPLAN_S:g} --seed {seed} (and options.variant_change_penalty = {PREVIOUS_CHANGE_PENALTY:g}, "
                   f"options.spare_capacity = \"artefact\")"),
        System(ARTEFACT_BATCHING_ROW, "proteus", SimulationConfig(**{**artefact, "batching": "proteus-artefact", "drop_rule": "slo-2x"}),
               spare_capacity="artefact", options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli="(as the first, with --batching proteus-artefact --drop-rule slo-2x)"),
        System(ARTEFACT_ROUTING_ROW, "proteus",
               SimulationConfig(**{**artefact, "batching": "proteus-artefact", "drop_rule": "slo-2x", "routing": "even"}),
               spare_capacity="artefact", options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli="(as the first, with --batching proteus-artefact --drop-rule slo-2x --routing even)"),
        System("(a), Tessera's spread", "proteus", SimulationConfig(**artefact), spare_capacity="fill",
               options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli="(as above, with options.spare_capacity = \"fill\")"),
        System("(a), idle devices", "proteus", SimulationConfig(**artefact), spare_capacity="idle",
               options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli="(as above, with options.spare_capacity = \"idle\")"),
        System("tessera (b)", "proteus", SimulationConfig(replan_interval_s=REPLAN_S, seed=seed), cli=f"--replan-every {REPLAN_S:g} --seed {seed}"),
        System("(b), quantile batching", "proteus", SimulationConfig(batching="quantile", replan_interval_s=REPLAN_S, seed=seed),
               cli=f"--batching quantile --replan-every {REPLAN_S:g} --seed {seed}"),
        System("(b), previous defaults", "proteus",
               SimulationConfig(batching="proteus", demand_estimate="mean", demand_headroom=1.0, replan_interval_s=REPLAN_S, seed=seed),
               options={"variant_change_penalty": PREVIOUS_CHANGE_PENALTY},
               cli=f"--batching proteus --demand-estimate mean --headroom 1 --replan-every {REPLAN_S:g} --seed {seed} "
                   f"(and options.variant_change_penalty = {PREVIOUS_CHANGE_PENALTY:g})"),
    ]


def trace_head(trace: Trace, seconds: float) -> Trace:
    keep = trace.time_s < seconds
    return Trace(time_s=trace.time_s[keep], application=trace.application[keep], applications=trace.applications,
                 deadline_ms=None if trace.deadline_ms is None else trace.deadline_ms[keep])


# Set in the parent before forking, so the workers share it instead of pickling the traces.
_INPUTS: dict[str, Any] = {}


def run_one(task: tuple[str, int]) -> dict[str, Any]:
    scenario, index = task
    problem: Problem = _INPUTS["problem"]
    system = _INPUTS["systems"][index]
    problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, spare_capacity=system.spare_capacity, **system.options))
    trace: Trace = _INPUTS["traces"][scenario]
    started = time.perf_counter()
    result = simulate(problem, trace, planner=system.planner, config=system.config)
    s = result.summary
    seconds = max(float(trace.time_s[-1]) if trace.time_s.size else 0.0, 1e-9)
    answered = s["on_time"] + s["late"]
    # The artefact's own accounting (docs/fidelity-proteus.md, section 2): an answer is late only past 1000 ms.
    q = result.queries
    served = (q["outcome"] == ON_TIME) | (q["outcome"] == LATE)
    late_1000 = int(((q["done_ms"] - q["arrival_ms"] > ARTEFACT_LATE_MS) & served).sum())
    return {
        "scenario": scenario, "system": system.name, "demand": s["queries"], "served": answered,
        "throughput_rps": answered / seconds,
        "effective_accuracy": 100.0 * s["effective_accuracy"] if s["effective_accuracy"] is not None else None,
        "slo_violation_ratio": (s["queries"] - answered + s["late"]) / s["queries"] if s["queries"] else None,
        "violation_ratio_late_1000ms": (s["queries"] - answered + late_1000) / s["queries"] if s["queries"] else None,
        "late": s["late"], "dropped_expired": s["dropped_expired"], "dropped_no_capacity": s["dropped_no_capacity"],
        "dropped_unfinished": s["dropped_unfinished"], "instances_created": s["instances_created"],
        "replans": s["replans"], "replans_burst": s["replans_burst"], "planner_wall_s": s["planner_wall_s"],
        "wall_s": time.perf_counter() - started,
        "devices_used_mean": sum(len({i.device for i in plan.instances}) for _, plan in result.plans) / max(1, len(result.plans)),
    }


FIELDS = (
    "scenario", "system", "demand", "served", "throughput_rps", "effective_accuracy", "slo_violation_ratio", "violation_ratio_late_1000ms",
    "violations_vs_proteus",
    "accuracy_vs_proteus_points", "late", "dropped_expired", "dropped_no_capacity", "dropped_unfinished", "instances_created",
    "devices_used_mean", "replans", "replans_burst", "planner_wall_s", "wall_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proteus", default=os.environ.get("PROTEUS_CHECKOUT"), help="checkout of github.com/UMass-LIDS/Proteus (or $PROTEUS_CHECKOUT)")
    parser.add_argument("--scenarios", default=",".join(PROTEUS_SCENARIOS), help="comma-separated: " + ", ".join(PROTEUS_SCENARIOS))
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_SECONDS:g} s of each trace")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write-inputs", action="store_true", help="also write the converted problem and traces for `tessera simulate`")
    args = parser.parse_args(argv)
    if not args.proteus:
        parser.error("--proteus PATH is required (a checkout of github.com/UMass-LIDS/Proteus; `git clone` it first)")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in PROTEUS_SCENARIOS]
    if unknown or not scenarios:
        parser.error(f"--scenarios: choose from {', '.join(PROTEUS_SCENARIOS)}, got {args.scenarios!r}")
    checkout = Path(args.proteus)
    try:
        problem = proteus_problem(checkout)
        names = tuple(a.name for a in problem.applications)
        traces = {s: proteus_trace(checkout, s, applications=names) for s in scenarios}
    except ProteusArtefactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        traces = {s: trace_head(t, QUICK_SECONDS) for s, t in traces.items()}
    recorded = {(r.scenario, r.system): r for r in proteus_recorded_figures(reference_data_dir() / "proteus" / "recorded_figures.csv")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.write_inputs:
        folder = out / "proteus"
        folder.mkdir(exist_ok=True)
        (folder / "problem.json").write_text(json.dumps(problem_to_dict(problem), indent=1) + "\n")
        for s, t in traces.items():
            trace_write(t, folder / f"{s}.csv")
        print(f"wrote {folder}/problem.json and one trace CSV per scenario")

    _INPUTS.update(problem=problem, traces=traces, systems=systems(args.seed))
    print(f"Proteus artefact: {checkout} ({len(problem.devices)} devices, {len(problem.variants)} variants, {len(problem.applications)} applications)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; jobs {args.jobs}"
          + (f"; --quick: first {QUICK_SECONDS:g} s of each trace (Proteus's figures are for the whole trace)" if args.quick else ""))
    started = time.perf_counter()
    tasks = [(s, i) for s in scenarios for i in range(len(_INPUTS["systems"]))]
    rows = parallel_map(run_one, tasks, args.jobs)
    for row in rows:
        ref = recorded.get((row["scenario"], "proteus"))
        if ref is not None:
            row["violations_vs_proteus"] = ratio(row["slo_violation_ratio"], ref.slo_violation_ratio)
            row["accuracy_vs_proteus_points"] = row["effective_accuracy"] - ref.effective_accuracy if row["effective_accuracy"] is not None else None
    table = []
    for s in scenarios:
        for (scenario, system), ref in recorded.items():
            if scenario == s:
                table.append({"scenario": s, "system": f"{system} (recorded)", "demand": ref.demand, "served": ref.served,
                              "throughput_rps": ref.throughput_rps, "effective_accuracy": ref.effective_accuracy,
                              "slo_violation_ratio": ref.slo_violation_ratio, "violations_vs_proteus": ratio(ref.slo_violation_ratio, recorded[(s, "proteus")].slo_violation_ratio)})
        table.extend(r for r in rows if r["scenario"] == s)

    print()
    print(f"{'scenario':<8} {'system':<30} {'demand':>7} {'served':>7} {'thr r/s':>8} {'eff.acc':>7} {'SLO viol':>8} {'@1000ms':>8} {'x Proteus':>9} "
          f"{'late':>6} {'expired':>7} {'no cap':>6} {'inst':>5} {'dev':>5}")
    for r in table:
        print(f"{r['scenario']:<8} {r['system']:<30} {r['demand']:>7} {r['served']:>7} {fmt(r['throughput_rps'], '8.1f')} "
              f"{fmt(r['effective_accuracy'], '7.2f')} {fmt(r['slo_violation_ratio'], '8.4f')} {fmt(r.get('violation_ratio_late_1000ms'), '8.4f')} "
              f"{fmt(r.get('violations_vs_proteus'), '9.2f')} "
              f"{fmt(r.get('late'), '6d')} {fmt(r.get('dropped_expired'), '7d')} {fmt(r.get('dropped_no_capacity'), '6d')} "
              f"{fmt(r.get('instances_created'), '5d')} {fmt(r.get('devices_used_mean'), '5.1f')}")
    print()
    print("Goals (Proteus's recorded figures as the peer):")
    for s in scenarios:
        ref = recorded[(s, "proteus")]
        verdicts = []
        for label, system, goal in (("(a)", "proteus (a)", "a"), ("(b)", "tessera (b)", "b"), ("(b) before", "(b), previous defaults", "b")):
            r = next(r for r in rows if r["scenario"] == s and r["system"] == system)
            points = r["accuracy_vs_proteus_points"]
            if goal == "a":
                met = r["violations_vs_proteus"] <= GOAL_A_VIOLATIONS and abs(points) <= GOAL_A_ACCURACY_POINTS
            else:
                met = r["violations_vs_proteus"] <= GOAL_B_VIOLATIONS and points >= 0
            verdicts.append(f"{label} {r['violations_vs_proteus']:.2f}x, {points:+.2f} pts: {'met' if met else 'MISSED'}")
        # Issue 41's goal for a faithful port: the artefact's semantics (its batching, routing and counting)
        # within 0.77-1.3x of its recorded violations and 0.5 points of its accuracy.
        r = next(r for r in rows if r["scenario"] == s and r["system"] == ARTEFACT_ROUTING_ROW)
        x = ratio(r["violation_ratio_late_1000ms"], ref.slo_violation_ratio)
        points = r["accuracy_vs_proteus_points"]
        met = x is not None and GOAL_FAITHFUL[0] <= x <= GOAL_FAITHFUL[1] and abs(points) <= GOAL_A_ACCURACY_POINTS
        verdicts.append(f"(a) faithful {fmt(x, '.2f')}x, {points:+.2f} pts: {'met' if met else 'MISSED'}")
        print(f"  {s:<7} " + ";  ".join(verdicts))
    print(f"  (goal (a): <= {GOAL_A_VIOLATIONS}x Proteus's violations, accuracy within {GOAL_A_ACCURACY_POINTS} points; "
          f"goal (b): <= {GOAL_B_VIOLATIONS}x, accuracy >= Proteus's; (a) faithful: the row '{ARTEFACT_ROUTING_ROW}' counted as the "
          f"artefact counts, {GOAL_FAITHFUL[0]}-{GOAL_FAITHFUL[1]}x, accuracy within {GOAL_A_ACCURACY_POINTS} points)")
    print()
    print("Reproduce a row: write the inputs with --write-inputs, then")
    for system in _INPUTS["systems"]:
        print(f"  {system.name:<30} tessera simulate --problem {out}/proteus/problem.json --trace {out}/proteus/<scenario>.csv {system.cli}")
    print(f"\n{len(rows)} simulations in {time.perf_counter() - started:.1f} s")

    csv_path = csv_rows_write(out / "proteus_traces.csv", table, FIELDS)
    print(f"wrote {csv_path}")
    plt = pyplot_load()
    if plt is None:
        print(PNG_SKIPPED.format(name="proteus_traces.png"))
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = ["proteus (recorded)"] + [s.name for s in _INPUTS["systems"]]
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        values_v, values_a = [], []
        for s in scenarios:
            r = next((r for r in table if r["scenario"] == s and r["system"] == label), None)
            # The artefact's batching serves many queries between the SLO and 2x it, which the artefact counts
            # on time: its bar is its violations counted as the artefact counts (late past 1000 ms).
            field = "violation_ratio_late_1000ms" if label in ARTEFACT_COUNTED_ROWS else "slo_violation_ratio"
            values_v.append(r[field] if r else 0.0)
            values_a.append(r["effective_accuracy"] if r else 0.0)
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(scenarios))]
        axes[0].bar(xs, values_v, width, label=f"{label} (late past 1000 ms)" if label in ARTEFACT_COUNTED_ROWS else label)
        axes[1].bar(xs, values_a, width, label=label)
    for ax, title in ((axes[0], "SLO violation ratio"), (axes[1], "effective accuracy (best = 100)")):
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title(title, fontsize=9)
    axes[1].set_ylim(97.5, 100.2)
    axes[0].legend(fontsize=7)
    print(figure_write(plt, fig, out / "proteus_traces.png",
                       "Proteus's traces: Tessera (simulated) beside Proteus's own simulator" + (" (--quick: first 60 s)" if args.quick else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
