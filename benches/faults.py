#!/usr/bin/env python
"""Fault injection: the control plane's outage table (issue 16). Each fault is played while clients keep
sending requests; per fault it prints requests sent / answered / wrong / errors, the longest wait, how long
after the fault ended the control plane was well again, and, for a killed worker or agent, how long the
control plane took to notice against the configured bound.

    .venv/bin/python benches/faults.py                  # every fault, 15 s each, about 5 min
    .venv/bin/python benches/faults.py --quick          # every fault, 3 s each, shorter bounds, about 1 min
    options: --faults postgres-refused,postgres-frozen,redis-refused,redis-frozen,worker-killed,agent-killed,
             --duration 15, --clients 3, --host-lost-after 10, --job-stale-after 10, --job-sweep-every 5,
             --postgres URL, --database tessera_faults, --redis redis://127.0.0.1:6379/10,
             --keep-database, --out bench-results

What runs (all on this machine):
- Two fault proxies (benches/faultproxy.py), one in front of PostgreSQL and one in front of Redis: the
  control plane's processes reach both only through them, so a fault is played on the proxy ("refused":
  the service killed; "frozen": the service stopped, accepting and never answering), never on the shared
  services. The bench's own database (`--database`, dropped and created, migrated, demo seed) and Redis
  database (`--redis`, flushed) are its own.
- The control plane as shipped: `tessera serve` (Daphne) on `controlplane.settings.local` with
  DJANGO_DEBUG=false and the psycopg pool, a Celery worker (`--pool=solo`, with `--include
  benches.fault_tasks` for the killed-worker job) and Celery beat (the job sweeper, the planning watch),
  all with the shipped timeouts (settings "Outages").
- Clients: `--clients` threads, each sending one request at a time, in turn: an API read
  (GET /api/v1/hosts/, operator token), a plan run (POST /api/v1/plan-runs/), a dashboard page
  (GET /overview/, viewer session) and GET /healthz; 40 s client timeout (so a held request shows).
- A request is "answered" when an HTTP answer came back (else it is an "error": timeout, reset); it is
  "wrong" when the answer is not what it should be: under /api/ anything but the right answer or a JSON
  503 in the error shape with Retry-After (a 500, an HTML page, a 409 from a job that will never run); a
  page other than itself or the "unavailable" page with 503; /healthz saying all is well while a service
  is away; a host still "online" after its agent died and the host-lost bound passed.
- After each fault: "recovered" = seconds from the fault's end to the first good API read and healthy
  /healthz; then every planning job must finish and a new plan run be accepted (202): a 409 is a wedged job.
- worker-killed: a job of `bench.steps` (one-second checkpointed steps) runs; its worker is SIGKILLed
  mid-job and a new one started at once (as a supervisor would). "noticed" = seconds from the kill to the
  job's next attempt starting, against the bound TESSERA_JOB_STALE_AFTER_S + TESSERA_JOB_SWEEP_EVERY_S
  (`--job-stale-after`, `--job-sweep-every`; the verdict allows PICKUP_S more: the sweep's trip through
  beat, Redis and the worker).
- agent-killed: a simulated agent (`tessera agent --backend simulated`) reports for a host; it is
  SIGKILLed; "noticed" = seconds until the host is marked offline, against the bound host_lost_after
  (the bench's policy: `--host-lost-after`, 10 s) + the planning watch's interval.
- `--quick` (the test suite's smoke run) plays every fault for 3 s with 2 clients and shorter bounds (a host
  lost after 5 s, a job stale after 5 s, swept every 2 s): the same checks, each against its own bound.

Writes OUT/faults.csv (one row per fault).
"""
from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import csv_rows_write, fmt, service_arguments_add  # noqa: E402
from faultproxy import FaultProxy, url_port, url_via  # noqa: E402
from telemetry import database_recreate, port_free_find, redis_flush, server_start, server_wait  # noqa: E402

