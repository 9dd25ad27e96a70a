"""Putting a new ONNX model into service through the dashboard, in a real browser (issue 38): the demo's live
control plane with its agents (tests/workers/test_with_control_plane.py's `fleet`), Debian's Chromium driven by
Playwright. An operator uploads the model on the Applications page, then follows its application's page:
sets the SLO policy with its expected demand, profiles it on the CPU host's agent, plans the fleet, approves
and applies the plan, each step opening its job; the router then answers for the model within its SLO."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
from django.contrib.auth import get_user_model

from apps.inventory.models import Host
from apps.inventory.services import router_credential_issue
from apps.jobs.models import Job
from apps.planning.models import Plan
from apps.policies.models import SloPolicy
from apps.registry.models import Application, ModelVariant, Profile
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)
from tests.waiting import wait_for
from tests.workers.test_app_deploy import _model_write
from tests.workers.dataplane_helpers import router_answer_wait
from tests.workers.test_with_control_plane import fleet  # noqa: F401 - the live demo fleet with its agents
from workers.router.main import router_build
from workers.router.server import router_start_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "Operator-browser-pass-1"


def _job_ends(page, kind: str, after: int) -> Job:
    """The job of `kind` the step opened (its page is the one shown), once it has ended."""
    job = wait_for(lambda: Job.objects.filter(kind=kind, pk__gt=after).order_by("pk").first(), 30, f"the {kind} job")
    assert page.url.rstrip("/").endswith(f"/jobs/{job.pk}"), page.url
    return wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=["succeeded", "failed"]).first(), 300, f"the {kind} job to end")


def _step_done(page, url: str, key: str) -> None:
    page.goto(url)
    page.wait_for_selector(f'[data-step="{key}"][data-done="true"]')


def test_an_operator_puts_a_new_model_into_service_from_the_dashboard(fleet, browser_page, tmp_path, monkeypatch) -> None:  # noqa: F811
    # Playwright's sync API runs an event loop in this thread; the test reads the database between the browser's
    # steps (each step's job), which Django allows from such a thread only when told (its documented switch).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    for name in ("sim-a100-01", "sim-2080ti-01", "sim-cpu-01"):
        wait_for(lambda: Host.objects.get(name=name).converged_version == 1, 120, f"{name} to converge")
    # As in the CLI's test: the idle ensemble would keep its idle floor, which does not fit beside the rest.
    SloPolicy.objects.filter(application__name="tabular-ensemble").update(scale_to_zero=True)
    application = Application.objects.create(name="tab-web")  # created over the API; the dashboard takes it from here
    operator = get_user_model().objects.get(username="operator")
    operator.set_password(PASSWORD)
    operator.save()
    model = tmp_path / "tab-web.onnx"
    _model_write(model, seed=9)
    page, url = browser_page, fleet["url"]
    page.goto(f"{url}/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_load_state()

    # 1. The upload, on the Applications page: it lands on the application's page, the next step offered.
    page.goto(f"{url}/applications/?application={application.pk}")
    page.fill("#id_name", "web-mlp")
    page.fill("#id_accuracy", "0.8")
    page.fill("#id_accuracy_metric", "holdout accuracy")
    page.set_input_files("#id_file", str(model))
    page.click("button[name=upload]")
    page.wait_for_url(f"{url}/applications/{application.pk}/")
    page.wait_for_selector('[data-step="variant"][data-done="true"]')
    # 2. The SLO policy, with the demand to plan for before its first query.
    page.fill('input[name="latency_p99_ms"]', "40")
    page.fill('input[name="expected_rps"]', "15")
    page.click('[data-deploy-action="slo"]')
    page.wait_for_selector('[data-step="slo"][data-done="true"]')
    assert SloPolicy.objects.get(application=application).expected_rps == 15.0
    # 3. Profiling on the fleet's agents (the CPU host's measures it; simulated GPUs cannot).
    last = Job.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    page.click('[data-deploy-action="profile"]')
    profiling = _job_ends(page, "profiling", last)
    assert profiling.status == "succeeded", profiling.log + profiling.error
    variant = ModelVariant.objects.get(application=application, name="web-mlp")
    assert Profile.objects.filter(variant=variant, device_type="cpu", source="measured").exists()
    _step_done(page, f"{url}/applications/{application.pk}/", "profiles")
    # 4. A plan that serves it: the operator's, unless the re-planning policy's watch started one first (a new
    #    profiled variant is a reason to re-plan); either way the page then offers to apply it.
    page.wait_for_selector('[data-deploy-action="plan"], [data-step="plan"][data-done="true"]')
    if page.locator('[data-deploy-action="plan"]').count():
        last = Job.objects.order_by("-pk").values_list("pk", flat=True).first()
        page.click('[data-deploy-action="plan"]')
        planning = _job_ends(page, "planning", last)
        assert planning.status == "succeeded", planning.log + planning.error
    plan = wait_for(lambda: Plan.objects.filter(status="validated", routing__has_key="tab-web").order_by("-pk").first(), 120, "a plan for tab-web")
    assert plan.result["served_rps"]["tab-web"] > 0, plan.notes
    _step_done(page, f"{url}/applications/{application.pk}/", "plan")
    # 5. Approve and apply: the rollout's job, then the application is in service.
    last = Job.objects.order_by("-pk").values_list("pk", flat=True).first()
    page.click('[data-deploy-action="apply"]')
    rollout = _job_ends(page, "rollout", last)
    assert rollout.status == "succeeded", rollout.log + rollout.error
    _step_done(page, f"{url}/applications/{application.pk}/", "serve")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "application-deployed.png"), full_page=True)

    router, _client = router_build(control_plane=url, token=router_credential_issue(name="browser-deploy")[1])
    handle = router_start_in_thread(router)
    try:
        rows = np.random.default_rng(2).normal(size=(1, 8)).astype(np.float32)
        body = {"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": rows.ravel().tolist()}]}
        answer = router_answer_wait(handle.url, "tab-web", body)
        assert answer["parameters"]["variant"] == "web-mlp" and answer["parameters"]["simulated"] is False
        # Within its SLO: the router gives a query the SLO's deadline and answers 504 past it.
        for _ in range(10):
            response = httpx.post(f"{handle.url}/v2/models/tab-web/infer", json=body, timeout=10)
            assert response.status_code == 200, response.text
    finally:
        handle.stop()
