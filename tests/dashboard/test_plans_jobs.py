"""The dashboard's plan and job pages through Django's test client: who sees the actions, approve and apply
through the rollout services (audited, eager job), refused actions as messages, and the job page."""
import pytest
from django.contrib.contenttypes.models import ContentType

from apps.core.models import ObjectChange
from apps.jobs.choices import JobKindChoices, JobStatusChoices
from apps.jobs.models import Job
from apps.planning.models import Plan

pytestmark = pytest.mark.django_db

PREDICTION = {
    "slo_violation_ratio": 0.0125, "effective_accuracy": 0.9312, "latency_p99_ms": 41.5,
    "applications": {"image-classify": {"queries": 800, "on_time": 790, "late": 6, "dropped": 4, "slo_violation_ratio": 0.0125,
                                        "effective_accuracy": 0.9312, "latency_p99_ms": 41.5}},
}
DIFF = {
    "against": {"plan": None, "description": "the hosts' latest desired states and the active routing tables"},
    "summary": {"changes": 3, "mig_created": 2, "mig_destroyed": 1, "runtimes_added": 1, "applications_rerouted": 1},
    "hosts": {"sim-a100-01": {"baseline": "nothing (no desired state yet)", "changed": True,
                              "gpus": {"gpu0": {"mig_enabled": {"before": True, "after": True}, "keep": [],
                                                "create": ["3g.20gb@0", "1g.5gb@6"], "destroy": ["7g.40gb@0"]}},
                              "runtimes": {"added": [{"key": "gpu0/3g.20gb@0", "application": "image-classify", "variant": None, "max_batch": 8}],
                                           "removed": [], "changed": [], "kept": 0}}},
    "routing": {},
}


def _plan(status="validated", **fields) -> Plan:
    defaults = dict(status=status, solver="pulp", solver_status="Optimal", gap=0.004, effective_accuracy=0.93,
                    shortfall={"image-classify": 2.5}, notes=["sim-cpu-01 left out: offline"], prediction=PREDICTION, diff=DIFF,
                    desired_states={}, routing={"image-classify": [{"instance": "sim-a100-01/gpu0/3g.20gb@0", "variant": None, "weight": 30.0},
                                                                   {"instance": "sim-a100-01/gpu1", "variant": None, "weight": 10.0}]})
    defaults.update(fields)
    return Plan.objects.create(**defaults)


def _empty_plan(status) -> Plan:
    """A plan whose rollout has nothing to write (no hosts, no routing): it succeeds at once."""
    return _plan(status=status, diff={}, prediction={}, routing={}, desired_states={})


def test_plans_list_and_nav(client, users):
    plan = _plan()
    client.force_login(users["viewer"])
    html = client.get("/plans/").content.decode()
    assert f'data-plan="{plan.pk}"' in html and "Validated" in html and "Optimal" in html
    assert "0.4%" in html and "93.0%" in html and "image-classify 2.5 rps" in html
    assert "+2/−1 MIG" in html
    assert 'href="/plans/" class="active"' in html and 'href="/jobs/">Jobs</a>' in html and "Plans <small>API" not in html
    # The planners a run may use, from the registry: the evaluation baselines are not among them.
    from apps.planning.services import PLAN_RUN_SOLVERS

    for name in PLAN_RUN_SOLVERS:
        assert f'data-planner="{name}"' in html
    assert 'data-planner="clipper-ha"' not in html and "gpulets (Choi et al., ATC&#x27;22)" in html


