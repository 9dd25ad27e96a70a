#!/usr/bin/env python
"""Tessera's simulator beside Proteus's own (the authors' artefact, github.com/UMass-LIDS/Proteus) on
identical inputs: the same traces, profiles, 40-device cluster and the SAME ALLOCATION HELD FIXED (issue 41,
item 1; docs/fidelity-proteus.md, "Side by side, run"). A script, not a test (its smoke run is
tests/engine/test_proteus_side_by_side.py).

    git clone https://github.com/UMass-LIDS/Proteus /tmp/proteus
    python3.11 -m venv /tmp/pvenv && /tmp/pvenv/bin/pip install numpy==1.23.5 pandas==2.1.1 gym==0.26.2 scipy==1.11.3 requests
    .venv/bin/python benches/proteus_side_by_side.py --proteus /tmp/proteus --artefact-python /tmp/pvenv/bin/python [--quick]
    options: --scenarios zipf,bursty,mnl --allocations starting,tessera[,schedule] --out DIR --seed S

The artefact runs in its own Python through benches/proteus_artefact_driver.py (a subprocess: it imports
the artefact's modules only). Allocations, each held fixed for the whole trace:
- "starting": the artefact's own algorithms/proteus_starting_solutions/starting_solution.txt (what its runs
  use for their first 5 s);
- "tessera": Tessera's `proteus` planner's plan for the trace's mean demand per family x 1.05 (Proteus's
  beta), every device given a variant and the traffic split evenly (`spare_capacity: artefact`), converted to
  the artefact's format (device cpu-0k <-> CPU-k, vpu-0k <-> VPU-k, ampere-0k <-> GPU_AMPERE-k, pascal-0k <->
  GPU_PASCAL-k; every device given a canary share > 0 so the artefact upgrades none);
- "schedule" (the same planner cadence): Tessera's `proteus` planner re-planning every 10 s on the last 10 s's
  mean demand x 1.05 in the faithful settings (burst trigger off); its plans, applied at the same seconds, are
  replayed into the artefact as a schedule.
Whatever the artefact makes of an allocation (it upgrades devices without a canary share, counts predictors
per (variant, type)) is read back from the driver (--dump-allocation) and Tessera runs exactly that.

Tessera runs each allocation in two settings: "faithful" (the artefact's batching `proteus-artefact`, its
drop of queries older than 2x the SLO `slo-2x`, its even routing `even`, no noise, no model-load time) and
"defaults" (Tessera's own: Nexus batching, deadline drop rule, routing by capacity, 5 % service-time noise).
Neither re-plans (the "schedule" allocation aside).

Counted per query by ARRIVAL second in both: demand, served (late included), late (after the 300 ms SLO),
late_1000 (after 1000 ms: the artefact's own count), dropped (every query not served, the artefact's
unresolved ones included), accuracy (mean over served, best = 100). Violations "artefact-style" = (D - S +
late_1000)/D (what its recorded figures are), "SLO" = (D - S + late)/D. Per-second agreement: Pearson
correlation and mean absolute difference of served and dropped per second, and the seconds where they
differ most. Writes DIR/proteus_side_by_side.csv (totals), DIR/proteus_side_by_side_per_second.csv and
DIR/proteus_side_by_side.png.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, fmt, pyplot_load, ratio  # noqa: E402
from proteus_traces import trace_head  # noqa: E402

from engine.plans.capacity import capacity_for, cpu_slice  # noqa: E402
from engine.plans.problem import FULL_SLICE, Plan, Problem  # noqa: E402
from engine.reference.proteus_artifact import (  # noqa: E402
    PROTEUS_SCENARIOS,
    ProteusArtefactError,
    proteus_families,
    proteus_problem,
    proteus_trace,
    proteus_variant_name,
)
from engine.simulation.simulator import (  # noqa: E402
    DROPPED_EXPIRED,
    DROPPED_NO_CAPACITY,
    DROPPED_UNFINISHED,
    LATE,
    ON_TIME,
    SimulationConfig,
    simulate,
)
from engine.simulation.workload import Trace  # noqa: E402
from engine.solvers.assemble import Assignment, plan_assemble  # noqa: E402

QUICK_SECONDS = 30.0
SLO_LATE_MS = 300.0
ARTEFACT_LATE_MS = 1000.0
BETA = 1.05  # Proteus's configs: plan for 1.05x the demand
REPLAN_S = 10.0
ARTEFACT_SEED = 10  # its configs' seed; further seeds count up from it
DRIVER = REPO / "benches" / "proteus_artefact_driver.py"
STARTING_SOLUTION = "algorithms/proteus_starting_solutions/starting_solution.txt"
# Tessera device name prefix <-> the artefact's accelerator type.
DEVICE_KINDS = {"cpu": "CPU", "ampere": "GPU_AMPERE", "vpu": "VPU", "pascal": "GPU_PASCAL"}
KIND_OF_TYPE = {t: k for k, t in DEVICE_KINDS.items()}
PER_SECOND_FIELDS = ("demand", "served", "late", "late_1000", "dropped", "accuracy_sum", "served_at", "dropped_at")


def faithful_config(seed: int, **over: Any) -> SimulationConfig:
    base = dict(batching="proteus-artefact", drop_rule="slo-2x", routing="even", noise_sigma=0.0, reconfiguration_delay_s=0.0,
                demand_estimate="mean", demand_headroom=BETA, replan_interval_s=None, burst_factor=None, seed=seed, record_batches=True)
    base.update(over)
    return SimulationConfig(**base)


def defaults_config(seed: int) -> SimulationConfig:
    return SimulationConfig(replan_interval_s=None, burst_factor=None, seed=seed, record_batches=True)


# --------------------------------------------------------------------------- allocations, both ways


def artefact_device(device: str) -> str:
    kind, number = device.rsplit("-", 1)
    return f"{DEVICE_KINDS[kind]}-{int(number)}"


def plan_to_artefact(problem: Problem, plan: Plan, artefact_names: dict[str, str], families: list[str]) -> tuple[dict, dict, dict]:
    """(required_predictors, canary_dict, ilp_x) in the artefact's format for a Tessera plan. Every device gets a
    canary share > 0 (its routing weight, or a token 1e-6) so that the artefact upgrades none of them
    (A: core/simulator.py:795-815); the artefact's even routing ignores the shares beyond that."""
    ilp_x: dict = {}
    canary: dict = {}
    weights = {e.instance: e.weight for entries in plan.routing.values() for e in entries}
    for inst in plan.instances:
        family = problem.variant(inst.variant).application
        device = artefact_device(inst.device)
        ilp_x[(artefact_names[inst.variant], device)] = 1
        canary[(device, families.index(family))] = max(float(weights.get(inst.id, 0.0)), 1e-6)
    required: dict = defaultdict(int)
    for (variant, device) in ilp_x:
        required[(variant, device.rsplit("-", 1)[0])] += 1
    return dict(required), canary, ilp_x


