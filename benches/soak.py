#!/usr/bin/env python
"""Soak under fire (issue 44): the production stack on one machine for hours, open-loop traffic to every
application through two routers, re-plans applied on their own every 30-60 s, and a seeded schedule of
faults that overlap them. It checks continuously and prints at the end what must be zero and what must stay
bounded.

    .venv/bin/python benches/soak.py                   # the report's run: 2 hours (docs/reliability.md)
    .venv/bin/python benches/soak.py --quick           # CI's 5-minute run (tests/integration/test_bench_soak_smoke.py)
    options: --duration 7200, --rate 24 (queries/s in all), --fault-every 60, --replan-every 45, --warmup 600,
             --retention 1200 (telemetry kept, s), --seed 0, --faults a,b,..., --postgres URL,
             --database tessera_soak, --redis redis://127.0.0.1:6379/11, --keep-database, --out bench-results

What runs (all on this machine, as shipped):
- PostgreSQL and Redis behind fault proxies (benches/faultproxy.py): the control plane's processes reach both
  only through them, so "refused" and "frozen" are played on the proxies, never on the shared services. The
  bench's database (`--database`, dropped and created) and Redis database (`--redis`, flushed) are its own.
- The control plane: `tessera serve` (Daphne, ASGI, DJANGO_DEBUG=false, the psycopg pool), a Celery worker
  and Celery beat (Tessera's scheduler over django-celery-beat's tables: the job sweeper, the planning watch, telemetry
  retention), with the shipped timeouts.
- The data plane: one agent per demo host (`tessera agent --backend simulated`: simulated GPUs whose runtimes
  wait out the profiled latency, and the CPU host, whose runtimes compute with onnxruntime), and two routers
  (`tessera router`), each with a credential of its own.
- A re-planning policy that plans every `--replan-every` s and applies the plans itself (auto-apply), on the
  demand the routers report.
- Traffic: open-loop Poisson arrivals, `--rate` queries/s split evenly over every application the routers
  serve (flat, the ensemble, the pipeline), alternating between the two routers, each query carrying its
  application's SLO as its deadline (X-Tessera-Deadline-Ms). Every answer is classified:
  answered (200), refused (by status, or `connect` when the router was down), wrong, hung.
  * wrong (must be 0): a 200 whose `model_name` is not the application asked (a pipeline: its last stage),
    whose variant (a pipeline: each stage's; an ensemble: each member) is not one of that application's, or,
    where the runtime computed (the CPU host's real models), whose outputs differ from the same variant's
    outputs computed here with onnxruntime on the same input;
  * hung (must be 0): no answer within the deadline + 1 s.
- Faults (seeded, one every `--fault-every` s, each kind in turn in a shuffled order, while plans roll out):
  agent, router, worker, beat, control plane killed with SIGKILL and restarted (the worker and beat at once,
  as a supervisor would; the others after a few seconds); PostgreSQL and Redis refused and frozen on their
  proxies for 5-20 s; a CPU runtime killed with SIGKILL while it serves; the artifact store slow (a FUSE
  passthrough, benches/slowdisk.py, under the control plane's media root: each read and write waits 250 ms)
  while a CPU runtime dies and its agent, its artifact cache emptied, downloads the model again. After each,
  "converged" is the time
  from the fault's end until what it broke is whole again, against the fault's bound (BOUNDS_S):
  the API and /healthz well again; the host online and converged on its desired state; the router ready and
  answering; a planning job able to run (the job sweeper's bound for the killed worker); beat's next sweep;
  the runtime serving again.
- Sampled every 5 s: the resident memory (VmRSS) of every process, by role (runtimes by the agent that runs
  them); every 30 s: the database's size and its tables' live rows.

At the end (after the faults stop, a grace of 60 s for the last plans and jobs):
- queries sent, answered, refused by status, wrong (0), hung (0);
- jobs wedged (0): a job still pending or running after the grace; plans that ended neither applied nor
  rolled back (0): still approved or rolling out;
- every fault's worst convergence against its bound;
- memory: per role, growth after the warm-up (`--warmup`) of each process that lived long enough (the median
  RSS of its last quarter against that of its first quarter after warm-up), which must stay under 10 %;
- the database: its size and the rows of every table at the warm-up and at the end, against the retention
  (telemetry and history older than `--retention` s are pruned every minute in this run: the settings
  TESSERA_TELEMETRY_RETENTION_DAYS and TESSERA_HISTORY_RETENTION_DAYS, 7 and 90 days by default), with each
  table's rate per hour between the two (a table held to its retention levels off);
- every ERROR (and CRITICAL, and traceback) line of every process's log, classified by process and logger
  and as "in a fault" (within a fault's window + 30 s, of a process that fault touches) or "outside";
- secrets (agent tokens, router credentials, the operator's API token) found in any log (must be 0).

Writes OUT/soak.csv (one row per fault), OUT/soak_queries.csv (per application), OUT/soak_memory.csv (the
samples), OUT/soak_database.csv (the samples) and OUT/soak.png (memory and database over time, traffic and
faults). Exit 1 when anything that must be zero is not, a convergence misses its bound, or memory grew by
10 % or more.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import csv_rows_write, figure_write, fmt, pyplot_load, service_arguments_add  # noqa: E402
from faultproxy import FaultProxy, url_port, url_via  # noqa: E402
from telemetry import database_recreate, port_free_find, redis_flush, server_wait  # noqa: E402

FAULTS = ("agent-killed", "router-killed", "worker-killed", "beat-killed", "control-plane-killed", "postgres-refused",
          "postgres-frozen", "redis-refused", "redis-frozen", "runtime-killed", "slow-disk")
# Convergence bound per fault, seconds from the fault's end (a restart: from the process's start). The job
# sweeper's: TESSERA_JOB_STALE_AFTER_S + TESSERA_JOB_SWEEP_EVERY_S + a pick-up; an agent: its restart, a report
# and a reconcile that adopts or restarts its runtimes; a runtime: the agent's next reconcile and a start.
BOUNDS_S = {"agent-killed": 60.0, "router-killed": 30.0, "worker-killed": 20.0, "beat-killed": 20.0, "control-plane-killed": 30.0,
            "postgres-refused": 15.0, "postgres-frozen": 15.0, "redis-refused": 15.0, "redis-frozen": 15.0, "runtime-killed": 45.0,
            "slow-disk": 45.0}
# Which processes' ERROR lines a fault explains (besides the process it kills).
EXPLAINS = {"postgres-refused": ("server", "worker", "beat"), "postgres-frozen": ("server", "worker", "beat"),
            "redis-refused": ("server", "worker", "beat"), "redis-frozen": ("server", "worker", "beat"),
            "control-plane-killed": ("agent", "router"), "router-killed": (), "agent-killed": (), "worker-killed": ("beat",),
            "beat-killed": (), "runtime-killed": ("agent", "router"), "slow-disk": ("agent", "router", "server")}
HUNG_GRACE_S = 1.0
MEMORY_GROWTH_LIMIT = 0.10
SAMPLE_MEMORY_S = 5.0
SAMPLE_DATABASE_S = 30.0
EXPLAIN_AFTER_S = 30.0
GRACE_S = 60.0
SLOW_DISK_MS = 250  # each read and write of the artifact store waits this long in a slow spell
QUICK = {"duration": 300.0, "rate": 16.0, "fault_every": 20.0, "replan_every": 30, "warmup": 60.0, "retention": 120.0}


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """One process of the stack, restartable: its role ("server", "agent", ...), name, command, environment."""
    role: str
    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    started: float = 0.0
    incarnations: list[tuple[int, float]] = field(default_factory=list)  # (pid, started)

    def start(self) -> "Proc":
        fh = self.log.open("a")
        self.popen = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        fh.close()
        self.started = time.monotonic()
        self.incarnations.append((self.popen.pid, self.started))
        return self

    def kill(self) -> None:
        """SIGKILL the process alone (what it started lives on, as when a host's process dies)."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (agents drain and stop their runtimes), SIGKILL of the group after the timeout."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Stack:
    env: dict[str, str]
    port: int
    var: Path
    pg: FaultProxy
    redis: FaultProxy
    procs: dict[str, Proc] = field(default_factory=dict)
    token: str = ""
    secrets: dict[str, str] = field(default_factory=dict)  # what must never be logged: {what: secret}
    router_urls: list[str] = field(default_factory=list)
    slow_disk: Path | None = None  # the artifact store's delay file (benches/slowdisk.py), None: no FUSE here

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, role: str, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(role, name, cmd, env or self.env, self.var / f"{name}.log")
        self.procs[name] = proc
        return proc.start()

    def of(self, role: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == role]

    def stop(self) -> None:
        # The data plane first (agents drain their runtimes while the control plane still answers); the
        # artifact store's mount last.
        for role in ("router", "agent", "beat", "worker", "server", "disk"):
            for proc in self.of(role):
                proc.stop()


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "controlplane", *args]


