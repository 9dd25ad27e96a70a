import pytest
from django.contrib.auth import authenticate

from apps.core.context import change_context
from apps.inventory.models import Accelerator, GpuInstance, Host, MpsPartition
from apps.policies.models import SloPolicy
from apps.registry.models import Application, Artifact, CorunMeasurement, ModelVariant, Pipeline, Profile
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
    # The MPS host: GPUs without MIG in MPS mode, their partitions declared (pending until its agent reports).
    mps_gpus = Accelerator.objects.filter(host__name="sim-2080ti-01").order_by("index")
    assert [(g.model_name, g.mig_capable, g.mps_enabled) for g in mps_gpus] == [("NVIDIA GeForce RTX 2080 Ti", False, True)] * 2
    assert [[p.slot for p in g.mps_partitions_set.order_by("index")] for g in mps_gpus] == [["mps60@0", "mps40@1"], ["mps50@0", "mps50@1"]]
    assert set(MpsPartition.objects.values_list("state", flat=True)) == {"pending"}
    for gpu in Accelerator.objects.filter(mig_enabled=True):
        layout = layout_parse([gi.placement for gi in gpu.gpu_instances.all()])
        assert layout and mig_layout_validate(catalogue.gpu_model_get(gpu.model_name), layout).valid
    assert GpuInstance.objects.exclude(state="pending").count() == 0, "declared, not reported by an agent"
    # Every application has an SLO policy but the pipeline's calibrator, which takes the path's.
    assert Application.objects.count() >= 5 and SloPolicy.objects.count() == Application.objects.count() - 1
    assert not SloPolicy.objects.filter(application__name="tabular-calibrate").exists()
    pipeline = Pipeline.objects.get(name="tabular-chain")
    assert pipeline.paths == [{"name": "tabular-chain", "stages": ["tabular-cpu", "tabular-calibrate"], "slo_ms": 40.0, "demand_rps": 20.0}]
    # GPU profiles say they are derived, except the MPS host's, which are the shared measurements imported;
    # CPU profiles are measured on real ONNX artifacts.
    gpu_rows = Profile.objects.exclude(device_type__in=["cpu", "RTX-2080Ti"])
    assert gpu_rows.count() > 100 and all(p.source_detail.startswith("derived:") for p in gpu_rows)
    mps_rows = Profile.objects.filter(device_type="RTX-2080Ti")
    assert mps_rows.count() == 420 and set(mps_rows.values_list("source", flat=True)) == {"imported"}
    assert all(p.slice.startswith("mps") and "engine/reference/data/gpulet" in p.source_detail for p in mps_rows)
    assert CorunMeasurement.objects.count() > 3000
    cpu_rows = Profile.objects.filter(device_type="cpu")
    # Eight CPU models (three classifiers, the calibrator, the ensemble's four members), seven batch sizes (the
    # heavy one five), at one and two threads.
    assert cpu_rows.count() == (3 * 7 + 5 + 4 * 7) * 2 and set(cpu_rows.values_list("source", flat=True)) == {"measured"}
    assert set(cpu_rows.values_list("cpu_cores", flat=True)) == {1, 2}
    assert Artifact.objects.count() == 8 and ModelVariant.objects.filter(artifact__isnull=False).count() == 8
    # The CPU-heavy variant is the most accurate, and two threads run its large batches faster (what its
    # vertical scaling rests on).
    tabular = list(ModelVariant.objects.filter(application__name="tabular-cpu").order_by("-accuracy"))
    assert tabular[0].name == "conv-features-80" and len(tabular) == 3
    heavy = {p.cpu_cores: p.latency_p50_ms for p in tabular[0].profiles.filter(batch_size=16)}
    assert heavy[2] < heavy[1]
    # Every CPU runtime of the hand-made deployment scales in place, with a latency model fitted to its profiles.
    from apps.deployments.models import HostDesiredState

    spec = HostDesiredState.objects.get(host__name="sim-cpu-01").spec
    verticals = {r["key"]: r.get("vertical") for r in spec["runtimes"] if r["application"] != "tabular-ensemble"}
    # Three or four: the heavy classifier is deployed where its seed-time profile fits half the SLO (on a machine
    # loaded while the demo measured it, it may not).
    assert len(verticals) in (3, 4) and all(v is not None and v["min_cores"] == 1 <= v["max_cores"] for v in verticals.values())
    assert {v["policy"] for v in verticals.values()} == {"sponge", "biscale"}
    # The ensemble application (issue 20): four bagged members, one runtime each, drawn per query by the
    # shipped learned scheduler, voted by held-out accuracy; its routing table carries the policy.
    from apps.deployments.models import RoutingTable
    from apps.policies.models import EnsemblePolicy

    members = [r for r in spec["runtimes"] if r["application"] == "tabular-ensemble"]
    assert len(members) == 4 and not any(r.get("vertical") for r in members)
    policy = EnsemblePolicy.objects.get(application__name="tabular-ensemble")
    assert policy.mode == "learned" and policy.scheduler == "demo-ensemble" and policy.members.count() == 4
    weights = {m.variant.name: m.weight for m in policy.members.select_related("variant")}
    assert weights == {v.name: v.accuracy for v in ModelVariant.objects.filter(application__name="tabular-ensemble")}
    table = RoutingTable.objects.get(application__name="tabular-ensemble", active=True)
    assert len(table.routes) == 4
    slices = set(Profile.objects.filter(device_type="A100-SXM4-40GB").values_list("slice", flat=True))
    assert {"full", "1g.5gb", "3g.20gb", "7g.40gb"} <= slices


