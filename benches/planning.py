#!/usr/bin/env python
"""Planning benchmark: how long the planners take, how close to optimal they get, and what MIG-aware
planning gains. A script, not a test (a smoke run of it is: tests/engine/test_bench_smoke.py).

    .venv/bin/python benches/planning.py            # full run (tens of minutes at worst)
    .venv/bin/python benches/planning.py --quick    # smoke run, seconds
    options: --out DIR (default bench-results), --seeds N, --time-limit S, --threads N, --profile

Writes DIR/planning.csv (one row per solve) and DIR/planning.png (needs matplotlib, the `bench` extra:
pip install -e '.[bench]'; without it only the PNG is skipped, with a message).

Measurements (HiGHS through plan_solve, `threads` HiGHS threads and the process pinned to as many cores):
1. proteus: solve time, status and gap vs size along Proteus's Figure 10 axes (§6.8 "Decision Overhead":
   Gurobi, 4.2 s on average at its size, under 60 s up to 160 devices, 450 variants or 17 query types),
   one axis at a time around Proteus's own size (40 devices of 4 types, 46 variants, 9 applications):
   devices {10..160}, variants {46..450}, applications {3, 9, 17}, and the three maxima at once; optimal
   (mip_gap 0). Problems:
   generate.proteus_sized_problem. 1b: the fleet model (the default planner) on the same problems at mip_gap
   5e-3 (issue 40: "optimal or with a reported gap <= 0.5 %"; every maximum < 10 s, all three at once < 30 s).
2. joint: MIG fleets of {8..64} A100-SXM4-40GB at 1 % gap, objectives max-accuracy and min-gpus.
   Problems: generate.mig_fleet_problem (current layout 3g.20gb@0 3g.20gb@4 everywhere, not fixed).
3. gain of MIG-aware planning on the same problems: joint vs proteus on whole GPUs (every device mig:
   false) vs proteus on a fixed homogeneous geometry (FIXED_GEOMETRY on every GPU, fixed_layout), all at
   the same 1 % gap, as ratios joint / baseline.
4. fleet (issue 40) against the compositions of the seeds' planners on mixed fleets (MIG A100s + MPS RTX 2080
   Tis + whole H100s + CPU hosts; flat applications, or with an ensemble and a pipeline beside them) at
   loads 0.5, 0.9 and 1.3, mip_gap 1e-3, spare capacity idle: `proteus` and `joint` as chosen planners
   compose fa2 (pipelines), gpulets (MPS GPUs) and themselves (engine/solvers/compose.py, mixed.py); the
   fleet model plans all of it, pipelines included, in one MILP. Problems: generate.mixed_fleet_problem. Reported per case: the smallest served fraction (fair share),
   served fraction, accuracy, objective, GPUs, gap, time, and how often the fleet model is no worse in
   the objective's order.
5. fleet at fleet scale: 300 MIG A100s, 300 MPS 2080 Tis, 400 whole H100s and 100 CPU hosts, 100
   applications (400 variants), loads 0.7 and 1.2, mip_gap 5e-3, 60 s.
6. re-planning (issue 40): small fleets (mixed, MPS-only, MIG-only) planned with fleet, then planned again at
   the same demand with the first plan running: instances kept, devices re-partitioned.
`--experiments proteus,mig,mixed,scale,replan` picks sections.
Wall time is measured around plan_solve. `highs_s` is the time inside HiGHS's run() (all MILP stages of the
plan, `highs_calls` of them); `other_s` = wall - highs_s is everything else (capacities, model build, PuLP's
hand-over to HiGHS, plan assembly); `solve_s` is what the plan itself reports.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.metadata
import os
import platform
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.geometry.layout import layout_parse  # noqa: E402
from engine.plans.problem import Plan, Problem, SolveOptions, device_slot_id, problem_from_dict, problem_to_dict  # noqa: E402
from engine.sharing.partitions import mps_slice_percent  # noqa: E402
from engine.reference.generate import mig_fleet_problem, mixed_fleet_problem, proteus_sized_problem  # noqa: E402
from engine.reference.profiles import GPULET_DERIVED_SPEEDUP, reference_data_dir  # noqa: E402
from _common import plan_fair_share  # noqa: E402

PROTEUS_SIZE = {"n_devices": 40, "n_device_types": 4, "n_variants": 46, "n_applications": 9}
FIGURE10_AXES = {"n_devices": (10, 20, 40, 80, 160), "n_variants": (46, 100, 200, 450), "n_applications": (3, 9, 17)}
# All three Figure 10 maxima at once (issue 22 section 4 asks for its time too).
FIGURE10_COMBINED = dict(PROTEUS_SIZE, **{axis: max(values) for axis, values in FIGURE10_AXES.items()})
MIG_FLEETS = (8, 16, 32, 64)
MIG_GPU = "A100-SXM4-40GB"
CURRENT_LAYOUT = ("3g.20gb@0", "3g.20gb@4")
# The fixed-geometry baseline: two 3g.20gb halves (mig-parted's all-3g.20gb), the common "split each GPU
# in two" choice; it leaves 1 of 7 compute slices idle, which is part of what a fixed geometry costs.
FIXED_GEOMETRY = ("3g.20gb@0", "3g.20gb@4")
JOINT_GAP = 0.01

# Targets from the issue, and Proteus's own figures (Gurobi) as the anchor.
TARGET_PROTEUS_SIZE_S = 1.0
TARGET_FIGURE10_MAX_S = 10.0
# 1b. The fleet model (the default planner) on the same Figure 10 problems, at the issue's "optimal or with a
# reported gap <= 0.5 %" (issue 40 section 2): every maximum < 10 s, all three at once < 30 s.
FIGURE10_FLEET_GAP = 5e-3
TARGET_FIGURE10_COMBINED_S = 30.0
TARGET_JOINT_64_S = 10.0
ANCHOR = "Proteus (ASPLOS'24, Gurobi): 4.2 s average at its own size, < 60 s at the Figure 10 maxima"

# 4. The fleet model against the compositions of the seeds' planners (issue 40), on mixed fleets:
# (name, MIG A100s, MPS 2080 Tis, whole H100s, CPU hosts); workloads flat, or with an ensemble and a pipeline.
MIXED_FLEETS = (("small", 4, 4, 2, 2), ("medium", 12, 12, 6, 6))
MIXED_LOADS = (0.5, 0.9, 1.3)
MIXED_WORKLOADS = {"flat": {}, "all": {"ensembles": 1, "pipelines": 1}}
MIXED_SOLVERS = ("proteus", "joint", "fleet")  # the first two are compositions (fa2 + gpulets + it) on a mixed fleet
MIXED_GAP = 1e-3
TARGET_MIXED_S = 10.0
# 5. The fleet model at fleet scale (issue 40): 1,000 GPUs of three kinds and 100 CPU hosts, 100 applications.
SCALE_FLEET = (300, 300, 400, 100)
SCALE_APPLICATIONS = 100
SCALE_LOADS = (0.7, 1.2)
SCALE_GAP = 5e-3
TARGET_SCALE_S = 60.0

# 6. Re-planning at the same demand with the plan running (issue 40, item 3): what the second plan keeps.
REPLAN_FLEETS = (("mixed", 2, 3, 1, 1), ("mps", 0, 4, 0, 1), ("mig", 3, 0, 1, 1))
REPLAN_LOADS = (0.5, 0.9)
REPLAN_SEEDS = 5

CSV_FIELDS = (
    "experiment", "solver", "variant_of", "objective", "n_devices", "n_device_types", "n_variants", "n_applications",
    "seed", "status", "objective_value", "bound", "gap", "wall_s", "solve_s", "highs_s", "other_s", "highs_calls",
    "effective_accuracy", "served_fraction", "fair_share", "gpus_used", "instances", "plan_solver", "error",
    "kept", "reconfigured",
)


class HighsClock:
    """Time spent inside HiGHS's `run()` (the MILP solves proper) and how many solves a plan took (the
    lexicographic stages). Everything else in a plan_solve call (capacities, model build, PuLP handing the
    model to HiGHS, plan assembly) is `other_s`. Wraps highspy.Highs.run in this process only."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.installed = False

    def install(self) -> None:
        try:
            import highspy
        except ImportError:
            return
        original = highspy.Highs.run
        clock = self

        def run(highs: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(highs, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.calls += 1

        highspy.Highs.run = run  # type: ignore[method-assign]
        self.installed = True

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


CLOCK = HighsClock()


# --------------------------------------------------------------------------- running one solve


def _plan_solve() -> Callable[..., Plan]:
    from engine.solvers.solve import plan_solve  # the solvers live apart; import late for a clear error

    return plan_solve


def _with_options(problem: Problem, **changes: Any) -> Problem:
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options, **changes))