def stack_start(args) -> Stack:
    database_url = f"{args.postgres.rstrip('/')}/{args.database}"
    database_recreate(args.postgres, args.database)
    redis_flush(args.redis)
    var = Path(tempfile.mkdtemp(prefix="tessera-soak-"))
    pg = FaultProxy(url_port(database_url, 5432)).start()
    rd = FaultProxy(url_port(args.redis, 6379)).start()
    retention_days = args.retention / 86400.0
    # This process (seed, checks, samples) uses the services directly; the control plane's processes only
    # through the proxies.
    os.environ.update({"DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DJANGO_DEBUG": "false", "DATABASE_URL": database_url,
                       "REDIS_URL": args.redis, "TESSERA_VAR_DIR": str(var), "TESSERA_DB_POOL": "false", "TESSERA_LOG_LEVEL": "WARNING",
                       "TESSERA_TELEMETRY_RETENTION_DAYS": repr(retention_days), "TESSERA_HISTORY_RETENTION_DAYS": repr(retention_days),
                       "TESSERA_HOUSEKEEPING_EVERY_S": "60", "TESSERA_MEDIA_ROOT": str(var / "media")})
    # The demo's CPU measurements and conv model are kept between runs (var/ is the checkout's own scratch).
    os.environ.setdefault("TESSERA_DEMO_MEASUREMENTS_DIR", str(REPO / "var" / "demo-measurements"))
    import django

    django.setup()
    env = dict(os.environ, DATABASE_URL=url_via(database_url, pg), REDIS_URL=url_via(args.redis, rd), TESSERA_DB_POOL="true",
               TESSERA_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1")
    stack = Stack(env=env, port=port_free_find(4), var=var, pg=pg, redis=rd)
    try:
        if slow_disk_possible():
            stack.slow_disk = var / "slow-disk-ms"
            stack.slow_disk.write_text("0")
            stack.add("disk", "slow-disk", [sys.executable, str(REPO / "benches" / "slowdisk.py"), str(var / "media-store"), str(var / "media"),
                                            "--control", str(stack.slow_disk)])
            wait_for(lambda: os.path.ismount(var / "media"), 30, "the artifact store's mount")
        seeded = fleet_seed(replan_every_s=args.replan_every)
        stack.token = seeded["operator_token"]
        stack.secrets = {"operator API token": seeded["operator_token"], **{f"router {n}": s for n, s in seeded["routers"].items()},
                         **{f"agent {n}": s for n, s in seeded["agents"].items()}}
        # Every process runs `python -m` in the checkout (cwd first on its path), so a run from a clone tests
        # that clone's code even with another checkout's editable install in the environment.
        stack.add("server", "server", [sys.executable, "-m", "controlplane.cli", "serve", "--bind", "127.0.0.1", "--port", str(stack.port)])
        server_wait(stack.port, stack.procs["server"].popen, var / "server.log", timeout_s=120)
        stack.add("worker", "worker", _celery("worker", "--pool=solo", "--without-gossip", "--without-mingle", "--loglevel=INFO"))
        # beat with the settings' scheduler (apps.core.beat: it waits for its database and rides out outages)
        stack.add("beat", "beat", _celery("beat", "--max-interval", "1", "--loglevel=INFO", "-s", str(var / "beat-schedule")))
        from apps.inventory.models import Host
        from controlplane.demo import demo_agent_command

        for host in Host.objects.filter(labels__demo="true").order_by("name"):
            agent_env = dict(env, TESSERA_AGENT_TOKEN=seeded["agents"][host.name], TESSERA_CONTROL_PLANE=stack.url)
            stack.add("agent", f"agent-{host.name}", demo_agent_command(host=host, state_dir=var / "agents" / host.name), agent_env)
        for i, (name, secret) in enumerate(sorted(seeded["routers"].items())):
            port = stack.port + 1 + i
            router_env = dict(env, TESSERA_ROUTER_TOKEN=secret, TESSERA_CONTROL_PLANE=stack.url)
            stack.add("router", name, [sys.executable, "-m", "controlplane.cli", "router", "--listen", f"127.0.0.1:{port}",
                                       "--grpc-listen", "off", "--name", name], router_env)
            stack.router_urls.append(f"http://127.0.0.1:{port}")
        wait_for(lambda: "Sending due task" in (var / "beat.log").read_text(), 120, "beat's first task")
        wait_for(lambda: " ready." in (var / "worker.log").read_text(), 120, "the worker")
        wait_for(lambda: all(_host_converged(h) for h in Host.objects.filter(labels__demo="true")), 180, "every agent converged")
        for url in stack.router_urls:
            wait_for(lambda url=url: _http_ok(f"{url}/v2/health/ready"), 120, f"the router at {url}")
        return stack
    except BaseException:  # a stack that did not come up is taken down whole
        stack.stop()
        pg.stop()
        rd.stop()
        raise


def slow_disk_possible() -> bool:
    """Whether this machine can mount the slow artifact store (benches/slowdisk.py): /dev/fuse, libfuse and
    mfusepy (the bench extra)."""
    import importlib

    try:
        importlib.import_module("mfusepy")  # loads libfuse too
    except (ImportError, OSError):
        return False
    return Path("/dev/fuse").exists()


def fleet_seed(*, replan_every_s: int) -> dict[str, Any]:
    """Migrate, seed the demo; one re-planning policy that plans every `replan_every_s` and applies its plans;
    telemetry pruned every minute; agent tokens, two router credentials, the operator's API token."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate, router_credential_issue
    from apps.planning.triggers import watch_schedule_ensure
    from apps.policies.models import ReplanPolicy
    from apps.users.services import token_create
    from controlplane.demo import demo_seed

    call_command("migrate", interactive=False, verbosity=0)
    demo_seed(admin_password="soak-admin-password-1")
    call_command("collectstatic", interactive=False, verbosity=0)
    with change_context(source="command"):
        # The policy named "default" decides auto-apply (apps.planning.services.auto_apply_policy).
        ReplanPolicy.objects.exclude(name="default").update(enabled=False)
        ReplanPolicy.objects.update_or_create(name="default", defaults={
            "enabled": True, "auto_apply": True, "interval_seconds": replan_every_s, "debounce_seconds": 0, "host_lost_after_seconds": 20})
        watch_schedule_ensure()
        minute, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
        PeriodicTask.objects.filter(name="telemetry.prune").update(interval=minute, expire_seconds=60)
        agents = {h.name: host_agent_token_rotate(host=h) for h in Host.objects.filter(labels__demo="true")}
        routers = {name: router_credential_issue(name=name, description="benches/soak.py")[1] for name in ("soak-router-1", "soak-router-2")}
        _, token = token_create(user=get_user_model().objects.get(username="operator"), description="benches/soak.py")
    return {"agents": agents, "routers": routers, "operator_token": token}


def _host_converged(host, since=None) -> bool:
    """The host is online and has converged on its latest desired state (after `since`: a report since then)."""
    from apps.deployments.services import host_desired_state_latest

    host.refresh_from_db()
    desired = host_desired_state_latest(host=host)
    if since is not None and (host.last_seen is None or host.last_seen <= since):
        return False
    return host.status == "online" and (desired is None or host.converged_version == desired.version)


def _http_ok(url: str, **kwargs: Any) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2.0, **kwargs).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until `predicate()` held; RuntimeError after `timeout_s`."""
    started = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except Exception:  # noqa: BLE001 - a check that cannot run yet (a service coming back) is "not yet"
            pass
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.25)


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Target:
    """What the traffic asks of one application or pipeline, and how its answers are checked."""
    name: str
    kind: str  # flat, ensemble, pipeline
    path: str
    body: bytes
    slo_ms: float
    variants: dict[str, frozenset[str]]  # application -> its variants' names (a pipeline: each stage's)
    last: str  # the application whose answer comes back (a pipeline: its last stage)
    expected: dict[str, Any] = field(default_factory=dict)  # variant (pipeline: "a=x, b=y") -> outputs, where computed
    headers: dict[str, str] = field(default_factory=dict)


