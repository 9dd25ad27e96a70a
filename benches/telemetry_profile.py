#!/usr/bin/env python
"""Where an agent's metrics report spends its time on the way in (issue 22 section 3: "measure first where
the time goes"). A profile, not a throughput figure: `benches/telemetry.py` measures the rate.

    .venv/bin/python benches/telemetry_profile.py                  # 2 x 540 reports, PostgreSQL, about 40 s
    options: --reports N, --instances 7, --postgres postgresql://postgres@127.0.0.1:5432,
             --database tessera_profile (dropped and created), --sqlite (the embedded default instead),
             --top 25, --out bench-results

What runs: the control plane in this process (`controlplane.settings.local`, DJANGO_DEBUG=false, in-memory
channel layer), one host with its own agent token, and `--reports` agent-shaped metrics reports
(`benches/telemetry.py` report_body: 7 runtimes and 7 MIG instances on one A100 by default) posted one
after another through Django's test client: URL routing, middleware, token authentication, the DRF view,
validation, the ingest service and the commit, as `tessera serve` runs them, without Daphne's HTTP parsing
and ASGI hand-over (the client calls the WSGI handler). Each report has its own `at`, so every one is
stored (none is a duplicate).

It prints, per report: the wall time; the time inside SQL (every query, timed around the driver's
execute through `connection.execute_wrapper`, so a round trip to PostgreSQL is counted whole; the
transaction's BEGIN and COMMIT do not pass through it and count with the rest) and the number of
queries, by kind; the rest ("Python outside SQL", which includes COMMIT's wait for PostgreSQL's WAL
flush); and cProfile's functions grouped by where they live
(Django, DRF, psycopg, Tessera's apps, JSON, ...) by own time. Writes OUT/telemetry_profile.csv (one row
per group, plus the SQL statement kinds).
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import json
import os
import pstats
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Where a function lives -> the group it is counted under (first match wins).
GROUPS = (
    ("psycopg (driver)", re.compile(r"/psycopg")),
    ("sqlite3 (driver)", re.compile(r"sqlite3")),
    ("DRF", re.compile(r"/rest_framework/")),
    ("Django ORM", re.compile(r"/django/db/")),
    ("Django test client", re.compile(r"/django/test/")),
    ("Django HTTP, middleware, URLs", re.compile(r"/django/(core|http|middleware|urls|utils|contrib)/")),
    ("Django other", re.compile(r"/django/")),
    ("Tessera apps", re.compile(r"/apps/")),
    ("Tessera controlplane", re.compile(r"/controlplane/")),
    ("channels, asgiref", re.compile(r"/(channels|asgiref)/")),
    ("JSON", re.compile(r"json")),
    ("whitenoise", re.compile(r"whitenoise")),
)


def group_of(filename: str) -> str:
    for name, pattern in GROUPS:
        if pattern.search(filename):
            return name
    return "Python built-ins" if filename.startswith("~") or filename.startswith("<") else "other"


def sql_kind(sql: str) -> str:
    words = sql.lstrip().split(None, 3)
    head = words[0].upper() if words else "?"
    if head in ("INSERT", "UPDATE", "DELETE") and len(words) > 2:
        table = words[2] if head != "UPDATE" else words[1]
        return f"{head} {table.strip(chr(34))}"
    if head == "SELECT":
        found = re.search(r'FROM\s+"?(\w+)"?', sql, re.IGNORECASE)
        return f"SELECT {found.group(1)}" if found else "SELECT"
    return head


class SqlClock:
    """Time and count every query (a Django execute wrapper)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self.by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def __call__(self, execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            dt = time.perf_counter() - t0
            self.seconds += dt
            self.count += 1
            entry = self.by_kind[sql_kind(sql)]
            entry[0] += 1
            entry[1] += dt


def setup(args: argparse.Namespace, var_dir: Path) -> None:
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.local",
        "DJANGO_DEBUG": "false",
        "TESSERA_VAR_DIR": str(var_dir),
        "TESSERA_LOG_LEVEL": "WARNING",
    })
    os.environ.pop("REDIS_URL", None)
    if args.sqlite:
        os.environ.pop("DATABASE_URL", None)
    else:
        from benches.telemetry import database_recreate

        database_recreate(args.postgres, args.database)
        os.environ["DATABASE_URL"] = f"{args.postgres.rstrip('/')}/{args.database}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=600)
    parser.add_argument("--instances", type=int, default=7)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default="tessera_profile")
    parser.add_argument("--sqlite", action="store_true", help="the embedded SQLite default instead of PostgreSQL")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    if args.reports < 10:
        parser.error("--reports must be at least 10 (the first 10% are warm-up)")

    var_dir = Path(tempfile.mkdtemp(prefix="tessera-profile-"))
    setup(args, var_dir)
    from django.db import connection
    from django.test import Client

    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate
    from benches.telemetry import report_body

    host = Host.objects.create(name="profile-host")
    secret = host_agent_token_rotate(host=host)
    body = report_body({"name": host.name}, args.instances, [("classify", "resnet50"), ("detect", "yolo")], seed=0).decode()
    client = Client(HTTP_AUTHORIZATION=f"Token {secret}")
    url = f"/api/v1/hosts/{host.pk}/metrics/"
    t_base = int(time.time()) - 3 * args.reports - 60  # recent: older reports are refused (retention)

    def post(i: int) -> None:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_base + i))
        response = client.post(url, body.replace("@AT@", at), content_type="application/json")
        if response.status_code != 201:
            raise SystemExit(f"report {i}: HTTP {response.status_code}: {response.content[:300]!r}")

    warmup = max(5, args.reports // 10)
    for i in range(warmup):
        post(i)
    # The same number of reports without the profiler first: cProfile slows Python, not the database.
    plain_clock = SqlClock()
    with connection.execute_wrapper(plain_clock):
        t0 = time.perf_counter()
        for i in range(args.reports, 2 * args.reports - warmup):
            post(i)
        plain_wall = time.perf_counter() - t0
    clock = SqlClock()
    profiler = cProfile.Profile()
    with connection.execute_wrapper(clock):
        t0 = time.perf_counter()
        profiler.enable()
        for i in range(2 * args.reports - warmup, 3 * args.reports - 2 * warmup):
            post(i)
        profiler.disable()
        wall = time.perf_counter() - t0
    n = args.reports - warmup

    from apps.telemetry.models import GpuSample, RuntimeSample

    stored = RuntimeSample.objects.filter(host=host).count()
    expected = (warmup + 2 * n) * args.instances
    stats = pstats.Stats(profiler)
    own: dict[str, float] = defaultdict(float)
    profiled_total = 0.0
    for (filename, _line, _func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        own[group_of(filename)] += tottime
        profiled_total += tottime
    scale = wall / profiled_total if profiled_total else 1.0  # cProfile's own overhead spread evenly

    database = "SQLite (embedded)" if args.sqlite else f"PostgreSQL {args.database}"
    lines = [
        f"Telemetry ingest profile: {n} agent reports (after {warmup} warm-up), {args.instances} runtimes and "
        f"{args.instances} MIG instances each, {database}, Django test client (no Daphne), one process.",
        f"Stored runtime samples: {stored} of {expected} sent ({'all' if stored == expected else 'MISSING ROWS'}); "
        f"GPU samples {GpuSample.objects.filter(host=host).count()}.",
        "",
        f"per report, without the profiler: wall {1e3 * plain_wall / n:.2f} ms ({n / plain_wall:.0f} reports/s in this process), "
        f"SQL {1e3 * plain_clock.seconds / n:.2f} ms in {plain_clock.count / n:.1f} queries ({plain_clock.seconds / plain_wall:.0%}), "
        f"Python outside SQL {1e3 * (plain_wall - plain_clock.seconds) / n:.2f} ms",
        f"per report, under cProfile: wall {1e3 * wall / n:.2f} ms ({n / wall:.0f} reports/s in this process), "
        f"SQL {1e3 * clock.seconds / n:.2f} ms in {clock.count / n:.1f} queries, Python outside SQL {1e3 * (wall - clock.seconds) / n:.2f} ms",
        "",
        f"{'SQL statement (profiled pass)':<44} {'per report':>10} {'ms/report':>10}",
    ]
    rows: list[dict[str, Any]] = [
        {"section": "total", "name": "wall, no profiler", "per_report": 1, "ms_per_report": 1e3 * plain_wall / n, "share": 1.0},
        {"section": "total", "name": "SQL, no profiler", "per_report": plain_clock.count / n, "ms_per_report": 1e3 * plain_clock.seconds / n,
         "share": plain_clock.seconds / plain_wall},
    ]
    for kind, (count, seconds) in sorted(clock.by_kind.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{kind:<44} {count / n:>10.2f} {1e3 * seconds / n:>10.3f}")
        rows.append({"section": "sql", "name": kind, "per_report": count / n, "ms_per_report": 1e3 * seconds / n, "share": seconds / wall})
    lines += ["", f"{'where the time goes (own time, cProfile)':<44} {'ms/report':>10} {'share':>7}"]
    for name, seconds in sorted(own.items(), key=lambda kv: -kv[1]):
        ms = 1e3 * seconds * scale / n
        lines.append(f"{name:<44} {ms:>10.3f} {seconds / profiled_total:>7.1%}")
        rows.append({"section": "group", "name": name, "per_report": "", "ms_per_report": ms, "share": seconds / profiled_total})
    lines += ["", f"top {args.top} functions by own time:"]
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.top]  # type: ignore[attr-defined]
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in top:
        short = filename.split("site-packages/")[-1].replace(str(REPO) + "/", "")
        lines.append(f"  {1e3 * tottime / n:7.3f} ms  {ncalls / n:7.1f} calls  {short}:{line}({func})")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "telemetry_profile.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["section", "name", "per_report", "ms_per_report", "share"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "telemetry_profile.json").write_text(json.dumps({"reports": n, "plain_wall_s": plain_wall, "plain_sql_s": plain_clock.seconds, "profiled_wall_s": wall, "profiled_sql_s": clock.seconds, "queries": clock.count}, indent=1))
    print(f"\nwrote {out / 'telemetry_profile.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
