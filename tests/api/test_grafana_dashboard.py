"""deploy/grafana/tessera-fleet.json against what Tessera really exposes (issue 21, section 4).

The expositions are real scrapes: a runtime process serving an ONNX model, a router in front of it (its
`/metrics` over HTTP), two agents' exporters (a simulated MIG host with the runtime's metrics merged in,
and a host of pre-Hopper GPUs read through the nvml backend on the fake pynvml) and the control plane's
`GET /metrics`, each scraped twice with traffic in between. Then:

- the JSON is a Grafana dashboard: unique panel ids, a grid that fits 24 columns without overlaps, a
  Prometheus datasource template variable that every panel, query and query variable uses;
- every PromQL expression names only metrics those expositions carry, matches and groups only by labels
  the metrics have (or that Prometheus attaches to a scrape: `job`, `instance`), and its legend too;
- promtool parses every expression (`promtool check rules`), and every query returns series when
  evaluated over the two scrapes (`promtool test rules`, Prometheus's own engine), the way Prometheus
  stores them with `honor_labels: true` (docs/metrics.md).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from apps.inventory.services import host_agent_token_rotate
from apps.planning.models import Plan
from tests.conftest import service_unavailable
from tests.factories import HostFactory
from tests.onnx_builders import onnx_mlp_bytes
from tests.workers.dataplane_helpers import frame_call, runtime_spec, runtime_start
from tests.workers.fake_pynvml import FakeNvml
from workers.agent.backends.nvml import NvmlBackend
from workers.agent.backends.simulated import SimulatedBackend
from workers.agent.exporter import AgentExporter
from workers.client import ReportBacklog
from workers.metrics import ReportBacklogCollector
from workers.router import Router, router_start_in_thread
from workers.wire import request_encode

pytestmark = pytest.mark.timeout(300)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tessera-fleet.json"
APP = "tabular-cpu"
TARGET_LABELS = {"job", "instance"}  # what Prometheus attaches to every scraped series
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
# The template variables as a Prometheus with the docs' scrape configuration would see them.
JOBS = {"router_job": "tessera-router", "agent_job": "tessera-agent", "control_plane_job": "tessera-control-plane"}
VARIABLES = {**JOBS, "application": ".*", "host": ".*", "__rate_interval": "2m"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels_of(board: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(board: dict) -> list[tuple[str, dict]]:
    """(panel title, target) of every PromQL query."""
    return [(panel["title"], target) for panel in panels_of(board) if panel["type"] != "row" for target in panel["targets"]]


# --------------------------------------------------------------------------- PromQL, read as far as checks need

_TOKEN = re.compile(r"""\s*(?:(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<range>\[[^\]]*\])|(?P<number>\d+(?:\.\d+)?)"""
                    r"""|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^(){},=<>]))""")
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan",  # and the aggregations, which may precede `by`
             "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while at < len(expr.rstrip()):
        match = _TOKEN.match(expr, at)
        assert match and match.end() > at, f"cannot read {expr[at:]!r} in {expr!r}"
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        at = match.end()
    return tokens


def promql_references(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """([(metric, labels its matchers name)], labels the expression groups or matches by)."""
    tokens = _tokens(expr)
    selectors: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if kind == "ident" and text in _GROUPING and following == "(":
            i += 2
            while tokens[i][1] != ")":
                if tokens[i][0] == "ident":
                    grouping.add(tokens[i][1])
                i += 1
        elif kind == "ident" and following != "(" and text.lower() not in _KEYWORDS:
            labels: set[str] = set()
            if following == "{":
                i += 2
                while tokens[i][1] != "}":
                    if tokens[i][0] == "ident":
                        labels.add(tokens[i][1])
                    i += 1
            selectors.append((text, labels))
        i += 1
    return selectors, grouping


def test_the_reader_finds_names_and_labels() -> None:
    selectors, grouping = promql_references(
        'histogram_quantile(0.99, sum by (application, le) (rate(a_bucket{job=~"$j", x!="y"}[5m]))) / 100 unless on (gpu) b')
    assert selectors == [("a_bucket", {"job", "x"}), ("b", set())] and grouping == {"application", "le", "gpu"}


# --------------------------------------------------------------------------- the scrapes


def samples(text: str) -> list[tuple[str, dict[str, str], str]]:
    """(sample name, labels, value) of every sample line, names exactly as written (Triton's counters have no _total)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        assert match, line
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', match[2] or ""))
        out.append((match[1], labels, match[3]))
    return out


@pytest.fixture(scope="module")
def data_plane(tmp_path_factory):
    """[(job, target instance, [first scrape, second scrape])] of a runtime's agent, a router and a second agent."""
    workdir = tmp_path_factory.mktemp("fleet")
    model = onnx_mlp_bytes(n_in=4, hidden=8, n_out=3, seed=1)
    (workdir / "mlp.onnx").write_bytes(model)
    instance = "gpu-host-1/cpu0/0"
    runtime = runtime_start(runtime_spec(artifact_path=str(workdir / "mlp.onnx"), sha256=hashlib.sha256(model).hexdigest(),
                                         instance=instance), workdir / "rt")
    route = {"instance": instance, "variant": "mlp-wide", "weight": 1.0, "endpoint": runtime.endpoint, "state": "ready"}
    table = {"id": 1, "application": APP, "version": 1, "active": True, "slo_ms": 5000.0, "drop_rule": "deadline", "routes": [route]}
    router = router_start_in_thread(Router(lambda: [table], None, name="router-1", refresh_s=0.1))
    client = httpx.Client(base_url=router.url, timeout=60.0)
    simulated = SimulatedBackend("1xA100-SXM4-40GB,1xT4", seed="gpu-host-1")
    simulated.mig_mode_set(0, True)
    simulated.mig_instance_create(0, "3g.20gb@4")
    fake = FakeNvml(["Tesla T4"])  # no GPM before Hopper: utilisation, no profiling series
    nvml = NvmlBackend(nvml=fake)

    def runtime_metrics() -> list[bytes]:
        reply, text = frame_call(runtime.endpoint, {"op": "metrics"})
        assert reply["status"] == 200
        return [text]

    agents = []
    for hostname, backend in (("gpu-host-1", simulated), ("gpu-host-2", nvml)):
        exporter = AgentExporter(hostname=hostname, runtime_metrics=runtime_metrics if backend is simulated else None)
        exporter.registry.register(ReportBacklogCollector("tessera_agent", ReportBacklog(lambda report: None, capacity=4)))
        agents.append((hostname, backend, exporter))
    body = request_encode({"x": np.zeros((1, 4), np.float32)}, request_id="q")[0]
    scrapes: dict[tuple[str, str], list[str]] = {}
    try:
        for round_ in range(2):
            for _ in range(5 + 5 * round_):
                assert client.post(f"/v1/infer/{APP}", content=body).status_code == 200
            assert client.post(f"/v1/infer/{APP}", content=body, headers={"x-tessera-deadline-ms": "0.001"}).status_code == 504
            header = {"op": "infer", "id": round_, "content_type": "application/json", "header_length": None,
                      "instance": instance, "deadline_ms": 0.01}
            assert frame_call(runtime.endpoint, header, body)[0]["status"] == 504  # dropped at the runtime: REJECTED
            simulated.set_load(0, "3g.20gb@4", 0.2 + 0.3 * round_)
            simulated.set_load(1, None, 0.1 * round_)
            fake.gpu_activity_set(0, utilization_pct=20.0 + 30 * round_, power_w=40.0)
            response = client.get("/metrics")
            assert response.status_code == 200
            scrapes.setdefault(("tessera-router", "router-1:8080"), []).append(response.text)
            for hostname, backend, exporter in agents:
                gpus = backend.gpus()
                exporter.update(backend.telemetry(), model_names={g.index: g.model_name for g in gpus},
                                gi_ids={(g.index, str(i.placement)): i.gpu_instance_id for g in gpus for i in g.instances})
                scrapes.setdefault(("tessera-agent", f"{hostname}:9400"), []).append(exporter.scrape().decode())
    finally:
        client.close()
        router.stop()
        nvml.close()
        assert runtime.stop() == 0, runtime.log()
    return [(job, target, texts) for (job, target), texts in scrapes.items()]


@pytest.fixture
def fleet(data_plane, db, client, settings) -> list[tuple[str, str, list[str]]]:
    """The data plane's scrapes and the control plane's, with plans solved, a host and a refused report between them."""
    # Unit tests run tasks in-process (no broker); the control plane reads the queue length from Redis only.
    broker = getattr(settings, "TESSERA_TEST_REDIS_URL", "") or ""
    if not broker.startswith(("redis://", "rediss://")):
        service_unavailable("the Celery queue length needs a Redis broker (REDIS_URL)")
    settings.CELERY_BROKER_URL = broker
    host = HostFactory(name="dashboard-host", status="online")
    token = host_agent_token_rotate(host=host)
    texts = []
    for solve_seconds in (1.5, 2.5):
        Plan.objects.create(status="validated", solve_seconds=solve_seconds)
        refused = client.post(f"/api/v1/hosts/{host.pk}/metrics/", {"at": "sometime"}, content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {token}")
        assert refused.status_code == 400
        response = client.get("/metrics")
        assert response.status_code == 200
        texts.append(response.content.decode())
    if "tessera_celery_queue_length" not in texts[-1]:
        service_unavailable("the Redis broker did not answer (tessera_broker_up 0)")
    return [*data_plane, ("tessera-control-plane", "web-1:8000", texts)]


def label_index(fleet) -> dict[str, set[str]]:
    """Sample name -> every label name its samples carry, over every exposition."""
    index: dict[str, set[str]] = {}
    for _, _, texts in fleet:
        for text in texts:
            for name, labels, _ in samples(text):
                index.setdefault(name, set()).update(labels)
    return index


# --------------------------------------------------------------------------- the checks


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 39 and board["uid"] and board["title"]  # Grafana 11 and newer
    everything = panels_of(board)
    ids = [panel["id"] for panel in everything]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in everything:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid) and all(isinstance(grid[k], int) and grid[k] >= 0 for k in "hwxy"), panel["title"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for panel in everything:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE and panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]
            for name in re.findall(r"\$\{?(\w+)", target["expr"]):
                assert name in variables or name in GRAFANA_BUILTINS, f"{panel['title']}: ${name} is not defined"


def test_every_query_names_only_what_tessera_exposes(fleet) -> None:
    index = label_index(fleet)
    assert not any("job" in labels for labels in index.values())  # left to Prometheus: the dashboard's jobs are targets'
    board = dashboard()
    checked = 0
    for title, target in queries(board):
        selectors, grouping = promql_references(target["expr"])
        assert selectors, title
        known: set[str] = set(TARGET_LABELS)
        for metric, labels in selectors:
            assert metric in index, f"{title}: {metric} is in no exposition"
            assert labels <= index[metric] | TARGET_LABELS, f"{title}: {metric} has no {sorted(labels - index[metric] - TARGET_LABELS)}"
            known |= index[metric]
        for label in grouping:
            missing = [m for m, _ in selectors if label not in index[m] | TARGET_LABELS]
            assert not missing, f"{title}: grouped by {label!r}, which {missing} do not carry"
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
            assert label in known, f"{title}: legend names {label!r}"
        checked += 1
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
        assert match and variable["query"]["query"] == variable["definition"], variable["name"]
        ((metric, labels),), _ = promql_references(match[1])
        assert metric in index and (labels | {match[2]}) <= index[metric] | TARGET_LABELS, variable["name"]
    assert checked >= 20


def _promql(expr: str) -> str:
    """The expression as Prometheus gets it from Grafana: template variables filled in."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VARIABLES[m[1]], expr)


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        service_unavailable("no promtool (apt-get install prometheus)")
    return promtool


def test_promtool_parses_every_query(tmp_path) -> None:
    rules = [{"record": f"tessera:dashboard_query:{k}", "expr": _promql(target["expr"])} for k, (_, target) in enumerate(queries(dashboard()))]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    result = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _series(name: str, labels: dict[str, str]) -> str:
    escaped = (f'{k}="{v}"' for k, v in sorted(labels.items()))  # values are as the exposition escaped them
    return f"{name}{{{','.join(escaped)}}}"


def test_every_query_returns_series_from_the_scrapes(fleet, tmp_path) -> None:
    """Prometheus's engine (promtool test rules) on the two scrapes, a minute apart: each query answers."""
    input_series: dict[str, list[str]] = {}
    for job, target, texts in fleet:
        for k, text in enumerate(texts):
            for name, labels, value in samples(text):
                stored = {"job": job, "instance": target, **labels}  # honor_labels: the exposition's own instance wins
                input_series.setdefault(_series(name, stored), ["_", "_"])[k] = value
    board = dashboard()
    tests = [{"expr": f"absent({_promql(target['expr'])})", "eval_time": "1m", "exp_samples": []} for _, target in queries(board)]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])[1]
            tests.append({"expr": f"absent({_promql(selector)})", "eval_time": "1m", "exp_samples": []})
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump({
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": s, "values": " ".join(v)} for s, v in input_series.items()],
                   "promql_expr_test": tests}],
    }, sort_keys=False))
    result = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, "queries that returned nothing:\n" + result.stdout[-6000:] + result.stderr[-2000:]
    assert len(tests) >= 25
