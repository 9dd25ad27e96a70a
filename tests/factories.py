import hashlib

import factory
from django.contrib.auth import get_user_model

from apps.inventory.choices import AcceleratorKindChoices, HostBackendChoices
from apps.inventory.models import Accelerator, GpuInstance, Host
from apps.policies.models import ReplanPolicy, SloPolicy
from apps.registry.models import Application, Artifact, ModelVariant, Profile, ProfilingRequest


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")

    @factory.post_generation
    def password(obj, create, extracted, **kwargs):
        obj.set_password(extracted or "pw-Correct-Horse-1")
        if create:
            obj.save(update_fields=["password"])


class HostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Host

    name = factory.Sequence(lambda n: f"host-{n:02d}")
    address = "10.0.0.1"
    backend = HostBackendChoices.SIMULATED


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Accelerator

    host = factory.SubFactory(HostFactory)
    index = factory.Sequence(lambda n: n)
    kind = AcceleratorKindChoices.GPU
    uuid = factory.Sequence(lambda n: f"GPU-test-{n:04d}")
    model_name = "NVIDIA A100-SXM4-40GB"
    memory_mb = 40960
    mig_capable = True
    mig_enabled = True


class CpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Accelerator

    host = factory.SubFactory(HostFactory)
    index = 0
    kind = AcceleratorKindChoices.CPU
    model_name = "cpu"
    cpu_cores = 8


class GpuInstanceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuInstance

    accelerator = factory.SubFactory(GpuFactory)
    profile = "3g.20gb"
    placement_start = 0


class ApplicationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Application

    name = factory.Sequence(lambda n: f"app-{n}")


class ArtifactFactory(factory.django.DjangoModelFactory):
    """An artifact row with a stored file, without the ONNX validation of an upload (for tests that only
    need one to exist or to be downloadable)."""

    class Meta:
        model = Artifact

    original_name = factory.Sequence(lambda n: f"model-{n}.onnx")
    sha256 = factory.Sequence(lambda n: hashlib.sha256(f"artifact-{n}".encode()).hexdigest())
    size_bytes = 16
    ir_version = 8
    opset = 17
    file = factory.django.FileField(filename="model.onnx", data=b"not-really-onnx!")


class ModelVariantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelVariant

    application = factory.SubFactory(ApplicationFactory)
    name = factory.Sequence(lambda n: f"variant-{n}")
    accuracy = 0.75
    accuracy_metric = "top-1"
    memory_mb = 500


class ProfileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Profile

    variant = factory.SubFactory(ModelVariantFactory)
    device_type = "A100-SXM4-40GB"
    slice = "3g.20gb"
    batch_size = 8
    latency_p50_ms = 10.0
    latency_p99_ms = 12.0
    throughput_rps = 800.0


class SloPolicyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SloPolicy

    application = factory.SubFactory(ApplicationFactory)
    latency_p99_ms = 50.0


class ReplanPolicyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ReplanPolicy

    name = factory.Sequence(lambda n: f"replan-{n}")


class ProfilingRequestFactory(factory.django.DjangoModelFactory):
    """A pending request to profile on cpu0 (give the host a CpuFactory accelerator where that matters)."""

    class Meta:
        model = ProfilingRequest

    variant = factory.SubFactory(ModelVariantFactory, artifact=factory.SubFactory(ArtifactFactory))
    host = factory.SubFactory(HostFactory)
    device = "cpu0"
    batch_sizes = [1, 2, 4]
    cpu_threads = [1, 2]