def targets_build(router_url: str, *, seed: int) -> list[Target]:
    """Every application the router serves and every pipeline, with one fixed input each (from the Open
    Inference Protocol's metadata) and the outputs of the real models on it."""
    import httpx
    import numpy as np

    from apps.policies.models import EnsemblePolicy, SloPolicy
    from apps.registry.models import Application, ModelVariant, Pipeline
    from workers.wire import request_encode

    rng = np.random.default_rng(seed)
    variants = defaultdict(set)
    for app, name in ModelVariant.objects.values_list("application__name", "name"):
        variants[app].add(name)
    ensembles = set(EnsemblePolicy.objects.values_list("application__name", flat=True))
    slo = {a: float(ms) for a, ms in SloPolicy.objects.values_list("application__name", "latency_p99_ms")}
    inputs: dict[str, tuple[bytes, dict, dict[str, str]]] = {}
    out: list[Target] = []
    with httpx.Client(base_url=router_url, timeout=5.0) as http:
        for app in Application.objects.order_by("name").values_list("name", flat=True):
            meta = http.get(f"/v2/models/{app}")
            if meta.status_code != 200:
                print(f"  {app}: not served by the routers ({meta.status_code}), no traffic")
                continue
            body, x, headers = _request_body(meta.json(), rng)
            inputs[app] = (body, x, headers)
            kind = "ensemble" if app in ensembles else "flat"
            out.append(Target(app, kind, f"/v2/models/{app}/infer", body, slo.get(app, 100.0), {app: frozenset(variants[app])}, app,
                              _expected_flat(app, x), headers))
    for pipeline in Pipeline.objects.order_by("name"):
        for path in pipeline.paths:  # each execution path, named in X-Tessera-Path
            stages = list(path["stages"])
            if stages[0] not in inputs:
                continue
            _body, x, _headers = inputs[stages[0]]
            body, _ = request_encode(x, binary=False)  # pipelines take JSON requests only
            name = pipeline.name if len(pipeline.paths) == 1 else f"{pipeline.name}:{path['name']}"
            out.append(Target(name, "pipeline", f"/v1/pipelines/{pipeline.name}/infer", body, float(path["slo_ms"]),
                              {s: frozenset(variants[s]) for s in stages}, stages[-1], _expected_pipeline(stages, x),
                              {"x-tessera-path": str(path["name"])}))
    return out


# Inputs at least this large go as the binary-data extension, as Triton's clients send tensors by default:
# an image's 150,528 floats as JSON text (0.96 MB against 0.60 MB) take 6-7 ms to decode where binary takes
# 0.01 ms, and on 2 cores saturated by the whole stack they pushed classify-vgg's queries past its 40 ms
# SLO (CI: 0 of 632 answered once; a local run: 284 of 633 refused at the deadline, none with binary).
BINARY_INPUT_ELEMENTS = 4096


def _request_body(meta: dict, rng) -> tuple[bytes, dict, dict[str, str]]:
    """One query's body for the application `meta` describes, its inputs, and the headers it needs: JSON
    for small inputs, the binary-data extension at `BINARY_INPUT_ELEMENTS` and above."""
    import numpy as np

    from workers.wire import request_encode

    x = {}
    for spec in meta["inputs"]:
        shape = [1 if d < 0 else d for d in spec["shape"]]  # one query: the batch axis (-1) is 1
        if spec["datatype"] != "FP32":
            raise RuntimeError(f"{meta['name']}: input {spec['name']} is {spec['datatype']}; the soak sends FP32 only")
        x[spec["name"]] = rng.normal(size=shape).astype(np.float32).round(3)
    binary = sum(v.size for v in x.values()) >= BINARY_INPUT_ELEMENTS
    body, header_length = request_encode(x, binary=binary)
    if header_length is None:
        return body, x, {}
    return body, x, {"content-type": "application/octet-stream", "inference-header-content-length": str(header_length)}


_SESSIONS: dict[tuple[str, str], Any] = {}


def _session(app: str, variant: str):
    """onnxruntime's session on the variant's own artifact (the file the control plane stores), or None for a
    variant the runtimes do not compute (no artifact)."""
    import onnxruntime as ort

    from apps.registry.models import ModelVariant

    key = (app, variant)
    if key not in _SESSIONS:
        row = ModelVariant.objects.select_related("artifact").get(application__name=app, name=variant)
        _SESSIONS[key] = (ort.InferenceSession(row.artifact.file.path, providers=["CPUExecutionProvider"])
                          if row.artifact is not None and row.artifact.file else None)
    return _SESSIONS[key]


def _run(app: str, variant: str, x: dict) -> dict | None:
    session = _session(app, variant)
    if session is None:
        return None
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, x)))