FAULTS = ("postgres-refused", "postgres-frozen", "redis-refused", "redis-frozen", "worker-killed", "agent-killed")
CLIENT_TIMEOUT_S = 40.0
HELD_LIMIT_S = 5.0  # the issue's bound: no request held longer by a frozen service
HOST_LOST_AFTER_S = 10  # the bench policy's host_lost_after_seconds (--host-lost-after)
RECOVERY_WAIT_S = 90.0
PICKUP_S = 2.0  # beyond a bound: a periodic task's trip through beat, Redis and a worker
CSV_FIELDS = ("fault", "sent", "answered", "ok", "unavailable", "wrong", "errors", "longest_wait_s", "p50_wait_s",
              "held_over_5s", "recovered_s", "plan_run_after", "noticed_s", "bound_s", "verdict", "wrong_examples")


# --------------------------------------------------------------------------- set-up


@dataclass
class Stack:
    """The processes under test and what the clients need to reach them."""
    env: dict[str, str]
    port: int
    var: Path
    pg: FaultProxy
    redis: FaultProxy
    token: str = ""
    session: str = ""
    server: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    beat: subprocess.Popen | None = None
    logs: list = field(default_factory=list)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.var / f"{name}.log").open("a")
        self.logs.append(log)
        return subprocess.Popen(cmd, cwd=REPO, env=env or self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def worker_start(self) -> subprocess.Popen:
        self.worker = self.spawn("worker", [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
                                            "--include", "benches.fault_tasks", "--without-gossip", "--without-mingle", "--loglevel=INFO"])
        return self.worker

    def stop(self) -> None:
        for proc in (self.server, self.worker, self.beat):
            _group_stop(proc)
        for log in self.logs:
            log.close()


def _group_stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stack_start(args) -> Stack:
    database_url = f"{args.postgres.rstrip('/')}/{args.database}"
    database_recreate(args.postgres, args.database)
    redis_flush(args.redis)
    var = Path(tempfile.mkdtemp(prefix="tessera-faults-"))
    pg = FaultProxy(url_port(database_url, 5432)).start()
    rd = FaultProxy(url_port(args.redis, 6379)).start()
    # This process (seed, job bookkeeping, the kill's job) uses the services directly; the control plane's
    # processes only through the proxies.
    os.environ.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DJANGO_DEBUG": "false", "DATABASE_URL": database_url,
                       "REDIS_URL": args.redis, "TESSERA_VAR_DIR": str(var), "TESSERA_DB_POOL": "false", "TESSERA_LOG_LEVEL": "WARNING",
                       "TESSERA_JOB_STALE_AFTER_S": f"{args.job_stale_after:g}", "TESSERA_JOB_SWEEP_EVERY_S": f"{args.job_sweep_every:g}"})
    import django

    django.setup()
    env = dict(os.environ, DATABASE_URL=url_via(database_url, pg), REDIS_URL=url_via(args.redis, rd), TESSERA_DB_POOL="true",
               TESSERA_LOG_LEVEL="INFO")
    stack = Stack(env=env, port=port_free_find(1), var=var, pg=pg, redis=rd)
    stack.token, stack.session = fleet_seed(host_lost_after_s=args.host_lost_after)
    stack.server = server_start(env, stack.port, var / "server.log")
    server_wait(stack.port, stack.server, var / "server.log")
    stack.worker_start()
    stack.beat = stack.spawn("beat", [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--max-interval", "1", "--loglevel=INFO",
                                      "-s", str(var / "beat-schedule")])  # the settings' scheduler (apps.core.beat)
    # Faults start once beat and the worker run (beat would wait for its database, but its first sweep is the
    # sign the stack is up).
    _wait_for(lambda: "Sending due task jobs.sweep" in (var / "beat.log").read_text(), 90, "beat's first sweep")
    _wait_for(lambda: " ready." in (var / "worker.log").read_text(), 90, "the worker")
    return stack


