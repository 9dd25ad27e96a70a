"""Importing profiles measured elsewhere: `POST /api/v1/profiles/import/` with CSV (text/csv body or a
multipart file) or a JSON list; upserted as `imported` profiles, all or nothing."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.registry.models import Profile
from tests.factories import ApplicationFactory, ModelVariantFactory, ProfileFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/profiles/import/"


@pytest.fixture
def variants(db):
    application = ApplicationFactory(name="classify")
    return ModelVariantFactory(application=application, name="resnet50"), ModelVariantFactory(application=application, name="mobilenet")


def _csv(client, text: str):
    return client.generic("POST", URL, text.encode(), content_type="text/csv")


def _good_csv(resnet, mobilenet, p50: float = 10.0) -> str:
    return (
        "variant,device_type,slice,cpu_cores,batch_size,latency_p50_ms,latency_p99_ms,throughput_rps,memory_mb,source_detail\n"
        f"classify/resnet50,NVIDIA A100-SXM4-40GB,MIG 3G.20GB,,8,{p50},{p50 * 1.5},,1200,vendor sheet\n"
        f"{mobilenet.pk},cpu,,4,1,{p50},{p50 * 2},90,,\n"
        f"classify/mobilenet,a100-sxm4-40gb,full,,16,{p50},{p50 * 1.2},,,\n"
    )


def test_csv_body_creates_then_updates(clients, variants):
    resnet, mobilenet = variants
    response = _csv(clients["operator"], _good_csv(resnet, mobilenet))
    assert response.status_code == 200, response.content
    assert response.json() == {"created": 3, "updated": 0}
    mig = Profile.objects.get(variant=resnet)
    assert (mig.device_type, mig.slice, mig.batch_size, mig.source, mig.source_detail) == ("A100-SXM4-40GB", "3g.20gb", 8, "imported", "vendor sheet")
    assert mig.throughput_rps == pytest.approx(800.0) and mig.memory_mb == 1200 and mig.measured_at is None
    cpu = Profile.objects.get(variant=mobilenet, device_type="cpu")
    assert (cpu.cpu_cores, cpu.slice, cpu.throughput_rps) == (4, "", 90.0)

    again = _csv(clients["operator"], _good_csv(resnet, mobilenet, p50=20.0))
    assert again.json() == {"created": 0, "updated": 3}
    assert Profile.objects.count() == 3 and Profile.objects.get(pk=mig.pk).latency_p50_ms == 20.0


def test_multipart_file_and_json_list(clients, variants):
    resnet, mobilenet = variants
    upload = SimpleUploadedFile("sheet.csv", _good_csv(resnet, mobilenet).encode("utf-8-sig"), content_type="text/csv")
    response = clients["operator"].post(URL, {"file": upload}, format="multipart")
    assert response.status_code == 200, response.content
    assert response.json() == {"created": 3, "updated": 0}
    assert Profile.objects.get(variant=mobilenet, device_type="cpu").source_detail == "imported from sheet.csv"

    measured = ProfileFactory(variant=resnet, device_type="A100-SXM4-40GB", slice="full", batch_size=1, source="measured")
    rows = [
        {"variant": resnet.pk, "device_type": "A100-SXM4-40GB", "slice": "full", "batch_size": 1, "latency_p50_ms": 3, "latency_p99_ms": 4},
        {"variant": "classify/resnet50", "device_type": "cpu", "cpu_cores": 2, "batch_size": 2, "latency_p50_ms": 30.5,
         "latency_p99_ms": 41, "throughput_rps": None, "source_detail": "laptop"},
    ]
    response = clients["operator"].post(URL, rows, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"created": 1, "updated": 1}
    measured.refresh_from_db()
    assert measured.source == "imported" and measured.latency_p50_ms == 3 and measured.throughput_rps == pytest.approx(1000 / 3)


def test_a_bad_csv_row_rejects_every_row_with_its_line(clients, variants):
    text = (
        "variant,device_type,slice,cpu_cores,batch_size,latency_p50_ms,latency_p99_ms\n"
        "classify/resnet50,cpu,,4,1,10,12\n"
        "\n"
        "classify/resnet50,cpu,,4,x,10,12\n"
        "classify/nope,cpu,,4,2,10,12\n"
        "classify/resnet50,A100-SXM4-40GB,4g.99gb,,1,10,12\n"
        "classify/resnet50,cpu,,4,8,10,5\n"
        "classify/resnet50,cpu,,4,1,11,12\n"
        "classify/resnet50,cpu,,4\n"
    )
    response = _csv(clients["operator"], text)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert set(fields) == {"line 4", "line 5", "line 6", "line 7", "line 8", "line 9"}
    assert "batch_size" in fields["line 4"][0] and "no variant 'classify/nope'" in fields["line 5"][0]
    assert "not a MIG profile" in " ".join(fields["line 6"]) and "p99 latency cannot be below p50" in " ".join(fields["line 7"])
    assert "the same point as line 2" in fields["line 8"][0] and "4 values for 7 columns" in fields["line 9"][0]
    assert response.json()["error"]["message"].startswith("line 4: ")
    assert not Profile.objects.exists()


def test_a_bad_json_row_rejects_every_row(clients, variants):
    resnet, _ = variants
    good = {"variant": resnet.pk, "device_type": "cpu", "cpu_cores": 1, "batch_size": 1, "latency_p50_ms": 1, "latency_p99_ms": 2}
    rows = [good, {**good, "batch_size": 2, "cpu_cores": None}, {**good, "batch_size": 3, "colour": "red"}, "nope"]
    response = clients["operator"].post(URL, rows, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert set(fields) == {"row 2", "row 3", "row 4"}
    assert "cores" in fields["row 2"][0] and "unknown field(s) colour" in fields["row 3"][0]
    assert not Profile.objects.exists()


@pytest.mark.parametrize(
    "body,content_type,needle",
    [
        ("variant,device,batch_size\n", "text/csv", "line 1"),
        ("", "text/csv", "empty"),
        ('{"variant": 1}', "application/json", "JSON list"),
        ("[]", "application/json", "Nothing to import"),
    ],
)
def test_bad_bodies(clients, variants, body, content_type, needle):
    response = clients["operator"].generic("POST", URL, body.encode(), content_type=content_type)
    assert response.status_code == 400 and needle in str(response.json()["error"]), response.content


def test_permissions(clients, agent_hosts, variants):
    _, (agent, _) = agent_hosts
    resnet, mobilenet = variants
    text = _good_csv(resnet, mobilenet)
    assert _csv(clients["viewer"], text).status_code == 403
    assert _csv(agent, text).status_code == 403
    assert _csv(clients["anonymous"], text).status_code in (401, 403)
    assert not Profile.objects.exists()
    assert _csv(clients["admin"], text).status_code == 200
