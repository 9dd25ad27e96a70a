"""MPS in the registry (issue 17, gpulets): profiles on MPS partitions ("mpsNN") with their L2/DRAM
utilisation, co-run interference measurements on the API, and the import of the gpulets reference data
(service and `manage.py gpulet_import`: idempotent, all or nothing)."""
import io
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from apps.core.models import ObjectChange
from apps.registry.models import CorunMeasurement, Profile
from apps.registry.services.gpulet import gpulet_import
from engine.reference.profiles import (
    GPULET_GPU_MODEL,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
)
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db


# --------------------------------------------------------------------------- profiles on MPS partitions


def _profile(variant, **over):
    return {"variant": variant.pk, "device_type": GPULET_GPU_MODEL, "slice": "mps60", "batch_size": 4, "latency_p50_ms": 10.0,
            "latency_p99_ms": 12.0, **over}


def test_profile_on_an_mps_partition_with_utilisation(clients):
    variant = ModelVariantFactory()
    op = clients["operator"]
    created = op.post("/api/v1/profiles/", _profile(variant, slice="MPS60", l2_util_pct=31.5, dram_util_pct=12.25), format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["slice"], body["l2_util_pct"], body["dram_util_pct"]) == ("mps60", 31.5, 12.25)
    # On a MIG-capable GPU of the catalogue too: an MPS partition is not a MIG profile.
    a100 = op.post("/api/v1/profiles/", _profile(variant, device_type="a100-sxm4-40gb", slice="mps100"), format="json")
    assert a100.status_code == 201, a100.content
    assert (a100.json()["device_type"], a100.json()["slice"]) == ("A100-SXM4-40GB", "mps100")
    assert [p["slice"] for p in op.get("/api/v1/profiles/?slice=mps60").json()["results"]] == ["mps60"]
    change = ObjectChange.objects.filter(changed_object_type__model="profile").order_by("time", "id").first()
    assert change.postchange_data["l2_util_pct"] == 31.5


@pytest.mark.parametrize(
    "over,field,needle",
    [
        ({"slice": "mps0"}, "slice", "not an MPS partition"),
        ({"slice": "mps101"}, "slice", "not an MPS partition"),
        ({"slice": "mps060"}, "slice", "not an MPS partition"),
        ({"slice": "mps"}, "slice", "not an MPS partition"),
        ({"slice": "mps60", "device_type": "A100-SXM4-40GB", "l2_util_pct": 100.5}, "l2_util_pct", "less than or equal to 100"),
        ({"slice": "mps60", "dram_util_pct": -1}, "dram_util_pct", "greater than or equal to 0"),
        ({"device_type": "cpu", "slice": "", "cpu_cores": 4, "l2_util_pct": 10.0}, "l2_util_pct", "CPU profile has none"),
    ],
)
def test_bad_mps_profile_is_refused(clients, over, field, needle):
    response = clients["operator"].post("/api/v1/profiles/", _profile(ModelVariantFactory(), **over), format="json")
    assert response.status_code == 400, response.content
    assert needle in " ".join(response.json()["error"]["fields"][field])
    assert not Profile.objects.exists()


def test_profile_import_takes_utilisations_and_refuses_non_finite_numbers(clients):
    variant = ModelVariantFactory(application=ApplicationFactory(name="classify"), name="resnet50")
    url = "/api/v1/profiles/import/"
    header = "variant,device_type,slice,batch_size,latency_p50_ms,latency_p99_ms,l2_util_pct,dram_util_pct\n"
    ok = clients["operator"].generic("POST", url, (header + "classify/resnet50,RTX-2080Ti,mps40,2,5,6,20.5,11\n").encode(),
                                     content_type="text/csv")
    assert ok.status_code == 200, ok.content
    assert Profile.objects.values_list("slice", "l2_util_pct", "dram_util_pct").get() == ("mps40", 20.5, 11.0)
    for bad in ("nan", "inf"):
        response = clients["operator"].generic("POST", url, (header + f"classify/resnet50,RTX-2080Ti,mps40,4,{bad},6,1,1\n").encode(),
                                               content_type="text/csv")
        assert response.status_code == 400 and "not a finite number" in response.json()["error"]["message"]
    assert Profile.objects.filter(variant=variant).count() == 1


# --------------------------------------------------------------------------- co-run measurements


def _corun(a, b, **over):
    return {"variant": a.pk, "corunner": b.pk, "device_type": GPULET_GPU_MODEL, "batch": 4, "partition_pct": 40,
            "corunner_batch": 8, "latency_ms": 12.5, **over}