def fleet_seed(*, host_lost_after_s: float) -> tuple[str, str]:
    """Migrate, seed the demo, a policy that loses a host after `host_lost_after_s` (re-planning off: the bench
    starts its own plan runs), the planning watch's beat entry; the operator's token, the viewer's session."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from apps.core.context import change_context
    from apps.planning.triggers import watch_schedule_ensure
    from apps.policies.models import ReplanPolicy
    from apps.users.services import token_create
    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    demo_seed(admin_password="faults-admin-password-1")
    call_command("collectstatic", interactive=False, verbosity=0)
    with change_context(source="command"):
        ReplanPolicy.objects.update(enabled=False)
        ReplanPolicy.objects.update_or_create(name="aaa-faults", defaults={"enabled": True, "auto_apply": False, "interval_seconds": 24 * 3600,
                                                                          "host_lost_after_seconds": int(host_lost_after_s)})
        watch_schedule_ensure()
        users = get_user_model().objects
        _, token = token_create(user=users.get(username="operator"), description="benches/faults.py")
    browser = Client()
    browser.force_login(users.get(username="viewer"))
    return token, browser.cookies[settings.SESSION_COOKIE_NAME].value


# --------------------------------------------------------------------------- clients


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    ok: int = 0
    unavailable: int = 0
    wrong: int = 0
    errors: int = 0
    waits: list = field(default_factory=list)
    wrong_examples: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, verdict: str, wait_s: float, example: str = "") -> None:
        with self.lock:
            self.sent += 1
            self.waits.append(wait_s)
            if verdict == "error":
                self.errors += 1
                return
            self.answered += 1
            setattr(self, verdict, getattr(self, verdict) + 1)
            if verdict == "wrong" and len(self.wrong_examples) < 3:
                self.wrong_examples.append(example)


def _api_unavailable(response) -> bool:
    """A JSON 503 in the API's error shape with Retry-After."""
    if response.status_code != 503 or not response.headers.get("content-type", "").startswith("application/json"):
        return False
    error = response.json().get("error", {})
    return error.get("status") == 503 and error.get("code") == "service_unavailable" and bool(response.headers.get("retry-after"))


def classify(kind: str, response, *, fault_active: bool, host_must_be_offline: bool = False) -> str:
    """"ok", "unavailable" (the right 503) or "wrong" for one answer."""
    status = response.status_code
    if kind == "api-read":
        if status == 200 and "results" in response.json():
            return "ok"
        return "unavailable" if _api_unavailable(response) else "wrong"
    if kind == "host-read":
        if status == 200:
            return "wrong" if host_must_be_offline and response.json().get("status") == "online" else "ok"
        return "unavailable" if _api_unavailable(response) else "wrong"
    if kind == "plan-run":
        if status == 202 or (status == 409 and response.json().get("error", {}).get("code") == "conflict"):
            return "ok"
        return "unavailable" if _api_unavailable(response) else "wrong"
    if kind == "page":
        html = response.headers.get("content-type", "").startswith("text/html")
        if status == 200 and html:
            return "ok"
        return "unavailable" if status == 503 and html and "unavailable" in response.text and response.headers.get("retry-after") else "wrong"
    if kind == "healthz":
        body = response.json()
        if status == 200 and body.get("status") == "ok":
            return "wrong" if fault_active else "ok"
        return "unavailable" if body.get("down") and status in (200, 503) else "wrong"
    raise ValueError(kind)


def requests_cycle(stack: Stack, host_id: int | None) -> list[tuple[str, str, str]]:
    reads = [("api-read", "GET", "/api/v1/hosts/")] if host_id is None else [("host-read", "GET", f"/api/v1/hosts/{host_id}/")]
    return [*reads, ("plan-run", "POST", "/api/v1/plan-runs/"), ("page", "GET", "/overview/"), ("healthz", "GET", "/healthz")]


