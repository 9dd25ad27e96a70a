"""The demo fleet, seeded by `tessera demo` on embedded defaults. Everything it creates is labelled for
what it is:
- hosts use the `simulated` backend (their GPUs are declared, not discovered);
- GPU profiles are *derived* from the gpulets measurements in engine/reference/data (RTX 2080 Ti under MPS), scaled
  to each MIG slice and GPU model by the stated rule and factors of `engine.reference.profiles.gpulet_profiles_derive`;
  each row says so in `source_detail`;
- the RTX 2080 Ti host runs its GPUs in MPS mode (gpulets): its profiles per partition, the models' L2/DRAM
  utilisations and the co-run measurements are the shared measurements themselves, imported as
  `manage.py gpulet_import` does (`apps.registry.services.gpulet`), and its partitions serve pairs of models
  time-sharing them in duty-cycle rounds;
- the CPU application's three variants are real ONNX models trained at seed time, uploaded through the
  same validation as any artifact, and profiled for real on this machine's CPU with onnxruntime at one
  and two threads; its runtimes (and the pipeline's calibrator) scale vertically in place: the agent's
  fast loop resizes them by Sponge's rule on the latency model fitted to those profiles (issue 19)."""
from __future__ import annotations

import io
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from apps.core.context import change_context
from apps.inventory.choices import AcceleratorKindChoices, GpuInstanceStateChoices, HostBackendChoices
from apps.inventory.models import Accelerator, GpuInstance, Host, MpsPartition
from apps.policies.choices import DropRuleChoices
from apps.policies.models import ReplanPolicy, SloPolicy
from apps.registry.choices import CPU_DEVICE_TYPE, ProfileSourceChoices, TaskChoices
from apps.registry.models import Application, ModelVariant, Profile
from apps.registry.services.artifacts import artifact_create
from apps.registry.services.gpulet import gpulet_import
from apps.registry.services.pipelines import pipeline_save
from apps.users.choices import RoleChoices
from apps.users.roles import roles_sync, user_role_set
from engine.dataplane.batching import DEFAULT_BATCHING_POLICY
from engine.reference.machine import cpu_model_name
from engine.dataplane.rounds import ROUND_BATCHING_POLICY
from engine.reference.ensemble_demo import DEMO_ENSEMBLE_APPLICATION, DEMO_ENSEMBLE_POLICY, DEMO_ENSEMBLE_SLO_MS
from engine.geometry.catalogue import gpu_model_canonical, mig_catalogue_load, plain_gpu_model_find
from engine.reference.profiles import (
    GPULET_DERIVED_SPEEDUP,
    GPULET_TOP1_ACCURACY,
    GPULET_VARIANT_MEMORY_MB,
    gpulet_inference_read,
    gpulet_profiles_derive,
)

from .demo_models import (
    CALIBRATOR_INPUT,
    CONV_MODEL_NAME,
    CONV_PROFILE_BATCHES,
    demo_calibrator_build,
    demo_ensemble_members_build,
    demo_models_build,
)

# The demo's GPU models and their illustrative speed-ups over the RTX 2080 Ti that gpulets measured (not
# measurements: see engine.reference.profiles.GPULET_DERIVED_SPEEDUP, where the table and the partition rule live).
DEMO_GPU_MODELS = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB")
DEMO_GPU_SPEEDUP = {name: GPULET_DERIVED_SPEEDUP[name] for name in DEMO_GPU_MODELS}

# Approximate weights plus workspace at batch 1 (MiB), for memory fit in the planner (estimates).
DEMO_VARIANT_MEMORY_MB = GPULET_VARIANT_MEMORY_MB
DEMO_APPLICATIONS = {
    # name: (variants, p99 SLO ms, min accuracy, priority)
    "classify-resnet": (("resnet50", "resnet101", "resnet152"), 60.0, 0.76, 70),
    "classify-densenet": (("densenet121", "densenet169", "densenet201"), 90.0, None, 50),
    "classify-vgg": (("vgg16", "vgg19"), 40.0, None, 40),
    "classify-mobile": (("mobilenet", "inception"), 50.0, 0.71, 60),
}


@dataclass(frozen=True)
class DemoHost:
    name: str
    gpu_model: str | None  # catalogue key (MIG) or a GPU without MIG (engine.geometry.catalogue.PLAIN_GPU_MODELS); None for the CPU host
    layouts: tuple[tuple[str, ...] | None, ...]  # per GPU: MIG layout (MPS layout when `mps`), or None for a whole GPU
    cpu_cores: int = 0
    mps: bool = False  # GPUs in MPS mode, `layouts` their partitions


