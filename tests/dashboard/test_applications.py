"""The applications page through Django's test client: viewers see every application with its SLO and
variants but no upload form; operators upload a variant with its ONNX file (artifact and variant stored
together), and a rejected file comes back inline with nothing stored."""
import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.registry.models import Application, Artifact, ModelVariant
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
        assert f'data-application="{application.name}"' in html
    assert 'data-variant="resnet50"' in html
    assert "p99 ≤ 60 ms" in html and "accuracy ≥ 76%" in html  # classify-resnet's SLO
    assert "no artifact" in html  # the GPU demo variants have no ONNX file
    tabular = ModelVariant.objects.filter(artifact__isnull=False).select_related("artifact").first()
    assert tabular.artifact.sha256[:12] in html and tabular.artifact.original_name in html
    assert "Upload a variant" not in html and 'enctype="multipart/form-data"' not in html
    assert 'href="/applications/" class="active"' in html and "Applications <small>API" not in html


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
    assert response.redirect_chain[-1][0] == "/applications/"
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
