"""The applications pages through Django's test client: the list (one row per application: SLO, demand,
served, p99, accuracy, variants, state) and each application's page (variants, profiles, pipelines,
ensemble, plans). Viewers see both but no upload form; operators upload a variant with its ONNX file
(artifact and variant stored together), and a rejected file comes back inline with nothing stored. Each
variant's stored profiles go to its application's page as chart data (latency per batch size and slice), in
one query for all variants."""
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.core.models import ObjectChange
from apps.dashboard.profile_charts import variant_profile_series
from apps.dashboard.selectors import applications_overview
from apps.registry.choices import ProfileSourceChoices
from apps.registry.models import Application, Artifact, ModelVariant, Profile
from controlplane.demo import demo_seed
from tests.onnx_builders import onnx_failing_checker_bytes, onnx_mlp_bytes

pytestmark = pytest.mark.django_db


@pytest.fixture
def users(db):
    """The demo fleet and its logins (demo_seed sets their passwords, so its own users are the ones to log in)."""
    demo_seed()
    return {role: get_user_model().objects.get(username=role) for role in ("viewer", "operator")}


def _form(application: Application, data: bytes, name: str = "mlp-small", **fields) -> dict:
    form = {"application": str(application.pk), "name": name, "accuracy": "0.81", "accuracy_metric": "holdout accuracy",
            "file": SimpleUploadedFile("mlp.onnx", data, content_type="application/octet-stream")}
    form.update(fields)
    return form


def test_viewer_sees_applications_without_the_form(client, users):
    client.force_login(users["viewer"])
    response = client.get("/applications/")
    assert response.status_code == 200
    html = response.content.decode()
    for application in Application.objects.all():
        assert f'data-application="{application.name}"' in html and f'href="/applications/{application.pk}/"' in html
    assert "data-profile-chart" not in html and "data-variant=" not in html  # a list to scan: details are on each page
    assert len(html) < 60_000, len(html)
    assert "Upload a variant" not in html and 'enctype="multipart/form-data"' not in html
    assert 'href="/applications/" class="active"' in html and "Applications <small>API" not in html
    resnet = Application.objects.get(name="classify-resnet")
    page = client.get(f"/applications/{resnet.pk}/").content.decode()
    assert 'data-variant="resnet50"' in page
    assert "p99 ≤ 60 ms" in page and "accuracy ≥ 76%" in page  # classify-resnet's SLO
    assert "no artifact" in page  # the GPU demo variants have no ONNX file
    tabular = ModelVariant.objects.filter(artifact__isnull=False).select_related("artifact").first()
    page = client.get(f"/applications/{tabular.application_id}/").content.decode()
    assert tabular.artifact.sha256[:12] in page and tabular.artifact.original_name in page
    assert "Upload another variant" not in page
    assert client.get("/applications/999999/").status_code == 404


def test_the_list_says_what_each_application_is_doing(client, users):
    """Its traffic over the last minute from the routers' reports, the accuracy of what its table routes,
    and a state an operator can act on."""
    from django.utils import timezone

    from apps.deployments.services import application_release
    from apps.telemetry.models import ApplicationSample

    resnet = Application.objects.get(name="classify-resnet")
    ApplicationSample.objects.create(router="r1", application=resnet, application_name=resnet.name, at=timezone.now(), interval_s=1.0,
                                     arrivals=120, served=114, late=6, latency_p99_ms=72.5)
    application_release(application=Application.objects.get(name="classify-vgg"))
    Application.objects.create(name="unplanned-app")
    client.force_login(users["viewer"])
    html = client.get("/applications/").content.decode()
    row = html.split('data-application="classify-resnet"', 1)[1].split("</tr>", 1)[0]
    assert "2.0/s" in row and "1.9/s" in row and "72.5 ms" in row and "5% bad" in row  # 120 and 114 in 60 s
    assert 'class="error">72.5 ms' in row  # over its 60 ms SLO
    assert "60 ms" in row and 'data-state="' in html.split('data-application="classify-resnet"', 1)[1][:40]
    vgg = html.split('data-application="classify-vgg"', 1)[1][:60]
    assert 'data-state="released"' in vgg
    assert 'data-state="no SLO"' in html.split('data-application="unplanned-app"', 1)[1][:40]