def test_corun_measurements_api(clients):
    application = ApplicationFactory()
    a, b = ModelVariantFactory(application=application), ModelVariantFactory(application=application)
    op = clients["operator"]
    created = op.post("/api/v1/corun-measurements/", _corun(a, b, source_detail="bench"), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["source"] == "imported" and "mps40" in created.json()["display"]
    same_variant = op.post("/api/v1/corun-measurements/", _corun(a, a, device_type="a100-sxm4-40gb"), format="json")
    assert same_variant.status_code == 201 and same_variant.json()["device_type"] == "A100-SXM4-40GB"
    assert [c["id"] for c in op.get(f"/api/v1/corun-measurements/?corunner={b.pk}").json()["results"]] == [created.json()["id"]]
    assert op.get(f"/api/v1/corun-measurements/?application={application.pk}&partition_pct=40").json()["count"] == 2
    twice = op.post("/api/v1/corun-measurements/", _corun(a, b), format="json")
    assert twice.status_code == 400 and "unique" in twice.json()["error"]["message"]
    assert clients["viewer"].post("/api/v1/corun-measurements/", _corun(b, a), format="json").status_code == 403
    assert ObjectChange.objects.filter(changed_object_type__model="corunmeasurement", action="create").count() == 2


@pytest.mark.parametrize(
    "over,field,needle",
    [
        ({"partition_pct": 100}, "partition_pct", "less than or equal to 99"),
        ({"partition_pct": 0}, "partition_pct", "greater than or equal to 1"),
        ({"latency_ms": 0}, "latency_ms", "greater than or equal to 0.0001"),
        ({"batch": 0}, "batch", "greater than or equal to 1"),
        ({"device_type": "cpu"}, "device_type", "a CPU has none"),
        ({"corunner": 10**9}, "corunner", "does not exist"),
    ],
)
def test_bad_corun_measurement_is_refused(clients, over, field, needle):
    a = ModelVariantFactory()
    response = clients["operator"].post("/api/v1/corun-measurements/", _corun(a, a, **over), format="json")
    assert response.status_code == 400, response.content
    assert needle in " ".join(response.json()["error"]["fields"][field])
    assert not CorunMeasurement.objects.exists()


# --------------------------------------------------------------------------- the gpulets import


@pytest.fixture
def small_data(tmp_path) -> Path:
    """Three CSVs in the shared data's format: two models, vgg19 also in mem_util at a point without a
    profile, a BERT utilisation (no variant), and co-runs of both models (one beside BERT)."""
    (tmp_path / "inference.csv").write_text(
        "vgg19,1,40,throughput,100.0,latency,0.010,1\n"
        "vgg19,1,60,throughput,150.0,latency,0.0066,1\n"
        "vgg19,2,60,throughput,160.0,latency,0.0125,0\n"  # flag 0: not a valid measurement
        "resnet50,1,40,throughput,300.0,latency,0.0033,1\n"
        "resnet50,1,60,throughput,400.0,latency,0.0025,1\n"
    )
    (tmp_path / "mem_util.csv").write_text(
        "vgg19,1,40,mem_util,10.0,l2_util,12.0,0\n"
        "vgg19,1,60,mem_util,14.0,l2_util,16.0,0\n"
        "vgg19,4,60,mem_util,30.0,l2_util,33.0,0\n"
        "resnet50,1,40,mem_util,5.0,l2_util,6.0,0\n"
        "BERT,1,40,mem_util,50.0,l2_util,60.0,0\n"
    )
    (tmp_path / "interference.csv").write_text(
        "vgg19,1,40,resnet50,1,throughput,80.0,latency,0.0125,1\n"
        "resnet50,1,60,vgg19,1,throughput,350.0,latency,0.0029,1\n"
        "resnet50,1,60,BERT,1,throughput,350.0,latency,0.0030,1\n"
        "vgg19,1,60,resnet50,1,throughput,1.0,latency,0.5,0\n"  # flag 0
    )
    return tmp_path


@pytest.fixture
def gpulet_variants(db):
    application = ApplicationFactory(name="classify")
    return {name: ModelVariantFactory(application=application, name=name) for name in ("vgg19", "resnet50")}


def test_import_is_idempotent_and_reports_counts(small_data, gpulet_variants):
    result = gpulet_import(data_dir=small_data)
    assert (result.profiles_created, result.profiles_updated, result.profiles_unchanged) == (4, 0, 0)
    assert (result.coruns_created, result.coruns_updated, result.coruns_unchanged) == (2, 0, 0)
    assert result.utilisations == 3 and result.utilisations_without_profile == 1 and result.models_without_variant == ("BERT",)
    vgg = Profile.objects.get(variant=gpulet_variants["vgg19"], slice="mps40", batch_size=1)
    assert (vgg.device_type, vgg.latency_p50_ms, vgg.latency_p99_ms, vgg.throughput_rps) == (GPULET_GPU_MODEL, 10.0, 10.0, 100.0)
    assert (vgg.l2_util_pct, vgg.dram_util_pct, vgg.source) == (12.0, 10.0, "imported")
    assert Profile.objects.get(variant=gpulet_variants["resnet50"], slice="mps60").l2_util_pct is None
    # Created in bulk, each row still has its own audit record with what was stored.
    created = ObjectChange.objects.filter(action="create", changed_object_type__model="profile")
    assert sorted(int(c.changed_object_id) for c in created) == sorted(Profile.objects.values_list("pk", flat=True))
    audited = created.get(changed_object_id=str(vgg.pk))
    assert audited.postchange_data["latency_p50_ms"] == 10.0 and audited.postchange_data["slice"] == "mps40"
    assert ObjectChange.objects.filter(action="create", changed_object_type__model="corunmeasurement").count() == 2
    corun = CorunMeasurement.objects.get(variant=gpulet_variants["vgg19"])
    assert (corun.corunner, corun.partition_pct, corun.batch, corun.corunner_batch, corun.latency_ms) == (
        gpulet_variants["resnet50"], 40, 1, 1, 12.5)

    before = ObjectChange.objects.count()
    again = gpulet_import(data_dir=small_data)
    assert (again.profiles_created, again.profiles_updated, again.profiles_unchanged) == (0, 0, 4)
    assert (again.coruns_created, again.coruns_updated, again.coruns_unchanged) == (0, 0, 2)
    assert ObjectChange.objects.count() == before, "an import that changes nothing writes no audit entry"

    (small_data / "inference.csv").write_text((small_data / "inference.csv").read_text().replace("0.010,1", "0.011,1"))
    changed = gpulet_import(data_dir=small_data)
    assert (changed.profiles_created, changed.profiles_updated, changed.profiles_unchanged) == (0, 1, 3)
    assert Profile.objects.get(pk=vgg.pk).latency_p50_ms == pytest.approx(11.0)
    assert ObjectChange.objects.count() == before + 1


def test_import_is_all_or_nothing(small_data, gpulet_variants):
    with (small_data / "interference.csv").open("a") as fh:
        fh.write("vgg19,1,100,resnet50,1,throughput,80.0,latency,0.0125,1\n")  # 100 %: no room for a co-runner
    before = ObjectChange.objects.count()
    with pytest.raises(ValidationError) as caught:
        gpulet_import(data_dir=small_data)
    assert "partition_pct" in str(caught.value) and "vgg19 b1 100%" in str(caught.value)
    assert not Profile.objects.exists() and not CorunMeasurement.objects.exists() and ObjectChange.objects.count() == before


def test_import_refuses_what_it_cannot_place(small_data, tmp_path):
    with pytest.raises(ValidationError, match="No variant is named like a gpulet model"):
        gpulet_import(data_dir=small_data)
    first, second = ApplicationFactory(name="one"), ApplicationFactory(name="two")
    ModelVariantFactory(application=first, name="vgg19")
    ModelVariantFactory(application=second, name="vgg19")
    with pytest.raises(ValidationError, match=r"vgg19 \(in one, two\)"):
        gpulet_import(data_dir=small_data)
    with pytest.raises(ValidationError, match="No application named 'three'"):
        gpulet_import(data_dir=small_data, application="three")
    result = gpulet_import(data_dir=small_data, application="two")
    assert result.profiles_created == 2 and result.coruns_created == 0 and set(result.models_without_variant) == {"BERT", "resnet50"}
    assert set(Profile.objects.values_list("variant__application__name", flat=True)) == {"two"}
    with pytest.raises(ValidationError, match="not there"):
        gpulet_import(data_dir=tmp_path / "nowhere")


def test_management_command(small_data, gpulet_variants):
    out = io.StringIO()
    call_command("gpulet_import", "--data-dir", str(small_data), stdout=out)
    assert "profiles on RTX-2080Ti: 4 created, 0 updated, 0 unchanged" in out.getvalue()
    assert "co-run measurements: 2 created" in out.getvalue() and "skipped: BERT" in out.getvalue()
    assert ObjectChange.objects.filter(source="command").count() == 6
    with pytest.raises(CommandError, match="nothing imported: application: No application named"):
        call_command("gpulet_import", "--data-dir", str(small_data), "--application", "nope", stdout=io.StringIO())


def test_import_of_the_shared_reference_data():
    application = ApplicationFactory(name="gpulet")
    models = sorted({p.model for p in gpulet_inference_read()})
    for name in models:
        ModelVariantFactory(application=application, name=name)
    result = gpulet_import()
    assert result.profiles_created == len(gpulet_inference_read()) == 420
    assert result.coruns_created == len(gpulet_interference_read()) == 3675
    assert result.models_without_variant == ("BERT",)  # mem_util.csv only
    profiled = {(p.model, p.batch, p.partition_pct) for p in gpulet_inference_read()}
    assert result.utilisations == sum(1 for u in gpulet_mem_util_read() if (u.model, u.batch, u.partition_pct) in profiled)
    assert Profile.objects.filter(slice="mps100").count() == 70
