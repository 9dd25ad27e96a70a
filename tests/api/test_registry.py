import hashlib
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from apps.registry.models import Artifact, ModelVariant, Profile
from tests.factories import ApplicationFactory, ModelVariantFactory
from tests.onnx_builders import onnx_failing_checker_bytes, onnx_mlp_bytes, onnx_sequence_input_bytes, onnx_text_bytes, onnx_unloadable_bytes

pytestmark = pytest.mark.django_db


def _upload(client, data: bytes, name: str = "model.onnx"):
    return client.post("/api/v1/artifacts/", {"file": SimpleUploadedFile(name, data)}, format="multipart")


def _stored_files(settings) -> list[Path]:
    root = Path(settings.MEDIA_ROOT) / "artifacts"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_upload_valid_onnx(clients, settings):
    data = onnx_mlp_bytes()
    response = _upload(clients["operator"], data, "mlp.onnx")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["sha256"] == hashlib.sha256(data).hexdigest() and body["size_bytes"] == len(data)
    assert body["opset"] == 17 and body["ir_version"] == 8 and body["original_name"] == "mlp.onnx"
    assert body["inputs"] == [{"name": "x", "dtype": "tensor(float)", "shape": ["batch", 4]}]
    assert body["outputs"][0]["name"] == "logits"
    download = clients["viewer"].get(f"/api/v1/artifacts/{body['id']}/download/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == data
    assert download["X-Checksum-Sha256"] == body["sha256"]
    assert len(_stored_files(settings)) == 1


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"this is not an onnx model", "Not an ONNX model"),
        (onnx_failing_checker_bytes(), "ONNX checker"),
        (onnx_unloadable_bytes(), "onnxruntime cannot load"),
        (onnx_sequence_input_bytes(), "Tessera cannot feed input xs (seq(tensor(float)))"),
        (b"", "empty"),
    ],
)
def test_bad_onnx_is_refused_and_leaves_nothing(clients, settings, data, needle):
    response = _upload(clients["operator"], data)
    assert response.status_code == 400
    error = response.json()["error"]
    assert needle in error["message"] and "file" in error["fields"]
    assert not Artifact.objects.exists() and _stored_files(settings) == []


def test_oversized_upload_is_refused(clients, settings):
    data = onnx_mlp_bytes(n_in=64, hidden=256)
    with override_settings(TESSERA_ARTIFACT_MAX_BYTES=len(data) - 1):
        response = _upload(clients["operator"], data)
    assert response.status_code == 400 and "larger than the limit" in response.json()["error"]["message"]
    assert not Artifact.objects.exists() and _stored_files(settings) == []


def test_duplicate_upload_is_refused(clients, settings):
    data = onnx_mlp_bytes()
    first = _upload(clients["operator"], data).json()
    again = _upload(clients["operator"], data)
    assert again.status_code == 400 and f"artifact {first['id']}" in again.json()["error"]["message"]
    assert Artifact.objects.count() == 1 and len(_stored_files(settings)) == 1


def test_artifact_in_use_cannot_be_deleted(clients, settings):
    artifact = _upload(clients["operator"], onnx_mlp_bytes()).json()
    ModelVariantFactory(artifact_id=artifact["id"])
    response = clients["operator"].delete(f"/api/v1/artifacts/{artifact['id']}/")
    assert response.status_code == 400 and "used by variants" in response.json()["error"]["message"]
    ModelVariant.objects.all().delete()
    assert clients["operator"].delete(f"/api/v1/artifacts/{artifact['id']}/").status_code == 204
    assert _stored_files(settings) == []