def test_an_applications_page_shows_its_pipelines_ensemble_and_plans(client, users):
    from apps.planning.models import Plan

    calibrate = Application.objects.get(name="tabular-calibrate")
    Plan.objects.create(status="validated", routing={"tabular-calibrate": [{"instance": "sim-cpu-01/cpu0/2", "variant": 1, "weight": 1.0}]})
    Plan.objects.create(status="validated", routing={"classify-resnet": []})
    client.force_login(users["viewer"])
    page = client.get(f"/applications/{calibrate.pk}/").content.decode()
    assert "Pipelines it is a stage of" in page and "tabular-chain" in page
    plans = page.split("data-plans", 1)[1]
    assert plans.count("data-plan=") == 1 and "1 instance" in plans
    ensemble = Application.objects.get(name="tabular-ensemble")
    page = client.get(f"/applications/{ensemble.pk}/").content.decode()
    assert "Ensemble policy" in page and "bag-rf-64" in page and "Policies page" in page
    assert "No plan has routed it yet." in page


def test_viewer_post_is_forbidden(client, users):
    client.force_login(users["viewer"])
    application = Application.objects.get(name="tabular-cpu")
    response = client.post("/applications/", _form(application, onnx_mlp_bytes()))
    assert response.status_code == 403
    assert not ModelVariant.objects.filter(name="mlp-small").exists()


