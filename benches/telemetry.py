#!/usr/bin/env python
"""Telemetry ingest: agent metric reports ingested per second, and the delay from a report to the browser.
No paper figure (none of the papers measures telemetry); the target is the issue's.

    .venv/bin/python benches/telemetry.py                       # full run, about 3 min on two cores
    .venv/bin/python benches/telemetry.py --quick               # smoke run, about 1 min
    options: --loads 1750,3500,7000,10500 (offered instance reports/s: agents x --instances), --instances 7, --duration 20,
             --warmup 5, --servers 1, --processes 1, --no-browser, --postgres URL, --database tessera_bench,
             --redis redis://127.0.0.1:6379/7, --out bench-results, --png docs/img/telemetry.png

What runs (all on this machine, sharing its cores; printed with the results):
- The control plane as production runs it: `tessera serve` (Daphne, HTTP and WebSocket, one process) on
  `controlplane.settings.local` with DJANGO_DEBUG=false, DATABASE_URL on a fresh PostgreSQL database
  (`--database`, dropped and created for each run, migrated, demo seed plus the bench's hosts) and
  REDIS_URL (the channels-redis layer; its Redis database is flushed first). Static files are collected
  and WhiteNoise serves them. `--servers K` runs K such processes on consecutive ports, the agents spread
  over them (the browser uses the first; with `--browser-server-alone` it takes no agent reports, as if
  agents and browsers had separate endpoints); the default is one.
- Agents: STAND-INS. One process (this one, asyncio) plays N agents. Each has its own host, registered
  with its own agent token, its own keep-alive HTTP/1.1 connection, and posts an agent-shaped
  `POST /api/v1/hosts/{id}/metrics/` (the shape of workers/agent/agent.py `metrics_tick`) once per
  second at its own phase (phases spread evenly over the second), one request at a time, as the real
  agent's metrics loop does (the next report a second after the previous one started, at once if that
  one took longer; 5 s timeout). A host has A100-SXM4-40GBs split into seven 1g.5gb MIG instances each,
  one runtime on each: a report carries `--instances` runtime records (default 7: one GPU; 56 is an
  8-GPU host) and as many MIG instance records plus each GPU's own. The numbers in it are fixed; no runtime, router or GPU runs.
- "instance reports/s" = runtime records ingested per second (agents x instances per agent per
  second: each becomes one RuntimeSample row); "HTTP reports/s" = metrics POSTs answered 201 per
  second. Offered loads are rounded to whole agents. The achieved rate is counted twice: from the 201
  answers, and from the RuntimeSample rows whose `at` falls in the measured window.
- Browser: Chromium (Playwright, /usr/bin/chromium, headless, same machine) logged in as the demo's
  viewer on /overview/, with `--dashboards` - 1 more overview pages open beside it (default 5 in all,
  issue 43's setting; each page its own WebSocket); a hook on the first page's `TesseraLive.on("metrics")`
  records, for every host in a push's `reports`, Date.now()/1000 - the report's `at` (stamped by the sender just before it sends; same
  clock). So the delay is sender -> Daphne -> PostgreSQL commit -> Redis channel layer -> the
  WebSocket consumer's roll-up (pushed within 0.2 s) -> the browser's JavaScript. "seen" counts the
  (host, at) pairs the browser received against the reports answered 201 (a host reporting twice
  between two pushes shows only its latest).
- Each load: `--warmup` s (connections opened, agents reporting, not measured), then `--duration` s
  measured: reports sent in that window count. CPU: per process group from /proc (the server
  process(es), PostgreSQL (postmaster and backends, dead ones through the postmaster's child times),
  Redis, the browser with Playwright's driver, this generator) in % of one core, and the machine's
  busy share of all its cores; "other" is CPU used by processes outside the bench (anything else running on
  the machine takes cores from the server: check it before trusting a row).
- `--db-pool` is a what-if, not the shipped configuration: the servers run the local settings plus
  DATABASES OPTIONS "pool" (Django's psycopg pool), from a settings module written to the run's temporary
  folder. Without it, as shipped, every request opens and closes its own PostgreSQL connection.
- Targets (issue 22 section 3): 1,000 agents' reports/s (a fleet of 1,000 one-GPU hosts) on 2 cores,
  nothing lost (the RuntimeSample and GpuSample rows of the window = reports sent x samples per report),
  browser p95 under 500 ms, and operators' API reads unaffected: an operator's GET /api/v1/hosts/?limit=50
  every 0.1 s, its p95 within 2x of the same probe's with no reports coming in (measured first). A load
  "keeps up" when at least 99 % of what it offers is answered 201, with no errors and nothing lost.
  (Issue 7's earlier target was 1,000 *instance* reports/s: 143 one-GPU agents.)

Writes OUT/telemetry.csv (one row per load) and the PNG (needs matplotlib).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PNG_SKIPPED, csv_rows_write, fmt, pyplot_load, service_arguments_add  # noqa: E402

TARGET_REPORTS = 1000.0  # agents' reports/s (HTTP): issue 22, a fleet of 1,000 GPU hosts reporting every second
TARGET_P95_S = 0.5
KEEP_UP = 0.99
INGEST_SCALING_TARGET = 1.8  # issue 43: two ingest processes against one, reports/s ingested
API_SLOWDOWN_MAX = 2.0  # operators' API p95 under load against idle: "unaffected" up to this ratio
API_PROBE_EVERY_S = 0.1
CHROMIUM = Path("/usr/bin/chromium")
MIG_PER_GPU = 7  # 1g.5gb instances on an A100-SXM4-40GB
REQUEST_TIMEOUT_S = 5.0  # the agent's client (workers/client.py)
CSV_FIELDS = (
    "offered_instance_rps", "agents", "instances_per_agent", "servers", "processes", "ingest_processes", "duration_s",
    "achieved_instance_rps", "db_instance_rps", "achieved_http_rps", "offered_http_rps", "sent", "ok", "errors", "timeouts",
    "http_p50_ms", "http_p95_ms", "http_p99_ms", "browser_p50_ms", "browser_p95_ms", "browser_p99_ms", "browser_max_ms",
    "browser_seen", "browser_pushes", "push_kb_mean",
    "samples_expected", "samples_stored", "samples_lost", "api_p50_ms", "api_p95_ms", "api_idle_p95_ms", "api_ratio",
    "cpu_server_pct", "cpu_postgres_pct", "cpu_redis_pct", "cpu_browser_pct", "cpu_generator_pct", "cpu_other_pct", "cpu_machine_pct",
    "browser_server_alone",
    "keeps_up", "rate_ratio", "p95_ratio", "verdict",
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- set-up


def bench_env(args, var_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.local",
        "DJANGO_DEBUG": "false",
        "DATABASE_URL": f"{args.postgres.rstrip('/')}/{args.database}",
        "REDIS_URL": args.redis,
        "TESSERA_VAR_DIR": str(var_dir),
        "TESSERA_LOG_LEVEL": "WARNING",
    })
    return env


def database_recreate(postgres_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{postgres_url.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def redis_flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def placements(instances: int) -> list[tuple[int, str]]:
    """(GPU index, placement) for `instances` 1g.5gb MIG instances, seven per A100-SXM4-40GB."""
    return [(i // MIG_PER_GPU, f"1g.5gb@{i % MIG_PER_GPU}") for i in range(instances)]


def fleet_seed(hosts: int, instances: int) -> dict[str, Any]:
    """Migrate, seed the demo (applications, variants, logins), add `hosts` bench hosts with agent tokens and
    collect static files. Returns the viewer's password, the hosts (id, name, token) and the
    (application, variant) pairs the stand-ins report."""
    from django.core.management import call_command
    from django.db import connection, transaction

    from apps.core.context import change_context
    from apps.inventory.models import Accelerator, GpuInstance, Host
    from apps.inventory.services import host_agent_token_rotate
    from apps.registry.models import ModelVariant
    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    seeded = demo_seed(admin_password="bench-admin-password-1")
    call_command("collectstatic", interactive=False, verbosity=0)
    gpus = sorted({g for g, _ in placements(instances)})
    out = []
    with change_context(source="command"), transaction.atomic():
        created = Host.objects.bulk_create([
            Host(name=f"bench-{h + 1:04d}", address="127.0.0.1", backend="simulated", status="online",
                 labels={"bench": "telemetry"}, description="benches/telemetry.py stand-in agent")
            for h in range(hosts)
        ])
        accelerators = Accelerator.objects.bulk_create([
            Accelerator(host=host, index=g, kind="gpu", uuid=f"GPU-bench-{host.name}-{g}", model_name="NVIDIA A100-SXM4-40GB",
                        memory_mb=40960, mig_capable=True, mig_enabled=True)
            for host in created for g in gpus
        ])
        by_key = {(a.host_id, a.index): a for a in accelerators}
        GpuInstance.objects.bulk_create([
            GpuInstance(accelerator=by_key[(host.pk, g)], profile=p.split("@")[0], placement_start=int(p.split("@")[1]),
                        placement_size=1, state="ready")  # bulk: save() would look the size up (1g.5gb: one slice)
            for host in created for g, p in placements(instances)
        ])
        for host in created:
            out.append({"id": host.pk, "name": host.name, "token": host_agent_token_rotate(host=host)})
    variants = list(ModelVariant.objects.exclude(application__name="tabular-cpu").order_by("application__name", "name")
                    .values_list("application__name", "name"))
    from django.contrib.auth import get_user_model

    from apps.users.services import token_create

    _, operator_token = token_create(user=get_user_model().objects.get(username="operator"), description="benches/telemetry.py API probe")
    connection.close()
    return {"viewer_password": seeded.logins["viewer"], "hosts": out, "variants": variants, "operator_token": operator_token}


def server_start(env: dict[str, str], port: int, log: Path, processes: int = 1, command: str = "serve") -> subprocess.Popen:
    """`tessera serve` (Daphne) on 127.0.0.1:port, with `processes` Daphne processes on that one socket;
    `command="ingest"`: `tessera ingest` (uvicorn, the data plane's HTTP API) instead."""
    fh = log.open("w")
    return subprocess.Popen([str(REPO / ".venv" / "bin" / "tessera"), command, "--bind", "127.0.0.1", "--port", str(port),
                             "--processes", str(processes)],
                            env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def server_wait(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                s.sendall(b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server on port {port} did not answer within {timeout_s:g} s")


def port_free_find(count: int) -> int:
    """The first of `count` consecutive free ports from 18400."""
    base = 18400
    while True:
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
        base += count


# --------------------------------------------------------------------------- CPU accounting from /proc


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(comm, ppid, own ticks, reaped children's ticks) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def cpu_snapshot(server_pids: set[int], browser_root: int | None) -> dict[str, float]:
    """Cumulative CPU seconds per group, and the machine's busy and total seconds."""
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                procs[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)

    def tree(root: int) -> set[int]:
        seen, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo += children.get(pid, [])
        return seen

    out = {"server": 0.0, "postgres": 0.0, "redis": 0.0, "browser": 0.0}
    for pid in server_pids:
        for p in tree(pid):
            if p in procs:
                out["server"] += (procs[p][2] + (procs[p][3] if p == pid else 0)) / CLK_TCK
    for pid, (comm, ppid, own, reaped) in procs.items():
        if comm.startswith("postgres"):
            postmaster = not procs.get(ppid, ("",))[0].startswith("postgres")  # it reaps the backends
            out["postgres"] += (own + (reaped if postmaster else 0)) / CLK_TCK
        elif comm.startswith("redis-server"):
            out["redis"] += own / CLK_TCK
    if browser_root is not None:
        servers = set().union(*(tree(pid) for pid in server_pids)) if server_pids else set()
        for p in tree(browser_root) - {os.getpid()} - servers:
            if p in procs:
                out["browser"] += (procs[p][2] + procs[p][3]) / CLK_TCK
    t = os.times()
    out["generator"] = t.user + t.system
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    out["machine_busy"] = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / CLK_TCK  # user nice system irq softirq
    out["machine_total"] = sum(fields[:8]) / CLK_TCK  # ... + idle iowait steal
    return out


# --------------------------------------------------------------------------- stand-in agents


class HttpConnection:
    """A minimal keep-alive HTTP/1.1 client (Content-Length or chunked answers): cheaper than a general one,
    so that the generator leaves the cores to the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        self.writer.write(data)
        line = await self.reader.readline()
        if not line:
            raise ConnectionError("closed by the server")
        status = int(line.split(None, 2)[1])
        length, chunked, close = None, False, False
        while True:
            h = await self.reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            body = b""
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                body += await self.reader.readexactly(size)
                await self.reader.readline()
        elif length is not None:
            body = await self.reader.readexactly(length)
        else:
            body = await self.reader.read()
            close = True
        if close:
            self.close()
        return status, body


@dataclass
class Sent:
    at: float  # the report's `at` (epoch), stamped just before it is sent
    latency_s: float | None  # request written to answer read; None on a timeout or a broken connection
    status: int  # 0: no answer


@dataclass
class Agent:
    host: dict
    port: int
    body: bytes  # the report with "@AT@" where its time goes
    phase_s: float
    sent: list[Sent] = field(default_factory=list)

    def request_bytes(self, at_iso: str) -> bytes:
        body = self.body.replace(b"@AT@", at_iso.encode())
        return (f"POST /api/v1/hosts/{self.host['id']}/metrics/ HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Bearer {self.host['token']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def run(self, start: float, stop: float) -> None:
        """Report every second from `start + phase` until `stop` (monotonic), one request at a time."""
        conn = HttpConnection(self.port)
        try:
            await conn.open()
            due = start + self.phase_s
            while True:
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                if time.monotonic() >= stop:
                    return
                began = time.monotonic()
                wall = time.time()
                data = self.request_bytes(datetime.fromtimestamp(wall, timezone.utc).isoformat())
                try:
                    status, _ = await asyncio.wait_for(conn.request(data), REQUEST_TIMEOUT_S)
                    self.sent.append(Sent(wall, time.monotonic() - began, status))
                except (OSError, asyncio.TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
                    conn.close()
                    self.sent.append(Sent(wall, None, 0))
                due = began + 1.0  # as the agent's metrics loop: a second after the last one started
        finally:
            conn.close()


def report_body(host: dict, instances: int, variants: list[tuple[str, str]], seed: int) -> bytes:
    """An agent-shaped metrics report (workers/agent/agent.py metrics_tick) with `"at": "@AT@"`."""
    layout = placements(instances)
    gpus = []
    for g in sorted({g for g, _ in layout}):
        gpus.append({
            "index": g, "uuid": f"GPU-bench-{host['name']}-{g}", "utilization_pct": 61.5, "memory_used_mb": 9000, "power_w": 251.0,
            "simulated": True,
            "instances": [{"placement": p, "gr_engine_active_pct": 40.0 + i % 7 * 5, "memory_used_mb": 1200 + 10 * (i % 7)}
                          for i, (gg, p) in enumerate(layout) if gg == g],
        })
    runtimes = []
    for i, (g, p) in enumerate(layout):
        application, variant = variants[(seed + i) % len(variants)]
        runtimes.append({
            "key": f"gpu{g}/{p}", "application": application, "variant": variant, "arrivals": 40, "served": 40, "late": 0,
            "dropped": 0, "queue_length": 1, "batches": 10, "batch_size_mean": 4.0, "latency_p50_ms": 12.5, "latency_p99_ms": 21.0,
        })
    return json.dumps({"at": "@AT@", "interval_s": 1.0, "gpus": gpus, "runtimes": runtimes}, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- the browser

HOOK = """() => {
  if (window.__bench) return true;
  window.__bench = {delays: [], pushes: 0, chars: 0};
  TesseraLive.on("metrics", function (m) {
    var now = Date.now() / 1000;
    window.__bench.pushes += 1;
    var reports = m.reports || {};
    Object.keys(reports).forEach(function (host) {
      if (host.indexOf("bench-") === 0) window.__bench.delays.push([host, reports[host], now - reports[host]]);
    });
  });
  return true;
}"""
DRAIN = """() => { var b = window.__bench; var out = {delays: b.delays, pushes: b.pushes}; b.delays = []; b.pushes = 0; return out; }"""


async def browser_open(playwright, base_url: str, password: str, dashboards: int = 1):
    """Chromium logged in as the viewer on /overview/, the page measured; `dashboards` - 1 more overview pages
    of the same session stay open beside it, each with its own WebSocket (the load of several operators)."""
    browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})  # one session for every page
    page = await context.new_page()
    page.set_default_timeout(30_000)
    sizes: list[int] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: sizes.append(len(payload))))
    await page.goto(f"{base_url}/login/?next=/overview/")
    await page.fill("#id_username", "viewer")
    await page.fill("#id_password", password)
    await page.click("form button[type=submit]")
    await page.wait_for_url(f"{base_url}/overview/")
    await page.wait_for_function("() => window.TesseraLive && TesseraLive.state.connected")
    await page.evaluate(HOOK)
    for _ in range(dashboards - 1):
        other = await context.new_page()
        await other.goto(f"{base_url}/overview/")
        await other.wait_for_function("() => window.TesseraLive && TesseraLive.state.connected")
    return browser, page, sizes


# --------------------------------------------------------------------------- one load


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def db_count(host_ids: list[int], t0: float, t1: float) -> tuple[int, int]:
    """(RuntimeSample rows, GpuSample rows) of these hosts with `at` in [t0, t1)."""
    from django.db import connection

    from apps.telemetry.models import GpuSample, RuntimeSample

    window = {"host_id__in": host_ids, "at__gte": datetime.fromtimestamp(t0, timezone.utc), "at__lt": datetime.fromtimestamp(t1, timezone.utc)}
    try:
        return RuntimeSample.objects.filter(**window).count(), GpuSample.objects.filter(**window).count()
    finally:
        connection.close()


def samples_per_report(instances: int) -> int:
    """Rows one report stores: a RuntimeSample per runtime, a GpuSample per GPU and per MIG instance."""
    return instances + len({g for g, _ in placements(instances)}) + instances


async def api_probe(port: int, token: str, until: float) -> list[float]:
    """An operator's API reads (GET /api/v1/hosts/, a page of 50) every API_PROBE_EVERY_S until `until`
    (monotonic): their latencies in s. A failed read counts as the client's timeout."""
    import httpx

    latencies = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_S,
                                 headers={"Authorization": f"Token {token}"}) as client:
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                ok = (await client.get("/api/v1/hosts/", params={"limit": 50})).status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.monotonic() - started if ok else REQUEST_TIMEOUT_S)
            await asyncio.sleep(max(0.0, API_PROBE_EVERY_S - (time.monotonic() - started)))
    return latencies


def api_port(args, ports: list[int]) -> int:
    """Where the operators' reads go: the browser's server, unless it is set apart (the last server then)."""
    return ports[-1] if args.browser_server_alone and len(ports) > 1 else ports[0]


async def load_run(args, load: float, seeded: dict, ports: list[int], page, frame_sizes: list[int], server_pids: set[int],
                   browser_root: int | None) -> dict[str, Any]:
    agents_n = max(1, round(load / args.instances))
    hosts = seeded["hosts"][:agents_n]
    agent_ports = [args.ingest_port] if args.ingest_port else ports[1:] if args.browser_server_alone and len(ports) > 1 else ports
    agents = [Agent(host=h, port=agent_ports[i % len(agent_ports)], body=report_body(h, args.instances, seeded["variants"], i), phase_s=i / agents_n)
              for i, h in enumerate(hosts)]
    start = time.monotonic() + 0.5
    t0_mono = start + args.warmup
    t1_mono = t0_mono + args.duration
    wall_offset = time.time() - time.monotonic()
    tasks = [asyncio.ensure_future(a.run(start, t1_mono)) for a in agents]
    await asyncio.sleep(max(0.0, t0_mono - time.monotonic()))
    probe = asyncio.ensure_future(api_probe(api_port(args, ports), seeded["operator_token"], t1_mono))
    if page is not None:
        await page.evaluate(DRAIN)
    frame_sizes.clear()
    cpu0 = cpu_snapshot(server_pids, browser_root)
    await asyncio.sleep(max(0.0, t1_mono - time.monotonic()))
    cpu1 = cpu_snapshot(server_pids, browser_root)
    await asyncio.gather(*tasks)  # reports in flight finish (or time out)
    await asyncio.sleep(1.0)  # the last roll-ups reach the browser
    t0, t1 = t0_mono + wall_offset, t1_mono + wall_offset
    sent = [s for a in agents for s in a.sent if t0 <= s.at < t1]
    ok = [s for s in sent if s.status == 201]
    errors = [s for s in sent if s.status not in (201, 0)]
    timeouts = [s for s in sent if s.status == 0]
    latencies = [s.latency_s for s in ok]
    delays, pushes = [], 0
    if page is not None:
        drained = await page.evaluate(DRAIN)
        pushes = drained["pushes"]
        seen = {(h, at): d for h, at, d in drained["delays"] if t0 <= at < t1}
        delays = list(seen.values())
    api = await probe
    runtime_rows, gpu_rows = await asyncio.to_thread(db_count, [h["id"] for h in hosts], t0, t1)
    rows_in_db = runtime_rows
    expected = len(sent) * samples_per_report(args.instances)  # every report sent in the window, stored once
    elapsed = cpu1["machine_total"] - cpu0["machine_total"]
    wall = t1 - t0

    def pct(key: str) -> float:
        return 100.0 * (cpu1[key] - cpu0[key]) / wall

    achieved = len(ok) * args.instances / args.duration
    offered = agents_n * args.instances
    lost = expected - (runtime_rows + gpu_rows)
    keeps_up = len(ok) >= KEEP_UP * agents_n * args.duration and not errors and not timeouts and lost == 0
    p95 = percentile(delays, 0.95)
    api_p95, api_idle = percentile(api, 0.95), seeded.get("api_idle_p95_s")
    row = {
        "offered_instance_rps": offered, "agents": agents_n, "instances_per_agent": args.instances, "servers": len(ports), "processes": args.processes,
        "ingest_processes": args.ingest_processes,
        "duration_s": args.duration, "achieved_instance_rps": achieved, "db_instance_rps": rows_in_db / args.duration,
        "achieved_http_rps": len(ok) / args.duration, "offered_http_rps": float(agents_n), "sent": len(sent), "ok": len(ok),
        "errors": len(errors), "timeouts": len(timeouts),
        "http_p50_ms": _ms(percentile(latencies, 0.5)), "http_p95_ms": _ms(percentile(latencies, 0.95)),
        "http_p99_ms": _ms(percentile(latencies, 0.99)),
        "browser_p50_ms": _ms(percentile(delays, 0.5)), "browser_p95_ms": _ms(p95), "browser_p99_ms": _ms(percentile(delays, 0.99)),
        "browser_max_ms": _ms(max(delays) if delays else None), "browser_seen": len(delays) if page is not None else None,
        "browser_pushes": pushes if page is not None else None,
        "push_kb_mean": statistics.mean(frame_sizes) / 1024 if frame_sizes else None,
        "samples_expected": expected, "samples_stored": runtime_rows + gpu_rows, "samples_lost": lost,
        "api_p50_ms": _ms(percentile(api, 0.5)), "api_p95_ms": _ms(api_p95), "api_idle_p95_ms": _ms(api_idle),
        "api_ratio": api_p95 / api_idle if api_p95 is not None and api_idle else None,
        "cpu_server_pct": pct("server"), "cpu_postgres_pct": pct("postgres"), "cpu_redis_pct": pct("redis"),
        "cpu_browser_pct": pct("browser") if page is not None else None, "cpu_generator_pct": pct("generator"),
        "cpu_machine_pct": 100.0 * (cpu1["machine_busy"] - cpu0["machine_busy"]) / elapsed if elapsed > 0 else None,
        "cpu_other_pct": max(0.0, 100.0 * (cpu1["machine_busy"] - cpu0["machine_busy"]) / wall - sum(
            pct(k) for k in ("server", "postgres", "redis", "generator", "browser"))),
        "browser_server_alone": bool(args.browser_server_alone and len(ports) > 1),
        "keeps_up": keeps_up, "rate_ratio": (len(ok) / args.duration) / TARGET_REPORTS,
        "p95_ratio": (p95 / TARGET_P95_S) if p95 is not None else None,
    }
    good_delay = p95 is not None and p95 < TARGET_P95_S
    api_unaffected = row["api_ratio"] is not None and row["api_ratio"] <= API_SLOWDOWN_MAX
    row["verdict"] = ("meets" if keeps_up and good_delay and api_unaffected else
                      "behind" if not keeps_up else "api slowed" if not api_unaffected else "slow" if page is not None else "no browser")
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


# --------------------------------------------------------------------------- main


async def trials(args, seeded: dict, ports: list[int], server_pids: set[int]) -> list[dict[str, Any]]:
    rows = []
    playwright = browser = page = None
    frame_sizes: list[int] = []
    browser_root = None
    try:
        if not args.no_browser:
            from playwright.async_api import async_playwright

            playwright = await async_playwright().start()
            browser, page, frame_sizes = await browser_open(playwright, f"http://127.0.0.1:{ports[0]}", seeded["viewer_password"],
                                                             args.dashboards)
            browser_root = os.getpid()  # Playwright's driver and Chromium are this process's descendants
        idle = await api_probe(api_port(args, ports), seeded["operator_token"], time.monotonic() + min(args.duration, 10.0))
        seeded["api_idle_p95_s"] = percentile(idle, 0.95)
        print(f"  operators' API with no reports coming in: p50 {_ms(percentile(idle, 0.5)):.1f} ms,"
              f" p95 {_ms(seeded['api_idle_p95_s']):.1f} ms ({len(idle)} reads of GET /api/v1/hosts/?limit=50)", flush=True)
        for load in args.loads:
            row = await load_run(args, load, seeded, ports, page, frame_sizes, server_pids, browser_root)
            rows.append(row)
            print(f"  offered {row['offered_instance_rps']:>5.0f}/s ({row['agents']} agents): ingested {row['achieved_instance_rps']:.0f}/s,"
                  f" browser p95 {fmt(row['browser_p95_ms'], '.0f')} ms, server CPU {row['cpu_server_pct']:.0f}%: {row['verdict']}", flush=True)
            await asyncio.sleep(2.0)  # the previous load's hosts leave the live window before the next starts
    finally:
        if browser is not None:
            await browser.close()
        if playwright is not None:
            await playwright.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", default="1750,3500,7000,10500", help="offered instance reports/s, comma-separated (agents x --instances)")
    parser.add_argument("--instances", type=int, default=7, help="runtime records per report (MIG instances per host)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per load")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before each load's window")
    parser.add_argument("--servers", type=int, default=1, help="`tessera serve` instances on separate ports (agents spread over them)")
    parser.add_argument("--processes", type=int, default=1, help="Daphne processes per `tessera serve` (--processes: one socket)")
    parser.add_argument("--ingest-processes", default="0",
                        help="agents post to `tessera ingest --processes K` (uvicorn) instead; browser and API probe stay on `serve`."
                             " A list (1,2) runs every load once per count, one after the other, and prints how ingest scales")
    parser.add_argument("--no-browser", action="store_true", help="skip Chromium (no delay to the browser)")
    parser.add_argument("--dashboards", type=int, default=5, help="overview pages open in Chromium (the first is measured; issue 43: 5)")
    parser.add_argument("--browser-server-alone", action="store_true",
                        help="with --servers K > 1: the browser's server (the first) takes neither agent reports nor the"
                             " operators' API reads (those go to the last): docs/deploy.md, 'The browser's server apart'")
    parser.add_argument("--quick", action="store_true", help="smoke run: loads 700,7000, 6 s each")
    service_arguments_add(parser, database="tessera_bench", redis_db=7)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "telemetry.png")
    args = parser.parse_args(argv)
    if args.dashboards < 1:
        parser.error("--dashboards must be >= 1")
    if args.quick:
        args.loads, args.duration, args.warmup = "700,7000", 6.0, 3.0
    args.loads = [float(x) for x in args.loads.split(",") if x.strip()]
    try:
        counts = [int(x) for x in str(args.ingest_processes).split(",") if x.strip()]
    except ValueError:
        parser.error(f"--ingest-processes must be a count or a comma-separated list of counts, got {args.ingest_processes!r}")
    if not counts or any(k < 0 for k in counts):
        parser.error("--ingest-processes: counts must be >= 0")
    args.ingest_processes = counts[0]
    if not args.no_browser and not CHROMIUM.exists():
        print(f"no Chromium at {CHROMIUM}: running without the browser")
        args.no_browser = True
    started = time.perf_counter()
    servers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-telemetry-") as tmp:
        var_dir = Path(tmp)
        env = bench_env(args, var_dir)
        os.environ.update({k: env[k] for k in ("DJANGO_DEBUG", "DATABASE_URL", "REDIS_URL", "TESSERA_VAR_DIR", "TESSERA_LOG_LEVEL")})
        os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings.local"  # this process only seeds and counts
        busy0 = cpu_snapshot(set(), None)
        time.sleep(2.0)
        busy1 = cpu_snapshot(set(), None)
        background = 100.0 * (busy1["machine_busy"] - busy0["machine_busy"]) / max(1e-9, busy1["machine_total"] - busy0["machine_total"])
        database_recreate(args.postgres, args.database)
        redis_flush(args.redis)
        import django

        django.setup()
        hosts_needed = max(max(1, round(load / args.instances)) for load in args.loads)
        seeded = fleet_seed(hosts_needed, args.instances)
        print(f"Telemetry ingest (benches/telemetry.py): PostgreSQL {args.database} (fresh), Redis {args.redis} channel layer,"
              f" {args.servers} x `tessera serve --processes {args.processes}` (Daphne, DEBUG off)"
              + (f", agents on `tessera ingest --processes {'/'.join(map(str, counts))}` (uvicorn)" if any(counts) else "")
              + f"; {os.cpu_count()} cores shared by everything.\n"
              f"  Agents are STAND-INS: one asyncio process, one keep-alive connection and one report per second each;"
              f" a report = {math.ceil(args.instances / MIG_PER_GPU)} A100 GPU(s), {args.instances} MIG instances, {args.instances} runtimes (no runtime runs).\n"
              f"  Browser: {'none' if args.no_browser else f'Chromium (headless, same machine) as viewer, {args.dashboards} overview page(s) open, the first measured'};"
              f" {args.warmup:g} s warm-up + {args.duration:g} s measured per load.\n"
              f"  Machine busy before the bench started: {background:.0f}% of its cores", flush=True)
        base = port_free_find(args.servers + len(counts))
        ports = [base + k for k in range(args.servers)]
        rows = []
        try:
            for k, port in enumerate(ports):
                servers.append(server_start(env, port, var_dir / f"server-{k}.log", args.processes))
            for k, port in enumerate(ports):
                server_wait(port, servers[k], var_dir / f"server-{k}.log")
            for j, count in enumerate(counts):  # the serve processes stay; the ingest service is started per count
                args.ingest_processes = count
                args.ingest_port = base + args.servers + j if count else None
                ingest = None
                if count:
                    log = var_dir / f"server-{len(servers)}.log"
                    ingest = server_start(env, args.ingest_port, log, count, "ingest")
                    servers.append(ingest)
                    server_wait(args.ingest_port, ingest, log)
                rows += asyncio.run(trials(args, seeded, ports, {p.pid for p in servers if p.poll() is None}))
                if ingest is not None and j < len(counts) - 1:
                    os.killpg(ingest.pid, signal.SIGTERM)
                    ingest.wait(timeout=30)
        finally:
            for proc in servers:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in servers:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            for k in range(len(servers)):
                log = (var_dir / f"server-{k}.log").read_text()
                errors = [line for line in log.splitlines() if line and not line[0].isspace() and " ERROR " not in line
                          and ("Error:" in line or "Exception:" in line)]  # the exceptions' own lines, not the log's
                if errors:
                    kinds = sorted({e[:160] for e in errors})
                    print(f"server {k}: {log.count('Traceback')} tracebacks in its log; distinct errors:\n  " + "\n  ".join(kinds[:5]))
            from django.db import connections

            connections.close_all()
            if not args.keep_database:
                database_recreate(args.postgres, args.database)  # leave it empty rather than holding gigabytes
    table_print(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {csv_rows_write(args.out / 'telemetry.csv', rows, CSV_FIELDS)} in {time.perf_counter() - started:.0f} s")
    print(plot(rows, args.png, args))
    return 0


def table_print(rows: list[dict[str, Any]], args) -> None:
    head = (f"{'ingest':>6} {'reports/s':>9} {'ingested':>8} {'inst/s':>7} {'lost':>5} {'err':>4} {'http p50':>8} {'p95':>6} {'p99':>6}"
            f" {'browser p50':>11} {'p95':>6} {'max':>6} {'seen':>6} {'api p95':>7} {'x idle':>6} {'cpu srv':>7} {'pg':>4} {'redis':>5}"
            f" {'brws':>4} {'gen':>4} {'other':>5} {'machine':>7}  verdict")
    print("\nagents' reports/s (offered = agents, ingested = 201 answers; inst/s = runtime records stored per second);"
          " lost = samples expected for the reports sent minus samples stored; latencies in ms; api = an operator's"
          f" GET /api/v1/hosts/ meanwhile; CPU in % of one core (machine: % of all {os.cpu_count()})\n" + head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['ingest_processes'] or 'serve':>6} {r['offered_http_rps']:>9.0f} {r['achieved_http_rps']:>8.1f} {r['db_instance_rps']:>7.0f} {r['samples_lost']:>5}"
              f" {r['errors'] + r['timeouts']:>4} {fmt(r['http_p50_ms'], '.1f'):>8} {fmt(r['http_p95_ms'], '.0f'):>6}"
              f" {fmt(r['http_p99_ms'], '.0f'):>6} {fmt(r['browser_p50_ms'], '.0f'):>11} {fmt(r['browser_p95_ms'], '.0f'):>6}"
              f" {fmt(r['browser_max_ms'], '.0f'):>6} {fmt(r['browser_seen'], 'd'):>6} {fmt(r['api_p95_ms'], '.0f'):>7}"
              f" {fmt(r['api_ratio'], '.2f'):>6} {r['cpu_server_pct']:>7.0f} {r['cpu_postgres_pct']:>4.0f} {r['cpu_redis_pct']:>5.0f}"
              f" {fmt(r['cpu_browser_pct'], '.0f'):>4} {r['cpu_generator_pct']:>4.0f} {r['cpu_other_pct']:>5.0f}"
              f" {fmt(r['cpu_machine_pct'], '.0f'):>7}  {r['verdict']}")
    ingest_scaling_print(rows)
    at_target = [r for r in rows if r["offered_http_rps"] >= TARGET_REPORTS]
    best = max((r for r in rows if r["verdict"] == "meets"), key=lambda r: r["achieved_http_rps"], default=None)
    print(f"\ntarget (issue 22): {TARGET_REPORTS:.0f} agents' reports/s with nothing lost, browser p95 < {TARGET_P95_S * 1000:.0f} ms"
          f" and operators' API p95 within {API_SLOWDOWN_MAX:g}x of idle, on {os.cpu_count()} cores")
    if best is not None:
        print(f"  highest load met: {best['achieved_http_rps']:.0f} reports/s ({best['rate_ratio']:.2f}x the target rate),"
              f" browser p95 {best['browser_p95_ms']:.0f} ms ({fmt(best['p95_ratio'], '.2f')}x the target delay),"
              f" API p95 {fmt(best['api_ratio'], '.2f')}x idle")
    target_row = min(at_target, key=lambda r: r["offered_http_rps"], default=None)
    if target_row is not None:
        print(f"  at {target_row['offered_http_rps']:.0f} offered: {target_row['verdict']}"
              f" (ingested {target_row['achieved_http_rps']:.0f}/s, lost {target_row['samples_lost']} samples,"
              f" browser p95 {fmt(target_row['browser_p95_ms'], '.0f')} ms, API p95 {fmt(target_row['api_ratio'], '.2f')}x idle)")
    print("  (stand-in agents; the browser, PostgreSQL, Redis and the generator share the same cores as the server;"
          " 'other' is CPU of processes outside the bench, which the numbers above had to share)")


def ingest_scaling_print(rows: list[dict[str, Any]]) -> None:
    """With more than one ingest process count: per offered load, reports ingested against one process's."""
    counts = sorted({r["ingest_processes"] for r in rows if r["ingest_processes"]})
    if len(counts) < 2:
        return
    print(f"\ningest scaling (issue 43: two processes >= {INGEST_SCALING_TARGET:g}x one), reports/s ingested:")
    for offered in sorted({r["offered_http_rps"] for r in rows}):
        by = {r["ingest_processes"]: r for r in rows if r["offered_http_rps"] == offered}
        one = by.get(counts[0])
        if one is None:
            continue
        parts = []
        for k in counts[1:]:
            if k in by and one["achieved_http_rps"] > 0:
                ratio = by[k]["achieved_http_rps"] / one["achieved_http_rps"]
                verdict = "" if k != 2 * counts[0] else (" meets" if ratio >= INGEST_SCALING_TARGET else " MISSES")
                parts.append(f"{k} processes {by[k]['achieved_http_rps']:.0f}/s = {ratio:.2f}x{verdict}"
                             f" (servers' CPU {by[k]['cpu_server_pct']:.0f}% of a core, PostgreSQL {by[k]['cpu_postgres_pct']:.0f}%,"
                             f" generator {by[k]['cpu_generator_pct']:.0f}%, machine {fmt(by[k]['cpu_machine_pct'], '.0f')}%)")
        print(f"  offered {offered:.0f}/s: {counts[0]} process(es) {one['achieved_http_rps']:.0f}/s"
              f" (machine {fmt(one['cpu_machine_pct'], '.0f')}%); " + "; ".join(parts))


def plot(rows: list[dict[str, Any]], path: Path, args) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if r["ingest_processes"] == rows[0]["ingest_processes"]]  # one curve: the first count's
    offered = [r["offered_http_rps"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(offered, offered, color="0.6", ls=":", lw=1, label="offered")
    left.plot(offered, [r["achieved_http_rps"] for r in rows], "o-", label="ingested (201)")
    left.plot(offered, [r["samples_stored"] / args.duration / samples_per_report(args.instances) for r in rows], "x", color="C2",
              label="stored in PostgreSQL (samples / per report)")
    left.axhline(TARGET_REPORTS, color="k", ls="--", lw=0.8, label=f"target {TARGET_REPORTS:.0f}/s")
    left.set_xlabel("offered agents' reports/s")
    left.set_ylabel("reports/s")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    for key, label, style in (("browser_p50_ms", "browser p50", "o-"), ("browser_p95_ms", "browser p95", "s-"),
                              ("http_p95_ms", "HTTP p95", "^:"), ("api_p95_ms", "operators' API p95", "d--")):
        right.plot(offered, [r[key] if r[key] is not None else float("nan") for r in rows], style, label=label)
    right.axhline(TARGET_P95_S * 1000, color="k", ls="--", lw=0.8, label="target p95 500 ms")
    right.set_yscale("log")
    right.set_xlabel("offered agents' reports/s")
    right.set_ylabel("ms (log)")
    right.legend(fontsize=7)
    right.grid(alpha=0.3, which="both")
    ingest = f", agents on {rows[0]['ingest_processes']} uvicorn ingest process(es)" if rows[0].get("ingest_processes") else ""
    fig.suptitle(f"Tessera telemetry ingest: {rows[0]['servers']} Daphne server(s){ingest}, PostgreSQL, Redis, Chromium, stand-in agents"
                 f" ({args.instances} instances each), {os.cpu_count()} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


if __name__ == "__main__":
    sys.exit(main())
