"""Pipelines on the dashboard: the applications page draws each declared pipeline's DAG with its paths'
SLOs; a plan's page draws each planned pipeline with every stage's variant, batch, replicas and budget,
and every path's planned and predicted latency against its SLO (a path over its SLO stands out)."""
import re

import pytest

from apps.planning.models import Plan
from apps.registry.services.pipelines import pipeline_save
from engine.plans.problem import problem_from_dict
from engine.simulation.pipeline import PipelineSimulationConfig, fleet_pipeline_simulate
from engine.solvers.solve import plan_solve
from tests.engine.test_pipeline_planning import _raw
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db


def _login(client, users, role="viewer"):
    client.force_login(users[role])
    return client


def test_the_applications_page_draws_declared_pipelines(client, users):
    for name in ("detect", "classify", "ocr"):
        ApplicationFactory(name=name)
    ModelVariantFactory(application_id=ApplicationFactory._meta.model.objects.get(name="classify").pk, name="resnet50")
    pipeline_save(data={"name": "video", "stages": ["detect", {"application": "classify", "variant": "resnet50"}, "ocr"], "paths": [
        {"name": "objects", "stages": "detect -> classify", "slo_ms": 150, "demand_rps": 30},
        {"name": "text", "stages": "detect -> ocr", "slo_ms": 300, "demand_rps": 10}]})
    html = _login(client, users).get("/applications/").content.decode()
    figure = html[html.index('data-pipeline="video"'):]
    stages = re.findall(r'data-stage="([^"]+)" transform="translate\((\d+),(\d+)\)"', figure)
    assert {s for s, _, _ in stages} == {"detect", "classify", "ocr"}
    x = {s: int(px) for s, px, _ in stages}
    assert x["detect"] < x["classify"] == x["ocr"]  # the entry first, the two branches one column on
    assert figure.count('class="pipeline-edge"') == 2
    assert "pinned: resnet50" in figure and "(entry)" in figure
    assert re.search(r'data-path="text"><td>text</td><td>detect → ocr</td><td>10 rps</td><td>300 ms</td>', figure)


def test_a_plan_page_draws_each_planned_pipeline_with_its_paths_against_their_slos(client, users):
    problem = problem_from_dict(_raw(demand_rps=300))
    engine_plan = plan_solve(problem, "fa2")
    simulated = fleet_pipeline_simulate(problem, engine_plan, "video", PipelineSimulationConfig(duration_s=10))
    prediction = {"pipelines": {"video": {"slo_violation_ratio": simulated.violation_ratio, "paths": {
        "video": {"latency_p99_ms": simulated.paths["video"].p99_ms, "slo_violation_ratio": simulated.paths["video"].violation_ratio}}}}}
    plan = Plan.objects.create(status="validated", solver="fa2", result=engine_plan.to_dict(), prediction=prediction, routing={},
                               desired_states={}, notes=[])
    html = _login(client, users).get(f"/plans/{plan.pk}/").content.decode()
    section = html[html.index('id="pipelines"'):]
    stage = engine_plan.pipelines["video"]["stages"]["detect"]
    assert f"det-l · batch {stage['batch']}" in section
    assert f"{stage['replicas_placed']}/{stage['replicas']} × 1 core" in section
    planned = engine_plan.pipelines["video"]["paths"]["video"]["latency_ms"]
    assert re.search(rf'<td class="ok" data-planned-latency>{planned:.1f} ms</td>', section)
    # A path over its SLO is marked.
    engine_plan.pipelines["video"]["paths"]["video"]["slo_ms"] = planned - 1
    Plan.objects.filter(pk=plan.pk).update(result=engine_plan.to_dict())
    html = client.get(f"/plans/{plan.pk}/").content.decode()
    assert 'class="bad" data-planned-latency' in html


def test_the_applications_page_shows_each_paths_live_latency_against_its_slo(client, users):
    from django.utils import timezone

    from apps.telemetry.models import PipelinePathSample

    for name in ("detect", "classify", "ocr"):
        ApplicationFactory(name=name)
    pipeline_save(data={"name": "video", "stages": ["detect", "classify", "ocr"], "paths": [
        {"name": "objects", "stages": "detect -> classify", "slo_ms": 150, "demand_rps": 30},
        {"name": "text", "stages": "detect -> ocr", "slo_ms": 300, "demand_rps": 10}]})
    now = timezone.now()
    PipelinePathSample.objects.bulk_create([
        PipelinePathSample(router="r1", pipeline_name="video", path="objects", at=now, interval_s=1.0, arrivals=100, served=98, late=3,
                           dropped=2, latency_p99_ms=171.0),
        PipelinePathSample(router="r2", pipeline_name="video", path="objects", at=now, interval_s=1.0, arrivals=100, served=100,
                           latency_p99_ms=120.0),
    ])
    html = _login(client, users).get("/applications/").content.decode()
    objects = html[html.index('data-path="objects"'):]
    objects = objects[:objects.index("</tr>")]
    # The worst router's p99 (171 ms) against the 150 ms SLO: marked; violations (3 + 2) / 200.
    assert '<td class="bad" data-live-p99>171.0 ms</td>' in objects and "<td data-live-violations>2.5%</td>" in objects
    text = html[html.index('data-path="text"'):]
    assert "no traffic" in text[:text.index("</tr>")]
