"""The plans API: who may start plan runs and read plans, 202/409 on runs, the list without the large
documents, the lifecycle actions and their refusals."""
from __future__ import annotations

import pytest

from apps.jobs.choices import JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import job_create, job_execute
from apps.planning.models import Plan
from apps.planning.services import PLAN_RUN_JOB_KEY, plan_run_execute, plan_run_start

pytestmark = pytest.mark.django_db

RUN = {"demand": {"classify": 200, "tabular": 20}, "time_limit_s": 5}


def _plan() -> Plan:
    job = plan_run_start(trigger="manual", options=RUN)
    job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    return Plan.objects.get(job=job)


def test_operators_start_plan_runs_viewers_and_agents_cannot(clients, agent_hosts, small_fleet, django_capture_on_commit_callbacks):
    assert clients["viewer"].post("/api/v1/plan-runs/", RUN, format="json").status_code == 403
    assert clients["anonymous"].post("/api/v1/plan-runs/", RUN, format="json").status_code in (401, 403)
    _hosts, (agent, _other) = agent_hosts
    assert agent.post("/api/v1/plan-runs/", RUN, format="json").status_code == 403
    assert not Job.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        response = clients["operator"].post("/api/v1/plan-runs/", {**RUN, "trigger_detail": "before the launch"}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["kind"] == "planning" and body["key"] == PLAN_RUN_JOB_KEY and body["actor"] == "operator"
    assert body["params"]["options"]["solver"] == "fleet" and body["params"]["options"]["headroom"] == 1.25
    assert body["params"]["options"]["headroom_target"] == 1.0
    job = Job.objects.get(pk=body["id"])
    assert job.status == "succeeded", job.error
    plan = Plan.objects.get(job=job)
    assert plan.created_by.username == "operator" and plan.trigger_detail == "before the launch"
    # Viewers follow runs and read plans.
    runs = clients["viewer"].get("/api/v1/plan-runs/").json()
    assert [r["id"] for r in runs["results"]] == [job.pk]
    assert clients["viewer"].get(f"/api/v1/plan-runs/{job.pk}/").json()["result"]["plan"] == plan.pk


def test_a_second_run_while_one_is_active_is_409_with_its_job(clients, small_fleet):
    active = job_create(kind=JobKindChoices.PLANNING, key=PLAN_RUN_JOB_KEY)
    response = clients["operator"].post("/api/v1/plan-runs/", RUN, format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["status"] == 409 and error["code"] == "conflict" and error["job"] == active.pk
    assert f"job {active.pk}" in error["message"]
    assert Job.objects.count() == 1


def test_bad_run_options_are_400(clients, small_fleet):
    response = clients["operator"].post("/api/v1/plan-runs/", {"solver": "magic"}, format="json")
    assert response.status_code == 400 and "solver" in response.json()["error"]["fields"]
    response = clients["operator"].post("/api/v1/plan-runs/", {"headroom": 0.5}, format="json")
    assert response.status_code == 400
    response = clients["operator"].post("/api/v1/plan-runs/", {"headroom_target": 11}, format="json")
    assert response.status_code == 400 and "headroom_target" in response.json()["error"]["fields"]
    assert not Job.objects.exists()


def test_viewers_read_plans_agents_do_not(clients, agent_hosts, small_fleet):
    plan = _plan()
    listing = clients["viewer"].get("/api/v1/plans/")
    assert listing.status_code == 200
    row = listing.json()["results"][0]
    assert row["id"] == plan.pk and row["status"] == "validated" and row["valid"] is True
    assert row["diff_summary"]["changes"] >= 0 and row["solver"] == "fleet"
    for big in ("problem", "result", "desired_states", "routing", "diff", "prediction"):
        assert big not in row
    detail = clients["viewer"].get(f"/api/v1/plans/{plan.pk}/").json()
    for field in ("problem", "result", "desired_states", "routing", "diff", "prediction", "validation", "demand", "devices", "notes"):
        assert field in detail
    assert detail["diff"]["summary"] == row["diff_summary"] and detail["prediction"]["queries"] > 0
    assert clients["viewer"].get("/api/v1/plans/?status=validated").json()["count"] == 1
    assert clients["viewer"].get("/api/v1/plans/?status=active").json()["count"] == 0
    assert clients["viewer"].get("/api/v1/plans/?trigger=manual").json()["count"] == 1
    assert clients["viewer"].get("/api/v1/plans/?trigger=periodic").json()["count"] == 0
    _hosts, (agent, _other) = agent_hosts
    assert agent.get("/api/v1/plans/").status_code == 403
    assert agent.get(f"/api/v1/plans/{plan.pk}/").status_code == 403
    assert agent.get("/api/v1/plan-runs/").status_code == 403
    root = clients["viewer"].get("/api/v1/").json()
    assert root["plan"].endswith("/api/v1/plans/") and root["planrun"].endswith("/api/v1/plan-runs/")


def test_lifecycle_actions(clients, small_fleet, monkeypatch):
    plan = _plan()
    url = f"/api/v1/plans/{plan.pk}"
    # Viewers cannot act on plans.
    for verb in ("approve", "apply", "rollback"):
        assert clients["viewer"].post(f"{url}/{verb}/").status_code == 403
    # Wrong states are refused with the reason.
    response = clients["operator"].post(f"{url}/apply/")
    assert response.status_code == 400 and "cannot become" in response.json()["error"]["message"]
    response = clients["operator"].post(f"{url}/rollback/")
    assert response.status_code == 400 and "active" in response.json()["error"]["message"]
    # Approve, then apply: 202 with the rollout job (its task is not run here: it would wait for agents).
    response = clients["operator"].post(f"{url}/approve/")
    assert response.status_code == 200 and response.json()["status"] == "approved" and response.json()["approved_by"] == "operator"
    assert clients["operator"].post(f"{url}/approve/").status_code == 400
    response = clients["operator"].post(f"{url}/apply/")
    assert response.status_code == 202, response.json()
    assert response.json()["kind"] == "rollout"
    plan.refresh_from_db()
    assert plan.status == "rolling_out"
    # A second rollout while this one is pending: 409 naming it.
    other = _plan()
    clients["operator"].post(f"/api/v1/plans/{other.pk}/approve/")
    response = clients["operator"].post(f"/api/v1/plans/{other.pk}/apply/")
    assert response.status_code == 409 and response.json()["error"]["job"] == Job.objects.get(kind="rollout").pk


def test_the_planners_are_listed_from_the_registry(clients):
    from apps.planning.services import PLAN_RUN_SOLVERS
    from engine.solvers.registry import PLANNERS

    assert clients["anonymous"].get("/api/v1/planners/").status_code == 401
    listed = clients["viewer"].get("/api/v1/planners/").json()
    assert [p["name"] for p in listed] == list(PLANNERS)
    by_name = {p["name"]: p for p in listed}
    assert by_name["gpulets"]["kind"] == "mps" and by_name["gpulets"]["plan_runs"] is True
    assert by_name["clipper-ha"]["kind"] == "baseline" and by_name["clipper-ha"]["plan_runs"] is False
    assert {n for n, p in by_name.items() if p["plan_runs"]} == set(PLAN_RUN_SOLVERS)
    one = clients["viewer"].get("/api/v1/planners/biscale/").json()
    assert one["kind"] == "vertical" and one["pipelines_by"] == "biscale" and "Biscale" in one["paper"]
    missing = clients["viewer"].get("/api/v1/planners/nope/")
    assert missing.status_code == 404 and "GET /api/v1/planners/ lists them" in missing.json()["error"]["message"]