def _expected_flat(app: str, x: dict) -> dict[str, Any]:
    from apps.registry.models import ModelVariant

    out = {}
    for variant in ModelVariant.objects.filter(application__name=app).values_list("name", flat=True):
        outputs = _run(app, variant, x)
        if outputs is not None:
            out[variant] = outputs
    return out


def _expected_pipeline(stages: list[str], x: dict) -> dict[str, Any]:
    """Outputs per combination of the stages' variants that compute (the next stage's input is the previous
    stage's first output, as the router passes it; engine.dataplane.pipelines)."""
    from apps.registry.models import ModelVariant

    combos: dict[str, dict] = {"": x}
    for stage in stages:
        following = {}
        for prefix, inputs in combos.items():
            for variant in ModelVariant.objects.filter(application__name=stage).values_list("name", flat=True):
                session = _session(stage, variant)
                if session is None:
                    continue
                feed = inputs if not prefix else {session.get_inputs()[0].name: next(iter(inputs.values()))}
                outputs = _run(stage, variant, feed)
                following[f"{prefix}, {stage}={variant}" if prefix else f"{stage}={variant}"] = outputs
        combos = following
    return combos


@dataclass
class QueryTally:
    sent: int = 0
    answered: int = 0
    refused: Counter = field(default_factory=Counter)
    wrong: int = 0
    hung: int = 0
    checked: int = 0  # answers whose outputs were compared with onnxruntime's
    wrong_examples: list = field(default_factory=list)
    hung_examples: list = field(default_factory=list)
    latencies: list = field(default_factory=list)


def answer_check(target: Target, status: int, headers, text: str) -> tuple[str, str, bool]:
    """("answered" | "wrong" | "refused:<status>", why, outputs compared) for one answer."""
    import numpy as np

    if status != 200:
        return f"refused:{status}", "", False
    try:
        body = json.loads(text)
    except ValueError:
        return "wrong", f"200 that is not JSON: {text[:80]!r}", False
    if body.get("model_name") != target.last:
        return "wrong", f"answered by {body.get('model_name')!r}", False
    variant = headers.get("x-tessera-variant", "")
    if target.kind == "pipeline":
        parts = dict(p.split("=", 1) for p in variant.split(", ") if "=" in p)
        if set(parts) != set(target.variants) or any(v not in target.variants[s] for s, v in parts.items()):
            return "wrong", f"stages answered by {variant!r}", False
    elif target.kind == "ensemble":
        chosen = (body.get("parameters") or {}).get("ensemble", {}).get("chosen") or []
        if not chosen or any(v not in target.variants[target.name] for v in chosen):
            return "wrong", f"ensemble members {chosen!r}", False
    elif variant not in target.variants[target.name]:
        return "wrong", f"variant {variant!r} is not one of {target.name}'s", False
    expected = target.expected.get(variant)
    if expected is None:
        return "answered", "", False
    got = {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in body.get("outputs", [])}
    for name, want in expected.items():
        if name in got and not np.allclose(got[name], np.asarray(want, dtype=np.float32).ravel(), rtol=1e-3, atol=1e-4, equal_nan=True):
            return "wrong", f"{variant}'s {name} differs from onnxruntime's", True
    return "answered", "", True


class Background:
    """A daemon thread running `target` from `start(t0)` (the bench's time origin) until `stop()`."""

    def __init__(self, target: Callable[[], None], *, join_timeout_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=target, daemon=True)
        self._join_timeout_s = join_timeout_s
        self.t0 = 0.0

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._join_timeout_s)