def clients_run(stack: Stack, *, clients: int, until: float, fault_active, tally: Tally, host_id: int | None = None,
                host_offline_after: float | None = None) -> None:
    """`clients` threads sending the cycle of requests until `until` (monotonic); each answer classified."""
    import httpx

    def client(offset: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=CLIENT_TIMEOUT_S,
                          headers={"Authorization": f"Token {stack.token}"}, cookies={"sessionid": stack.session}) as http:
            cycle = requests_cycle(stack, host_id)
            for kind, method, path in itertools.islice(itertools.cycle(cycle), offset, None):
                if time.monotonic() >= until:
                    return
                started = time.monotonic()
                active = fault_active()
                try:
                    response = http.request(method, path, json={} if method == "POST" else None)
                except httpx.HTTPError as exc:
                    tally.add("error", time.monotonic() - started, f"{kind}: {exc.__class__.__name__}")
                    continue
                must_be_offline = host_offline_after is not None and started > host_offline_after
                try:
                    verdict = classify(kind, response, fault_active=active, host_must_be_offline=must_be_offline)
                except ValueError:  # a body that is not JSON where JSON is due
                    verdict = "wrong"
                tally.add(verdict, time.monotonic() - started, f"{kind} {response.status_code} {response.text[:80]!r}")
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --------------------------------------------------------------------------- after a fault


def recovered_after(stack: Stack, since: float) -> float | None:
    """Seconds from `since` to the first good API read with a healthy /healthz; None if not within RECOVERY_WAIT_S."""
    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=5, headers={"Authorization": f"Token {stack.token}"}) as http:
        while time.monotonic() - since < RECOVERY_WAIT_S:
            try:
                if http.get("/api/v1/hosts/").status_code == 200 and http.get("/healthz").json().get("status") == "ok":
                    return time.monotonic() - since
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
    return None


def plan_run_after(stack: Stack) -> str:
    """Once no planning job is active, a plan run must be accepted: "202", else the status (409: wedged)."""
    import httpx

    from apps.jobs.models import Job

    deadline = time.monotonic() + RECOVERY_WAIT_S
    while Job.objects.filter(kind="planning", status__in=("pending", "running")).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=10, headers={"Authorization": f"Token {stack.token}"}) as http:
        status = http.post("/api/v1/plan-runs/", json={}).status_code
    return str(status)