def test_anonymous_is_sent_to_login(client):
    response = client.get("/applications/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_operator_uploads_a_variant(client, users):
    client.force_login(users["operator"])
    assert "Upload a variant" in client.get("/applications/").content.decode()
    application = Application.objects.get(name="tabular-cpu")
    data = onnx_mlp_bytes(seed=123)
    artifacts = Artifact.objects.count()
    response = client.post("/applications/", _form(application, data), follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == f"/applications/{application.pk}/"  # to the application's page
    variant = ModelVariant.objects.get(application=application, name="mlp-small")
    assert variant.accuracy == pytest.approx(0.81) and variant.accuracy_metric == "holdout accuracy"
    assert variant.artifact is not None and variant.artifact.original_name == "mlp.onnx"
    assert variant.artifact.uploaded_by == users["operator"] and variant.inputs == variant.artifact.inputs
    assert Artifact.objects.count() == artifacts + 1
    html = response.content.decode()
    assert "Variant tabular-cpu/mlp-small uploaded" in html and variant.artifact.sha256[:12] in html


@pytest.mark.parametrize("data, text", [
    (b"not an onnx model", "Not an ONNX model"),
    (onnx_failing_checker_bytes(), "ONNX checker"),
])
def test_invalid_file_is_shown_inline_and_nothing_is_stored(client, users, data, text):
    client.force_login(users["operator"])
    application = Application.objects.get(name="tabular-cpu")
    artifacts, variants = Artifact.objects.count(), ModelVariant.objects.count()
    response = client.post("/applications/", _form(application, data, name="broken-one"))
    assert response.status_code == 400
    html = response.content.decode()
    assert "data-upload-errors" in html and text in html
    assert 'value="broken-one"' in html and 'value="holdout accuracy"' in html  # the form keeps its values
    assert f'<option value="{application.pk}" selected>' in html
    assert Artifact.objects.count() == artifacts and ModelVariant.objects.count() == variants


def test_bad_variant_fields_roll_back_the_artifact(client, users):
    client.force_login(users["operator"])
    application = Application.objects.get(name="tabular-cpu")
    existing = application.variants.first().name
    artifacts = Artifact.objects.count()
    response = client.post("/applications/", _form(application, onnx_mlp_bytes(seed=7), name=existing))
    assert response.status_code == 400
    assert "already exists" in response.content.decode()
    assert Artifact.objects.count() == artifacts
    response = client.post("/applications/", _form(application, onnx_mlp_bytes(seed=7), accuracy="1.5"))
    assert response.status_code == 400 and "Accuracy: " in response.content.decode()
    assert Artifact.objects.count() == artifacts
    # The same file goes through once the fields are right: no leftover row or file blocked it.
    response = client.post("/applications/", _form(application, onnx_mlp_bytes(seed=7)))
    assert response.status_code == 302 and Artifact.objects.count() == artifacts + 1


# --------------------------------------------------------------------------- profile charts

def _chart_data(html: str, variant: ModelVariant) -> dict:
    """The json_script block the page embeds for a variant's latency-vs-batch chart."""
    match = re.search(rf'<script id="profile-data-{variant.pk}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no chart data for {variant}"
    return json.loads(match[1])


def test_profiled_variant_embeds_its_stored_profiles(client, users):
    client.force_login(users["viewer"])
    variant = ModelVariant.objects.get(application__name="classify-resnet", name="resnet50")
    html = client.get(f"/applications/{variant.application_id}/").content.decode()
    data = _chart_data(html, variant)
    rows = list(Profile.objects.filter(variant=variant))
    assert data["batch_sizes"] == sorted({p.batch_size for p in rows})
    assert data["slo_ms"] == 60.0  # classify-resnet's p99 SLO, drawn as the reference line
    assert f'data-profile-chart="profile-data-{variant.pk}"' in html
    stored = {(p.device_type, p.slice, p.batch_size): p.latency_p99_ms for p in rows}
    assert len(data["series"]) == len({(p.device_type, p.slice) for p in rows})
    for series in data["series"]:
        for batch, latency in zip(data["batch_sizes"], series["latency_ms"]):
            assert latency == stored.get((series["device_type"], series["slice"], batch))
        assert series["source"] == "imported"
    # Within a GPU model, slices go smallest to largest, the whole GPU last.
    a100 = [s["slice"] for s in data["series"] if s["device_type"] == "A100-SXM4-40GB"]
    assert a100[0].startswith("1g.") and a100[-1] == "full" and "3g.20gb" in a100
    # The CPU variants' measured profiles come out labelled as such.
    cpu_variant = ModelVariant.objects.filter(application__name="tabular-cpu").first()
    cpu = _chart_data(client.get(f"/applications/{cpu_variant.application_id}/").content.decode(), cpu_variant)["series"]
    assert [(s["device"], s["label"], s["source"]) for s in cpu] == [("CPU", "1 core", "measured"), ("CPU", "2 cores", "measured")]
    assert '<script src="/static/dashboard/profile_charts.js">' in html and "uPlot.iife.min.js" in html


def test_unprofiled_variant_says_so(client, users):
    application = Application.objects.get(name="classify-resnet")
    variant = ModelVariant.objects.create(application=application, name="resnet18", accuracy=0.69, accuracy_metric="ImageNet top-1")
    client.force_login(users["viewer"])
    html = client.get(f"/applications/{application.pk}/").content.decode()
    figure = html.split('data-variant-profiles="resnet18"', 1)[1].split("</figure>", 1)[0]
    assert "Not profiled yet." in figure and "data-profile-chart" not in figure
    assert f'id="profile-data-{variant.pk}"' not in html


def test_profile_series_gaps_and_order():
    application = Application.objects.create(name="charts-app")
    variant = ModelVariant.objects.create(application=application, name="v", accuracy=0.5, accuracy_metric="m")
    other = ModelVariant.objects.create(application=application, name="w", accuracy=0.4, accuracy_metric="m")
    points = [("A100-SXM4-40GB", "full", None, 1, 2.0), ("A100-SXM4-40GB", "full", None, 8, 5.0),
              ("A100-SXM4-40GB", "1g.5gb", None, 1, 4.0), ("A100-SXM4-40GB", "1g.5gb", None, 4, 9.0),
              ("cpu", "", 2, 1, 30.0)]
    for device_type, slice_, cores, batch, p99 in points:
        Profile.objects.create(variant=variant, device_type=device_type, slice=slice_, cpu_cores=cores, batch_size=batch,
                               latency_p50_ms=p99, latency_p99_ms=p99, throughput_rps=batch * 1000 / p99,
                               source=ProfileSourceChoices.MEASURED)
    data = variant_profile_series([variant.pk, other.pk])
    assert set(data) == {variant.pk}  # a variant without rows is absent (the page says "not profiled yet")
    chart = data[variant.pk]
    assert chart["batch_sizes"] == [1, 4, 8]
    assert [(s["label"], s["latency_ms"]) for s in chart["series"]] == [
        ("1g.5gb", [4.0, 9.0, None]), ("full GPU", [2.0, None, 5.0]), ("2 cores", [30.0, None, None]),
    ]
    assert chart["series"][-1]["device"] == "CPU" and chart["series"][0]["source"] == "measured"
    assert variant_profile_series([]) == {}


def test_profile_series_is_one_query(users, django_assert_num_queries, django_assert_max_num_queries):
    variants = ModelVariant.objects.all()
    with django_assert_num_queries(1):
        data = variant_profile_series(variants)
    assert len(data) == Profile.objects.values("variant").distinct().count() >= 10
    # The page's selector stays bounded however many variants there are (no query per variant).
    with django_assert_max_num_queries(8):
        overview = applications_overview(users["viewer"])
    assert sum(1 for a in overview for v in a.variants if v.chart) == len(data)
    # So does the list's: a fixed number of queries, not one per application.
    from apps.dashboard.applications import applications_list

    with django_assert_max_num_queries(10):
        rows = applications_list(users["viewer"])
    assert len(rows) == Application.objects.count()


# --------------------------------------------------------------------------- the guided deploy flow

def _steps(html: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r'<li data-step="(\w+)" data-done="(true|false)"', html)}


def test_a_new_applications_page_says_what_is_missing_step_by_step(client, users):
    from apps.policies.models import SloPolicy

    fresh = Application.objects.create(name="fresh-app")
    client.force_login(users["operator"])
    page = client.get(f"/applications/{fresh.pk}/").content.decode()
    assert _steps(page) == {"variant": "false", "slo": "false", "profiles": "false", "plan": "false", "serve": "false"}
    assert f'href="/applications/?application={fresh.pk}#upload">Upload one</a>' in page and "no variant with an ONNX file yet" in page
    assert "data-deploy-action" not in page  # nothing to profile or plan before a variant exists
    # The upload link preselects the application in the list's form.
    assert f'<option value="{fresh.pk}" selected>' in client.get(f"/applications/?application={fresh.pk}").content.decode()

    client.post("/applications/", _form(fresh, onnx_mlp_bytes(seed=5), name="fresh-mlp"))
    page = client.get(f"/applications/{fresh.pk}/").content.decode()
    assert _steps(page)["variant"] == "true" and 'data-deploy-action="slo"' in page and 'name="latency_p99_ms"' in page
    refused = client.post(f"/applications/{fresh.pk}/deploy/slo/", {"latency_p99_ms": "fast"}, follow=True)
    assert "give a number" in refused.content.decode() and not SloPolicy.objects.filter(application=fresh).exists()
    refused = client.post(f"/applications/{fresh.pk}/deploy/slo/", {"latency_p99_ms": "-5"}, follow=True)
    assert not SloPolicy.objects.filter(application=fresh).exists()
    client.post(f"/applications/{fresh.pk}/deploy/slo/", {"latency_p99_ms": "50", "expected_rps": "20"})
    slo = SloPolicy.objects.get(application=fresh)
    assert (slo.latency_p99_ms, slo.expected_rps) == (50.0, 20.0)
    assert ObjectChange.objects.filter(changed_object_type__model="slopolicy", changed_object_id=str(slo.pk), user=users["operator"]).exists()
    page = client.get(f"/applications/{fresh.pk}/").content.decode()
    assert _steps(page) == {"variant": "true", "slo": "true", "profiles": "false", "plan": "false", "serve": "false"}
    assert "planned for at least 20 queries/s" in page and "not profiled: fresh-mlp" in page
    assert 'data-deploy-action="profile"' in page and 'data-deploy-action="plan"' not in page  # one step at a time
    # No agent of the demo can measure it (its hosts have not reported): refused as a message, nothing stored.
    response = client.post(f"/applications/{fresh.pk}/deploy/profile/", follow=True)
    assert response.redirect_chain[-1][0] == f"/applications/{fresh.pk}/"
    assert "error" in response.content.decode() and not fresh.variants.get().profiles.exists()

    client.force_login(users["viewer"])
    page = client.get(f"/applications/{fresh.pk}/").content.decode()
    assert "data-deploy-action" not in page  # viewers see the steps, not the actions
    assert client.post(f"/applications/{fresh.pk}/deploy/plan/").status_code == 403


def test_the_plan_and_apply_steps_open_their_jobs(client, users, django_capture_on_commit_callbacks):
    from apps.jobs.models import Job
    from apps.planning.models import Plan

    from apps.inventory.models import Host

    Host.objects.update(status="online")  # as if their agents had reported: the fleet can be planned
    mobile = Application.objects.get(name="classify-mobile")
    client.force_login(users["operator"])
    assert client.post(f"/applications/{mobile.pk}/deploy/nothing/").status_code == 404
    page = client.get(f"/applications/{mobile.pk}/").content.decode()
    assert _steps(page)["profiles"] == "true"
    with django_capture_on_commit_callbacks(execute=True):  # the plan run's task runs in the caller here
        response = client.post(f"/applications/{mobile.pk}/deploy/plan/")
    job = Job.objects.filter(kind="planning").latest("pk")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    plan = Plan.objects.get(job=job)
    assert plan.trigger_detail == "dashboard: deploy classify-mobile" and plan.created_by == users["operator"]
    assert plan.status == "validated", plan.notes
    page = client.get(f"/applications/{mobile.pk}/").content.decode()
    assert _steps(page)["plan"] == "true" and f"Approve and apply plan #{plan.pk}" in page
    response = client.post(f"/applications/{mobile.pk}/deploy/apply/")  # queued on commit: not run here
    rollout = Job.objects.filter(kind="rollout").latest("pk")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{rollout.pk}/" and rollout.params["plan"] == plan.pk