class Traffic(Background):
    """Open-loop Poisson arrivals per target, alternating routers, on an asyncio loop in a thread."""

    def __init__(self, targets: list[Target], router_urls: list[str], *, rate: float, seed: int) -> None:
        self.targets = targets
        self.routers = router_urls
        self.rate = rate / max(1, len(targets))
        self.seed = seed
        self.tally = {t.name: QueryTally() for t in targets}
        self.per_second: dict[int, Counter] = defaultdict(Counter)
        super().__init__(lambda: asyncio.run(self._main()), join_timeout_s=120)

    async def _main(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits) as http:
            await asyncio.gather(*(self._arrivals(http, t, i) for i, t in enumerate(self.targets)))

    async def _arrivals(self, http, target: Target, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        pending: set[asyncio.Task] = set()
        n = 0
        next_at = time.monotonic() + rng.expovariate(self.rate)
        while not self._stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            router = self.routers[n % len(self.routers)]
            n += 1
            task = asyncio.create_task(self._one(http, target, router))
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += rng.expovariate(self.rate)
        if pending:
            await asyncio.wait(pending, timeout=30)

    async def _one(self, http, target: Target, router: str) -> None:
        import httpx

        tally = self.tally[target.name]
        tally.sent += 1
        started = time.monotonic()
        second = int(started - self.t0)
        limit_s = target.slo_ms / 1000.0 + HUNG_GRACE_S
        try:
            # The whole exchange within the deadline + 1 s (httpx's timeout bounds each read, not their sum).
            response = await asyncio.wait_for(http.post(
                f"{router}{target.path}", content=target.body, timeout=limit_s,
                headers={"content-type": "application/json", "x-tessera-deadline-ms": f"{target.slo_ms:g}", **target.headers}), limit_s)
        except (httpx.TimeoutException, asyncio.TimeoutError):
            response = None
        except httpx.HTTPError as exc:  # the router is down (killed): refused before it was asked
            tally.refused[f"connect ({exc.__class__.__name__})"] += 1
            self.per_second[second]["refused"] += 1
            return
        elapsed = time.monotonic() - started
        if response is None or elapsed > limit_s:  # no answer, or one past the deadline + 1 s: hung
            tally.hung += 1
            self.per_second[second]["hung"] += 1
            if len(tally.hung_examples) < 5:
                tally.hung_examples.append(f"{router}: {'no answer' if response is None else response.status_code} after {elapsed:.2f} s")
            return
        verdict, why, checked = answer_check(target, response.status_code, response.headers, response.text)
        tally.checked += checked
        if verdict == "answered":
            tally.answered += 1
            tally.latencies.append(elapsed)
            self.per_second[second]["answered"] += 1
        elif verdict == "wrong":
            tally.wrong += 1
            self.per_second[second]["wrong"] += 1
            if len(tally.wrong_examples) < 5:
                tally.wrong_examples.append(f"{router}: {why}")
        else:
            code = ""
            try:  # Tessera's error shape {"error": {"code": ...}}, or the protocol's {"error": "message"}
                error = response.json().get("error")
                code = error.get("code", "") if isinstance(error, dict) else ""
            except (ValueError, AttributeError):
                pass
            tally.refused[f"{response.status_code} {code}".strip()] += 1
            self.per_second[second]["refused"] += 1


# --------------------------------------------------------------------------- samples


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Sampler(Background):
    """Memory every SAMPLE_MEMORY_S, the database every SAMPLE_DATABASE_S, in a thread (direct to PostgreSQL)."""

    def __init__(self, stack: Stack, database_url: str) -> None:
        self.stack = stack
        self.database_url = database_url
        self.memory: list[dict] = []  # t, role, name, pid, rss_kib
        self.database: list[dict] = []  # t, table, rows (table "(size)": bytes)
        super().__init__(self._run, join_timeout_s=60)

    def _run(self) -> None:
        next_db = 0.0
        while not self._stop.wait(SAMPLE_MEMORY_S):
            t = time.monotonic() - self.t0
            for proc in list(self.stack.procs.values()):
                if not proc.alive:
                    continue
                pid = proc.popen.pid
                rss = _rss_kib(pid)
                if rss is not None:
                    self.memory.append({"t": round(t, 1), "role": proc.role, "name": proc.name, "pid": pid, "rss_kib": rss})
                if proc.role == "agent":  # its runtimes: children of the agent, or of the agent it replaced
                    for child in _children(pid):
                        rss = _rss_kib(child)
                        if rss is not None:
                            self.memory.append({"t": round(t, 1), "role": "runtime", "name": f"{proc.name}/{child}", "pid": child, "rss_kib": rss})
            for pid in _orphan_runtimes(self.stack):
                rss = _rss_kib(pid)
                if rss is not None:
                    self.memory.append({"t": round(t, 1), "role": "runtime", "name": f"adopted/{pid}", "pid": pid, "rss_kib": rss})
            if t >= next_db:
                next_db = t + SAMPLE_DATABASE_S
                try:
                    self.database += database_sample(self.database_url, round(t, 1))
                except Exception as exc:  # noqa: BLE001 - a sample missed is reported, not fatal
                    print(f"  database sample at {t:.0f} s failed: {exc}")


def _orphan_runtimes(stack: Stack) -> list[int]:
    """Runtime processes that outlived a killed agent (re-adopted by its successor, reparented to init): found
    by their command line under the bench's folder."""
    agents = {p.popen.pid for p in stack.of("agent") if p.alive}
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "workers.runtime.server" in cmdline and str(stack.var) in cmdline and ppid not in agents:
            out.append(int(entry.name))
    return out


def autovacuum_setting(database_url: str) -> str:
    """The server's autovacuum ("on" or "off"): where it is off, Tessera's housekeeping vacuums
    (apps.core.housekeeping.dead_rows_vacuum), and the database's size shows whether that keeps up."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute("SHOW autovacuum").fetchone()[0]


def database_sample(database_url: str, t: float) -> list[dict]:
    """The database's size (table "(size)", in `rows`: bytes) and per table its live and dead rows and its
    bytes with indexes and TOAST: where the size goes when the rows level off."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        rows = conn.execute("SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables").fetchall()
    return [{"t": t, "table": "(size)", "rows": size, "dead": None, "bytes": size},
            *({"t": t, "table": name, "rows": n, "dead": dead, "bytes": nbytes} for name, n, dead, nbytes in rows)]


# --------------------------------------------------------------------------- faults


@dataclass
class FaultRecord:
    fault: str
    target: str
    at: float  # bench time the fault started
    ended: float = 0.0
    converged_s: float | None = None
    bound_s: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.converged_s is not None and self.converged_s <= self.bound_s


def fault_play(stack: Stack, fault: str, rng: random.Random, t0: float, *, hold_s: float) -> FaultRecord:
    """Play one fault and wait for what it broke to be whole again (at most 4x its bound)."""
    from django.utils import timezone

    from apps.inventory.models import Host

    record = FaultRecord(fault, "", time.monotonic() - t0, bound_s=BOUNDS_S[fault])
    limit = 4 * record.bound_s
    if fault in ("postgres-refused", "postgres-frozen", "redis-refused", "redis-frozen"):
        service, mode = fault.split("-")
        proxy = stack.pg if service == "postgres" else stack.redis
        record.target = service
        proxy.mode = mode
        time.sleep(hold_s)
        proxy.mode = "up"
        record.ended = time.monotonic() - t0
        record.converged_s = _converged_within(lambda: _control_plane_well(stack), limit)
        return record
    if fault == "slow-disk":
        return _slow_disk_play(stack, record, t0, rng, hold_s=hold_s, limit_s=limit)
    if fault == "runtime-killed":
        pid, key = _runtime_serving(stack, rng)
        record.target = key
        if pid is None:
            record.note = "no CPU runtime process found"
            record.ended = time.monotonic() - t0
            return record
        os.kill(pid, signal.SIGKILL)
        record.ended = time.monotonic() - t0
        record.converged_s = _converged_within(lambda: _runtime_back(stack, key, pid), limit)
        return record
    role = {"agent-killed": "agent", "router-killed": "router", "worker-killed": "worker", "beat-killed": "beat",
            "control-plane-killed": "server"}[fault]
    proc = rng.choice(sorted(stack.of(role), key=lambda p: p.name))
    record.target = proc.name
    log_size = proc.log.stat().st_size
    proc.kill()
    if role in ("agent", "router", "server"):
        time.sleep(hold_s)  # down for a while, as a host rebooting or a pod rescheduled
    proc.start()
    record.ended = time.monotonic() - t0
    if role == "server":
        check = lambda: _control_plane_well(stack)  # noqa: E731
    elif role == "agent":
        host = Host.objects.get(name=proc.name.removeprefix("agent-"))
        restarted = timezone.now()
        check = lambda: _host_converged(host, since=restarted)  # noqa: E731
    elif role == "router":
        url = stack.router_urls[sorted(p.name for p in stack.of("router")).index(proc.name)]
        check = lambda: _router_serving(url)  # noqa: E731
    elif role == "worker":
        check = lambda: _worker_serving(stack, log_size)  # noqa: E731
    else:
        check = lambda: "Sending due task" in _read_from(proc.log, log_size)  # noqa: E731
    record.converged_s = _converged_within(check, limit)
    return record


def _slow_disk_play(stack: Stack, record: FaultRecord, t0: float, rng: random.Random, *, hold_s: float, limit_s: float) -> FaultRecord:
    """The artifact store slow (every read and write SLOW_DISK_MS) while a CPU runtime dies and its agent, its
    artifact cache emptied, must download the model again: from the slow store, through the control plane."""
    if stack.slow_disk is None:
        record.note = "not played: no FUSE on this machine (benches/slowdisk.py)"
        record.ended = time.monotonic() - t0
        return record
    pid, key = _runtime_serving(stack, rng)
    record.target = f"artifacts for {key}" if key else "artifacts"
    stack.slow_disk.write_text(str(SLOW_DISK_MS))
    try:
        killed = time.monotonic()
        if pid is not None:
            for cached in (stack.var / "agents" / key.split("/")[0] / "artifacts").glob("*.onnx"):
                cached.unlink(missing_ok=True)
            os.kill(pid, signal.SIGKILL)
        while time.monotonic() - killed < hold_s:
            if pid is not None and not record.note and _runtime_back(stack, key, pid):
                record.note = f"served again {time.monotonic() - killed:.1f} s after its kill, inside the slow spell"
            time.sleep(0.25)
    finally:
        stack.slow_disk.write_text("0")
    record.ended = time.monotonic() - t0
    record.converged_s = _converged_within(lambda: _runtime_back(stack, key, pid) if pid else _control_plane_well(stack), limit_s)
    return record


def _converged_within(check: Callable[[], bool], limit_s: float) -> float | None:
    try:
        return wait_for(check, limit_s, "convergence")
    except RuntimeError:
        return None


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def _control_plane_well(stack: Stack) -> bool:
    import httpx

    with httpx.Client(base_url=stack.url, timeout=5.0, headers={"Authorization": f"Token {stack.token}"}) as http:
        return http.get("/api/v1/hosts/").status_code == 200 and http.get("/healthz").json().get("status") == "ok"


def _router_serving(url: str) -> bool:
    import httpx

    if not _http_ok(f"{url}/v2/health/ready"):
        return False
    index = httpx.post(f"{url}/v2/repository/index", json={}, timeout=2.0)
    return index.status_code == 200 and any(m.get("state") == "READY" for m in index.json())


def _worker_serving(stack: Stack, log_offset: int) -> bool:
    """The restarted worker took its queue again (its log, from its start, says it is ready) and no job is
    left with a stale heartbeat: a planning job queued now would run."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from apps.jobs.models import Job

    if " ready." not in _read_from(stack.procs["worker"].log, log_offset):
        return False
    stale = timezone.now() - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S)
    return not Job.objects.filter(status="running", heartbeat__lt=stale).exists()


def _runtime_serving(stack: Stack, rng: random.Random) -> tuple[int | None, str]:
    """A runtime that computes (the CPU host's, real onnxruntime) and is running: its pid, from its agent's
    runtime record (STATE_DIR/runtimes/KEY.json, workers/agent/supervisor.py), and "host/key"."""
    from apps.deployments.models import Runtime

    rows = list(Runtime.objects.filter(state="ready", simulated=False).exclude(endpoint="").order_by("host__name", "key")
                .values_list("host__name", "key"))
    candidates = [(pid, f"{host}/{key}") for host, key in rows if (pid := _runtime_pid(stack, host, key)) is not None]
    if not candidates:
        return None, ""
    return rng.choice(candidates)


def _runtime_pid(stack: Stack, host: str, key: str) -> int | None:
    """The pid in the agent's runtime record for `key` (STATE_DIR/runtimes/*.json), when that process lives."""
    for record in (stack.var / "agents" / host / "runtimes").glob("*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if data.get("key") == key and data.get("pid") and Path(f"/proc/{data['pid']}").exists():
            return int(data["pid"])
    return None


def _runtime_back(stack: Stack, key: str, killed_pid: int) -> bool:
    """The agent saw its runtime die and started it again: its record names a new live process, and the
    control plane has it ready (so routers route to it again)."""
    from apps.deployments.models import Runtime

    host, runtime_key = key.split("/", 1)
    pid = _runtime_pid(stack, host, runtime_key)
    return pid not in (None, killed_pid) and Runtime.objects.filter(host__name=host, key=runtime_key, state="ready").exists()


# --------------------------------------------------------------------------- the end


def jobs_and_plans() -> dict[str, Any]:
    from apps.jobs.models import Job
    from apps.planning.models import Plan

    return {"jobs": dict(Counter(Job.objects.values_list("status", flat=True))),
            "jobs_wedged": Job.objects.filter(status__in=("pending", "running")).count(),
            "plans": dict(Counter(Plan.objects.values_list("status", flat=True))),
            "plans_unfinished": Plan.objects.filter(status__in=("approved", "rolling_out")).count(),
            "failed_jobs": list(Job.objects.filter(status="failed").values_list("kind", "error")[:10])}


def memory_growth(samples: list[dict], *, warmup_s: float) -> list[dict]:
    """Per process incarnation that lived past the warm-up for at least two more sampling minutes: the median
    RSS of its last quarter over the median of its first quarter after the warm-up (the worst per role). An
    incarnation a fault restarted gets a warm-up of its own from its first sample: a Python process fills
    its caches again after a restart, which is not growth (CI's 5-minute run once flagged a server restarted
    by a fault at 14.5 % over its 131 s)."""
    by_pid: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    names = {}
    for s in samples:
        by_pid[(s["role"], s["pid"])].append((s["t"], s["rss_kib"]))
        names[(s["role"], s["pid"])] = s["name"]
    worst: dict[str, dict] = {}
    for (role, pid), points in by_pid.items():
        start = points[0][0] + warmup_s if points[0][0] > SAMPLE_MEMORY_S else warmup_s  # started after the first samples: restarted
        after = [(t, r) for t, r in points if t >= start]
        if len(after) < 24:  # two minutes of samples
            continue
        q = len(after) // 4
        first = statistics.median(r for _, r in after[:q])
        last = statistics.median(r for _, r in after[-q:])
        growth = last / first - 1.0
        row = {"role": role, "process": names[(role, pid)], "pid": pid, "from_mib": first / 1024, "to_mib": last / 1024,
               "growth": growth, "span_s": after[-1][0] - after[0][0]}
        if role not in worst or growth > worst[role]["growth"]:
            worst[role] = row
    return sorted(worst.values(), key=lambda r: r["role"])


def database_growth(samples: list[dict], *, warmup_s: float) -> list[dict]:
    """Per table: rows (the database: bytes) at the warm-up, halfway to the end and at the end, and the rate per
    hour over the second half: a table held to its retention (shorter than that half) levels off there."""
    by_table: dict[str, list[tuple[float, int, int | None]]] = defaultdict(list)
    for s in samples:
        by_table[s["table"]].append((s["t"], s["rows"], s.get("bytes")))
    out = []
    for table, points in by_table.items():
        start = next((p for p in points if p[0] >= warmup_s), points[0])
        end = points[-1]
        mid = next((p for p in points if p[0] >= (start[0] + end[0]) / 2), end)
        hours = max(1e-9, (end[0] - mid[0]) / 3600.0)
        out.append({"table": table, "at_warmup": start[1], "at_mid": mid[1], "at_end": end[1], "per_hour": (end[1] - mid[1]) / hours,
                    "mib_at_mid": mid[2] / 2**20 if mid[2] is not None else None,
                    "mib_at_end": end[2] / 2**20 if end[2] is not None else None})
    # The database first, then where its bytes are.
    return sorted(out, key=lambda r: (r["table"] != "(size)", -(r["mib_at_end"] or 0), -r["at_end"]))


ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b")
STAMP = re.compile(r"\[?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})")
LOGGER = re.compile(r"\b(?:ERROR|CRITICAL)\b[:/ ]+(?:\[?)([\w.]+)")


def logs_of(stack: Stack) -> list[tuple[str, str, Path]]:
    """(role, name, path) of every log: the stack's processes' and the runtimes' (each agent's logs folder)."""
    out = [(p.role, p.name, p.log) for p in stack.procs.values() if p.log.exists()]
    for log in sorted((stack.var / "agents").glob("*/logs/*.log")):
        out.append(("runtime", f"{log.parent.parent.name}/{log.stem}", log))
    return out


def errors_classify(stack: Stack, faults: list[FaultRecord], t0_wall: float) -> list[dict]:
    """Every ERROR/CRITICAL line of every log, and every traceback not part of one: by process role, logger and
    whether a fault explains it (its window + EXPLAIN_AFTER_S, a process it touches). Times come from the
    line's asctime (a traceback's from the last stamped line before it)."""
    from datetime import datetime

    classes: Counter = Counter()
    examples: dict[tuple, str] = {}
    for role, name, path in logs_of(stack):
        when, stamped_error = None, False
        for line in path.read_text(errors="replace").splitlines():
            stamp = STAMP.match(line)
            if stamp:
                try:
                    when = datetime.fromisoformat(stamp.group(1).replace("T", " ")).timestamp() - t0_wall
                except ValueError:
                    when = None
                stamped_error = bool(ERROR_LINE.search(line))
                if not stamped_error:
                    continue
            elif not (line.startswith("Traceback") and not stamped_error):
                continue
            explained = "unknown time"
            if when is not None:
                explained = "outside faults"
                for f in faults:
                    touches = name in (f.target, f"agent-{f.target.split('/')[0]}") or role in EXPLAINS[f.fault]
                    if touches and f.at - 1 <= when <= f.ended + EXPLAIN_AFTER_S + (f.converged_s or 0):
                        explained = f"in {f.fault}"
                        break
            logger = LOGGER.search(line)
            key = (role, logger.group(1) if logger else "traceback", explained)
            classes[key] += 1
            examples.setdefault(key, line.strip()[:160])
    return [{"role": r, "logger": lg, "when": w, "lines": n, "example": examples[(r, lg, w)]}
            for (r, lg, w), n in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))]


def secrets_logged(stack: Stack) -> list[str]:
    """Every log line that holds a secret (or 16 characters of one), masked: apps.core.security's finder."""
    from apps.core.security import secrets_in_logs_find

    found = []
    for _role, name, path in logs_of(stack):
        found += [f"{name}: {finding}" for finding in secrets_in_logs_find(path.read_text(errors="replace"), stack.secrets)]
    return found


# --------------------------------------------------------------------------- report


def report(traffic: Traffic, faults: list[FaultRecord], end: dict[str, Any], memory: list[dict], database: list[dict],
           errors: list[dict], secrets: list[str], args) -> list[str]:
    lines = []
    total = QueryTally()
    lines.append(f"{'target':<18}{'kind':<10}{'sent':>8}{'answered':>10}{'checked':>9}{'refused':>9}{'wrong':>7}{'hung':>6}"
                 f"{'p50 ms':>9}{'p99 ms':>9}  refused by status")
    for name, t in traffic.tally.items():
        kind = next(x.kind for x in traffic.targets if x.name == name)
        lat = sorted(t.latencies)
        p50 = lat[len(lat) // 2] * 1000 if lat else None
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else None
        refused = sum(t.refused.values())
        lines.append(f"{name:<18}{kind:<10}{t.sent:>8}{t.answered:>10}{t.checked:>9}{refused:>9}{t.wrong:>7}{t.hung:>6}"
                     f"{fmt(p50, '.1f'):>9}{fmt(p99, '.1f'):>9}  {dict(t.refused.most_common())}")
        for example in t.wrong_examples:
            lines.append(f"    wrong: {example}")
        for example in t.hung_examples:
            lines.append(f"    hung: {example}")
        total.sent += t.sent
        total.answered += t.answered
        total.wrong += t.wrong
        total.hung += t.hung
        total.checked += t.checked
        total.refused.update(t.refused)
    lines.append(f"{'all':<28}{total.sent:>8}{total.answered:>10}{total.checked:>9}{sum(total.refused.values()):>9}"
                 f"{total.wrong:>7}{total.hung:>6}")
    lines += ["", f"{'fault':<22}{'times':>6}{'worst converged s':>19}{'bound s':>9}  verdict   targets"]
    by_fault: dict[str, list[FaultRecord]] = defaultdict(list)
    for f in faults:
        by_fault[f.fault].append(f)
    for fault, records in by_fault.items():
        worst = max((r.converged_s for r in records if r.converged_s is not None), default=None)
        missed = [r for r in records if not r.ok]
        verdict = "ok" if not missed else f"MISSED x{len(missed)}"
        lines.append(f"{fault:<22}{len(records):>6}{fmt(worst, '.1f'):>19}{BOUNDS_S[fault]:>9.0f}  {verdict:<9} "
                     f"{', '.join(sorted({r.target for r in records}))}" + "".join(f"; {r.note}" for r in records if r.note)[:300])
    lines += ["", f"jobs by status {end['jobs']}; wedged {end['jobs_wedged']}",
              f"plans by status {end['plans']}; neither applied nor rolled back {end['plans_unfinished']}"]
    for kind, error in end["failed_jobs"]:
        lines.append(f"    failed {kind} job: {error[:120]}")
    lines += ["", f"{'memory (worst per role)':<26}{'process':<30}{'MiB after warm-up':>19}{'MiB at end':>12}{'growth':>9}{'over s':>8}"]
    for m in memory:
        flag = "" if m["growth"] < MEMORY_GROWTH_LIMIT else "  OVER 10 %"
        lines.append(f"{m['role']:<26}{m['process'][:29]:<30}{m['from_mib']:>19.1f}{m['to_mib']:>12.1f}{m['growth'] * 100:>8.1f}%"
                     f"{m['span_s']:>8.0f}{flag}")
    lines += ["", f"database (telemetry and history kept {args.retention:g} s, pruned every 60 s; the server's autovacuum "
                  f"{args.autovacuum}{', so housekeeping vacuums' if args.autovacuum == 'off' else ''})",
              f"{'table (rows; the database: bytes)':<40}{'at warm-up':>14}{'halfway':>14}{'at end':>14}{'per hour, 2nd half':>20}"
              f"{'MiB halfway':>13}{'MiB at end':>12}"]
    for d in database[:16]:
        lines.append(f"{d['table']:<40}{d['at_warmup']:>14}{d['at_mid']:>14}{d['at_end']:>14}{d['per_hour']:>20.0f}"
                     f"{fmt(d['mib_at_mid'], '.1f'):>13}{fmt(d['mib_at_end'], '.1f'):>12}")
    lines += ["", f"{'ERROR lines: process':<24}{'logger':<36}{'when':<26}{'lines':>6}  example"]
    for e in errors[:30]:
        lines.append(f"{e['role']:<24}{e['logger'][:35]:<36}{e['when']:<26}{e['lines']:>6}  {e['example'][:100]}")
    lines += ["", f"secrets in logs: {len(secrets)}", *(f"    {finding[:200]}" for finding in secrets[:10])]
    return lines


def plot(traffic: Traffic, faults: list[FaultRecord], memory: list[dict], database: list[dict], path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return "no PNG (matplotlib is not installed)"
    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    series: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for s in memory:
        series[s["role"]][s["t"]] += s["rss_kib"]
    for role, points in sorted(series.items()):
        ts = sorted(points)
        axes[0].plot(ts, [points[t] / 1024 for t in ts], label=role)
    axes[0].set_ylabel("RSS, MiB (sum per role)")
    axes[0].legend(fontsize=7, ncol=4)
    size = [(s["t"], s["rows"] / 2**20) for s in database if s["table"] == "(size)"]
    if size:
        axes[1].plot(*zip(*size), color="k")
    axes[1].set_ylabel("database, MiB")
    seconds = sorted(traffic.per_second)
    for outcome, color in (("answered", "tab:green"), ("refused", "tab:orange"), ("wrong", "tab:red"), ("hung", "tab:purple")):
        axes[2].plot(seconds, [traffic.per_second[s][outcome] for s in seconds], label=outcome, color=color, lw=0.8)
    axes[2].set_ylabel("queries per second")
    axes[2].set_xlabel("seconds")
    axes[2].legend(fontsize=7, ncol=4)
    for ax in axes:
        for f in faults:
            ax.axvspan(f.at, max(f.ended, f.at + 1), color="tab:red", alpha=0.12, lw=0)
    return figure_write(plt, fig, path, "Soak: memory, database and traffic under faults (red: faults)")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=7200.0, help="seconds of traffic and faults [7200]")
    parser.add_argument("--rate", type=float, default=24.0, help="queries per second in all, split over the applications [24]")
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults' starts [60]")
    parser.add_argument("--replan-every", type=int, default=45, help="the re-planning policy's interval, s [45]")
    parser.add_argument("--warmup", type=float, default=600.0, help="memory and rows are compared from this second [600]")
    parser.add_argument("--retention", type=float, default=1200.0, help="telemetry kept, seconds [1200]")
    parser.add_argument("--faults", default=",".join(FAULTS), help="which faults, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="CI's run: 5 minutes, 16 queries/s, a fault every 20 s, re-plans every 30 s")
    service_arguments_add(parser, database="tessera_soak", redis_db=11, keep_help="leave the bench database as the run left it")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    args = parser.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    chosen = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = set(chosen) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(FAULTS)})")
    if args.duration <= args.warmup or args.rate <= 0 or args.fault_every <= 0:
        parser.error("--duration must exceed --warmup; --rate and --fault-every must be > 0")
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    print(f"soak: {args.duration:g} s, {args.rate:g} queries/s, a fault every {args.fault_every:g} s ({', '.join(chosen)}), "
          f"re-plans every {args.replan_every} s applied on their own, seed {args.seed}")
    # A SIGTERM (a CI timeout) unwinds like Ctrl-C, so the stack is stopped and nothing outlives the bench.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    stack = stack_start(args)
    args.autovacuum = autovacuum_setting(os.environ["DATABASE_URL"])  # stack_start set it: the server, not the proxy
    print(f"stack up in {time.monotonic() - started:.0f} s: control plane {stack.url}, routers {', '.join(stack.router_urls)}, "
          f"{len(stack.of('agent'))} agents; logs in {stack.var}")
    targets = targets_build(stack.router_urls[0], seed=args.seed)
    print("traffic to: " + ", ".join(f"{t.name} ({t.kind}, SLO {t.slo_ms:g} ms{', outputs checked' if t.expected else ''})" for t in targets))
    t0, t0_wall = time.monotonic(), time.time()
    traffic = Traffic(targets, stack.router_urls, rate=args.rate, seed=args.seed)
    sampler = Sampler(stack, os.environ["DATABASE_URL"])
    traffic.start(t0)
    sampler.start(t0)
    records: list[FaultRecord] = []
    order: list[str] = []
    try:
        next_fault = t0 + min(args.fault_every, args.warmup / 2)
        # Until the duration is up, and at least until every fault has been played once.
        while time.monotonic() - t0 < args.duration or len({r.fault for r in records}) < len(chosen):
            if time.monotonic() < next_fault:
                time.sleep(0.5)
                continue
            if not order:
                order = rng.sample(chosen, len(chosen))
            fault = order.pop()
            held, down = ((4.0, 8.0), (1.0, 4.0)) if args.quick else ((5.0, 20.0), (2.0, 8.0))
            record = fault_play(stack, fault, rng, t0, hold_s=rng.uniform(*(down if fault.endswith("killed") else held)))
            records.append(record)
            print(f"  {record.at:7.0f} s {fault:<22} {record.target:<24} converged "
                  f"{fmt(record.converged_s, '.1f')} s (bound {record.bound_s:g}){'' if record.ok else '  MISSED'}{'  ' + record.note if record.note else ''}", flush=True)
            next_fault = max(next_fault + args.fault_every, time.monotonic() + 1.0)
        traffic.stop()
        # The grace: the last plans finish their rollouts, the last jobs end.
        from apps.jobs.models import Job
        from apps.planning.models import Plan

        try:
            wait_for(lambda: not Job.objects.filter(status__in=("pending", "running")).exists()
                     and not Plan.objects.filter(status__in=("approved", "rolling_out")).exists(), GRACE_S, "the last jobs")
        except RuntimeError:
            pass
        end = jobs_and_plans()
        sampler.stop()
    finally:
        stack.stop()
        stack.pg.stop()
        stack.redis.stop()
        from django.db import connections

        connections.close_all()
    memory = memory_growth(sampler.memory, warmup_s=args.warmup)
    database = database_growth(sampler.database, warmup_s=args.warmup)
    errors = errors_classify(stack, records, t0_wall)
    secrets = secrets_logged(stack)
    lines = report(traffic, records, end, memory, database, errors, secrets, args)
    print()
    print("\n".join(lines))
    fault_rows = [{"fault": r.fault, "target": r.target, "at_s": round(r.at, 1), "ended_s": round(r.ended, 1),
                   "converged_s": r.converged_s, "bound_s": r.bound_s, "ok": r.ok, "note": r.note} for r in records]
    csv_rows_write(args.out / "soak.csv", fault_rows, ("fault", "target", "at_s", "ended_s", "converged_s", "bound_s", "ok", "note"))
    query_rows = [{"target": n, "kind": next(x.kind for x in targets if x.name == n), "sent": t.sent, "answered": t.answered,
                   "checked": t.checked, "refused": sum(t.refused.values()), "wrong": t.wrong, "hung": t.hung,
                   "refused_by_status": json.dumps(dict(t.refused)), "wrong_examples": " | ".join(t.wrong_examples)}
                  for n, t in traffic.tally.items()]
    csv_rows_write(args.out / "soak_queries.csv", query_rows, tuple(query_rows[0]) if query_rows else ("target",))
    csv_rows_write(args.out / "soak_memory.csv", sampler.memory, ("t", "role", "name", "pid", "rss_kib"))
    csv_rows_write(args.out / "soak_database.csv", sampler.database, ("t", "table", "rows", "dead", "bytes"))
    print(plot(traffic, records, sampler.memory, sampler.database, args.out / "soak.png"))
    print(f"wrote {args.out}/soak.csv, soak_queries.csv, soak_memory.csv, soak_database.csv; logs kept in {stack.var}")
    if not args.keep_database:
        database_recreate(args.postgres, args.database)  # left empty
    failures = []
    if sum(t.wrong for t in traffic.tally.values()):
        failures.append("wrong answers")
    if sum(t.hung for t in traffic.tally.values()):
        failures.append("hung queries")
    if end["jobs_wedged"] or end["plans_unfinished"]:
        failures.append("wedged jobs or unfinished plans")
    if any(not r.ok for r in records):
        failures.append("convergence past its bound")
    if any(m["growth"] >= MEMORY_GROWTH_LIMIT for m in memory):
        failures.append("memory growth")
    if secrets:
        failures.append("secrets in logs")
    print("verdict: " + ("ok" if not failures else "FAILS: " + ", ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