DEMO_FLEET = (
    DemoHost("sim-a100-01", "A100-SXM4-40GB", (("4g.20gb@0", "3g.20gb@4"), ("2g.10gb@0", "2g.10gb@2", "3g.20gb@4"))),
    DemoHost("sim-a100-02", "A100-SXM4-80GB", (("1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"), None)),
    DemoHost("sim-h100-01", "H100-SXM5-80GB", (("4g.40gb@0", "3g.40gb@4"), None)),
    DemoHost("sim-2080ti-01", "RTX-2080Ti", (("mps60@0", "mps40@1"), ("mps50@0", "mps50@1")), mps=True),
    DemoHost("sim-cpu-01", None, (), cpu_cores=16),
)


@dataclass
class DemoSeedResult:
    created: bool
    admin_password: str
    logins: dict[str, str]


def _gpu_profiles_derived(variant: ModelVariant, family: str, points, gpu_key: str) -> list[Profile]:
    # One derivation for the demo, the generators and the benchmarks: engine.reference.profiles.gpulet_profiles_derive.
    rows = []
    for derived in gpulet_profiles_derive(points, gpu_key, DEMO_GPU_SPEEDUP[gpu_key], models=[family]):
        p = derived.point
        latency = p.latency_ms
        rows.append(
            Profile(
                variant=variant, device_type=p.device_type, slice=p.slice, batch_size=p.batch,
                latency_p50_ms=round(latency, 4), latency_p99_ms=round(latency * 1.1, 4),
                throughput_rps=round(p.batch * 1000.0 / latency, 3), source=ProfileSourceChoices.IMPORTED,
                source_detail=f"{derived.detail}; p99 = 1.1 x p50"[:200],
            )
        )
    return rows


# The demo's CPU profiles are measured at these thread counts: the vertical scaling's latency model
# l(b, c) is fitted across them (engine/vertical/sponge.py), which needs two or more.
DEMO_CPU_PROFILE_CORES = (1, 2)
# Each profiled batch runs for about this long (at least 20, at most 200 runs): the heavy variant's batch
# of 64 takes tens of ms.
PROFILE_TIME_S = 0.25
_measured: dict[tuple[str, int], list[dict]] = {}  # (model sha256, cores) -> rows: measured once per process