def test_viewer_sees_plan_detail_without_buttons(client, users):
    plan = _plan()
    client.force_login(users["viewer"])
    response = client.get(f"/plans/{plan.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "1.2%" in html and "93.1%" in html  # violation ratio, predicted accuracy
    assert 'data-prediction-application="image-classify"' in html
    assert "75.0%" in html and "25.0%" in html  # weights 30:10
    assert "+ 3g.20gb@0" in html and "− 7g.40gb@0" in html and "gpu0/3g.20gb@0" in html
    assert "sim-cpu-01 left out: offline" in html and "Optimal" in html
    assert "<form method=\"post\" action=\"/plans/" not in html
    assert ">Approve<" not in html and ">Apply<" not in html


def test_viewer_post_is_forbidden(client, users):
    plan = _plan()
    client.force_login(users["viewer"])
    assert client.post(f"/plans/{plan.pk}/approve/").status_code == 403
    plan.refresh_from_db()
    assert plan.status == "validated"


def test_buttons_follow_the_state(client, users):
    client.force_login(users["operator"])
    for status, button in (("validated", ">Approve<"), ("approved", ">Apply<"), ("active", ">Roll back<")):
        plan = _empty_plan(status)
        html = client.get(f"/plans/{plan.pk}/").content.decode()
        assert button in html, status
        plan.delete()
    plan = _empty_plan("failed")
    html = client.get(f"/plans/{plan.pk}/").content.decode()
    assert ">Approve<" not in html and ">Apply<" not in html and ">Roll back<" not in html


def test_operator_approves_with_audit(client, users):
    plan = _plan()
    client.force_login(users["operator"])
    response = client.post(f"/plans/{plan.pk}/approve/")
    assert response.status_code == 302 and response.headers["Location"] == f"/plans/{plan.pk}/"
    plan.refresh_from_db()
    assert plan.status == "approved" and plan.approved_by == users["operator"]
    change = ObjectChange.objects.filter(changed_object_type=ContentType.objects.get_for_model(Plan), changed_object_id=str(plan.pk),
                                         action="update").first()
    assert change is not None and change.source == "web" and change.user == users["operator"]
    assert "approved" in client.get(response.headers["Location"]).content.decode()


def test_operator_applies_and_lands_on_the_job(client, users, django_capture_on_commit_callbacks):
    plan = _empty_plan("approved")
    client.force_login(users["operator"])
    with django_capture_on_commit_callbacks(execute=True):  # the job's task is queued on commit (eager in tests)
        response = client.post(f"/plans/{plan.pk}/apply/")
    job = Job.objects.get(kind=JobKindChoices.ROLLOUT)
    assert response.status_code == 302 and response.headers["Location"] == f"/jobs/{job.pk}/"
    assert job.status == JobStatusChoices.SUCCEEDED and job.progress == 100, job.log
    plan.refresh_from_db()
    assert plan.status == "active"
    html = client.get(response.headers["Location"]).content.decode()
    assert 'data-job-status="succeeded"' in html and 'data-progress="100"' in html and "width: 100%" in html
    assert 'http-equiv="refresh"' not in html  # finished: no refresh
    assert f'href="/plans/{plan.pk}/"' in html


def test_wrong_state_shows_the_error(client, users):
    plan = _empty_plan("validated")
    client.force_login(users["operator"])
    response = client.post(f"/plans/{plan.pk}/apply/", follow=True)
    assert response.redirect_chain[-1][0] == f"/plans/{plan.pk}/"
    html = response.content.decode()
    assert 'class="message error"' in html and "cannot become rolling out" in html
    assert not Job.objects.exists()
    response = client.post(f"/plans/{plan.pk}/rollback/", follow=True)
    assert "Only the active plan can be rolled back" in response.content.decode()


def test_conflicting_rollout_shows_the_error(client, users):
    plan = _empty_plan("approved")
    Job.objects.create(kind=JobKindChoices.ROLLOUT, status=JobStatusChoices.RUNNING, key="rollout:fleet")
    client.force_login(users["operator"])
    html = client.post(f"/plans/{plan.pk}/apply/", follow=True).content.decode()
    assert "Another rollout is running" in html
    plan.refresh_from_db()
    assert plan.status == "approved"


def test_jobs_list_and_detail(client, users):
    running = Job.objects.create(kind=JobKindChoices.PLANNING, status=JobStatusChoices.RUNNING, progress=42,
                                 log="10:00:00 solving\n10:00:01 <gap> 1%\n", actor_name="operator")
    done = Job.objects.create(kind=JobKindChoices.ROLLOUT, status=JobStatusChoices.FAILED, progress=50, error="RolloutFailed: late")
    client.force_login(users["viewer"])
    html = client.get("/jobs/").content.decode()
    assert f'data-job="{running.pk}"' in html and f'data-job="{done.pk}"' in html
    assert "width: 42%" in html and "Planning" in html and "Rollout" in html
    html = client.get(f"/jobs/{running.pk}/").content.decode()
    assert 'data-progress="42"' in html and "<pre" in html and "&lt;gap&gt; 1%" in html
    # Active: follows the job over the live stream; refreshes itself only without JavaScript.
    assert 'data-live-topics="jobs"' in html and "jobs_live.js" in html
    assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in html
    html = client.get(f"/jobs/{done.pk}/").content.decode()
    assert 'http-equiv="refresh"' not in html and "RolloutFailed: late" in html


def test_anonymous_and_roleless(client, roles):
    from tests.factories import UserFactory

    assert client.get("/plans/").status_code == 302
    assert client.get("/jobs/").status_code == 302
    client.force_login(UserFactory(username="nobody"))
    assert client.get("/plans/").status_code == 403
    assert client.get("/jobs/").status_code == 403