def test_variant_takes_io_from_artifact_and_checks_names(clients):
    artifact = _upload(clients["operator"], onnx_mlp_bytes()).json()
    app = ApplicationFactory()
    ok = clients["operator"].post(
        "/api/v1/variants/",
        {"application": app.pk, "name": "mlp", "accuracy": 0.9, "accuracy_metric": "val acc", "artifact": artifact["id"]},
        format="json",
    )
    assert ok.status_code == 201, ok.content
    assert ok.json()["inputs"][0]["name"] == "x"
    wrong = clients["operator"].post(
        "/api/v1/variants/",
        {"application": app.pk, "name": "mlp2", "accuracy": 0.9, "accuracy_metric": "val acc", "artifact": artifact["id"],
         "inputs": [{"name": "pixels", "dtype": "tensor(float)", "shape": [1]}]},
        format="json",
    )
    assert wrong.status_code == 400 and "pixels" in wrong.json()["error"]["message"]


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"accuracy": 1.2}, "accuracy"),
        ({"accuracy": -0.1}, "accuracy"),
        ({"application": 999999}, "application"),
        ({"name": "has space"}, "name"),
        ({"inputs": [{"dtype": "float"}]}, "inputs"),
    ],
)
def test_variant_bad_input(clients, payload, field):
    app = ApplicationFactory()
    body = {"application": app.pk, "name": "v1", "accuracy": 0.7, "accuracy_metric": "top-1", **payload}
    response = clients["operator"].post("/api/v1/variants/", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert not ModelVariant.objects.exists()


def test_variant_names_unique_per_application(clients):
    variant = ModelVariantFactory(name="fast")
    response = clients["operator"].post(
        "/api/v1/variants/",
        {"application": variant.application_id, "name": "fast", "accuracy": 0.5, "accuracy_metric": "x"},
        format="json",
    )
    assert response.status_code == 400
    other = clients["operator"].post(
        "/api/v1/variants/",
        {"application": ApplicationFactory().pk, "name": "fast", "accuracy": 0.5, "accuracy_metric": "x"},
        format="json",
    )
    assert other.status_code == 201


def test_profile_normalises_gpu_and_derives_throughput(clients):
    variant = ModelVariantFactory()
    response = clients["operator"].post(
        "/api/v1/profiles/",
        {"variant": variant.pk, "device_type": "NVIDIA A100-SXM4-40GB", "slice": "MIG 3G.20GB", "batch_size": 8,
         "latency_p50_ms": 20, "latency_p99_ms": 25},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["device_type"] == "A100-SXM4-40GB" and body["slice"] == "3g.20gb"
    assert body["throughput_rps"] == pytest.approx(400.0)


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"device_type": "A100-SXM4-40GB", "slice": "1g.18gb"}, "slice"),
        ({"device_type": "A100-SXM4-40GB", "slice": ""}, "slice"),
        ({"device_type": "cpu", "slice": ""}, "cpu_cores"),
        ({"device_type": "cpu", "slice": "full", "cpu_cores": 4}, "slice"),
        ({"device_type": "A100-SXM4-40GB", "slice": "full", "latency_p99_ms": 1}, "latency_p99_ms"),
        ({"device_type": "A100-SXM4-40GB", "slice": "full", "batch_size": 0}, "batch_size"),
        ({"device_type": "A100-SXM4-40GB", "slice": "full", "latency_p50_ms": -3}, "latency_p50_ms"),
    ],
)
def test_profile_bad_input(clients, payload, field):
    variant = ModelVariantFactory()
    body = {"variant": variant.pk, "batch_size": 4, "latency_p50_ms": 5, "latency_p99_ms": 6, **payload}
    response = clients["operator"].post("/api/v1/profiles/", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"], response.content
    assert not Profile.objects.exists()


def test_profile_for_a_gpu_outside_the_catalogue(clients):
    variant = ModelVariantFactory()
    response = clients["operator"].post(
        "/api/v1/profiles/",
        {"variant": variant.pk, "device_type": "RTX-2080Ti", "slice": "full", "batch_size": 1, "latency_p50_ms": 4.7, "latency_p99_ms": 5},
        format="json",
    )
    assert response.status_code == 201


def test_profile_filters(clients):
    variant = ModelVariantFactory()
    for batch in (1, 2, 4):
        Profile.objects.create(variant=variant, device_type="cpu", cpu_cores=4, batch_size=batch, latency_p50_ms=batch, latency_p99_ms=batch, throughput_rps=1000)
    rows = clients["viewer"].get(f"/api/v1/profiles/?variant={variant.pk}&device_type=cpu&ordering=-batch_size").json()["results"]
    assert [r["batch_size"] for r in rows] == [4, 2, 1]


def test_a_text_model_is_accepted_with_its_inputs_as_bytes(clients):
    """String inputs are fed as the protocol's BYTES (issue 38): a text model uploads, and its tensors read so."""
    response = _upload(clients["operator"], onnx_text_bytes())
    assert response.status_code == 201, response.content
    assert response.json()["inputs"] == [{"name": "text", "dtype": "tensor(string)", "shape": ["batch", 1]}]
