#!/usr/bin/env python
"""The control loop's reaction time: from a change in demand to every router on the new plan.
No paper figure: Proteus (ASPLOS'24 §6.3, Figure 5) shows SLO violations around a burst, not the time its
control path takes; the target is the issue's.

    .venv/bin/python benches/control_loop.py [--hosts 8] [--gpus-per-host 8] [--trials 4] [--agent-delay-s 1.0]

A simulated fleet of 64 A100-SXM4-40GB GPUs (MIG, `4g.20gb@0 3g.20gb@4` each) over 8 hosts, the demo's four
image-classification applications and their derived profiles, in the control plane's own process on
SQLite (embedded defaults). Each trial moves every application's demand (x2, then back) by writing the
per-second router reports a jump produces, and measures until every router holds the new tables:

- detect: until the planning watch (every 5 s, as beat runs it; its phase is random against the change)
  has seen the change and started a plan run;
- demand, snapshot, solve, validate, simulate, translate, diff: the plan run's own parts (proteus,
  headroom 1.25, 30 s time limit), auto-applied;
- rollout make / switch / break: the rollout's waves (half the hosts at a time). The agents are stand-ins
  that report a host converged `--agent-delay-s` after its desired state is written (labelled as such:
  a real agent's time is MIG operations and model loading, which this bench does not run);
- routers: 8 routers polling the active tables every second (a database read, as the API serves them),
  random phase; the trial's time is when the last one first holds the new tables. The break wave (old
  instances going) runs after the switch and is reported, but no router waits for it.

Target (issue 6): under 10 s. Writes bench-results/control_loop.csv (one row per trial) and a PNG.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_S = 10.0
WATCH_EVERY_S = 5.0
ROUTER_REFRESH_S = 1.0
# Base demand (rps); x2 needs about 60% of the fleet at the most accurate variants, so the plan moves
# variants and instances, not only traffic weights.
APPLICATIONS = {"classify-resnet": 6000.0, "classify-densenet": 3000.0, "classify-vgg": 3000.0, "classify-mobile": 6000.0}
CSV_FIELDS = ("trial", "demand_factor", "total_s", "detect_s", "demand_s", "snapshot_s", "solve_s", "validate_s", "simulate_s",
              "translate_s", "diff_s", "make_s", "switch_s", "break_s", "routers_s", "hosts_written", "plan", "verdict")


def django_setup(var_dir: Path) -> None:
    from _common import django_bench_setup

    django_bench_setup(var_dir)
    from django.conf import settings

    settings.TESSERA_JOBS_IN_THREAD = False  # the watch thread runs each job to its end, in order


def fleet_build(hosts: int, gpus: int) -> None:
    from django.core.management import call_command

    from apps.core.context import change_context
    from apps.inventory.models import Accelerator, GpuInstance, Host
    from apps.policies.models import ReplanPolicy
    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    demo_seed(admin_password="bench-password-1")
    with change_context(source="command"):
        Host.objects.update(status="maintenance")  # the demo's own hosts stay out of it
        for h in range(hosts):
            host = Host.objects.create(name=f"bench-{h + 1:02d}", backend="simulated", status="online", description="benches/control_loop.py")
            for g in range(gpus):
                gpu = Accelerator.objects.create(host=host, index=g, kind="gpu", uuid=f"GPU-bench-{h}-{g}", model_name="NVIDIA A100-SXM4-40GB",
                                                 memory_mb=40960, mig_capable=True, mig_enabled=True)
                for placement in ("4g.20gb@0", "3g.20gb@4"):
                    profile, start = placement.split("@")
                    GpuInstance.objects.create(accelerator=gpu, profile=profile, placement_start=int(start), state="ready")
        ReplanPolicy.objects.filter(name="default").update(auto_apply=True, debounce_seconds=0, demand_change_threshold=0.25)


def demand_write(factor: float) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.registry.models import Application
    from apps.telemetry.models import ApplicationSample

    ApplicationSample.objects.all().delete()
    now = timezone.now()
    rows: list = []
    for name, rps in APPLICATIONS.items():
        app = Application.objects.get(name=name)
        rows += [ApplicationSample(application=app, application_name=name, router="bench", at=now - timedelta(seconds=s), interval_s=1.0,
                                   arrivals=int(rps * factor), served=int(rps * factor)) for s in range(60)]
    ApplicationSample.objects.bulk_create(rows)


class StandInAgents(threading.Thread):
    """Reports a host converged `delay_s` after a new desired-state version appears (not a real agent)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(daemon=True)
        self.delay_s = delay_s
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from apps.deployments.models import HostDesiredState
        from apps.inventory.models import Host

        seen: dict[tuple[int, int], float] = {}
        try:
            while not self.stop.wait(0.05):
                now = time.monotonic()
                for host_id, version, converged in _latest_versions(HostDesiredState, Host):
                    if converged == version:
                        continue
                    first = seen.setdefault((host_id, version), now)
                    if now - first >= self.delay_s:
                        Host.objects.filter(pk=host_id).update(converged_version=version)
        finally:
            connection.close()