def _cpu_points_measure(onnx_bytes: bytes, cores: int, batches: tuple[int, ...]) -> list[dict]:
    """p50 and p99 per batch size at `cores` threads. Every thread count of DEMO_CPU_PROFILE_CORES is measured
    at once, run by run in turn (1, 2, 1, 2, ...), so that they are compared over the same seconds: measured one
    after the other, a change in what else the machine runs between them decided which was faster."""
    import hashlib

    sha = hashlib.sha256(onnx_bytes).hexdigest()
    if (sha, cores) in _measured:
        return _measured[(sha, cores)]
    counts = tuple(dict.fromkeys((*DEMO_CPU_PROFILE_CORES, cores)))
    kept = demo_measurement_path(onnx_bytes, counts, batches)
    if kept is not None and kept.exists():
        try:
            rows = {int(threads): points for threads, points in json.loads(kept.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            rows = {}  # unreadable: measured again below
        if all(threads in rows for threads in counts):
            for threads in counts:
                _measured[(sha, threads)] = rows[threads]
            return rows[cores]
    sessions = {}
    for threads in counts:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        sessions[threads] = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    (model_input,) = sessions[counts[0]].get_inputs()
    width = int(model_input.shape[1])
    rows: dict[int, list[dict]] = {threads: [] for threads in counts}
    for batch in batches:
        # Positive values: the calibrator takes probabilities (its log of a negative would be NaN, not slower).
        feed = {model_input.name: np.abs(np.random.default_rng(batch).normal(size=(batch, width))).astype(np.float32)}
        t0 = time.perf_counter()
        for _ in range(5):
            for session in sessions.values():
                session.run(None, feed)  # warm-up, and a first timing
        per_round = (time.perf_counter() - t0) / 5
        runs = int(min(200, max(20, PROFILE_TIME_S * len(counts) / max(per_round, 1e-6))))
        samples: dict[int, list[float]] = {threads: [] for threads in counts}
        for _ in range(runs):
            for threads, session in sessions.items():
                t0 = time.perf_counter()
                session.run(None, feed)
                samples[threads].append((time.perf_counter() - t0) * 1000.0)
        for threads in counts:
            rows[threads].append({"batch": batch, "p50": float(np.percentile(samples[threads], 50)),
                                  "p99": float(np.percentile(samples[threads], 99)), "runs": runs})
    for threads in counts:
        _measured[(sha, threads)] = rows[threads]
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({str(threads): rows[threads] for threads in counts}))
        partial.replace(kept)  # whole or not at all: a concurrent seed reads either nothing or all of it
    return rows[cores]


def demo_measurement_path(onnx_bytes: bytes, counts: tuple[int, ...], batches: tuple[int, ...]) -> Path | None:
    """Where the demo keeps what it measured of one model at these thread counts and batches, on this machine
    (settings.TESSERA_DEMO_MEASUREMENTS_DIR; None when unset: measured on every seed). The key holds what the
    latencies depend on besides the model: onnxruntime's version, the CPU and its count."""
    import hashlib
    import platform

    from django.conf import settings

    folder = getattr(settings, "TESSERA_DEMO_MEASUREMENTS_DIR", "")
    if not folder:
        return None
    machine = [ort.__version__, platform.machine(), cpu_model_name(), os.cpu_count(), PROFILE_TIME_S]
    key = hashlib.sha256(onnx_bytes + json.dumps([list(counts), list(batches), machine]).encode()).hexdigest()[:40]
    return Path(folder) / f"demo-cpu-{key}.json"



def _cpu_profiles_measured(variant: ModelVariant, onnx_bytes: bytes, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> list[Profile]:
    rows = []
    for cores in DEMO_CPU_PROFILE_CORES:
        for point in _cpu_points_measure(onnx_bytes, cores, batches):
            p50, p99 = point["p50"], point["p99"]
            rows.append(
                Profile(
                    variant=variant, device_type=CPU_DEVICE_TYPE, cpu_cores=cores, batch_size=point["batch"],
                    latency_p50_ms=round(max(p50, 1e-4), 4), latency_p99_ms=round(max(p99, p50, 1e-4), 4),
                    throughput_rps=round(point["batch"] * 1000.0 / max(p50, 1e-4), 3), source=ProfileSourceChoices.MEASURED,
                    source_detail=f"measured at demo seed on this machine's CPU, onnxruntime {ort.__version__}, {cores} thread(s), "
                                  f"{point['runs']} runs",
                    measured_at=timezone.now(),
                )
            )
    return rows


def _vertical_block(variant: ModelVariant, *, policy: str, cpu_cores: int, max_batch: int, reserve_ms: float = 0.0) -> dict | None:
    """A demo CPU runtime's in-place vertical scaling (issue 19): the latency model l(b, c) fitted to its
    measured profiles, from one core to the most it was profiled at (as the planners bound it: the model
    is not trusted past that, and the demo machine's real cores are few, whatever the host declares),
    Sponge's rule in the agent's fast loop. None when the profiles cannot fit it."""
    from engine.vertical.sponge import vertical_latency_fit

    points = [(p.batch_size, p.cpu_cores, p.latency_p50_ms) for p in variant.profiles.filter(device_type=CPU_DEVICE_TYPE)]
    try:
        model = vertical_latency_fit(points)
    except ValueError:
        return None
    return {"policy": policy, "model": {"gamma1": round(model.gamma1, 6), "eps1": round(model.eps1, 6), "delta1": round(model.delta1, 6),
                                        "eta1": round(model.eta1, 6)},
            "min_cores": 1, "max_cores": min(cpu_cores, max(c for _, c, _ in points)), "max_batch": max(max_batch, 16),
            "reserve_ms": round(reserve_ms, 6)}


def _fleet_seed() -> None:
    catalogue = mig_catalogue_load()
    for demo in DEMO_FLEET:
        host = Host.objects.create(
            name=demo.name, address="127.0.0.1", backend=HostBackendChoices.SIMULATED,
            labels={"demo": "true", "pool": demo.gpu_model or "cpu"},
            description="Demo host: simulated backend, declared devices.",
        )
        if demo.gpu_model is None:
            Accelerator.objects.create(host=host, index=0, kind=AcceleratorKindChoices.CPU, model_name="cpu", cpu_cores=demo.cpu_cores)
            continue
        if demo.mps:
            _mps_host_seed(host, demo)
            continue
        spec = catalogue.gpu_model_get(demo.gpu_model)
        for index, layout in enumerate(demo.layouts):
            accelerator = Accelerator(
                host=host, index=index, kind=AcceleratorKindChoices.GPU, uuid=f"GPU-sim-{demo.name}-{index}",
                model_name=spec.nvml_names[0], memory_mb=spec.memory_mib, mig_capable=True, mig_enabled=layout is not None,
            )
            accelerator.full_clean()
            accelerator.save()
            for placement in layout or ():
                profile, start = placement.split("@")
                # Declared, not yet confirmed by an agent: pending until a (simulated) agent reports it.
                instance = GpuInstance(accelerator=accelerator, profile=profile, placement_start=int(start), state=GpuInstanceStateChoices.PENDING)
                instance.full_clean()
                instance.save()


def _mps_host_seed(host: Host, demo: DemoHost) -> None:
    """GPUs without MIG in MPS mode, their partitions declared (pending until the agent reports them)."""
    plain = plain_gpu_model_find(demo.gpu_model or "")
    if plain is None:
        raise ValueError(f"{demo.name}: {demo.gpu_model!r} is not a known GPU without MIG")
    for index, layout in enumerate(demo.layouts):
        accelerator = Accelerator(
            host=host, index=index, kind=AcceleratorKindChoices.GPU, uuid=f"GPU-sim-{demo.name}-{index}",
            model_name=plain.nvml_names[0], memory_mb=plain.memory_mib, mig_capable=False, mig_enabled=False, mps_enabled=True,
        )
        accelerator.full_clean()
        accelerator.save()
        for slot in layout or ():
            percent, start = slot.removeprefix("mps").split("@")
            partition = MpsPartition(accelerator=accelerator, percent=int(percent), index=int(start), state=GpuInstanceStateChoices.PENDING)
            partition.full_clean()
            partition.save()


def _cpu_variant_seed(application: Application, model, *, admin, accuracy_metric: str, memory_mb: float,
                      batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> ModelVariant:
    """One of the demo's real ONNX models as a variant of `application`: its artifact, the variant, and its CPU
    profiles measured here (`_cpu_profiles_measured`), each checked before the bulk insert."""
    artifact = artifact_create(upload=io.BytesIO(model.onnx_bytes), original_name=f"{model.name}.onnx", uploaded_by=admin)
    variant = ModelVariant(
        application=application, name=model.name, accuracy=round(model.accuracy, 4), accuracy_metric=accuracy_metric,
        artifact=artifact, memory_mb=memory_mb, description=model.description,
    )
    variant.full_clean()
    variant.save()
    measured = _cpu_profiles_measured(variant, model.onnx_bytes, batches)
    _profiles_of_new_variant_check(measured)
    Profile.objects.bulk_create(measured)
    return variant


def _profiles_of_new_variant_check(rows: list[Profile]) -> None:
    """Every field and each row's clean() of a variant created a moment ago, without full_clean's query per
    row for the unique constraint (1,470 rows cost 2.8 s of each seed on PostgreSQL): a new variant has no
    stored profiles, so only a point listed twice could break it, and that is checked here."""
    keys = [(r.device_type, r.slice, r.cpu_cores, r.batch_size) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the demo lists a profile point twice: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
    for row in rows:
        row.full_clean(exclude=["variant"], validate_constraints=False)


def _registry_seed(admin) -> None:
    points = gpulet_inference_read()
    for app_name, (families, slo_ms, min_accuracy, priority) in DEMO_APPLICATIONS.items():
        application = Application.objects.create(
            name=app_name, task=TaskChoices.IMAGE_CLASSIFICATION,
            input_spec=[{"name": "images", "dtype": "tensor(float)", "shape": ["batch", 3, 224, 224]}],
            description="Demo application; its variants' profiles are derived from the gpulets reference data.",
        )
        for family in families:
            variant = ModelVariant.objects.create(
                application=application, name=family, accuracy=GPULET_TOP1_ACCURACY[family],
                accuracy_metric="ImageNet top-1 (torchvision reference weights)", memory_mb=DEMO_VARIANT_MEMORY_MB[family],
            )
            rows = []
            for gpu_key in DEMO_GPU_MODELS:
                rows += _gpu_profiles_derived(variant, family, points, gpu_key)
            _profiles_of_new_variant_check(rows)
            Profile.objects.bulk_create(rows)  # bulk: thousands of derived rows are one import, not one change each
        SloPolicy.objects.create(
            application=application, latency_p99_ms=slo_ms, min_accuracy=min_accuracy, priority=priority,
            drop_rule=DropRuleChoices.DEADLINE,
        )
    # The MPS host's profiles and co-runs: the shared measurements, onto the variants named like their models.
    gpulet_import()

    application = Application.objects.create(
        name="tabular-cpu", task=TaskChoices.OTHER,
        input_spec=[{"name": "input", "dtype": "tensor(float)", "shape": ["batch", 8]}],
        description="Demo CPU application: two real ONNX classifiers trained at seed time on synthetic data.",
    )
    for model in demo_models_build():
        _cpu_variant_seed(application, model, admin=admin, accuracy_metric="held-out accuracy on the demo's synthetic data", memory_mb=16,
                          **({"batches": CONV_PROFILE_BATCHES} if model.name == CONV_MODEL_NAME else {}))
    SloPolicy.objects.create(application=application, latency_p99_ms=20.0, priority=30, drop_rule=DropRuleChoices.SLO_2X)
    _pipeline_seed(admin)
    _ensemble_seed(admin)
    ReplanPolicy.objects.create(name="default", interval_seconds=300, demand_change_threshold=0.25, auto_apply=False)


# The demo's pipeline: the CPU classifier, then a calibrator of its probabilities (controlplane/demo_models.py).
DEMO_PIPELINE = {"name": "tabular-chain", "stages": "tabular-cpu -> tabular-calibrate", "slo_ms": 40.0, "demand_rps": 20.0,
                 "description": "The CPU classifier's probabilities, calibrated by temperature scaling: two real ONNX models in a row."}


def _pipeline_seed(admin) -> None:
    """A second CPU application, the calibrator, and the two-stage pipeline through both. The calibrator has
    no SLO policy of its own: as a stage it takes the path's."""
    calibrator = demo_calibrator_build()
    application = Application.objects.create(
        name="tabular-calibrate", task=TaskChoices.OTHER,
        input_spec=[{"name": CALIBRATOR_INPUT, "dtype": "tensor(float)", "shape": ["batch", 3]}],
        description="Second stage of the demo pipeline: temperature scaling of tabular-cpu's probabilities.",
    )
    _cpu_variant_seed(application, calibrator, admin=admin, accuracy_metric="share of answers whose winning class it keeps", memory_mb=4)
    pipeline_save(data=DEMO_PIPELINE)


# The CPU applications the demo's CPU host serves (the GPU hosts serve the others).
DEMO_CPU_APPLICATIONS = ("tabular-cpu", "tabular-calibrate", DEMO_ENSEMBLE_APPLICATION)


def _ensemble_seed(admin) -> None:
    """The ensemble application (issue 20, Garrison's random ensembles): four bagged classifiers
    (controlplane/demo_models.py), each query answered by the members the learned scheduler `demo-ensemble`
    (engine/ensembles/policies/, trained by `tessera scheduler train --scenario demo`) draws, combined by a
    soft vote weighted by each member's held-out accuracy."""
    from apps.policies.services import ensemble_policy_set

    application = Application.objects.create(
        name=DEMO_ENSEMBLE_APPLICATION, task=TaskChoices.OTHER,
        input_spec=[{"name": "input", "dtype": "tensor(float)", "shape": ["batch", 8]}],
        description="Demo ensemble application: four bagged random-feature classifiers, a random ensemble of them per query, "
                    "combined by weighted vote (Garrison, DAC'24).",
    )
    accuracy = {}
    for model in demo_ensemble_members_build():
        variant = _cpu_variant_seed(application, model, admin=admin, accuracy_metric="held-out accuracy on the demo's synthetic data", memory_mb=4)
        accuracy[model.name] = variant.accuracy
    SloPolicy.objects.create(application=application, latency_p99_ms=DEMO_ENSEMBLE_SLO_MS, priority=30, drop_rule=DropRuleChoices.DEADLINE)
    policy = dict(DEMO_ENSEMBLE_POLICY)
    policy["members"] = [{**m, "weight": accuracy[m["variant"]]} for m in DEMO_ENSEMBLE_POLICY["members"]]
    ensemble_policy_set(application=application, data=policy, actor=admin)


def _login(username: str, role: str, password: str, *, superuser: bool = False):
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=username)
    user.is_staff = superuser
    user.is_superuser = superuser
    user.set_password(password)
    user.save()
    user_role_set(user, role)
    return user


def demo_seed(*, admin_password: str | None = None) -> DemoSeedResult:
    """Seed the demo fleet once (later runs keep what is there) and (re)set the demo logins' passwords."""
    roles_sync()
    admin_password = admin_password or secrets.token_urlsafe(12)
    other_password = secrets.token_urlsafe(12)
    with change_context(source="command"), transaction.atomic():
        admin = _login("admin", RoleChoices.ADMIN, admin_password, superuser=True)
        _login("operator", RoleChoices.OPERATOR, other_password)
        _login("viewer", RoleChoices.VIEWER, other_password)
        created = not Host.objects.exists()
        if created:
            _fleet_seed()
            _registry_seed(admin)
            _deployment_seed(admin)
    return DemoSeedResult(
        created=created, admin_password=admin_password,
        logins={"admin": admin_password, "operator": other_password, "viewer": other_password},
    )


# --------------------------------------------------------------------------- what runs where

# Until a plan is applied (the control loop), the demo runs a hand-made placement: every GPU instance of
# the demo fleet serves one application, taken in turn, with the most accurate variant whose profiled
# p50 latency at batch 1 fits half the SLO there, and the largest batch that still does; each
# application's traffic is split in proportion to its instances' capacity at that batch. An MPS GPU's
# partitions each serve two applications time-sharing it (`_mps_gpu_placement`).


def _batch_fitting(rows: list[Profile], budget_ms: float) -> tuple[int, float] | None:
    fitting = [(r.batch_size, r.latency_p50_ms) for r in rows if r.latency_p50_ms <= budget_ms]
    return max(fitting) if fitting else None


def _demo_runtime(application: Application, device_type: str, slice_name: str, cpu_cores: int | None = None):
    """(variant, max batch, capacity in queries/s) of the best variant that fits, or None."""
    slo_ms = application.slo_policy.latency_p99_ms
    best = None
    for variant in application.variants.order_by("-accuracy", "name"):
        rows = list(variant.profiles.filter(device_type=device_type, slice=slice_name, cpu_cores=cpu_cores))
        fit = _batch_fitting(rows, slo_ms / 2)
        if fit is not None:
            best = (variant, fit[0], fit[0] * 1000.0 / fit[1])
            break
    return best


def _mps_gpu_placement(host: Host, accelerator: Accelerator, gpu_apps: list[Application], turn: int, *, gpus: list, runtimes: list,
                       routes: dict) -> int:
    """An MPS GPU's hand-made placement: each partition is time-shared by two applications taken in turn,
    each with its most accurate variant whose batch of one on the partition fits a quarter of the pair's
    tighter SLO, at the largest batch that does. The round (duty cycle) is the two turns, so a query waits
    at most a round for its batch and runs in the next: within three quarters of the SLO (Nexus's rule,
    gpulets §2.2). Returns the next turn."""
    device_type = gpu_model_canonical(accelerator.model_name) or accelerator.model_name
    partitions = list(accelerator.mps_partitions_set.order_by("index"))
    gpus.append({"index": accelerator.index, "mig_enabled": False, "layout": [], "mps_enabled": True,
                 "mps_layout": [p.slot for p in partitions]})
    for partition in partitions:
        pair = [gpu_apps[(turn + j) % len(gpu_apps)] for j in range(2)]
        turn += 2
        budget = min(a.slo_policy.latency_p99_ms for a in pair) / 4
        chosen = []
        for application in pair:
            for variant in application.variants.order_by("-accuracy", "name"):
                fit = _batch_fitting(list(variant.profiles.filter(device_type=device_type, slice=f"mps{partition.percent}")), budget)
                if fit is not None:
                    chosen.append((application, variant, fit[0], fit[1]))
                    break
        duty = sum(latency for *_, latency in chosen) if len(chosen) > 1 else None
        for slot, (application, variant, batch, latency) in enumerate(chosen):
            key = f"gpu{accelerator.index}/{partition.slot}/{slot}"
            runtimes.append({"key": key, "application": application.name, "variant": variant.pk, "max_batch": batch,
                             "batching": {"policy": ROUND_BATCHING_POLICY}, "mps_percent": partition.percent, "duty_cycle_ms": duty,
                             "turn_ms": latency})
            routes[application].append({"instance": f"{host.name}/{key}", "variant": variant.pk,
                                        "weight": batch * 1000.0 / (duty or latency)})
    return turn


def _deployment_seed(admin) -> None:
    from apps.deployments.services import host_desired_state_set, routing_tables_publish

    catalogue = mig_catalogue_load()
    gpu_apps = list(Application.objects.exclude(name__in=DEMO_CPU_APPLICATIONS).order_by("-slo_policy__priority", "name"))
    routes: dict[Application, list[dict]] = {a: [] for a in Application.objects.all()}
    turn = 0
    for host in Host.objects.filter(labels__demo="true").order_by("name"):
        gpus, runtimes = [], []
        for accelerator in host.accelerators.order_by("kind", "index"):
            if accelerator.kind == AcceleratorKindChoices.CPU:
                slot = 0
                # The CPU-heavy classifier last: the demo's first runtimes keep their keys (cpu0/0 linear,
                # cpu0/1 the random features, cpu0/2 the calibrator), cpu0/3 the heavy one.
                ordered = [(name, variant) for name in ("tabular-cpu", "tabular-calibrate")
                           for variant in Application.objects.get(name=name).variants.order_by("name") if variant.name != CONV_MODEL_NAME]
                ordered += [("tabular-cpu", v) for v in Application.objects.get(name="tabular-cpu").variants.filter(name=CONV_MODEL_NAME)]
                # Then the ensemble's four members, one runtime each (cpu0/4 on, after the heavy classifier's cpu0/3).
                ordered += [(DEMO_ENSEMBLE_APPLICATION, v) for v in Application.objects.get(name=DEMO_ENSEMBLE_APPLICATION).variants.order_by("name")]
                for name, variant in ordered:
                    application = variant.application
                    # The calibrator, a stage without an SLO policy, batches within half the pipeline's SLO.
                    slo_ms = application.slo_policy.latency_p99_ms if hasattr(application, "slo_policy") else DEMO_PIPELINE["slo_ms"] / 2
                    # The batch that fits half the SLO at the fewest profiled threads that fit one: one thread on
                    # most machines. Where one core is too slow for the heavy classifier (its latency is measured
                    # here, at seed time) it still starts on one thread, and the fast loop grows it with traffic.
                    fit = None
                    for threads in sorted(set(variant.profiles.filter(device_type=CPU_DEVICE_TYPE).values_list("cpu_cores", flat=True))):
                        fit = _batch_fitting(list(variant.profiles.filter(device_type=CPU_DEVICE_TYPE, cpu_cores=threads)), slo_ms / 2)
                        if fit is not None:
                            break
                    if fit is None:
                        continue
                    key = f"cpu{accelerator.index}/{slot}"
                    slot += 1
                    batching = {"policy": DEFAULT_BATCHING_POLICY, **({} if hasattr(application, "slo_policy") else {"slo_ms": slo_ms})}
                    runtime = {"key": key, "cpu_threads": 1, "application": application.name, "variant": variant.pk,
                               "max_batch": fit[0], "batching": batching}
                    # Resized in place by the agent's fast loop: Sponge for the application, the calibrator
                    # as the pipeline's last stage (nothing to keep for stages after it).
                    vertical = None if name == DEMO_ENSEMBLE_APPLICATION else _vertical_block(
                        variant, policy="sponge" if name == "tabular-cpu" else "biscale", cpu_cores=accelerator.cpu_cores or 1, max_batch=fit[0])
                    if vertical is not None:
                        runtime["vertical"] = vertical
                    runtimes.append(runtime)
                    routes[application].append({"instance": f"{host.name}/{key}", "variant": variant.pk, "weight": fit[0] * 1000.0 / fit[1]})
                continue
            if accelerator.mps_enabled:
                turn = _mps_gpu_placement(host, accelerator, gpu_apps, turn, gpus=gpus, runtimes=runtimes, routes=routes)
                continue
            spec = catalogue.gpu_model_get(accelerator.model_name)
            layout = [gi.placement for gi in accelerator.gpu_instances.order_by("placement_start")]
            gpus.append({"index": accelerator.index, "mig_enabled": accelerator.mig_enabled, "layout": layout})
            for placement in layout or [None]:
                slice_name = placement.split("@")[0] if placement else "full"
                for attempt in range(len(gpu_apps)):
                    application = gpu_apps[(turn + attempt) % len(gpu_apps)]
                    chosen = _demo_runtime(application, spec.name, slice_name)
                    if chosen is not None:
                        break
                turn += 1
                if chosen is None:
                    continue
                variant, max_batch, capacity = chosen
                key = f"gpu{accelerator.index}/{placement}" if placement else f"gpu{accelerator.index}"
                runtimes.append({"key": key, "application": application.name, "variant": variant.pk, "max_batch": max_batch,
                                 "batching": {"policy": DEFAULT_BATCHING_POLICY}})
                routes[application].append({"instance": f"{host.name}/{key}", "variant": variant.pk, "weight": capacity})
        host_desired_state_set(host=host, spec={"gpus": gpus, "runtimes": runtimes}, actor=admin)
    routing_tables_publish(tables={a: r for a, r in routes.items() if r}, actor=admin)


# --------------------------------------------------------------------------- the demo's data plane


@dataclass(frozen=True)
class DemoDataPlane:
    processes: tuple  # subprocess.Popen of each agent and the router
    router_url: str
    router_grpc: str | None = None  # HOST:PORT of the router's gRPC (the Open Inference Protocol), when it serves it


def _simulate_option(host: Host) -> str:
    counts: dict[str, int] = {}
    catalogue = mig_catalogue_load()
    for accelerator in host.accelerators.filter(kind=AcceleratorKindChoices.GPU).order_by("index"):
        name = gpu_model_canonical(accelerator.model_name, catalogue) or accelerator.model_name
        counts[name] = counts.get(name, 0) + 1
    return ",".join(f"{n}x{name}" for name, n in counts.items())


def demo_agent_command(*, host: Host, state_dir) -> list[str]:
    """The command line of a demo host's simulated agent (its token and the control plane's URL come from the
    environment: TESSERA_AGENT_TOKEN, TESSERA_CONTROL_PLANE): its GPUs and declared cores as the inventory
    says, its runtimes drained and stopped when it exits (a SIGKILL leaves them running, as on a real host)."""
    import sys

    cmd = [sys.executable, "-m", "controlplane.cli", "agent", "--backend", "simulated", "--simulate", _simulate_option(host),
           "--state-dir", str(state_dir), "--stop-runtimes-on-exit"]
    cpu = host.accelerators.filter(kind=AcceleratorKindChoices.CPU).first()
    if cpu is not None and cpu.cpu_cores:
        cmd += ["--simulate-cpu-cores", str(cpu.cpu_cores)]  # the demo's declared cores, as its GPUs are declared
    return cmd


def demo_dataplane_start(*, control_plane: str, state_root, router_port: int = 8100, router_grpc_port: int | None = None,
                         log_dir=None) -> DemoDataPlane:
    """Start one simulated agent per demo host (new agent tokens each time) and a router with a router
    credential of its own (issued anew each time), named after the CPU host it would run on. They reach the
    control plane at `control_plane` over its REST API, like real ones. The router serves gRPC too on
    `router_grpc_port` when one is given."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from apps.inventory.services import host_agent_token_rotate, router_credential_issue

    state_root = Path(state_root)
    log_dir = Path(log_dir or state_root / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    with change_context(source="command"):
        hosts = list(Host.objects.filter(labels__demo="true").order_by("name"))
        tokens = {host.name: host_agent_token_rotate(host=host) for host in hosts}
        cpu_hosts = [h.name for h in hosts if not h.accelerators.filter(kind=AcceleratorKindChoices.GPU).exists()]
        router_name = cpu_hosts[-1] if cpu_hosts else "demo-router"
        _, router_token = router_credential_issue(name=router_name, description="the demo's router")
    for host in hosts:
        env = dict(os.environ, TESSERA_AGENT_TOKEN=tokens[host.name], TESSERA_CONTROL_PLANE=control_plane)
        cmd = demo_agent_command(host=host, state_dir=state_root / host.name)
        with open(log_dir / f"agent-{host.name}.log", "ab") as log:
            processes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,  # nosec B603 - the demo's agent, an argument list
                                              stdin=subprocess.DEVNULL))
    env = dict(os.environ, TESSERA_ROUTER_TOKEN=router_token, TESSERA_CONTROL_PLANE=control_plane)
    grpc = f"127.0.0.1:{router_grpc_port}" if router_grpc_port is not None else None
    cmd = [sys.executable, "-m", "controlplane.cli", "router", "--listen", f"127.0.0.1:{router_port}", "--grpc-listen", grpc or "off",
           "--name", router_name]
    with open(log_dir / "router.log", "ab") as log:
        processes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,  # nosec B603 - the demo's router, an argument list
                                          stdin=subprocess.DEVNULL))
    return DemoDataPlane(tuple(processes), f"http://127.0.0.1:{router_port}", grpc)


def demo_dataplane_stop(dataplane: DemoDataPlane, timeout_s: float = 20.0) -> None:
    """SIGTERM every process (agents drain and stop their runtimes), SIGKILL what is left after the timeout."""
    import subprocess

    for process in dataplane.processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in dataplane.processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
