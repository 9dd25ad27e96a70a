#!/usr/bin/env python
"""The demo fleet planned by every planner the control loop may be given (issue 40: "the fleet model on the
demo fleet < 10 s"): the problem the live system builds (apps/planning/snapshot.py `fleet_problem_build`)
from the seeded demo (controlplane/demo.py: 6 MIG A100s, 2 MPS RTX 2080 Tis, one 16-core CPU host; four
image applications, a CPU pipeline and a four-member CPU ensemble), every application at `--base-rps`
(the demo sets no expected demand) times each of `--scales`, solved by `proteus` (the default, composed
with fa2 and gpulets) and `fleet`.

    .venv/bin/python benches/demo_plan.py [--base-rps 10] [--scales 1,10,30,100] [--out bench-results]

Prints a table (planner, status, wall time, served of demand, GPUs, gap, validator verdict) and writes
DIR/demo_plan.csv. SQLite in a temporary folder; the demo's CPU profiles are measured on this machine when
it is seeded (about half a minute), so served figures on the CPU host follow this machine's speed."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PLANNERS = ("proteus", "fleet")
TARGET_S = 10.0
CSV_FIELDS = ("scale", "planner", "plan_solver", "status", "wall_s", "fair_share", "served_rps", "demand_rps", "short_applications",
              "gpus_used", "gap", "valid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-rps", type=float, default=10.0, help="each application's demand at scale 1 (rps)")
    parser.add_argument("--scales", default="1,10,30,100", help="multiples of the base demand, comma-separated")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = parser.parse_args(argv)
    try:
        scales = [float(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--scales: numbers, comma-separated, got {args.scales!r}")
    if not scales or any(s <= 0 for s in scales):
        parser.error("--scales: one or more numbers > 0")
    if not args.base_rps > 0:
        parser.error("--base-rps: a number > 0")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-demo-plan-") as tmp:
        from _common import csv_rows_write, django_bench_setup, fmt, plan_fair_share

        django_bench_setup(Path(tmp))
        from django.core.management import call_command

        from apps.planning.snapshot import fleet_problem_build
        from apps.policies.models import SloPolicy
        from controlplane.demo import demo_seed
        from engine.plans.problem import SolveOptions
        from engine.plans.validate import plan_validate
        from engine.solvers.solve import plan_solve

        call_command("migrate", interactive=False, verbosity=0)
        demo_seed(admin_password="bench-password-1")
        expected = {p.application.name: p.expected_rps or args.base_rps for p in SloPolicy.objects.select_related("application")}
        print(f"demo fleet, demand at scale 1: {', '.join(f'{k} {v:g}' for k, v in sorted(expected.items()))} rps")
        print(f"{'scale':>5} {'planner':<8} {'plan':<22} {'status':<10} {'wall s':>7} {'fair':>5} {'served / demand':>17} {'short':<28} "
              f"{'GPUs':>4} {'gap':>7} valid")
        for scale in scales:
            snapshot = fleet_problem_build(demand={k: v * scale for k, v in expected.items()}, options=SolveOptions(), include_registered=True)
            problem = snapshot.problem
            if problem is None:
                print(f"nothing to plan: {'; '.join(snapshot.notes)}")
                return 1
            for planner in PLANNERS:
                started = time.perf_counter()
                plan = plan_solve(problem, planner)
                wall = time.perf_counter() - started
                short = sorted(a for a, rps in plan.shortfall_rps.items() if rps > 1e-6)
                fair = plan_fair_share(problem, plan)
                fair = 1.0 if fair is None else fair
                row = {"scale": scale, "planner": planner, "plan_solver": plan.solver, "status": plan.status, "wall_s": wall, "fair_share": fair,
                       "served_rps": plan.total_served_rps, "demand_rps": problem.total_demand_rps, "short_applications": " ".join(short),
                       "gpus_used": plan.gpus_used, "gap": plan.gap, "valid": plan_validate(problem, plan).valid}
                rows.append(row)
                print(f"{scale:>5g} {planner:<8} {plan.solver:<22} {plan.status:<10} {wall:>7.2f} {fair:>5.3f} "
                      f"{plan.total_served_rps:>8.1f} / {problem.total_demand_rps:<6.1f} {', '.join(short) or '-':<28} "
                      f"{plan.gpus_used:>4} {fmt(plan.gap, '.4f'):>7} {row['valid']}")
    slowest = max((r["wall_s"] for r in rows if r["planner"] == "fleet"), default=None)
    verdict = "met" if slowest is not None and slowest < TARGET_S else "missed"
    print(f"fleet model on the demo fleet: slowest {fmt(slowest, '.2f')} s (target < {TARGET_S:g} s: {verdict})")
    args.out.mkdir(parents=True, exist_ok=True)
    path = csv_rows_write(args.out / "demo_plan.csv", rows, CSV_FIELDS)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