def _devices_whole(problem: Problem) -> Problem:
    devices = tuple(dataclasses.replace(d, mig=False, layout=None, fixed_layout=False) for d in problem.devices)
    return dataclasses.replace(problem, devices=devices)


def _devices_fixed(problem: Problem, geometry: Iterable[str]) -> Problem:
    layout = layout_parse(list(geometry))
    devices = tuple(dataclasses.replace(d, mig=True, layout=layout, fixed_layout=True) for d in problem.devices)
    return dataclasses.replace(problem, devices=devices)


def solve_once(problem: Problem, solver: str, objective: str, row: dict[str, Any]) -> dict[str, Any]:
    """Solve and fill a CSV row; a solver exception becomes status 'error' (the run goes on)."""
    return solve_with_plan(problem, solver, objective, row)[0]


def solve_with_plan(problem: Problem, solver: str, objective: str, row: dict[str, Any]) -> tuple[dict[str, Any], Plan | None]:
    """`solve_once`'s row and the plan it measured (None when the solver raised)."""
    row = dict(row, solver=solver, objective=objective, n_devices=len(problem.devices),
               n_device_types=len({d.type for d in problem.devices}), n_variants=len(problem.variants),
               n_applications=len(problem.applications))
    demand = problem.total_demand_rps
    CLOCK.reset()
    t0 = time.perf_counter()
    try:
        plan = _plan_solve()(problem, solver=solver, objective=objective)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures, it does not stop on them
        row.update(status="error", wall_s=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:300])
        traceback.print_exc(limit=3, file=sys.stderr)
        return row, None
    wall = time.perf_counter() - t0
    row.update(
        fair_share=plan_fair_share(problem, plan), plan_solver=plan.solver,
        status=plan.status, objective_value=plan.objective, bound=plan.bound, gap=plan.gap, wall_s=wall,
        solve_s=plan.solve_seconds, highs_s=CLOCK.seconds if CLOCK.installed else None,
        other_s=wall - CLOCK.seconds if CLOCK.installed else None, highs_calls=CLOCK.calls if CLOCK.installed else None,
        effective_accuracy=plan.effective_accuracy, served_fraction=plan.total_served_rps / demand if demand else None,
        gpus_used=plan.gpus_used, instances=len(plan.instances), error="",
    )
    return row, plan