def _row(fault: str, tally: Tally, **extra: Any) -> dict[str, Any]:
    waits = sorted(tally.waits) or [0.0]
    return {"fault": fault, "sent": tally.sent, "answered": tally.answered, "ok": tally.ok, "unavailable": tally.unavailable,
            "wrong": tally.wrong, "errors": tally.errors, "longest_wait_s": waits[-1], "p50_wait_s": waits[len(waits) // 2],
            "held_over_5s": sum(w > HELD_LIMIT_S for w in waits), "wrong_examples": " | ".join(tally.wrong_examples), **extra}


def _verdict(row: dict[str, Any]) -> str:
    good = row["wrong"] == 0 and row["errors"] == 0 and row["held_over_5s"] == 0 and row.get("plan_run_after", "202") == "202"
    if row.get("bound_s") not in (None, ""):
        good = good and row.get("noticed_s") is not None and row["noticed_s"] <= row["bound_s"] + PICKUP_S
    return "ok" if good else "FAILS"


# --------------------------------------------------------------------------- the faults


def fault_service(stack: Stack, fault: str, *, duration: float, clients: int) -> dict[str, Any]:
    """A service (postgres, redis) refused or frozen on its proxy for `duration` s while the clients run."""
    service, mode = fault.split("-")
    proxy = stack.pg if service == "postgres" else stack.redis
    tally = Tally()
    proxy.mode = mode
    ended: list[float] = []
    clients_run(stack, clients=clients, until=time.monotonic() + duration, fault_active=lambda: not ended, tally=tally)
    proxy.mode = "up"
    ended.append(time.monotonic())
    recovered = recovered_after(stack, ended[0])
    return _row(fault, tally, recovered_s=recovered, plan_run_after=plan_run_after(stack))


def fault_worker_killed(stack: Stack, *, duration: float, clients: int) -> dict[str, Any]:
    """SIGKILL the worker in the middle of a checkpointed job, start another at once; time to the job's next attempt."""
    from django.conf import settings
    from django.db import transaction

    from apps.jobs.models import Job
    from apps.jobs.services import job_create, job_enqueue
    from benches.fault_tasks import bench_steps_task

    steps = max(8, int(duration) + 4)
    with transaction.atomic():
        job = job_create(kind="profiling", actor_name="benches/faults.py", params={"steps": steps})
        job_enqueue(job=job, task=bench_steps_task)
    _wait_for(lambda: Job.objects.filter(pk=job.pk, status="running", progress__gt=0).exists(), 60, "the bench job to start")
    tally = Tally()
    killed_at = time.monotonic()
    os.killpg(stack.worker.pid, signal.SIGKILL)
    stack.worker.wait()
    stack.worker_start()  # at once, as a supervisor would
    resumed: list[float] = []

    def watch() -> None:
        while time.monotonic() - killed_at < RECOVERY_WAIT_S:
            if Job.objects.filter(pk=job.pk, attempts__gte=2).exists():
                resumed.append(time.monotonic() - killed_at)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients_run(stack, clients=clients, until=time.monotonic() + duration, fault_active=lambda: False, tally=tally)
    watcher.join()
    if resumed:  # then it must finish; a job never resumed is the failure the row reports
        _wait_for(lambda: not Job.objects.get(pk=job.pk).active, RECOVERY_WAIT_S, "the resumed bench job to finish")
    finished = Job.objects.get(pk=job.pk)
    bound = settings.TESSERA_JOB_STALE_AFTER_S + settings.TESSERA_JOB_SWEEP_EVERY_S
    if finished.status != "succeeded":  # told beside the wrong answers, not in their place
        tally.wrong_examples.append(f"job {job.pk} {finished.status} after {RECOVERY_WAIT_S:.0f} s: {finished.error[:80]}")
    return _row("worker-killed", tally, noticed_s=resumed[0] if resumed else None, bound_s=bound, plan_run_after=plan_run_after(stack),
                recovered_s=0.0)


def fault_agent_killed(stack: Stack, *, duration: float, clients: int, host_lost_after_s: float) -> dict[str, Any]:
    """A simulated agent reports for a host, then is SIGKILLed; time until the host is marked offline."""
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate
    from apps.planning.triggers import WATCH_INTERVAL_S

    with change_context(source="command"):
        host = Host.objects.create(name="faults-agent", address="127.0.0.1", backend="simulated", status="offline",
                                   description="benches/faults.py agent-killed")
        token = host_agent_token_rotate(host=host)
    env = dict(stack.env, TESSERA_AGENT_TOKEN=token, TESSERA_CONTROL_PLANE=f"http://127.0.0.1:{stack.port}")
    agent = stack.spawn("agent", [sys.executable, "-m", "controlplane.cli", "agent", "--backend", "simulated",
                                  "--state-dir", str(stack.var / "agent")], env=env)
    try:
        _wait_for(lambda: Host.objects.get(pk=host.pk).status == "online", 60, "the agent's first report")
        time.sleep(1.0)
        killed_at = time.monotonic()
        os.kill(agent.pid, signal.SIGKILL)  # the agent alone: what it started lives on, as on a real host
        bound = host_lost_after_s + WATCH_INTERVAL_S
        noticed: list[float] = []

        def watch() -> None:
            while time.monotonic() - killed_at < bound + RECOVERY_WAIT_S:
                if Host.objects.get(pk=host.pk).status != "online":
                    noticed.append(time.monotonic() - killed_at)
                    return
                time.sleep(0.1)

        watcher = threading.Thread(target=watch)
        watcher.start()
        tally = Tally()
        # Reads of the host until the bound has passed, plus the window: past the bound it must not be "online".
        clients_run(stack, clients=clients, until=killed_at + max(duration, bound + 3), fault_active=lambda: False, tally=tally,
                    host_id=host.pk, host_offline_after=killed_at + bound + 1.0)
        watcher.join()
    finally:
        _group_stop(agent)
    return _row("agent-killed", tally, noticed_s=noticed[0] if noticed else None, bound_s=float(bound), recovered_s=0.0,
                plan_run_after=plan_run_after(stack))


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


# --------------------------------------------------------------------------- report


def table_print(rows: list[dict[str, Any]]) -> None:
    head = (f"{'fault':<17}{'sent':>6}{'answered':>10}{'ok':>6}{'503':>6}{'wrong':>7}{'errors':>8}{'longest s':>11}{'>5 s':>6}"
            f"{'recovered s':>13}{'plan run after':>16}{'noticed s':>11}{'bound s':>9}  verdict")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['fault']:<17}{r['sent']:>6}{r['answered']:>10}{r['ok']:>6}{r['unavailable']:>6}{r['wrong']:>7}{r['errors']:>8}"
              f"{fmt(r['longest_wait_s'], '.2f'):>11}{r['held_over_5s']:>6}{fmt(r.get('recovered_s'), '.1f'):>13}"
              f"{r.get('plan_run_after', '-'):>16}{fmt(r.get('noticed_s'), '.1f'):>11}{fmt(r.get('bound_s'), '.0f'):>9}  {r['verdict']}")
        if r.get("wrong_examples"):
            print(f"    {r['wrong_examples']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in this order")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds each fault lasts")
    parser.add_argument("--clients", type=int, default=3, help="client threads, one request at a time each")
    parser.add_argument("--host-lost-after", type=int, default=HOST_LOST_AFTER_S, help="the policy's host_lost_after_seconds [10]")
    parser.add_argument("--job-stale-after", type=float, default=10.0, help="TESSERA_JOB_STALE_AFTER_S of the stack [10]")
    parser.add_argument("--job-sweep-every", type=float, default=5.0, help="TESSERA_JOB_SWEEP_EVERY_S of the stack [5]")
    parser.add_argument("--quick", action="store_true", help="smoke run: every fault, 3 s each, 2 clients, shorter bounds (5 / 5 / 2 s)")
    service_arguments_add(parser, database="tessera_faults", redis_db=10, keep_help="leave the bench database as the run left it")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.clients = 3.0, 2
        args.host_lost_after, args.job_stale_after, args.job_sweep_every = 5, 5.0, 2.0
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(FAULTS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"faults: {', '.join(faults)}; {args.duration:g} s each, {args.clients} clients; proxies in front of PostgreSQL and Redis")
    stack = stack_start(args)
    print(f"control plane on 127.0.0.1:{stack.port} (logs in {stack.var}); PostgreSQL via :{stack.pg.port}, Redis via :{stack.redis.port}")
    rows = []
    try:
        for fault in faults:
            if fault == "worker-killed":
                row = fault_worker_killed(stack, duration=args.duration, clients=args.clients)
            elif fault == "agent-killed":
                row = fault_agent_killed(stack, duration=args.duration, clients=args.clients, host_lost_after_s=args.host_lost_after)
            else:
                row = fault_service(stack, fault, duration=args.duration, clients=args.clients)
            row["verdict"] = _verdict(row)
            rows.append(row)
            print(f"  {fault}: sent {row['sent']}, answered {row['answered']}, wrong {row['wrong']}, errors {row['errors']}, "
                  f"longest {row['longest_wait_s']:.2f} s: {row['verdict']}", flush=True)
    finally:
        stack.stop()
        stack.pg.stop()
        stack.redis.stop()
        from django.db import connections

        connections.close_all()
        if not args.keep_database:
            database_recreate(args.postgres, args.database)  # left empty
    print()
    table_print(rows)
    path = csv_rows_write(args.out / "faults.csv", rows, CSV_FIELDS)
    print(f"\nwrote {path}")
    return 0 if all(r["verdict"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
