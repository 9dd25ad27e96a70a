#!/usr/bin/env python
"""Proteus's own simulator (the authors' artefact, github.com/UMass-LIDS/Proteus) run on ONE allocation held
fixed, or on a schedule of allocations applied at given seconds, instead of its ILP: issue 41, item 1 (the
side-by-side with Tessera's simulator, benches/proteus_side_by_side.py; docs/fidelity-proteus.md, section (a),
"Option 2").

THIS SCRIPT RUNS UNDER THE ARTEFACT'S OWN PYTHON, not Tessera's: it imports only the artefact's modules
(`core.scheduling_env`), the standard library and numpy, and none of Tessera. Nothing of the artefact is
copied here; the script builds the artefact's `SchedulingEnv` with the arguments the artefact's `run.py`
passes for `configs/<scenario>/proteus.json` (A: run.py:145-183), except that the ILP is never built (so no
Gurobi is needed) and the allocation comes from a file through the artefact's own
`Simulator.apply_ilp_solution` (A: core/simulator.py:769-784), then steps one simulated second at a time with
null actions as run.py does (A: run.py:261-373).

    python3.11 -m venv /tmp/pvenv
    /tmp/pvenv/bin/pip install numpy==1.23.5 pandas==2.1.1 gym==0.26.2 scipy==1.11.3 requests
    git clone https://github.com/UMass-LIDS/Proteus /tmp/proteus
    /tmp/pvenv/bin/python benches/proteus_artefact_driver.py --checkout /tmp/proteus --scenario zipf \\
        --allocation /tmp/proteus/algorithms/proteus_starting_solutions/starting_solution.txt --out /tmp/out [--seconds 30]
    /tmp/pvenv/bin/python benches/proteus_artefact_driver.py --checkout /tmp/proteus --scenario zipf \\
        --allocation FILE --dump-allocation        # the allocation as the artefact applies it, as JSON, and stop

Scenarios: zipf (zipf_exponential), bursty (zipf_exponential_bursty), mnl (medium-normal_load): the folder
names of configs/ and traces/twitter/asplos/.

The allocation file: the artefact's own format (algorithms/proteus_starting_solutions/starting_solution.txt;
read by A: algorithms/ilp.py:57-66): six lines, labels on lines 1, 3, 5 and on lines 2, 4, 6 a Python dict
literal each: required_predictors {(variant, type): count}, canary_dict {(device, family index): share},
ilp_x {(variant, device): 1}. Types CPU, GPU_AMPERE, VPU, GPU_PASCAL; devices <type>-0..9; family index =
the sorted family order (bert 0 ... yolo 8). Or a schedule: a first line `schedule:` and then one Python
literal, a list of (time_s, required_predictors, canary_dict, ilp_x) tuples; the entry with time_s = t is
applied at the start of step t, i.e. before the artefact simulates (t, t+1] s, as run.py applies an ILP
solution (A: run.py:283-284, 353). The files are read with ast.literal_eval (the artefact uses eval).

What the artefact does to an allocation, and what this script therefore reports as the "effective" one: a
device of ilp_x absent from canary_dict is upgraded to its family's most accurate variant that fits the
SLO on its type (A: core/simulator.py:786-827); predictors are counted per (variant, type), not bound to a
device (A: core/simulator.py:869-989); with `use_proportional` set (it is, once a solution is applied) a
query goes to one of its family's predictors chosen uniformly (A: core/executor.py:1172-1188).

Outputs, in --out:
- per_second.csv: per second s, counted by ARRIVAL second (floor(arrival_ms / 1000)): demand, served, late
  (served after the 300 ms SLO), late_1000 (after 1000 ms, the artefact's own count), dropped, accuracy_sum
  (sum of the served queries' accuracy, 0-100 scale); and by EVENT second (completion or drop time):
  served_at, dropped_at.
- per_family.csv: the same by arrival second, per family.
- queries.csv: one row per query: family, arrival_ms, done_ms, outcome (served | dropped | unresolved),
  accuracy, the serving predictor's variant and type.
- runpy_log.csv: per step the columns of run.py's throughput log (simulation_time, demand, successful,
  dropped, late, total_accuracy), computed from the artefact's counters as run.py computes them
  (A: run.py:375-400): demand is the arrivals of the previous step, the rest are deltas during the step.
- summary.json: totals (from the per-query records and from the artefact's own counters, which must agree),
  the queries served by predictors an allocation had removed (they drain their queues), the batch-size
  counts, the effective allocation, the wall time.

Only the artefact's wall-clock sleeps are skipped (time.sleep is made a no-op in this process: the
simulator sleeps 1 s per finished trace file, A: core/simulator.py:700). The artefact's logs (per-predictor
files, latency log, reward log) are written under --out/_artefact_workdir, not into the checkout.
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import logging
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

SCENARIOS = {"zipf": "zipf_exponential", "bursty": "zipf_exponential_bursty", "mnl": "medium-normal_load"}
TYPES = ("CPU", "GPU_AMPERE", "VPU", "GPU_PASCAL")  # the artefact's accelerator types, AccType 1..4
SLO_LATE_MS = 300.0
ARTEFACT_LATE_MS = 1000.0


def scenario_folder(name: str) -> str:
    if name in SCENARIOS:
        return SCENARIOS[name]
    if name in SCENARIOS.values():
        return name
    raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(list(SCENARIOS) + list(SCENARIOS.values()))}")


def allocation_read(path: Path) -> list[tuple[float, dict, dict, dict]]:
    """[(time_s, required_predictors, canary_dict, ilp_x)], one entry at 0 for a single allocation file."""
    text = Path(path).read_text()
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("schedule"):
        body = text[text.index(first) + len(first):]
        entries = ast.literal_eval(body.strip())
        out = [(float(t), dict(rp), dict(cd), dict(x)) for t, rp, cd, x in entries]
        return sorted(out, key=lambda e: e[0])
    if len(lines) < 6:
        raise SystemExit(f"{path}: expected the artefact's six-line allocation format (or a 'schedule:' file)")
    return [(0.0, ast.literal_eval(lines[1].strip()), ast.literal_eval(lines[3].strip()), ast.literal_eval(lines[5].strip()))]


def workdir_make(out: Path, checkout: Path, folder: str, seconds: float | None) -> tuple[Path, Path]:
    """A working directory with the `logs/...` folders the artefact writes into (its paths are relative to
    the current directory), and the trace folder: the checkout's, or a copy cut to the first `seconds`."""
    work = out / "_artefact_workdir"
    for sub in ("logs/reward", "logs/latency", "logs/per_predictor", "logs/throughput", "logs/ilp", "logs/throughput_per_model"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    for stale in (work / "logs" / "per_predictor").iterdir():
        stale.unlink()
    source = checkout / "traces" / "twitter" / "asplos" / folder / "300"
    if not source.is_dir():
        raise SystemExit(f"{source}: not found; is {checkout} a checkout of github.com/UMass-LIDS/Proteus?")
    if seconds is None:
        return work, source
    cut = work / "trace"
    cut.mkdir(exist_ok=True)
    for stale in cut.iterdir():
        stale.unlink()
    limit = seconds * 1000.0
    for path in sorted(source.glob("*.txt")):
        kept = [line for line in path.read_text().splitlines() if line.strip() and int(line.split(",")[0]) < limit]
        if not kept:
            raise SystemExit(f"{path}: no query in the first {seconds:g} s (the artefact needs one to learn the family's SLO)")
        (cut / path.name).write_text("\n".join(kept) + "\n")
    return work, cut


def effective_allocation(sim) -> list[dict]:
    """The predictors the artefact's simulator holds now: (family, variant, type, count, max batch)."""
    counts: dict[tuple, int] = defaultdict(int)
    for family, executor in sim.executors.items():
        for predictor in executor.predictors.values():
            counts[(family, predictor.variant_name, TYPES[predictor.acc_type - 1], predictor.max_batch_size)] += 1
    return [{"family": f, "variant": v, "type": t, "count": n, "max_batch": b} for (f, v, t, b), n in sorted(counts.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", required=True, help="a checkout of github.com/UMass-LIDS/Proteus")
    parser.add_argument("--scenario", required=True, help="zipf | bursty | mnl (or the config folder name)")
    parser.add_argument("--allocation", required=True, help="the artefact's allocation format, or a 'schedule:' file")
    parser.add_argument("--out", default=None, help="output folder (required unless --dump-allocation)")
    parser.add_argument("--seconds", type=float, default=None, help="only the queries that arrive in the first SECONDS")
    parser.add_argument("--seed", type=int, default=None, help="the artefact's random seed (default: the config's, 10)")
    parser.add_argument("--dump-allocation", action="store_true", help="print the effective allocation(s) as JSON and stop")
    args = parser.parse_args(argv)

    checkout = Path(args.checkout).resolve()
    folder = scenario_folder(args.scenario)
    config_path = checkout / "configs" / folder / "proteus.json"
    config = json.loads(config_path.read_text())
    schedule = allocation_read(Path(args.allocation))
    out = Path(args.out).resolve() if args.out else Path(os.environ.get("TMPDIR", "/tmp")).resolve() / f"proteus_driver_{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    work, trace_dir = workdir_make(out, checkout, folder, args.seconds)

    sys.path.insert(0, str(checkout))
    os.chdir(work)
    time.sleep = lambda _s: None  # the artefact's wall-clock sleeps (1 s per finished trace file) only
    logging.disable(logging.INFO)  # its INFO/DEBUG logging costs time and says nothing we record
    from core.scheduling_env import SchedulingEnv  # the artefact's

    # run.py's arguments (A: run.py:145-183, its argparse defaults at 20-38), the allocation aside.
    env = SchedulingEnv(
        trace_dir=str(trace_dir), job_sched_algo=config["job_scheduling"], action_group_size=1,
        logging_level=logging.WARNING, reward_window_length=10, random_runtimes=False,
        fixed_seed=args.seed if args.seed is not None else (int(config["seed"]) if "seed" in config else 0), allocation_window=1000,
        model_assignment="ilp", batching=config["batching"] != "disabled", batching_algo=config["batching"],
        profiling_data=str(checkout / config["profiling_data"]), allowed_variants_path=str(checkout / config["allowed_variants"]),
        max_batch_size=config.get("max_batch_size"), ewma_decay=float(config["ewma_decay"]) if "ewma_decay" in config else None,
        infaas_slack=None, infaas_downscale_slack=None,
    )
    sim = env.simulator
    families = [sim.idx_to_executor[i] for i in range(len(sim.idx_to_executor))]

    if args.dump_allocation:
        effective = []
        for t, required, canary, ilp_x in schedule:
            sim.apply_ilp_solution(required, canary, ilp_x)
            effective.append({"time_s": t, "predictors": effective_allocation(sim)})
        print(json.dumps({"families": families, "allocations": effective}, indent=1))
        return 0

    # Per-query records, by wrapping (not changing) the artefact's three accounting calls.
    records: list[tuple] = []  # (family, arrival_ms, done_ms, outcome, accuracy, variant, type)
    served_by: dict[str, tuple[str, str, bool]] = {}
    ghosts: list[str] = []
    original_failed = sim.bump_failed_request_stats
    original_success = sim.bump_successful_request_stats

    def failed(event):
        records.append((event.desc, float(event.start_time), float(sim.clock), "dropped", 0.0, "", ""))
        return original_failed(event)

    def succeeded(event, processing_time):
        variant, kind, ghost = served_by.pop(event.id, ("", "", False))
        if ghost:
            ghosts.append(event.id)
        records.append((event.desc, float(event.event_counter), float(sim.clock), "served", float(event.accuracy_seen), variant, kind))
        return original_success(event, processing_time=processing_time)

    sim.bump_failed_request_stats = failed
    sim.bump_successful_request_stats = succeeded
    for executor in sim.executors.values():
        def finish(event, clock, executor=executor, original=executor.finish_request):
            predictor = executor.assigned_requests.get(event.id)
            if predictor is not None:
                # A predictor an allocation removed keeps draining its queue (a "ghost", A: core/executor.py:104-113).
                served_by[event.id] = (predictor.variant_name, TYPES[predictor.acc_type - 1], predictor.id not in executor.predictors)
            return original(event, clock)
        executor.finish_request = finish

    started = time.perf_counter()
    observation = env.reset()
    pending = list(schedule)
    effective: list[dict] = []
    runpy_rows = []
    totals = {"successful": 0, "dropped": 0, "late": 0, "accuracy": 0.0}
    i = 0
    while True:
        while pending and pending[0][0] <= i:
            t, required, canary, ilp_x = pending.pop(0)
            sim.apply_ilp_solution(required, canary, ilp_x)
            effective.append({"time_s": t, "applied_at_step": i, "predictors": effective_allocation(sim)})
        action = sim.null_action(env.action_space.sample(), 1)  # what run.py steps with between solves
        observation, _reward, done, _info = env.step(action)
        if done:
            break  # run.py breaks before logging the last step (A: run.py:371-372)
        now = {"successful": sim.total_successful, "dropped": sim.slo_timeouts["timeouts"], "late": sim.slo_timeouts["late"],
               "accuracy": sim.total_accuracy}
        runpy_rows.append({"simulation_time": i, "demand": int(sum(observation[:-1, -2])),
                           "successful": now["successful"] - totals["successful"], "dropped": now["dropped"] - totals["dropped"],
                           "late": now["late"] - totals["late"], "total_accuracy": now["accuracy"] - totals["accuracy"]})
        totals = now
        i += 1
    wall = time.perf_counter() - started

    # The queries the simulator read but never resolved (a predictor with no batch size under SLO/2 holds its
    # queue forever, A: core/predictor.py:80-83): demand from the trace files.
    arrivals: list[tuple[str, float]] = []
    for family in families:
        for line in (trace_dir / f"{family}.txt").read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                arrivals.append((family, float(int(line.split(",")[0]))))
    resolved = defaultdict(int)
    for r in records:
        resolved[(r[0], r[1])] += 1
    unresolved = []
    seen = defaultdict(int)
    for family, at in arrivals:
        seen[(family, at)] += 1
        if seen[(family, at)] > resolved.get((family, at), 0):
            unresolved.append((family, at, math.nan, "unresolved", 0.0, "", ""))
    records.extend(unresolved)

    horizon = int(max((a for _, a in arrivals), default=0) // 1000) + 1
    done_horizon = int(max((r[2] for r in records if not math.isnan(r[2])), default=0) // 1000) + 1
    n = max(horizon, done_horizon)
    per = {k: [0] * n for k in ("demand", "served", "late", "late_1000", "dropped", "unresolved", "served_at", "dropped_at")}
    per["accuracy_sum"] = [0.0] * n
    fam = {f: {k: [0] * n for k in ("demand", "served", "late", "dropped")} for f in families}
    for f in families:
        fam[f]["accuracy_sum"] = [0.0] * n
    for family, at, done_ms, outcome, accuracy, _v, _t in records:
        s = int(at // 1000)
        per["demand"][s] += 1
        fam[family]["demand"][s] += 1
        if outcome == "served":
            per["served"][s] += 1
            per["accuracy_sum"][s] += accuracy
            fam[family]["served"][s] += 1
            fam[family]["accuracy_sum"][s] += accuracy
            per["served_at"][int(done_ms // 1000)] += 1
            if done_ms - at > SLO_LATE_MS + 1e-6:
                per["late"][s] += 1
                fam[family]["late"][s] += 1
            if done_ms - at > ARTEFACT_LATE_MS:
                per["late_1000"][s] += 1
        elif outcome == "dropped":
            per["dropped"][s] += 1
            fam[family]["dropped"][s] += 1
            per["dropped_at"][int(done_ms // 1000)] += 1
        else:
            per["unresolved"][s] += 1

    fields = ("second", "demand", "served", "late", "late_1000", "dropped", "unresolved", "accuracy_sum", "served_at", "dropped_at")
    with (out / "per_second.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(fields)
        for s in range(n):
            w.writerow([s] + [round(per[k][s], 6) if k == "accuracy_sum" else per[k][s] for k in fields[1:]])
    with (out / "per_family.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("second", "family", "demand", "served", "late", "dropped", "accuracy_sum"))
        for s in range(n):
            for f in families:
                if fam[f]["demand"][s]:
                    w.writerow((s, f, fam[f]["demand"][s], fam[f]["served"][s], fam[f]["late"][s], fam[f]["dropped"][s],
                                round(fam[f]["accuracy_sum"][s], 6)))
    with (out / "queries.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("family", "arrival_ms", "done_ms", "outcome", "accuracy", "variant", "type"))
        for r in sorted(records, key=lambda r: (r[1], r[0])):
            w.writerow((r[0], int(r[1]), "" if math.isnan(r[2]) else round(r[2], 6), r[3], round(r[4], 6), r[5], r[6]))
    with (out / "runpy_log.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(runpy_rows[0]) if runpy_rows else ["simulation_time"])
        w.writeheader()
        w.writerows(runpy_rows)

    demand = len(arrivals)
    served = sum(per["served"])
    summary = {
        "scenario": folder, "seconds": args.seconds, "allocation": str(Path(args.allocation).resolve()), "config": str(config_path),
        "seed": args.seed if args.seed is not None else config.get("seed"), "wall_s": round(wall, 1), "steps": i,
        "demand": demand, "served": served, "dropped": sum(per["dropped"]), "unresolved": sum(per["unresolved"]),
        "served_by_removed_predictors": len(ghosts),
        "late_300ms": sum(per["late"]), "late_1000ms": sum(per["late_1000"]),
        "accuracy_sum": sum(per["accuracy_sum"]),
        "effective_accuracy": sum(per["accuracy_sum"]) / served if served else None,
        "violation_ratio_artefact": (demand - served + sum(per["late_1000"])) / demand if demand else None,
        "violation_ratio_slo": (demand - served + sum(per["late"])) / demand if demand else None,
        # The artefact's own counters (what run.py prints at the end, A: run.py:443-465), to check the records.
        "artefact_counters": {"total_successful": sim.total_successful, "timeouts": sim.slo_timeouts["timeouts"],
                              "late": sim.slo_timeouts["late"], "total_accuracy": sim.total_accuracy,
                              "requests_added": sim.requests_added},
        "runpy_log_totals": {k: sum(r[k] for r in runpy_rows) for k in ("demand", "successful", "dropped", "late", "total_accuracy")},
        "batch_size_counters": {str(k): v for k, v in sim.batch_size_counters.items()},
        "families": families,
        "effective_allocations": effective,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("scenario", "seconds", "wall_s", "demand", "served", "dropped", "unresolved",
                                              "late_300ms", "late_1000ms", "effective_accuracy", "violation_ratio_artefact",
                                              "violation_ratio_slo", "artefact_counters", "batch_size_counters")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
