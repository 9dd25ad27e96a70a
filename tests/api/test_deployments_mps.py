"""MPS in a host's desired state (issue 17; /tmp contract, docs/dataplane.md): a GPU's `mps_enabled` and
`mps_layout`, and runtimes of models in an MPS partition (`gpu0/mps60@0/1`, `mps_percent`,
`duty_cycle_ms`), checked against the inventory as the version leaves it."""
import pytest

from apps.deployments.models import HostDesiredState
from apps.inventory.models import MpsPartition
from tests.factories import ApplicationFactory, GpuFactory, GpuInstanceFactory, ModelVariantFactory, ProfileFactory, SloPolicyFactory

pytestmark = pytest.mark.django_db

RTX = {"model_name": "RTX-2080Ti", "memory_mb": 11264, "mig_capable": False, "mig_enabled": False}


class Fleet:
    pass


@pytest.fixture
def fleet(agent_hosts):
    """agent-host-a (simulated): gpu0 an RTX 2080 Ti in MPS mode with partitions 60 % and 40 %, gpu1 one
    not in MPS mode, gpu2 one in MPS mode allowing 25 % and 75 % only, gpu3 an A100 with MIG on
    (3g.20gb@4). `classify` (SLO 60 ms) with vgg19 and resnet50 profiled on mps40, mps60, mps100 and the
    whole GPU; mobilenet on mps100 only."""
    (host, _), _ = agent_hosts
    f = Fleet()
    f.host = host
    f.gpu0 = GpuFactory(host=host, index=0, **RTX, mps_enabled=True)
    MpsPartition.objects.create(accelerator=f.gpu0, percent=60, index=0)
    MpsPartition.objects.create(accelerator=f.gpu0, percent=40, index=1)
    GpuFactory(host=host, index=1, **RTX)
    GpuFactory(host=host, index=2, **RTX, mps_enabled=True, mps_partitions=[25, 75])
    GpuInstanceFactory(accelerator=GpuFactory(host=host, index=3), profile="3g.20gb", placement_start=4)
    f.classify = ApplicationFactory(name="classify")
    SloPolicyFactory(application=f.classify, latency_p99_ms=60.0)
    f.vgg = ModelVariantFactory(application=f.classify, name="vgg19")
    f.resnet = ModelVariantFactory(application=f.classify, name="resnet50")
    f.mobile = ModelVariantFactory(application=f.classify, name="mobilenet")
    for variant, base in ((f.vgg, 10.0), (f.resnet, 5.0)):
        for slice_, factor in (("mps40", 2.0), ("mps60", 1.5), ("mps100", 1.0), ("full", 1.0)):
            for batch in (1, 4):
                latency = base * factor * batch
                ProfileFactory(variant=variant, device_type="RTX-2080Ti", slice=slice_, batch_size=batch,
                               latency_p50_ms=latency, latency_p99_ms=latency * 1.1)
    ProfileFactory(variant=f.mobile, device_type="RTX-2080Ti", slice="mps100", batch_size=1, latency_p50_ms=1.0, latency_p99_ms=1.0)
    return f


def rt(f, key, variant=None, **over):
    return {"key": key, "application": "classify", "variant": (variant or f.vgg).pk, "max_batch": 4,
            "batching": {"policy": "proteus"}, **over}


def url(host):
    return f"/api/v1/hosts/{host.pk}/desired-state/"