def _write_if_changed(path: Path, text: str) -> Path:
    """Write `text` unless the file already holds it (so that --reuse can tell an unchanged allocation by its age)."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def allocation_write(path: Path, required: dict, canary: dict, ilp_x: dict) -> Path:
    return _write_if_changed(path, f"required_predictors:\n{required!r}\ncanary_dict:\n{canary!r}\nilp_x:\n{ilp_x!r}\n")


def schedule_write(path: Path, entries: list[tuple[float, dict, dict, dict]]) -> Path:
    return _write_if_changed(path, "schedule:\n" + repr([(float(t), r, c, x) for t, r, c, x in entries]) + "\n")


def plan_from_effective(problem: Problem, predictors: list[dict], previous: dict[str, str] | None = None) -> tuple[Plan, list[dict], dict[str, str]]:
    """The Tessera plan running what the artefact holds. The artefact counts predictors per (variant, type)
    with no device identity (A: core/simulator.py:869-989): a new allocation keeps min(existing, required)
    predictors of each (variant, type) as they are and adds or removes the rest. So devices are numbered in
    order within each type, except that a predictor kept from `previous` (device -> variant) stays on its
    device, as the artefact keeps it. Predictors the artefact holds but that cannot serve (no batch size under
    SLO/2 on that type: max_batch 0, A: core/predictor.py:80-83) are left out and returned: their share of the
    family's queries vanishes in the artefact and has no instance in Tessera. Returns (plan, unservable,
    device -> variant)."""
    previous = previous or {}
    wanted: list[tuple[str, dict]] = []  # (kind, predictor) per predictor
    for p in predictors:
        wanted.extend((KIND_OF_TYPE[p["type"]], p) for _ in range(int(p["count"])))
    placement: dict[str, str] = {}
    unplaced = []
    for kind, p in wanted:  # keep a predictor where it was
        variant = proteus_variant_name(p["variant"])
        kept = next((d for d, v in sorted(previous.items()) if v == variant and d.startswith(kind + "-") and d not in placement), None)
        if kept is None:
            unplaced.append((kind, p))
        else:
            placement[kept] = variant
    for kind, p in unplaced:  # the others on the free devices of their type, in order
        device = next(d.name for d in problem.devices if d.name.startswith(kind + "-") and d.name not in placement)
        placement[device] = proteus_variant_name(p["variant"])
    max_batch = {(proteus_variant_name(p["variant"]), KIND_OF_TYPE[p["type"]]): p.get("max_batch", 1) for p in predictors}
    assignments = []
    unservable = []
    for name, variant in sorted(placement.items()):
        device = problem.device(name)
        slice_name = cpu_slice(problem, variant, device) if device.is_cpu else FULL_SLICE
        capacity = capacity_for(problem, variant, device, slice_name) if slice_name else None
        if capacity is None or max_batch[(variant, name.split("-")[0])] == 0:
            unservable.append({"device": name, "variant": variant})
            continue
        # Routing weights by capacity (Tessera's own routing uses them; `even` ignores them).
        assignments.append(Assignment(device=name, slice=slice_name, start=None, variant=variant, assigned_rps=capacity.capacity_rps))
    plan = plan_assemble(problem, assignments, status="feasible", solver="fixed-allocation", objective=None, bound=None, gap=None, solve_seconds=0.0)
    return plan, unservable, placement


def plan_for_mean_demand(problem: Problem, trace: Trace) -> Plan:
    from engine.solvers.solve import plan_solve

    seconds = max(float(trace.time_s[-1]), 1e-9) if trace.time_s.size else 1.0
    counts = np.bincount(trace.application, minlength=len(trace.applications))
    demand = {name: BETA * counts[i] / seconds for i, name in enumerate(trace.applications)}
    apps = tuple(dataclasses.replace(a, demand_rps=float(demand.get(a.name, 0.0))) for a in problem.applications)
    sized = dataclasses.replace(problem, applications=apps, options=dataclasses.replace(problem.options, spare_capacity="artefact"))
    return plan_solve(sized, "proteus")


# --------------------------------------------------------------------------- the artefact (subprocess)


def driver_run(python: str, checkout: Path, scenario: str, allocation: Path, out: Path, seconds: float | None,
               dump: bool = False, seed: int = 10, reuse: bool = False) -> dict[str, Any]:
    summary_path = out / "summary.json"
    if reuse and not dump and summary_path.is_file() and summary_path.stat().st_mtime > Path(allocation).stat().st_mtime:
        summary = json.loads(summary_path.read_text())
        if summary.get("seed") == seed and summary.get("seconds") == seconds and summary.get("allocation") == str(Path(allocation).resolve()):
            return summary  # the same run, done before
    cmd = [python, str(DRIVER), "--checkout", str(checkout), "--scenario", scenario, "--allocation", str(allocation), "--out", str(out),
           "--seed", str(seed)]
    if seconds is not None:
        cmd += ["--seconds", f"{seconds:g}"]
    if dump:
        cmd.append("--dump-allocation")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the artefact driver failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
    if dump:
        text = done.stdout
        return json.loads(text[text.index("{\n"):])
    return json.loads((out / "summary.json").read_text())


def artefact_per_second(folder: Path) -> dict[str, np.ndarray]:
    with (folder / "per_second.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    out = {k: np.array([float(r[k]) for r in rows]) for k in PER_SECOND_FIELDS}
    # The artefact's never-resolved queries (held by a predictor that cannot serve) count as dropped here.
    out["dropped"] = out["dropped"] + np.array([float(r["unresolved"]) for r in rows])
    return out


def drop_causes(ages_ms: np.ndarray, unserved_other: int) -> dict[str, int]:
    """Drops by cause, told apart by the query's age when dropped (the same in both simulators): at most the
    SLO, a head dropped because the batch the queue fills would make it late (the artefact's
    pop_while_first_expires, A: core/predictor.py:463-508, and `proteus-artefact`'s early drop; Tessera's
    deadline rule and Nexus's early drop also land here); over twice the SLO, the 2x-SLO drop at a batch
    launch (A: core/predictor.py:660-675, the `slo-2x` rule); `no_instance`: queries no predictor can ever
    serve (the artefact's unresolved ones, Tessera's no-capacity and unfinished ones)."""
    return {"drop_early": int((ages_ms <= SLO_LATE_MS + 1e-6).sum()), "drop_2x": int((ages_ms > 2 * SLO_LATE_MS).sum()),
            "drop_between": int(((ages_ms > SLO_LATE_MS + 1e-6) & (ages_ms <= 2 * SLO_LATE_MS)).sum()), "drop_no_instance": unserved_other}


def artefact_drop_causes(folder: Path) -> dict[str, int]:
    ages, unresolved = [], 0
    with (folder / "queries.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["outcome"] == "dropped":
                ages.append(float(r["done_ms"]) - float(r["arrival_ms"]))
            elif r["outcome"] == "unresolved":
                unresolved += 1
    return drop_causes(np.array(ages), unresolved)


def artefact_batches(summary: dict[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in summary["batch_size_counters"].items()}


# --------------------------------------------------------------------------- Tessera


def tessera_run(problem: Problem, trace: Trace, planner: Any, config: SimulationConfig) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    result = simulate(problem, trace, planner=planner, config=config)
    q = result.queries
    accuracy_of_instance = {}
    for inst in result.instances:
        accuracy_of_instance[inst["index"]] = 100.0 * problem.variant(inst["variant"]).accuracy
    served = (q["outcome"] == ON_TIME) | (q["outcome"] == LATE)
    latency = q["done_ms"] - q["arrival_ms"]
    accuracy = np.array([accuracy_of_instance.get(int(k), 0.0) if s else 0.0 for k, s in zip(q["instance"], served)])
    arr_s = (q["arrival_ms"] // 1000).astype(np.int64)
    done_s = np.where(np.isfinite(q["done_ms"]), q["done_ms"] // 1000, arr_s).astype(np.int64)
    n = int(max(arr_s.max(initial=0), done_s.max(initial=0))) + 1
    per = {
        "demand": np.bincount(arr_s, minlength=n).astype(float),
        "served": np.bincount(arr_s[served], minlength=n).astype(float),
        "late": np.bincount(arr_s[served & (latency > SLO_LATE_MS + 1e-6)], minlength=n).astype(float),
        "late_1000": np.bincount(arr_s[served & (latency > ARTEFACT_LATE_MS)], minlength=n).astype(float),
        "dropped": np.bincount(arr_s[~served], minlength=n).astype(float),
        "accuracy_sum": np.bincount(arr_s, weights=accuracy, minlength=n),
        "served_at": np.bincount(done_s[served], minlength=n).astype(float),
        "dropped_at": np.bincount(done_s[~served], minlength=n).astype(float),
    }
    sizes = Counter(len(b[2]) for b in result.batches)
    expired = q["outcome"] == DROPPED_EXPIRED
    causes = drop_causes(latency[expired], int(((q["outcome"] == DROPPED_NO_CAPACITY) | (q["outcome"] == DROPPED_UNFINISHED)).sum()))
    return {"batches": dict(sorted(sizes.items())), "summary": result.summary, "causes": causes}, per, result


# --------------------------------------------------------------------------- comparison


def totals(per: dict[str, np.ndarray]) -> dict[str, Any]:
    d, s = per["demand"].sum(), per["served"].sum()
    return {
        "demand": int(d), "served": int(s), "dropped": int(per["dropped"].sum()), "late": int(per["late"].sum()),
        "late_1000": int(per["late_1000"].sum()),
        "accuracy": per["accuracy_sum"].sum() / s if s else None,
        "violations_artefact": (d - s + per["late_1000"].sum()) / d if d else None,
        "violations_slo": (d - s + per["late"].sum()) / d if d else None,
    }


def mean_totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of every figure (counts rounded)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        mean = sum(values) / len(values) if values else None
        out[key] = int(round(mean)) if isinstance(runs[0][key], int) and mean is not None else mean
    return out


def aligned(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = max(len(a), len(b))
    return np.pad(a, (0, n - len(a))), np.pad(b, (0, n - len(b)))


def agreement(art: dict[str, np.ndarray], tes: dict[str, np.ndarray], field: str) -> dict[str, Any]:
    a, b = aligned(art[field], tes[field])
    corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else None
    diff = b - a
    worst = np.argsort(-np.abs(diff))[:3]
    return {"corr": corr, "mad": float(np.abs(diff).mean()), "worst": [(int(s), int(a[s]), int(b[s])) for s in worst if diff[s] != 0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proteus", default=os.environ.get("PROTEUS_CHECKOUT"), help="checkout of github.com/UMass-LIDS/Proteus (or $PROTEUS_CHECKOUT)")
    parser.add_argument("--artefact-python", default=os.environ.get("PROTEUS_PYTHON"),
                        help="the Python of the artefact's own environment (or $PROTEUS_PYTHON)")
    parser.add_argument("--scenarios", default=",".join(PROTEUS_SCENARIOS))
    parser.add_argument("--allocations", default="starting,tessera", help="comma-separated: starting, tessera, schedule")
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_SECONDS:g} s of each trace")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--reuse", action="store_true",
                        help="keep an artefact run already in DIR for the same allocation, seed and length (the artefact is the slow side)")
    parser.add_argument("--seed", type=int, default=1, help="Tessera's first seed (the artefact's is its configs' 10)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="run each simulator with this many seeds (the artefact 10, 11, ...; Tessera S, S+1, ...) and report "
                             "means; with 2 or more, the artefact's second seed against its first is the per-second noise floor")
    args = parser.parse_args(argv)
    if not args.proteus or not args.artefact_python:
        parser.error("--proteus PATH and --artefact-python PYTHON are required (or $PROTEUS_CHECKOUT and $PROTEUS_PYTHON)")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    kinds = [s.strip() for s in args.allocations.split(",") if s.strip()]
    if any(s not in PROTEUS_SCENARIOS for s in scenarios) or any(k not in ("starting", "tessera", "schedule") for k in kinds):
        parser.error("unknown scenario or allocation")
    checkout = Path(args.proteus).resolve()
    seconds = QUICK_SECONDS if args.quick else None
    out = Path(args.out).resolve()
    work = out / "proteus_side_by_side"
    work.mkdir(parents=True, exist_ok=True)
    try:
        problem = proteus_problem(checkout)
        families = list(proteus_families(checkout))
        names = tuple(a.name for a in problem.applications)
        traces = {s: proteus_trace(checkout, s, applications=names) for s in scenarios}
        if seconds is not None:
            traces = {s: trace_head(t, seconds) for s, t in traces.items()}
    except ProteusArtefactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    artefact_names = {proteus_variant_name(v): v for members in proteus_families(checkout).values() for v in members}

    rows: list[dict[str, Any]] = []
    per_second_rows: list[dict[str, Any]] = []
    series: dict[tuple[str, str, str], dict[str, np.ndarray]] = {}
    started = time.perf_counter()
    for scenario in scenarios:
        trace = traces[scenario]
        for kind in kinds:
            tag = f"{scenario}-{kind}"
            folder = work / tag
            folder.mkdir(exist_ok=True)
            replay_plans = None
            if kind == "starting":
                allocation = checkout / STARTING_SOLUTION
            elif kind == "tessera":
                plan = plan_for_mean_demand(problem, trace)
                allocation = allocation_write(folder / "allocation.txt", *plan_to_artefact(problem, plan, artefact_names, families))
            else:  # the planner's cadence: Tessera's re-plans, replayed into the artefact
                planned = dataclasses.replace(problem, options=dataclasses.replace(problem.options, spare_capacity="artefact"))
                recorded = simulate(planned, trace, planner="proteus", config=faithful_config(args.seed, replan_interval_s=REPLAN_S))
                entries = [(t, *plan_to_artefact(problem, p, artefact_names, families)) for t, p in recorded.plans]
                allocation = schedule_write(folder / "schedule.txt", entries)
                replay_plans = recorded.plans
            dumped = driver_run(args.artefact_python, checkout, PROTEUS_SCENARIOS[scenario], allocation, folder / "artefact", seconds, dump=True)
            effective = []
            placement: dict[str, str] = {}
            for a in dumped["allocations"]:
                plan_e, unservable_e, placement = plan_from_effective(problem, a["predictors"], placement)
                effective.append((plan_e, unservable_e))
            unservable = effective[0][1]
            runs: dict[str, list[tuple[dict[str, Any], dict[int, int], float]]] = defaultdict(list)
            for j in range(args.seeds):
                t0 = time.perf_counter()
                target = folder / ("artefact" if j == 0 else f"artefact-seed{ARTEFACT_SEED + j}")
                summary = driver_run(args.artefact_python, checkout, PROTEUS_SCENARIOS[scenario], allocation, target, seconds,
                                     seed=ARTEFACT_SEED + j, reuse=args.reuse)
                art = artefact_per_second(target)
                runs["artefact"].append(({**totals(art), **artefact_drop_causes(target), "served_by_removed": summary.get("served_by_removed_predictors")},
                                         artefact_batches(summary), time.perf_counter() - t0))
                series.setdefault((scenario, kind, "artefact" if j == 0 else "artefact, other seed"), art)
                for setting, config in (("tessera faithful", faithful_config(args.seed + j)), ("tessera defaults", defaults_config(args.seed + j))):
                    if replay_plans is None:
                        fixed = effective[0][0]
                        planner = lambda _p, fixed=fixed: fixed  # noqa: E731 - the same plan at every call: held fixed
                    else:
                        # The artefact's effective plans at the same instants (what it made of each of Tessera's plans).
                        planner = _Replay([plan for plan, _ in effective])
                        config = dataclasses.replace(config, replan_interval_s=REPLAN_S)
                    t0 = time.perf_counter()
                    info, tes, _result = tessera_run(problem, trace, planner, config)
                    runs[setting].append(({**totals(tes), **info["causes"]}, info["batches"], time.perf_counter() - t0))
                    series.setdefault((scenario, kind, setting), tes)
            base = mean_totals([r[0] for r in runs["artefact"]])
            systems = list(runs) + (["artefact, other seed"] if args.seeds > 1 else [])
            for system in systems:
                if system == "artefact, other seed":
                    seeded = runs["artefact"][1:]
                else:
                    seeded = runs[system]
                tot = mean_totals([r[0] for r in seeded])
                spread = [r[0]["violations_artefact"] for r in seeded]
                batches: Counter = Counter()
                for r in seeded:
                    batches.update(r[1])
                row = {"scenario": scenario, "allocation": kind, "system": system, "seeds": len(seeded), **tot,
                       "violations_artefact_min": min(spread), "violations_artefact_max": max(spread),
                       "violations_vs_artefact": ratio(tot["violations_artefact"], base["violations_artefact"]),
                       "violations_slo_vs_artefact": ratio(tot["violations_slo"], base["violations_slo"]),
                       "accuracy_vs_artefact_points": tot["accuracy"] - base["accuracy"] if tot["accuracy"] is not None and base["accuracy"] is not None else None,
                       "batches": " ".join(f"{b}:{n}" for b, n in sorted(batches.items())), "unservable_predictors": len(unservable),
                       "wall_s": round(sum(r[2] for r in seeded) / len(seeded), 1)}
                if system != "artefact":
                    for field in ("served", "dropped", "late"):
                        agree = agreement(series[(scenario, kind, "artefact")], series[(scenario, kind, system)], field)
                        row[f"{field}_corr"] = agree["corr"]
                        row[f"{field}_mad"] = agree["mad"]
                        row[f"{field}_worst"] = "; ".join(f"s{s}: {a} vs {b}" for s, a, b in agree["worst"])
                rows.append(row)
            for system in systems:
                data = series[(scenario, kind, system)]
                n = max(len(v) for v in data.values())
                for s in range(n):
                    per_second_rows.append({"scenario": scenario, "allocation": kind, "system": system, "second": s,
                                            **{k: (float(data[k][s]) if s < len(data[k]) else 0.0) for k in PER_SECOND_FIELDS}})
            print(f"{scenario}/{kind}: done ({time.perf_counter() - started:.0f} s so far)", flush=True)

    print()
    print(f"Proteus artefact at {checkout}; {'--quick: first %g s of each trace' % QUICK_SECONDS if args.quick else 'whole traces'}; "
          f"allocation held fixed{' (schedule: replayed at the same seconds)' if 'schedule' in kinds else ''}")
    header = (f"{'scenario':<7} {'alloc':<9} {'system':<20} {'demand':>7} {'served':>7} {'dropped':>7} {'late300':>7} {'late1000':>8} "
              f"{'acc':>6} {'viol(A)':>8} {'(min-max)':>15} {'viol300':>8} {'x A':>5} {'x A300':>6} {'srv r':>6} {'srv mad':>7} {'drp r':>6} {'drp mad':>7}")
    print(header)
    for r in rows:
        print(f"{r['scenario']:<7} {r['allocation']:<9} {r['system']:<20} {r['demand']:>7} {r['served']:>7} {r['dropped']:>7} {r['late']:>7} "
              f"{r['late_1000']:>8} {fmt(r['accuracy'], '6.2f')} {fmt(r['violations_artefact'], '8.4f')} {r['violations_artefact_min']:>7.4f}-{r['violations_artefact_max']:<7.4f} {fmt(r['violations_slo'], '8.4f')} "
              f"{fmt(r['violations_vs_artefact'], '5.2f')} {fmt(r['violations_slo_vs_artefact'], '6.2f')} {fmt(r.get('served_corr'), '6.3f')} "
              f"{fmt(r.get('served_mad'), '7.1f')} {fmt(r.get('dropped_corr'), '6.3f')} {fmt(r.get('dropped_mad'), '7.1f')}")
    print()
    for r in rows:
        if r["system"] != "artefact":
            print(f"  {r['scenario']}/{r['allocation']}/{r['system']}: most different seconds (artefact vs Tessera) served {r['served_worst'] or '-'}; "
                  f"dropped {r['dropped_worst'] or '-'}")
        print(f"  {r['scenario']}/{r['allocation']}/{r['system']}: batch sizes {r['batches']}; drops: early {r['drop_early']}, "
              f"between SLO and 2x {r['drop_between']}, past 2x SLO {r['drop_2x']}, no instance {r['drop_no_instance']}")
    fields = ("scenario", "allocation", "system", "seeds", "demand", "served", "dropped", "late", "late_1000", "accuracy", "violations_artefact",
              "violations_slo", "drop_early", "drop_between", "drop_2x", "drop_no_instance", "served_by_removed", "violations_artefact_min", "violations_artefact_max", "violations_vs_artefact", "violations_slo_vs_artefact", "accuracy_vs_artefact_points", "served_corr",
              "served_mad", "dropped_corr", "dropped_mad", "late_corr", "late_mad", "served_worst", "dropped_worst", "batches",
              "unservable_predictors", "wall_s")
    print(f"wrote {csv_rows_write(out / 'proteus_side_by_side.csv', rows, fields)}")
    print(f"wrote {csv_rows_write(out / 'proteus_side_by_side_per_second.csv', per_second_rows, ('scenario', 'allocation', 'system', 'second') + PER_SECOND_FIELDS)}")
    plt = pyplot_load()
    if plt is None:
        print(PNG_SKIPPED.format(name="proteus_side_by_side.png"))
        return 0
    combos = [(s, k) for s in scenarios for k in kinds]
    fig, axes = plt.subplots(len(combos), 2, figsize=(12, 2.6 * len(combos)), squeeze=False)
    styles = {"artefact": ("black", "-"), "artefact, other seed": ("grey", "-"), "tessera faithful": ("tab:blue", "--"), "tessera defaults": ("tab:orange", ":")}
    for row_axes, (s, k) in zip(axes, combos):
        for ax, field in zip(row_axes, ("served", "dropped")):
            for system, (colour, style) in styles.items():
                data = series.get((s, k, system))
                if data is not None:
                    ax.plot(data[field], color=colour, linestyle=style, linewidth=0.9, label=system)
            ax.set_title(f"{s}, {k} allocation: {field} per second (by arrival)", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    print(figure_write(plt, fig, out / "proteus_side_by_side.png",
                       "Proteus's simulator vs Tessera's, same allocation held fixed" + (" (--quick: first 30 s)" if args.quick else "")))
    return 0


class _Replay:
    """A planner that hands out recorded plans in order, one per call (the simulator calls it at t = 0 and at
    every periodic re-plan, the same instants the plans were recorded at)."""

    __name__ = "replay"

    def __init__(self, plans: list[Plan]) -> None:
        self.plans = list(plans)
        self.calls = 0

    def __call__(self, _problem: Problem) -> Plan:
        plan = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        return plan


if __name__ == "__main__":
    sys.exit(main())