def _latest_versions(HostDesiredState, Host) -> list[tuple[int, int, int | None]]:
    from django.db.models import Max

    latest = dict(HostDesiredState.objects.values("host").annotate(v=Max("version")).values_list("host", "v"))
    converged = dict(Host.objects.filter(pk__in=latest).values_list("pk", "converged_version"))
    return [(h, v, converged.get(h)) for h, v in latest.items()]


class Routers(threading.Thread):
    """N routers refreshing the active tables every second at random phases; records when each first
    holds a given set of versions."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.n = n
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.held: list[dict[int, int]] = [{} for _ in range(n)]
        self.first_seen: dict[tuple[int, int, int], float] = {}  # (router, application, version) -> wall time
        self.lock = threading.Lock()

    def run(self) -> None:
        from django.db import connection

        from apps.deployments.models import RoutingTable

        due = [time.monotonic() + self.rng.random() * ROUTER_REFRESH_S for _ in range(self.n)]
        try:
            while not self.stop.is_set():
                i = min(range(self.n), key=due.__getitem__)
                self.stop.wait(max(0.0, due[i] - time.monotonic()))
                tables = dict(RoutingTable.objects.filter(active=True).values_list("application_id", "version"))
                seen = time.time()
                with self.lock:
                    self.held[i] = tables
                    for application, version in tables.items():
                        self.first_seen.setdefault((i, application, version), seen)
                due[i] += ROUTER_REFRESH_S
        finally:
            connection.close()

    def all_on_since(self, versions: dict[int, int]) -> float:
        """Wall time at which the last router first held every one of `versions`."""
        with self.lock:
            return max(self.first_seen[(i, a, v)] for i in range(self.n) for a, v in versions.items())

    def all_hold(self, versions: dict[int, int]) -> bool:
        with self.lock:
            return all(all(h.get(a) == v for a, v in versions.items()) for h in self.held)


def watch_loop(stop: threading.Event, phase_s: float) -> None:
    from django.db import connection

    from apps.planning.triggers import planning_watch

    try:
        if stop.wait(phase_s):
            return
        while True:
            planning_watch()
            if stop.wait(WATCH_EVERY_S):
                return
    finally:
        connection.close()


def trial(n: int, factor: float, routers: Routers, seed: int) -> dict[str, Any]:
    from apps.deployments.models import RoutingTable
    from apps.jobs.models import Job
    from apps.planning.models import Plan

    active_before = Plan.objects.filter(status="active").values_list("pk", flat=True).first()
    last_job = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    stop = threading.Event()
    watcher = threading.Thread(target=watch_loop, args=(stop, random.Random(seed).random() * WATCH_EVERY_S), daemon=True)
    demand_write(factor)
    t0, wall0 = time.monotonic(), time.time()
    watcher.start()
    try:
        deadline = t0 + 120
        while time.monotonic() < deadline:
            plan = Plan.objects.filter(status="active").exclude(pk=active_before).first()
            if plan is not None:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("no new active plan within 120 s")
        versions = dict(RoutingTable.objects.filter(active=True).values_list("application_id", "version"))
        while not routers.all_hold(versions):
            time.sleep(0.02)
        total = routers.all_on_since(versions) - wall0  # every router on the new plan (the break phase may still run)
    finally:
        stop.set()
        watcher.join(timeout=60)
    planning = Job.objects.get(pk=plan.job_id)
    rollout = Job.objects.filter(kind="rollout", pk__gt=last_job).order_by("-pk").first()
    seconds = planning.result.get("seconds", {})
    detect = planning.created.timestamp() - wall0
    row = {
        "trial": n, "demand_factor": factor, "total_s": total, "detect_s": detect,
        **{f"{k}_s": seconds.get(k) for k in ("demand", "snapshot", "solve", "validate", "translate", "diff")},
        "simulate_s": seconds.get("predict"),
        "make_s": rollout.result.get("make_s") if rollout else None, "switch_s": rollout.result.get("switch_s") if rollout else None,
        "break_s": rollout.result.get("break_s") if rollout else None, "plan": plan.pk,
        "hosts_written": sum(1 for h in plan.rollout.get("hosts", {}).values() if h.get("versions")),
    }
    switched = plan.rollout.get("switched_at")
    row["routers_s"] = total - (datetime.fromisoformat(switched).timestamp() - wall0) if switched else None  # pick-up after the switch
    row["verdict"] = "meets" if total < TARGET_S else "MISSES"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--agent-delay-s", type=float, default=1.0, help="stand-in agents report convergence this long after a write")
    parser.add_argument("--routers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-loop-") as tmp:
        django_setup(Path(tmp))
        from _common import csv_rows_write, fmt

        fleet_build(args.hosts, args.gpus_per_host)
        agents = StandInAgents(args.agent_delay_s)
        routers = Routers(args.routers, args.seed)
        agents.start()
        routers.start()
        print(f"Control loop reaction (benches/control_loop.py): {args.hosts} hosts x {args.gpus_per_host} A100-SXM4-40GB (MIG 4g+3g),"
              f" {len(APPLICATIONS)} applications; SQLite, jobs in-process; watch every {WATCH_EVERY_S:g} s; {args.routers} routers polling every"
              f" {ROUTER_REFRESH_S:g} s; stand-in agents converge {args.agent_delay_s:g} s after a write (not real agents)")
        rows = []
        for n in range(args.trials + 1):
            factor = 2.0 if n % 2 else 1.0  # trial 0 makes the first plan (baseline), then x2, x1, x2, ...
            row = trial(n, factor, routers, args.seed + n)
            if n > 0:
                rows.append(row)
                print(f"  trial {n} (demand x{factor:g}): {row['total_s']:.2f} s", flush=True)
        agents.stop.set()
        routers.stop.set()
    head = f"{'trial':>5} {'demand':>6} {'hosts':>5} {'total':>7} {'detect':>7} {'solve':>6} {'valid.':>6} {'simul.':>6} {'make':>6} {'switch':>6} {'break':>6} {'routers':>7}  verdict (< {TARGET_S:g} s)"
    print("\nseconds\n" + head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['trial']:>5} {'x' + format(r['demand_factor'], 'g'):>6} {r['hosts_written']:>5} {r['total_s']:>7.2f} {fmt(r['detect_s'], '.2f'):>7} {fmt(r['solve_s'], '.2f'):>6}"
              f" {fmt(r['validate_s'], '.2f'):>6} {fmt(r['simulate_s'], '.2f'):>6} {fmt(r['make_s'], '.2f'):>6} {fmt(r['switch_s'], '.3f'):>6}"
              f" {fmt(r['break_s'], '.2f'):>6} {fmt(r['routers_s'], '.2f'):>7}  {r['verdict']}")
    totals = [r["total_s"] for r in rows]
    print(f"\ntotal: mean {statistics.mean(totals):.2f} s, max {max(totals):.2f} s; target {TARGET_S:g} s")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {csv_rows_write(args.out / 'control_loop.csv', rows, CSV_FIELDS)} in {time.perf_counter() - started:.0f} s")
    print(plot(rows, args.out / "control_loop.png"))
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    from _common import PNG_SKIPPED, pyplot_load

    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    parts = [("detect_s", "detect"), ("solve_s", "solve"), ("validate_s", "validate"), ("simulate_s", "simulate"),
             ("make_s", "rollout: make"), ("switch_s", "switch"), ("routers_s", "routers pick up")]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for i, r in enumerate(rows):
        left = 0.0
        for key, label in parts:
            width = r.get(key) or 0.0
            ax.barh(i, width, left=left, label=label if i == 0 else None, color=plt.cm.tab10(parts.index((key, label))))
            left += width
        ax.text(r["total_s"] + 0.1, i, f"{r['total_s']:.1f} s", va="center", fontsize=8)
    ax.axvline(TARGET_S, color="k", ls="--", lw=0.8, label=f"target {TARGET_S:g} s")
    ax.set_yticks(range(len(rows)), [f"trial {r['trial']} (x{r['demand_factor']:g})" for r in rows])
    ax.set_xlabel("seconds from the demand change (parts stacked; other plan-run steps not drawn)")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.suptitle("Tessera control loop: demand change to every router on the new plan (64 simulated GPUs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


if __name__ == "__main__":
    sys.exit(main())
