"""Plumbing the reproduction benches share: formatting, parallel runs, CSV output, optional plotting,
and the monotone-profile variant of a problem. Imported as `_common` (the scripts' own folder is first on
sys.path when they run)."""
from __future__ import annotations

import csv
import dataclasses
import math
import multiprocessing
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from engine.plans.problem import Problem

PNG_SKIPPED = "PNG skipped: matplotlib is not installed (the `bench` extra); {name} not written, the CSV has every number."


def fmt(value: Any, spec: str) -> str:
    """`value` formatted with `spec`, or "-" when it is missing (None, "" or NaN)."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def plan_fair_share(problem: Problem, plan: Any) -> float | None:
    """The smallest served fraction of any application with demand (what the planners raise first); None
    when nothing has demand."""
    fractions = [plan.served_rps.get(a.name, 0.0) / a.demand_rps for a in problem.applications if a.demand_rps > 0]
    return min(fractions) if fractions else None


def ratio(a: float, b: float) -> float | None:
    if b > 0:
        return a / b
    return None if a == 0 else float("inf")


def monotone_profiles(problem: Problem) -> Problem:
    """The problem with every (variant, device type, slice) latency curve made non-decreasing in the batch
    size (running maximum over the profiled batches). The gpulets measurements are flat, and slightly
    decreasing, at small batches (e.g. resnet101 on 100 %: 9.11 ms at batch 1, 8.79 ms at batch 2)."""
    groups: dict[tuple[str, str, str], list] = defaultdict(list)
    for point in problem.profiles:
        groups[(point.variant, point.device_type, point.slice)].append(point)
    out = []
    for points in groups.values():
        highest = 0.0
        for point in sorted(points, key=lambda p: p.batch):
            highest = max(highest, point.latency_ms)
            out.append(point if point.latency_ms >= highest else dataclasses.replace(point, latency_ms=highest))
    return dataclasses.replace(problem, profiles=tuple(out))


def parallel_map(fn: Callable[[Any], dict[str, Any]], tasks: Sequence[Any], jobs: int) -> list[dict[str, Any]]:
    """`fn` over `tasks` in `jobs` forked workers (they inherit module state set up before the call), or in
    this process where fork is not available or one job is asked for."""
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(fn, tasks))
    return [fn(task) for task in tasks]


def csv_rows_write(path: Path, rows: Iterable[dict[str, Any]], fields: Sequence[str]) -> Path:
    """The rows' `fields` as CSV, floats rounded to 6 decimals."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items() if k in fields})
    return path


def pyplot_load():
    """matplotlib.pyplot on the Agg backend, or None when the `bench` extra is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def figure_write(plt, fig, path: Path, title: str) -> str:
    """Title, lay out, write at the benches' resolution and close `fig`; the line the bench prints."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def django_bench_setup(var_dir: Path) -> None:
    """Django on its embedded defaults in `var_dir` (SQLite there, no Redis), logging warnings only: for a
    bench that seeds the demo in a temporary folder."""
    import os

    os.environ["TESSERA_VAR_DIR"] = str(var_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.local")
    os.environ.pop("REDIS_URL", None)
    os.environ.pop("DATABASE_URL", None)
    os.environ["TESSERA_LOG_LEVEL"] = "WARNING"
    import django

    django.setup()


def service_arguments_add(parser, *, database: str, redis_db: int, keep_help: str = "leave the bench database behind") -> None:
    """The options of a bench that runs the control plane on its own PostgreSQL database and Redis database
    (each bench its own names, so two benches or a bench and CI never share one)."""
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432", help="server URL, without a database")
    parser.add_argument("--database", default=database, help="dropped and created for the run")
    parser.add_argument("--redis", default=f"redis://127.0.0.1:6379/{redis_db}", help="flushed for the run")
    parser.add_argument("--keep-database", action="store_true", help=keep_help)