def test_demo_seed_is_idempotent():
    demo_seed()
    counts = (Host.objects.count(), Profile.objects.count(), Artifact.objects.count())
    with change_context(source="test"):
        again = demo_seed()
    assert not again.created and counts == (Host.objects.count(), Profile.objects.count(), Artifact.objects.count())


def test_the_demo_mps_host_serves_pairs_of_models_in_rounds():
    """The hand-made placement of the MPS host: each partition time-shared by up to two applications, one
    round (duty cycle) per partition that is the models' turns, within the pair's SLOs; the routes reach
    each model's instance."""
    from apps.deployments.models import HostDesiredState, RoutingTable
    from engine.geometry.names import runtime_key_parse

    demo_seed()
    spec = HostDesiredState.objects.filter(host__name="sim-2080ti-01").latest("version").spec
    assert [g["mps_layout"] for g in spec["gpus"]] == [["mps60@0", "mps40@1"], ["mps50@0", "mps50@1"]]
    assert all(g["mps_enabled"] and not g["mig_enabled"] for g in spec["gpus"])
    by_partition: dict[str, list[dict]] = {}
    for runtime in spec["runtimes"]:
        by_partition.setdefault(runtime_key_parse(runtime["key"]).partition_key, []).append(runtime)
    assert max(len(models) for models in by_partition.values()) == 2  # temporal sharing happens
    slos = {a.name: a.slo_policy.latency_p99_ms for a in Application.objects.filter(slo_policy__isnull=False)}
    for models in by_partition.values():
        duty = models[0]["duty_cycle_ms"]
        assert all(m["duty_cycle_ms"] == duty and m["batching"]["policy"] == "nexus" for m in models)
        if len(models) > 1:
            assert duty == pytest.approx(sum(m["turn_ms"] for m in models))
            # A query waits at most a round and runs in the next: within its SLO.
            assert all(duty + m["turn_ms"] <= slos[m["application"]] for m in models)
    routed = {r["instance"] for t in RoutingTable.objects.filter(active=True) for r in t.routes}
    assert {f"sim-2080ti-01/{r['key']}" for r in spec["runtimes"]} <= routed


def test_the_conv_model_is_read_back_from_the_measurements_folder(tmp_path, monkeypatch):
    """demo_conv_model_build keeps what it computed (14 s of two cores) in TESSERA_DEMO_MEASUREMENTS_DIR under
    a key of its inputs, and a process that finds it there reads it instead of computing it again."""
    from controlplane import demo_models

    monkeypatch.setenv("TESSERA_DEMO_MEASUREMENTS_DIR", str(tmp_path))
    path = demo_models._conv_cache_path()
    assert path is not None and path.parent == tmp_path and path.name.startswith("demo-conv-")
    path.with_suffix(".json").write_text('{"accuracy": 0.5, "description": "kept"}')
    path.write_bytes(b"onnx bytes")
    demo_models.demo_conv_model_build.cache_clear()
    try:
        kept = demo_models.demo_conv_model_build()
        assert (kept.onnx_bytes, kept.accuracy, kept.description) == (b"onnx bytes", 0.5, "kept")
    finally:
        demo_models.demo_conv_model_build.cache_clear()  # the next caller in this process builds (or reads) the real one
    monkeypatch.delenv("TESSERA_DEMO_MEASUREMENTS_DIR")
    assert demo_models._conv_cache_path() is None
