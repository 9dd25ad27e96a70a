import pytest
from django.contrib.auth import authenticate

from apps.core.context import change_context
from apps.inventory.models import Accelerator, GpuInstance, Host
from apps.policies.models import SloPolicy
from apps.registry.models import Application, Artifact, ModelVariant, Profile
from controlplane.demo import DEMO_FLEET, demo_seed
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import layout_parse, mig_layout_validate

pytestmark = pytest.mark.django_db


def test_demo_seed_builds_a_valid_labelled_fleet():
    result = demo_seed(admin_password="Admin-demo-pass-1")
    assert result.created
    assert authenticate(username="admin", password="Admin-demo-pass-1") is not None
    assert Host.objects.count() == len(DEMO_FLEET) and all(h.simulated for h in Host.objects.all())
    gpu_models = set(Accelerator.objects.filter(kind="gpu").values_list("model_name", flat=True))
    assert any("A100" in m for m in gpu_models) and any("H100" in m for m in gpu_models)
    assert Accelerator.objects.filter(kind="cpu").count() == 1
    catalogue = mig_catalogue_load()
    for gpu in Accelerator.objects.filter(mig_enabled=True):
        layout = layout_parse([gi.placement for gi in gpu.gpu_instances.all()])
        assert layout and mig_layout_validate(catalogue.gpu_model_get(gpu.model_name), layout).valid
    assert GpuInstance.objects.exclude(state="pending").count() == 0, "declared, not reported by an agent"
    assert Application.objects.count() >= 4 and SloPolicy.objects.count() == Application.objects.count()
    # GPU profiles say they are derived; CPU profiles are measured on real ONNX artifacts.
    gpu_rows = Profile.objects.exclude(device_type="cpu")
    assert gpu_rows.count() > 100 and all(p.source_detail.startswith("derived:") for p in gpu_rows)
    cpu_rows = Profile.objects.filter(device_type="cpu")
    assert cpu_rows.count() == 14 and set(cpu_rows.values_list("source", flat=True)) == {"measured"}
    assert Artifact.objects.count() == 2 and ModelVariant.objects.filter(artifact__isnull=False).count() == 2
    slices = set(Profile.objects.filter(device_type="A100-SXM4-40GB").values_list("slice", flat=True))
    assert {"full", "1g.5gb", "3g.20gb", "7g.40gb"} <= slices


def test_demo_seed_is_idempotent():
    demo_seed()
    counts = (Host.objects.count(), Profile.objects.count(), Artifact.objects.count())
    with change_context(source="test"):
        again = demo_seed()
    assert not again.created and counts == (Host.objects.count(), Profile.objects.count(), Artifact.objects.count())