# --------------------------------------------------------------------------- experiments


def proteus_configs(quick: bool) -> list[tuple[str, dict[str, int]]]:
    if quick:
        return [("n_devices", dict(PROTEUS_SIZE, n_devices=10, n_applications=3))]
    seen: set[tuple[int, ...]] = set()
    out = []
    for axis, values in FIGURE10_AXES.items():
        for value in values:
            size = dict(PROTEUS_SIZE, **{axis: value})
            key = tuple(size.values())
            if key not in seen:  # Proteus's own size sits on all three axes: solve it once
                seen.add(key)
                out.append((axis, size))
    out.append(("combined", FIGURE10_COMBINED))
    return out


def run_proteus(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    options = SolveOptions(time_limit_s=args.time_limit, mip_gap=0.0, threads=args.threads, solver="highs")
    for axis, size in proteus_configs(args.quick):
        for seed in range(args.seeds):
            problem = proteus_sized_problem(**size, seed=seed, options=options)
            emit(solve_once(problem, "proteus", "max-accuracy", {"experiment": f"proteus:{axis}", "variant_of": "", "seed": seed}))
            problem = proteus_sized_problem(**size, seed=seed, options=dataclasses.replace(options, mip_gap=FIGURE10_FLEET_GAP))
            emit(solve_once(problem, "fleet", "max-accuracy", {"experiment": f"figure10:{axis}", "variant_of": "", "seed": seed}))


def run_mig(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    options = SolveOptions(time_limit_s=args.time_limit, mip_gap=JOINT_GAP, threads=args.threads, solver="highs")
    fleets = MIG_FLEETS[:1] if args.quick else MIG_FLEETS
    for n_gpus in fleets:
        for seed in range(args.seeds):
            base = mig_fleet_problem(n_gpus, MIG_GPU, seed=seed, current_layout=list(CURRENT_LAYOUT), options=options)
            for objective in ("max-accuracy", "min-gpus"):
                problem = _with_options(base, objective=objective)
                common = {"seed": seed}
                emit(solve_once(problem, "joint", objective, dict(common, experiment="joint", variant_of="mig")))
                emit(solve_once(_devices_whole(problem), "proteus", objective, dict(common, experiment="gain", variant_of="whole-gpu")))
                emit(solve_once(_devices_fixed(problem, FIXED_GEOMETRY), "proteus", objective,
                                dict(common, experiment="gain", variant_of="fixed:" + "+".join(FIXED_GEOMETRY))))


def run_mixed(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """The fleet model against the compositions (fa2 for pipelines, then gpulets on the MPS GPUs and proteus
    or joint on the rest, in the better order: engine/solvers/mixed.py) on the same mixed fleets. Spare
    capacity is left idle, so GPUs used are the planners' own choice."""
    options = SolveOptions(time_limit_s=args.time_limit, mip_gap=MIXED_GAP, threads=args.threads, solver="highs", spare_capacity="idle")
    fleets = MIXED_FLEETS[:1] if args.quick else MIXED_FLEETS
    loads = MIXED_LOADS[:1] if args.quick else MIXED_LOADS
    workloads = {"flat": MIXED_WORKLOADS["flat"]} if args.quick else MIXED_WORKLOADS
    for name, n_mig, n_mps, n_whole, n_cpu in fleets:
        for workload, extra in workloads.items():
            for load in loads:
                for seed in range(args.seeds):
                    problem = mixed_fleet_problem(n_mig, n_mps, n_whole, n_cpu, seed=seed, load=load, options=options, **extra)
                    for solver in MIXED_SOLVERS:
                        emit(solve_once(problem, solver, "max-accuracy",
                                        {"experiment": "mixed", "variant_of": f"{name}/{workload}/{load:g}", "seed": seed}))


def run_scale(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """The fleet model alone on SCALE_FLEET (the compositions' gpulets stage alone takes minutes there)."""
    options = SolveOptions(time_limit_s=TARGET_SCALE_S, mip_gap=SCALE_GAP, threads=args.threads, solver="highs", spare_capacity="idle")
    for load in SCALE_LOADS[:1] if args.quick else SCALE_LOADS:
        problem = mixed_fleet_problem(*SCALE_FLEET, n_applications=SCALE_APPLICATIONS, seed=0, load=load, options=options)
        emit(solve_once(problem, "fleet", "max-accuracy", {"experiment": "scale", "variant_of": f"{load:g}", "seed": 0}))


def problem_with_plan_running(problem: Problem, plan: Plan) -> Problem:
    """`problem` with `plan` as what runs now: each device's MIG layout or MPS partitions and its instances
    (as `running`, several models on a time-shared partition), through the problem's JSON form."""
    raw = problem_to_dict(problem)
    running: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for inst in plan.instances:
        device = problem.device(inst.device)
        running[inst.device][device_slot_id(inst.slice, inst.start, is_cpu=device.is_cpu)].append(inst.variant)
    for entry in raw["devices"]:
        device = problem.device(entry["name"])
        layout = (plan.layouts or {}).get(device.name)
        if device.mig and layout is not None:
            entry["layout"] = list(layout)
        elif device.mps and layout is not None:
            entry["mps_layout"] = "+".join(str(mps_slice_percent(slot.split("@")[0])) for slot in layout)
        slots = running.get(device.name)
        if device.is_cpu and slots and sum(len(v) for v in slots.values()) > 1:
            slots = None  # a CPU host's running state names one instance ("cpu"); several are not written
        entry.pop("running", None)
        if slots:
            entry["running"] = {slot: names[0] if len(names) == 1 else names for slot, names in slots.items()}
    return problem_from_dict(raw)


def run_replan(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """Plan a fleet with `fleet`, then plan it again at the same demand with the first plan running: how
    many of its instances (device, slot, variant) the second keeps, and how many devices it re-partitions."""
    options = SolveOptions(time_limit_s=args.time_limit, mip_gap=MIXED_GAP, threads=args.threads, solver="highs", spare_capacity="idle")
    fleets = REPLAN_FLEETS[:1] if args.quick else REPLAN_FLEETS
    for name, n_mig, n_mps, n_whole, n_cpu in fleets:
        for load in REPLAN_LOADS[:1] if args.quick else REPLAN_LOADS:
            for seed in range(1 if args.quick else REPLAN_SEEDS):
                problem = mixed_fleet_problem(n_mig, n_mps, n_whole, n_cpu, n_applications=4, seed=seed, load=load, options=options)
                first = _plan_solve()(problem, solver="fleet")
                again = problem_with_plan_running(problem, first)
                row, second = solve_with_plan(again, "fleet", "max-accuracy", {"experiment": "replan", "variant_of": f"{name}/{load:g}", "seed": seed})
                if second is not None:
                    before = {(i.device, i.slice, i.start, i.variant) for i in first.instances}
                    after = {(i.device, i.slice, i.start, i.variant) for i in second.instances}
                    changed = [d for d in problem.devices
                               if (first.layouts or {}).get(d.name) is not None and (second.layouts or {}).get(d.name) is not None
                               and list(first.layouts[d.name]) != list(second.layouts[d.name])]
                    row.update(kept=f"{len(before & after)}/{len(before)}", reconfigured=len(changed))
                emit(row)


def _lex_not_worse(fleet: dict[str, Any], other: dict[str, Any]) -> bool:
    """The fleet model's plan is no worse than `other` in the objective's own order: the smallest served
    fraction (fair share), then served traffic, then the objective (accuracy over demand), each within the
    MILP's gap (a tie below it is solver tolerance)."""
    for key in ("fair_share", "served_fraction", "objective_value"):
        f, o = _num(fleet.get(key)), _num(other.get(key))
        if f is None or o is None:
            return f is not None
        if f > o + MIXED_GAP * max(abs(o), 1e-9):
            return True
        if f < o - MIXED_GAP * max(abs(o), 1e-9):
            return False
    return True


# --------------------------------------------------------------------------- reporting


def _num(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _statuses(rows: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def _agg(rows: list[dict[str, Any]], key: str) -> tuple[float | None, float | None]:
    values = [v for v in (_num(r.get(key)) for r in rows) if v is not None]
    return (statistics.fmean(values), max(values)) if values else (None, None)


def _verdict(value: float | None, target: float, rows: list[dict[str, Any]]) -> str:
    if value is None or any(r["status"] in ("error", "infeasible") for r in rows):
        return "MISS (failed solves)"
    return "ok" if value < target else "MISS"


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    out = lines.append
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["experiment"].startswith(("proteus:", "figure10:")):
            key = (r["experiment"].split(":")[0], r["n_devices"], r["n_device_types"], r["n_variants"], r["n_applications"])
        else:
            key = (r["experiment"], r["solver"], r["variant_of"], r["objective"], r["n_devices"])
        groups[key].append(r)

    for section, label, combined_target in (
        ("proteus", f"1. proteus, optimal (mip_gap 0), HiGHS {args.threads} threads, limit {args.time_limit:g} s; {args.seeds} seed(s) per size",
         TARGET_FIGURE10_MAX_S),
        ("figure10", f"1b. fleet (the default planner) on the same problems, mip_gap {FIGURE10_FLEET_GAP:g} (issue 40: optimal or a "
         f"reported gap <= 0.5 %), limit {args.time_limit:g} s", TARGET_FIGURE10_COMBINED_S),
    ):
        if not any(k[0] == section for k in groups):
            continue
        out("")
        out(label)
        out(f"   {'axis':<12} {'devices':>7} {'types':>5} {'variants':>8} {'apps':>4}  {'status':<22} {'wall mean':>9} {'wall max':>9} "
            f"{'HiGHS mean':>10} {'other mean':>10} {'stages':>6} {'gap max':>8} {'served min':>10}  target")
        sweeps = [(axis, dict(PROTEUS_SIZE, **{axis: v})) for axis, values in FIGURE10_AXES.items() for v in values]
        solved = [dict(zip(PROTEUS_SIZE, k[1:])) for k in groups if k[0] == section]
        extra = [("combined" if size == FIGURE10_COMBINED else "other", size) for size in solved if size not in [s for _, s in sweeps]]
        for axis, size in sweeps + extra:
            g = groups.get((section, *size.values()))
            if not g:
                continue
            dev, types, var, apps = size.values()
            wall_mean, wall_max = _agg(g, "wall_s")
            target = ""
            if size == PROTEUS_SIZE and section == "proteus":
                target = f"< {TARGET_PROTEUS_SIZE_S:g} s (mean): {_verdict(wall_mean, TARGET_PROTEUS_SIZE_S, g)}  (Proteus's size)"
            elif axis == "combined":
                target = f"< {combined_target:g} s (max): {_verdict(wall_max, combined_target, g)}"
            elif axis != "other" and size[axis] == max(FIGURE10_AXES[axis]):
                target = f"< {TARGET_FIGURE10_MAX_S:g} s (max): {_verdict(wall_max, TARGET_FIGURE10_MAX_S, g)}"
            served = [v for v in (_num(r.get("served_fraction")) for r in g) if v is not None]
            out(f"   {axis.removeprefix('n_'):<12} {dev:>7} {types:>5} {var:>8} {apps:>4}  {_statuses(g):<22} {_fmt(wall_mean):>9} {_fmt(wall_max):>9} "
                f"{_fmt(_agg(g, 'highs_s')[0]):>10} {_fmt(_agg(g, 'other_s')[0]):>10} {_fmt(_agg(g, 'highs_calls')[1], '.0f'):>6} "
                f"{_fmt(_agg(g, 'gap')[1], '.4f'):>8} {_fmt(min(served) if served else None, '.4f'):>10}  {target}")

    out("")
    out(f"2. joint on MIG fleets of {MIG_GPU} (current layout {' '.join(CURRENT_LAYOUT)}), mip_gap {JOINT_GAP:g}")
    out(f"   {'GPUs':>5} {'objective':<13} {'status':<22} {'wall mean':>9} {'wall max':>9} {'HiGHS mean':>10} {'other mean':>10} {'stages':>6} {'gap max':>8}  target")
    for key in sorted(k for k in groups if k[0] == "joint"):
        g = groups[key]
        n_gpus, objective = key[4], key[3]
        wall_mean, wall_max = _agg(g, "wall_s")
        target = f"< {TARGET_JOINT_64_S:g} s (max): {_verdict(wall_max, TARGET_JOINT_64_S, g)}" if n_gpus == max(MIG_FLEETS) else ""
        out(f"   {n_gpus:>5} {objective:<13} {_statuses(g):<22} {_fmt(wall_mean):>9} {_fmt(wall_max):>9} "
            f"{_fmt(_agg(g, 'highs_s')[0]):>10} {_fmt(_agg(g, 'other_s')[0]):>10} {_fmt(_agg(g, 'highs_calls')[1], '.0f'):>6} {_fmt(_agg(g, 'gap')[1], '.4f'):>8}  {target}")

    out("")
    out("3. gain of MIG-aware planning (same problems, all at mip_gap 0.01): joint / baseline, mean over seeds")
    out("   max-accuracy: effective accuracy (over served traffic) and served fraction; min-gpus: GPUs used")
    out(f"   {'GPUs':>5} {'baseline':<26} {'acc joint':>9} {'acc base':>9} {'acc ratio':>9} {'served j':>8} {'served b':>8} "
        f"{'GPUs j':>7} {'GPUs b':>7} {'GPU ratio':>9}  base status")
    joint: dict[tuple[str, int, int], dict[str, Any]] = {(r["objective"], r["n_devices"], r["seed"]): r for r in rows if r["experiment"] == "joint"}
    baselines = sorted({(r["n_devices"], r["variant_of"]) for r in rows if r["experiment"] == "gain"})
    for n_gpus, base in baselines:
        def pairs(objective: str, key: str) -> tuple[float | None, float | None, float | None]:
            j_vals, b_vals, ratios = [], [], []
            for r in rows:
                if r["experiment"] != "gain" or r["variant_of"] != base or r["n_devices"] != n_gpus or r["objective"] != objective:
                    continue
                j = joint.get((objective, n_gpus, r["seed"]))
                jv, bv = _num(j.get(key)) if j else None, _num(r.get(key))
                if jv is not None:
                    j_vals.append(jv)
                if bv is not None:
                    b_vals.append(bv)
                if jv is not None and bv:
                    ratios.append(jv / bv)
            mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
            return mean(j_vals), mean(b_vals), mean(ratios)

        acc_j, acc_b, acc_r = pairs("max-accuracy", "effective_accuracy")
        srv_j, srv_b, _ = pairs("max-accuracy", "served_fraction")
        gpu_j, gpu_b, gpu_r = pairs("min-gpus", "gpus_used")
        base_rows = [r for r in rows if r["experiment"] == "gain" and r["variant_of"] == base and r["n_devices"] == n_gpus]
        out(f"   {n_gpus:>5} {base:<26} {_fmt(acc_j, '.4f'):>9} {_fmt(acc_b, '.4f'):>9} {_fmt(acc_r, '.4f'):>9} {_fmt(srv_j, '.3f'):>8} "
            f"{_fmt(srv_b, '.3f'):>8} {_fmt(gpu_j, '.1f'):>7} {_fmt(gpu_b, '.1f'):>7} {_fmt(gpu_r, '.3f'):>9}  {_statuses(base_rows)}")
    mixed = [r for r in rows if r["experiment"] == "mixed"]
    if mixed:
        out("")
        out(f"4. the fleet model against the compositions of the seeds' planners on mixed fleets (MIG + MPS + whole + CPU), "
            f"mip_gap {MIXED_GAP:g}, spare capacity idle; mean over seeds")
        out("   fair = smallest served fraction of any application; served = fraction of all demand; acc = accuracy over served; "
            "obj = accuracy x served over demand")
        out(f"   {'fleet/workload/load':<20} {'planner':<22} {'fair':>6} {'served':>6} {'acc':>6} {'obj':>7} {'GPUs':>5} {'gap max':>8} "
            f"{'wall mean':>9} {'wall max':>8}  {'fleet >= it (seeds)':<20}")
        cases = sorted({r["variant_of"] for r in mixed}, key=lambda v: (v.split("/")[0] != "small", v))
        not_worse = total = 0
        fleet_walls: list[float] = []
        for case in cases:
            by_solver: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for r in mixed:
                if r["variant_of"] == case:
                    by_solver[r["solver"]].append(r)
            fleet_rows = {r["seed"]: r for r in by_solver.get("fleet", [])}
            fleet_walls += [w for w in (_num(r.get("wall_s")) for r in fleet_rows.values()) if w is not None]
            for solver in MIXED_SOLVERS:
                g = by_solver.get(solver, [])
                if not g:
                    continue
                verdict = ""
                if solver != "fleet":
                    wins = [_lex_not_worse(fleet_rows[r["seed"]], r) for r in g if r["seed"] in fleet_rows]
                    not_worse += sum(wins)
                    total += len(wins)
                    verdict = f"{sum(wins)}/{len(wins)}"
                label = g[0].get("plan_solver") or solver
                out(f"   {case:<20} {label:<22} {_fmt(_agg(g, 'fair_share')[0], '.3f'):>6} {_fmt(_agg(g, 'served_fraction')[0], '.3f'):>6} "
                    f"{_fmt(_agg(g, 'effective_accuracy')[0], '.4f'):>6} {_fmt(_agg(g, 'objective_value')[0], '.4f'):>7} "
                    f"{_fmt(_agg(g, 'gpus_used')[0], '.1f'):>5} {_fmt(_agg(g, 'gap')[1], '.4f'):>8} {_fmt(_agg(g, 'wall_s')[0]):>9} "
                    f"{_fmt(_agg(g, 'wall_s')[1]):>8}  {verdict:<20}")
        worst = max(fleet_walls) if fleet_walls else None
        out(f"   fleet model no worse than the composition (fair share, then served, then objective): {not_worse} of {total} "
            f"solves; its slowest {_fmt(worst)} s (target < {TARGET_MIXED_S:g} s: "
            f"{'met' if worst is not None and worst < TARGET_MIXED_S else 'missed'})")
    scale = [r for r in rows if r["experiment"] == "scale"]
    if scale:
        mig, mps, whole, cpu = SCALE_FLEET
        out("")
        out(f"5. the fleet model at fleet scale: {mig} MIG A100s + {mps} MPS 2080 Tis + {whole} whole H100s + {cpu} CPU hosts, "
            f"{SCALE_APPLICATIONS} applications, mip_gap {SCALE_GAP:g}, limit {TARGET_SCALE_S:g} s (one model, no decomposition)")
        out(f"   {'load':>5} {'status':<10} {'fair':>6} {'served':>6} {'obj':>7} {'GPUs':>5} {'gap':>8} {'wall':>7}  target")
        for r in scale:
            wall, gap = _num(r.get("wall_s")), _num(r.get("gap"))
            met = wall is not None and wall < TARGET_SCALE_S and gap is not None and gap <= SCALE_GAP
            out(f"   {r['variant_of']:>5} {r['status']:<10} {_fmt(_num(r.get('fair_share')), '.3f'):>6} "
                f"{_fmt(_num(r.get('served_fraction')), '.4f'):>6} {_fmt(_num(r.get('objective_value')), '.4f'):>7} "
                f"{r.get('gpus_used', ''):>5} {_fmt(gap, '.4f'):>8} {_fmt(wall, '.1f'):>7}  < {TARGET_SCALE_S:g} s with gap <= "
                f"{SCALE_GAP:g}: {'met' if met else 'missed'}")
    replan = [r for r in rows if r["experiment"] == "replan"]
    if replan:
        out("")
        out("6. re-planning at the same demand with the first plan running (fleet; mip_gap "
            f"{MIXED_GAP:g}, spare capacity idle): instances kept (device, slot, variant) and devices re-partitioned")
        out(f"   {'case':<12} {'seeds':>5} {'kept':>9} {'all kept':>9} {'re-partitioned':>15} {'wall mean':>10}")
        by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in replan:
            by_case[r["variant_of"]].append(r)
        total_kept = total = 0
        for case, group in by_case.items():
            pairs = [tuple(int(x) for x in str(r["kept"]).split("/")) for r in group if r.get("kept")]
            kept, count = sum(k for k, _ in pairs), sum(n for _, n in pairs)
            total_kept, total = total_kept + kept, total + count
            out(f"   {case:<12} {len(group):>5} {f'{kept}/{count}':>9} {sum(1 for k, n in pairs if k == n):>6}/{len(pairs):<2} "
                f"{sum(int(r.get('reconfigured') or 0) for r in group):>15} {_fmt(_agg(group, 'wall_s')[0]):>10}")
        out(f"   all: {total_kept} of {total} instances kept")
    out("")
    out(f"Targets (issue): proteus optimal < {TARGET_PROTEUS_SIZE_S:g} s at Proteus's size on 2 cores; < {TARGET_FIGURE10_MAX_S:g} s at "
        f"the Figure 10 maxima; joint at {max(MIG_FLEETS)} A100 < {TARGET_JOINT_64_S:g} s at 1 % gap.")
    out(f"Anchor: {ANCHOR}.")
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        out(f"{len(errors)} solve(s) raised; first: {errors[0]['error']}")
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (f"PNG skipped: matplotlib is not installed (it is the `bench` extra: pip install -e '.[bench]'); "
                f"{path.name} not written, the CSV has every figure.")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (axis, label) in zip(axes[0], (("n_devices", "devices (4 types)"), ("n_variants", "variants"), ("n_applications", "applications"))):
        for prefix, name in (("proteus:", "proteus, gap 0"), ("figure10:", f"fleet, gap {FIGURE10_FLEET_GAP:g}")):
            g: dict[int, list[float]] = defaultdict(list)
            for r in rows:
                on_axis = all(r[k] == v for k, v in PROTEUS_SIZE.items() if k != axis)  # Proteus's size on the other axes
                if r["experiment"].startswith(prefix) and on_axis and r.get("wall_s") not in (None, ""):
                    g[int(r[axis])].append(float(r["wall_s"]))
            xs = sorted(g)
            if xs:
                ax.plot(xs, [statistics.fmean(g[x]) for x in xs], "o-", label=f"{name} mean")
                ax.plot(xs, [max(g[x]) for x in xs], "v--", label=f"{name} max")
        ax.axhline(TARGET_FIGURE10_MAX_S, color="red", lw=0.8, ls=":", label="target at maxima (10 s)")
        ax.axhline(TARGET_PROTEUS_SIZE_S, color="orange", lw=0.8, ls=":", label="target at Proteus size (1 s)")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("wall time (s)")
        ax.set_title(f"Figure 10 axes: solve time vs {label}")
        ax.legend(fontsize=7)
    ax = axes[1][0]
    for objective, marker in (("max-accuracy", "o-"), ("min-gpus", "s-")):
        g = defaultdict(list)
        for r in rows:
            if r["experiment"] == "joint" and r["objective"] == objective and r.get("wall_s") not in (None, ""):
                g[int(r["n_devices"])].append(float(r["wall_s"]))
        xs = sorted(g)
        if xs:
            ax.plot(xs, [statistics.fmean(g[x]) for x in xs], marker, label=f"{objective} mean")
            ax.plot(xs, [max(g[x]) for x in xs], marker[0] + "--", alpha=0.6, label=f"{objective} max")
    ax.axhline(TARGET_JOINT_64_S, color="red", lw=0.8, ls=":", label="target at 64 GPUs (10 s)")
    ax.set_yscale("log")
    ax.set_xlabel(f"{MIG_GPU} GPUs")
    ax.set_ylabel("wall time (s)")
    ax.set_title("joint (variant + MIG geometry), 1 % gap")
    ax.legend(fontsize=7)
    for ax, (objective, key, title) in zip(axes[1][1:], (("max-accuracy", "effective_accuracy", "effective accuracy (max-accuracy)"),
                                                          ("min-gpus", "gpus_used", "GPUs used (min-gpus)"))):
        labels = [("joint", "joint", "mig")] + [("proteus " + b, "gain", b) for b in sorted({r["variant_of"] for r in rows if r["experiment"] == "gain"})]
        fleets = sorted({int(r["n_devices"]) for r in rows if r["experiment"] == "joint"})
        width = 0.8 / max(1, len(labels))
        for i, (name, experiment, variant_of) in enumerate(labels):
            vals = []
            for n in fleets:
                v = [float(r[key]) for r in rows if r["experiment"] == experiment and r["variant_of"] == variant_of and
                     r["objective"] == objective and int(r["n_devices"]) == n and r.get(key) not in (None, "")]
                vals.append(statistics.fmean(v) if v else 0.0)
            ax.bar([j + i * width for j in range(len(fleets))], vals, width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(fleets))], [str(n) for n in fleets])
        ax.set_xlabel(f"{MIG_GPU} GPUs")
        ax.set_title(title)
        if key == "effective_accuracy":
            ax.set_ylim(0.6, 0.8)
        ax.legend(fontsize=7)
    fig.suptitle("Tessera planning benchmark (profiles derived from engine/reference/data/gpulet; see benches/planning.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def header(args: argparse.Namespace) -> list[str]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    from engine.reference.machine import cpu_model_name

    cpu = cpu_model_name() or "?"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    speedups = ", ".join(f"{k} x{v:g}" for k, v in GPULET_DERIVED_SPEEDUP.items())
    return [
        "Tessera planning benchmark" + (" (--quick smoke run)" if args.quick else ""),
        f"Reference data: {reference_data_dir() / 'gpulet'} (engine/reference/data/gpulet: RTX 2080 Ti under MPS, gpulets ATC'22 artefact).",
        f"Profiles on other GPUs and MIG slices are DERIVED from it (engine.reference.profiles.gpulet_profiles_derive; speed-ups {speedups}),",
        "CPU profiles come from a stated synthetic cost model, variants beyond the 10 measured models are generated perturbations",
        "(engine/reference/generate.py). The gains below illustrate the method on these numbers; they predict no real fleet.",
        f"Machine: {cpu}; pinned to cores {cores}; HiGHS threads {args.threads}; highspy {version('highspy')}, PuLP {version('pulp')}; "
        f"Python {platform.python_version()}; load average at start {_loadavg()} (other work on these cores inflates the times)",
    ]


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def pin_cores(threads: int) -> None:
    # "2 cores": HiGHS gets `threads` threads, and the process (and any solver subprocess) that many cores.
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cores)


def profile_one(args: argparse.Namespace) -> None:
    """cProfile of one solve at Proteus's size and one joint solve at the largest fleet: where the time goes."""
    import cProfile
    import pstats

    cases = [
        ("proteus", proteus_sized_problem(**PROTEUS_SIZE, seed=0, options=SolveOptions(time_limit_s=args.time_limit, mip_gap=0.0, threads=args.threads)), "max-accuracy"),
        ("joint", mig_fleet_problem(max(MIG_FLEETS), MIG_GPU, seed=0, current_layout=list(CURRENT_LAYOUT),
                                    options=SolveOptions(time_limit_s=args.time_limit, mip_gap=JOINT_GAP, threads=args.threads)), "max-accuracy"),
    ]
    for solver, problem, objective in cases:
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        plan = _plan_solve()(problem, solver=solver, objective=objective)
        profiler.disable()
        print(f"\n--- profile: {solver} ({len(problem.devices)} devices, {len(problem.variants)} variants): "
              f"wall {time.perf_counter() - t0:.3f} s, plan.solve_seconds {plan.solve_seconds:.3f} s, status {plan.status}")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes, one seed: a smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per size (default 3; 1 with --quick)")
    parser.add_argument("--time-limit", type=float, default=None, help="per solve, seconds (default 60; 20 with --quick)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="only profile one proteus and one joint solve")
    parser.add_argument("--experiments", default=None,
                        help="comma-separated: proteus (Figure 10 sizes), mig (joint and its gain), mixed (the fleet model "
                             "against the compositions), scale (the fleet model on 1,000 GPUs and 100 CPU hosts), replan "
                             "(a re-plan at the same demand with the plan running); default all, all but scale with --quick")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.time_limit = args.time_limit or (20.0 if args.quick else 60.0)
    pin_cores(args.threads)
    CLOCK.install()
    if args.profile:
        profile_one(args)
        return 0

    for line in header(args):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "planning.csv"
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()

        def emit(row: dict[str, Any]) -> None:
            rows.append(row)
            writer.writerow({k: row.get(k, "") for k in CSV_FIELDS})
            fh.flush()  # a long run that is stopped still leaves its rows
            print(f"  {row['experiment']:<22} {row['solver']:<8} {row['variant_of']:<24} {row['objective']:<13} "
                  f"dev={row['n_devices']:<4} var={row['n_variants']:<4} apps={row['n_applications']:<3} seed={row['seed']} "
                  f"{row['status']:<10} wall={_fmt(_num(row.get('wall_s')))} gap={_fmt(_num(row.get('gap')), '.4f')}", flush=True)

        default = "proteus,mig,mixed,replan" if args.quick else "proteus,mig,mixed,scale,replan"
        chosen = {e.strip() for e in (args.experiments or default).split(",") if e.strip()}
        unknown = chosen - {"proteus", "mig", "mixed", "scale", "replan"}
        if unknown:
            parser.error(f"--experiments: unknown {', '.join(sorted(unknown))} (choose from proteus, mig, mixed, scale, replan)")
        if "proteus" in chosen:
            run_proteus(args, emit)
        if "mig" in chosen:
            run_mig(args, emit)
        if "mixed" in chosen:
            run_mixed(args, emit)
        if "scale" in chosen:
            run_scale(args, emit)
        if "replan" in chosen:
            run_replan(args, emit)
    for line in report(rows, args):
        print(line)
    print(f"\nwrote {csv_path} ({len(rows)} rows) in {time.perf_counter() - t_start:.1f} s; load average at end {_loadavg()}")
    print(plot(rows, args.out / "planning.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