def test_mps_runtimes_on_the_inventory_layout(clients, fleet):
    f = fleet
    spec = {"runtimes": [rt(f, "gpu0/mps60@0/0", duty_cycle_ms=40, turn_ms=12), rt(f, "gpu0/mps60@0/1", f.resnet, duty_cycle_ms=40.0, mps_percent=60),
                         rt(f, "gpu0/mps40@1/0", f.resnet, placement="mps40@1")]}
    created = clients["operator"].post(url(f.host), spec, format="json")
    assert created.status_code == 201, created.content
    doc = created.json()
    # gpu0 runs partitions, so it is listed as it is (the agent runs partitions only on a GPU listed in MPS mode).
    assert doc["gpus"] == [{"index": 0, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps60@0", "mps40@1"]}]
    runtimes = {r["key"]: r for r in doc["runtimes"]}
    assert list(runtimes) == ["gpu0/mps40@1/0", "gpu0/mps60@0/0", "gpu0/mps60@0/1"]
    first = runtimes["gpu0/mps60@0/0"]
    assert (first["device"], first["placement"], first["mps_percent"], first["duty_cycle_ms"]) == ("gpu0", "mps60@0", 60, 40.0)
    assert first["turn_ms"] == 12.0 and runtimes["gpu0/mps60@0/1"]["turn_ms"] is None  # its slot in the round; null: its profile's
    assert first["profile"] == [{"batch": 1, "latency_ms": 15.0}, {"batch": 4, "latency_ms": 60.0}]  # vgg19 on mps60
    assert runtimes["gpu0/mps40@1/0"]["profile"][0] == {"batch": 1, "latency_ms": 10.0}  # resnet50 on mps40
    assert runtimes["gpu0/mps40@1/0"]["duty_cycle_ms"] is None
    # A document read back can be posted again.
    resent = clients["operator"].post(url(f.host), clients["viewer"].get(url(f.host)).json(), format="json")
    assert resent.status_code == 201 and resent.json()["runtimes"] == doc["runtimes"] and resent.json()["gpus"] == doc["gpus"]


def test_mps_layout_set_by_the_version(clients, fleet):
    f = fleet
    spec = {
        "gpus": [
            {"index": 0, "mig_enabled": False, "layout": []},  # MPS off on gpu0
            {"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps20@2", "mps50@0", "mps30@1"]},
            {"index": 2, "mig_enabled": False, "mps_enabled": True, "mps_layout": []},
        ],
        "runtimes": [rt(f, "gpu0", f.resnet), rt(f, "gpu1/mps50@0/0"), rt(f, "gpu1/mps30@1/3", f.resnet, profile=[{"batch": 1, "latency_ms": 9}])],
    }
    created = clients["operator"].post(url(f.host), spec, format="json")
    assert created.status_code == 400  # 30 % is not an allowed size by default
    assert "gpu1): invalid MPS layout '50+30+20': partition sizes [30] are not allowed" in created.json()["error"]["message"]
    spec["gpus"][1]["mps_layout"] = ["mps40@1", "mps60@0"]
    spec["runtimes"][1:] = [rt(f, "gpu1/mps60@0/0"), rt(f, "gpu1/mps40@1/3", f.resnet, profile=[{"batch": 1, "latency_ms": 9}])]
    created = clients["operator"].post(url(f.host), spec, format="json")
    assert created.status_code == 201, created.content
    doc = created.json()
    assert doc["gpus"] == [
        {"index": 0, "mig_enabled": False, "layout": []},
        {"index": 1, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": ["mps60@0", "mps40@1"]},
        {"index": 2, "mig_enabled": False, "layout": [], "mps_enabled": True, "mps_layout": []},
    ]
    runtimes = {r["key"]: r for r in doc["runtimes"]}
    assert runtimes["gpu0"]["placement"] is None and "mps_percent" not in runtimes["gpu0"]
    assert runtimes["gpu1/mps40@1/3"]["profile"] == [{"batch": 1, "latency_ms": 9.0}]


BAD = [
    ("mig-and-mps", {"gpus": [{"index": 3, "mig_enabled": True, "layout": ["3g.20gb@4"], "mps_enabled": True, "mps_layout": []}]},
     "MIG and MPS cannot both be enabled"),
    ("layout-without-mps", {"gpus": [{"index": 1, "mig_enabled": False, "mps_layout": ["mps100@0"]}]}, "needs mps_enabled true"),
    ("over-100", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps60@0", "mps50@1"]}]}, "add up to 110 %"),
    ("not-allowed", {"gpus": [{"index": 2, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps50@0"]}]}, "not allowed (allowed: 25, 75 %)"),
    ("largest-first", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps40@0", "mps60@1"]}]}, "largest first"),
    ("gap", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps60@1"]}]}, "indices must be 0..0"),
    ("twice", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps60@0", "mps40@0"]}]}, "listed twice"),
    ("malformed", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": True, "mps_layout": ["mps60"]}]}, "not an MPS partition placement"),
    ("mps-not-bool", {"gpus": [{"index": 1, "mig_enabled": False, "mps_enabled": "yes"}]}, "'mps_enabled' must be true or false"),
    ("not-in-layout", {"runtimes": [("gpu0/mps50@0/0", {})]}, "mps50@0 is not in gpu0's MPS layout (mps60@0, mps40@1)"),
    ("no-mps", {"runtimes": [("gpu1/mps100@0/0", {})]}, "MPS is not enabled on gpu1"),
    ("mps-off-in-version", {"gpus": [{"index": 0, "mig_enabled": False, "layout": []}], "runtimes": [("gpu0/mps60@0/0", {})]},
     "MPS is not enabled on gpu0"),
    ("partition-key", {"runtimes": [("gpu0/mps60@0", {})]}, "an MPS partition's own key"),
    ("percent", {"runtimes": [("gpu0/mps60@0/0", {"mps_percent": 40})]}, "'mps_percent' must be 60"),
    ("duty-negative", {"runtimes": [("gpu0/mps60@0/0", {"duty_cycle_ms": -5})]}, "'duty_cycle_ms' must be a finite number"),
    ("duty-differs", {"runtimes": [("gpu0/mps60@0/0", {"duty_cycle_ms": 30}), ("gpu0/mps60@0/1", {"duty_cycle_ms": 40, "variant": "resnet"})]},
     "differs from gpu0/mps60@0/0's (30.0)"),
    ("variant-twice", {"runtimes": [("gpu0/mps60@0/0", {}), ("gpu0/mps60@0/1", {})]}, "already served in partition gpu0/mps60@0"),
    ("placement", {"runtimes": [("gpu0/mps60@0/0", {"placement": "mps40@1"})]}, "'placement' must be 'mps60@0'"),
    ("whole-gpu", {"runtimes": [("gpu0", {})]}, "a whole-GPU runtime needs MPS disabled on gpu0"),
    ("mps-fields-on-mig", {"runtimes": [("gpu3/3g.20gb@4", {"duty_cycle_ms": 10})]}, "duty_cycle_ms: only for a model in an MPS partition"),
    ("turn-on-mig", {"runtimes": [("gpu3/3g.20gb@4", {"turn_ms": 10})]}, "turn_ms: only for a model in an MPS partition"),
    ("turn-zero", {"runtimes": [("gpu0/mps60@0/0", {"turn_ms": 0})]}, "'turn_ms' must be a finite number of milliseconds > 0"),
    ("mig-slot", {"runtimes": [("gpu3/3g.20gb@4/1", {})]}, "not a runtime key"),
    ("no-profile", {"runtimes": [("gpu0/mps40@1/0", {"variant": "mobile"})]}, "no profile of classify/mobilenet on RTX-2080Ti/mps40"),
]


@pytest.mark.parametrize("spec,needle", [pytest.param(s, n, id=name) for name, s, n in BAD])
def test_bad_mps_desired_state_is_refused_and_stores_nothing(clients, fleet, spec, needle):
    f = fleet
    variants = {"resnet": f.resnet, "mobile": f.mobile}
    body = {"gpus": spec.get("gpus", [])}
    body["runtimes"] = [rt(f, key, variants.get(over.pop("variant", None)), **over) for key, over in
                        ((k, dict(o)) for k, o in spec.get("runtimes", []))]
    response = clients["operator"].post(url(f.host), body, format="json")
    assert response.status_code == 400, response.content
    assert needle in response.json()["error"]["message"], response.json()["error"]["message"]
    assert not HostDesiredState.objects.exists()
