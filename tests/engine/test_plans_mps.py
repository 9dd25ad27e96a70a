"""MPS partitioning (gpulets, ATC'22) in the problem and plan formats, the capacity model and plan_validate:
a small hand-built problem on RTX 2080 Ti GPUs (not in the MIG catalogue), its JSON round trip and the
reader's refusals, and a valid plan with two partitions (one time-shared by two models with a duty cycle)
that each test breaks in exactly one way."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Callable

import pytest

from engine.plans.capacity import capacity_for, slice_memory_mb
from engine.plans.problem import (
    DeviceSpec,
    Plan,
    PlanInstance,
    Problem,
    ProblemError,
    RouteEntry,
    plan_from_dict,
    problem_from_dict,
    problem_to_dict,
)
from engine.plans.schema import SchemaError, json_validate, plan_schema, problem_schema
from engine.plans.validate import PlanVerdict, plan_validate
from engine.sharing.partitions import mps_slice_name, mps_slice_percent

from .test_problem_format import small_problem_dict
from .test_validate import good_plan

GPU = "RTX 2080 Ti"
GPU_MEMORY_MB = 11264.0
BATCHES = (1, 2, 4, 8)
PARTITIONS = [10, 20, 40, 50, 60, 100]
# name: (application, accuracy, memory_mb at batch 1, base ms, ms per item, MB per item); latency on the
# whole GPU is base + per item x batch.
VARIANTS: dict[str, tuple[str, float, float, float, float, float]] = {
    "resnet18": ("classify", 0.70, 500.0, 2.0, 0.5, 40.0),
    "resnet50": ("classify", 0.76, 1000.0, 4.0, 1.2, 80.0),
    "yolo_s": ("detect", 0.40, 2000.0, 6.0, 2.0, 150.0),
}
# slice -> latency factor relative to the whole GPU (fewer SMs, slower; not linear, as gpulets measured)
SLICES = {"mps100": 1.0, "mps60": 1.4, "mps40": 2.0}


def mps_problem_dict() -> dict[str, Any]:
    """classify (SLO 100 ms, 300 rps) and detect (SLO 200 ms, 50 rps); gpu0 is an MPS GPU whose layout the
    planner may change, gpu1 one whose 60+40 layout is fixed (two models time-share its 40 % partition),
    gpu2 a whole GPU."""
    profiles = []
    for variant, (_, _, mem, base, per, mem_per) in VARIANTS.items():
        for slice_name, factor in SLICES.items():
            for b in BATCHES:
                profiles.append({
                    "variant": variant, "device_type": GPU, "slice": slice_name, "batch": b,
                    "latency_ms": round((base + per * b) * factor, 3), "memory_mb": mem + mem_per * b,
                })
    return {
        "format_version": 1,
        "applications": [
            {"name": "classify", "slo_ms": 100.0, "demand_rps": 300.0},
            {"name": "detect", "slo_ms": 200.0, "demand_rps": 50.0},
        ],
        "variants": [{"name": n, "application": a, "accuracy": acc, "memory_mb": m} for n, (a, acc, m, *_rest) in VARIANTS.items()],
        "devices": [
            {"name": "gpu0", "type": GPU, "memory_mb": GPU_MEMORY_MB, "mps": True, "mps_partitions": PARTITIONS,
             "mps_layout": "100", "running": {"mps100@0": "resnet50"}},
            {"name": "gpu1", "type": GPU, "memory_mb": GPU_MEMORY_MB, "mps": True, "mps_partitions": PARTITIONS,
             "mps_layout": "60+40", "fixed_layout": True, "running": {"mps60@0": "resnet50", "mps40@1": ["yolo_s", "resnet18"]}},
            {"name": "gpu2", "type": GPU, "memory_mb": GPU_MEMORY_MB},
        ],
        "profiles": profiles,
    }


@pytest.fixture(scope="module")
def problem() -> Problem:
    return problem_from_dict(mps_problem_dict())


# ----------------------------------------------------------------------------- plans, built by hand


@dataclasses.dataclass(frozen=True)
class Row:
    device: str
    slot: str  # "mps60@0"
    variant: str
    batch: int
    assigned_rps: float
    factor: float = 1.0
    duty: float | None = None


def profiled_ms(variant: str, slice_name: str, batch: int) -> float:
    _, _, _, base, per, _ = VARIANTS[variant]
    return round((base + per * batch) * SLICES[slice_name], 3)


def build_plan(problem: Problem, rows: list[Row], layouts: dict[str, list[str]]) -> Plan:
    """A plan whose every derived figure (latency with interference, capacity per round, served, shortfall,
    routing, accuracy, GPUs) is computed here, independently of the planners and the validator."""
    instances = []
    for r in rows:
        slice_name, start = r.slot.split("@")
        latency = profiled_ms(r.variant, slice_name, r.batch) * r.factor
        capacity = r.batch * 1000.0 / (r.duty if r.duty is not None else latency)
        instances.append(PlanInstance(
            device=r.device, slice=slice_name, start=int(start), variant=r.variant, batch=r.batch,
            latency_ms=round(latency, 6), capacity_rps=capacity, assigned_rps=r.assigned_rps,
            duty_cycle_ms=r.duty, interference_factor=r.factor,
        ))
    served = {a.name: 0.0 for a in problem.applications}
    weighted = {a.name: 0.0 for a in problem.applications}
    for inst in instances:
        variant = problem.variant(inst.variant)
        served[variant.application] += inst.assigned_rps
        weighted[variant.application] += inst.assigned_rps * variant.accuracy
    routing = {
        app: [RouteEntry(i.id, i.assigned_rps / served[app]) for i in instances
              if problem.variant(i.variant).application == app and i.assigned_rps > 0]
        for app in served
    }
    total = sum(served.values())
    return Plan(
        status="optimal", solver="hand", objective_kind="max-accuracy", objective=None, bound=None, gap=None, solve_seconds=0.0,
        effective_accuracy=sum(weighted.values()) / total if total else None, served_rps=served,
        shortfall_rps={a.name: max(0.0, a.demand_rps - served[a.name]) for a in problem.applications},
        instances=instances, routing=routing, layouts=layouts,
        accuracy_by_application={app: weighted[app] / s for app, s in served.items() if s > 0},
        gpus_used=len({i.device for i in instances}),
    )


def good_rows(duty: float = 40.0, *, resnet18: float = 50.0, yolo: float = 50.0) -> list[Row]:
    """resnet50 alone on gpu0's 60 % partition (slowed 10 % by its neighbour): 19.04 x 1.1 = 20.944 ms at
    batch 8. resnet18 and yolo_s time-share the 40 % partition (slowed 5 %): 8.4 ms + 29.4 ms = 37.8 ms fit a
    40 ms round; a query waits at most a round, so 40 + 8.4 <= 100 ms and 40 + 29.4 <= 200 ms."""
    return [
        Row("gpu0", "mps60@0", "resnet50", 8, 250.0, factor=1.1),
        Row("gpu0", "mps40@1", "resnet18", 4, resnet18, factor=1.05, duty=duty),
        Row("gpu0", "mps40@1", "yolo_s", 4, yolo, factor=1.05, duty=duty),
    ]


GOOD_LAYOUT = {"gpu0": ["mps60@0", "mps40@1"]}


def good_mps_plan(problem: Problem) -> Plan:
    return build_plan(problem, good_rows(), dict(GOOD_LAYOUT))


def instance(plan: Plan, iid: str) -> PlanInstance:
    return next(i for i in plan.instances if i.id == iid)


def replace_instance(plan: Plan, iid: str, **changes: Any) -> Plan:
    return dataclasses.replace(plan, instances=[dataclasses.replace(i, **changes) if i.id == iid else i for i in plan.instances])


def assert_error(verdict: PlanVerdict, *fragments: str) -> None:
    assert not verdict.valid, "expected the plan to be refused"
    assert any(all(f in e for f in fragments) for e in verdict.errors), f"no error with {fragments!r} in {verdict.errors}"


def assert_only_error(verdict: PlanVerdict, *fragments: str) -> None:
    """The plan breaks exactly one rule: one error, and it is the expected one."""
    assert_error(verdict, *fragments)
    assert len(verdict.errors) == 1, verdict.errors


# ----------------------------------------------------------------------------- partitions.py helpers


def test_mps_slice_names() -> None:
    assert mps_slice_name(50) == "mps50" and mps_slice_name(100) == "mps100" and mps_slice_name(1) == "mps1"
    for bad in (0, 101, 5.5, True, "50"):
        with pytest.raises(ValueError):
            mps_slice_name(bad)  # type: ignore[arg-type]
    assert mps_slice_percent("mps50") == 50 and mps_slice_percent("mps100") == 100
    for other in ("mps0", "mps101", "mps5.5", "MPS50", "mps050", "mps", "full", "3g.20gb", "4", "", None):
        assert mps_slice_percent(other) is None, other  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- problem format


def test_mps_problem_round_trip_is_exact(problem: Problem) -> None:
    once = problem_to_dict(problem)
    again = problem_from_dict(json.loads(json.dumps(once)))
    assert again == problem
    assert problem_to_dict(again) == once
    gpu0, gpu1, gpu2 = problem.devices
    assert (gpu0.partitioning, gpu1.partitioning, gpu2.partitioning) == ("mps", "mps", "none")
    assert gpu1.mps and gpu1.fixed_layout and gpu1.mps_layout == (60, 40) and gpu1.mps_partitions == tuple(PARTITIONS)
    assert gpu1.running == (("mps40@1", "resnet18"), ("mps40@1", "yolo_s"), ("mps60@0", "resnet50"))
    assert gpu2.mps_layout is None and not gpu2.mps
    written = once["devices"][1]
    assert written["mps"] is True and written["mps_layout"] == "60+40" and written["mps_partitions"] == PARTITIONS
    assert written["running"] == {"mps40@1": ["resnet18", "yolo_s"], "mps60@0": "resnet50"}
    assert "mps" not in once["devices"][2] and "mps_layout" not in once["devices"][2]
    json_validate(mps_problem_dict(), problem_schema())
    json_validate(once, problem_schema())


def test_mps_layout_as_a_list_and_default_partitions() -> None:
    raw = mps_problem_dict()
    raw["devices"][0].update(mps_layout=[40, 60], running={"mps60@0": "resnet50"})
    del raw["devices"][0]["mps_partitions"]
    device = problem_from_dict(raw).device("gpu0")
    assert device.mps_layout == (60, 40)
    assert device.mps_partitions == (20, 40, 50, 60, 80, 100)  # gpulets' shares
    json_validate(raw, problem_schema())


def test_a_cpu_and_mig_gpus_are_not_mps() -> None:
    problem = problem_from_dict(small_problem_dict())
    assert [d.partitioning for d in problem.devices] == ["mig", "mig", "none", "none"]
    assert DeviceSpec("g", GPU, mps=True).partitioning == "mps"


def test_mps_profile_slices_are_normalised_and_valid_on_any_gpu_type() -> None:
    raw = mps_problem_dict()
    raw["profiles"][0]["slice"] = "MPS100"
    raw["profiles"].append({"variant": "resnet18", "device_type": "A100-SXM4-40GB", "slice": "mps50", "batch": 1, "latency_ms": 3.0})
    problem = problem_from_dict(raw)
    assert problem.profiles[0].slice == "mps100"
    assert [p.batch for p in problem.profiles_for("resnet18", GPU, "mps100")] == list(BATCHES)
    assert problem.profiles_for("resnet18", "A100-SXM4-40GB", "mps50")


Mutation = Callable[[dict[str, Any]], None]


def _device(index: int, **changes: Any) -> Mutation:
    return lambda raw: raw["devices"][index].update(changes)


def _drop(index: int, key: str) -> Mutation:
    return lambda raw: raw["devices"][index].pop(key)


def _profile_slice(slice_name: str, device_type: str = GPU) -> Mutation:
    return lambda raw: raw["profiles"][0].update(slice=slice_name, device_type=device_type)


def _add_cpu(**extra: Any) -> Mutation:
    return lambda raw: raw["devices"].append({"name": "cpu0", "type": "cpu", "cores": 8, **extra})


# (mutation, what the reader's message must contain, whether the schema also refuses it)
MALFORMED: dict[str, tuple[Mutation, str, bool]] = {
    "mig and mps": (_device(0, mig=True), "devices[0] (gpu0): mig and mps are both true", True),
    "mps on a cpu": (_add_cpu(mps=True), "devices[3] (cpu0): a CPU cannot use MPS", True),
    "mps_layout without mps": (_device(2, mps_layout="100"), "devices[2] (gpu2): mps_layout is given but mps is false", True),
    "mps_partitions without mps": (_device(2, mps_partitions=[50, 100]), "devices[2] (gpu2): mps_partitions is given but mps is false", True),
    "fixed layout without a layout": (_drop(1, "mps_layout"), "devices[1] (gpu1): fixed_layout needs an mps_layout", True),
    "layout over 100 %": (_device(0, mps_layout="60+50", running={}), "devices[0] (gpu0).mps_layout: invalid MPS layout '60+50': partitions add up to 110 % of the GPU (at most 100 %)", False),
    "layout share not allowed": (_device(0, mps_layout="70+30", running={}), "devices[0] (gpu0).mps_layout: invalid MPS layout '70+30': partition sizes [30, 70] are not allowed", False),
    "malformed layout text": (_device(0, mps_layout="60+abc"), "devices[0] (gpu0).mps_layout: MPS layout '60+abc': 'abc' is not a whole percent", True),
    "layout list of text": (_device(0, mps_layout=["60", "40"]), "devices[0] (gpu0).mps_layout: '60' is not a whole percent 1..100", True),
    "partition of 0 %": (_device(0, mps_partitions=[0, 100]), "devices[0] (gpu0).mps_partitions: 0 is not a whole percent 1..100", True),
    "partition of 5.5 %": (_device(0, mps_partitions=[5.5, 100]), "devices[0] (gpu0).mps_partitions: 5.5 is not a whole percent 1..100", True),
    "partition listed twice": (_device(0, mps_partitions=[100, 40, 40]), "devices[0] (gpu0).mps_partitions: 40 % is listed twice", True),
    "no partitions": (_device(0, mps_partitions=[]), "devices[0] (gpu0).mps_partitions: expected a non-empty list", True),
    "running slot not in the layout": (_device(1, running={"mps50@0": "resnet50"}), "devices[1] (gpu1).running: slot 'mps50@0' is not on this device (slots: mps40@1, mps60@0)", False),
    "running index out of order": (_device(1, running={"mps40@0": "resnet50"}), "devices[1] (gpu1).running: slot 'mps40@0' is not on this device", False),
    "running without a layout": (lambda raw: raw["devices"][0].pop("mps_layout"), "devices[0] (gpu0).running: slot 'mps100@0' is not on this device (slots: none)", False),
    "running variant listed twice": (_device(1, running={"mps40@1": ["resnet18", "resnet18"]}), "devices[1] (gpu1).running['mps40@1']: variant 'resnet18' is listed twice", True),
    "running empty list": (_device(1, running={"mps40@1": []}), "devices[1] (gpu1).running['mps40@1']: expected a variant or a non-empty list", True),
    "running unknown variant": (_device(1, running={"mps40@1": ["resnet18", "vgg16"]}), "device gpu1: running['mps40@1'] names unknown variant 'vgg16'", False),
    "running list on a whole GPU": (_device(2, running={"full": ["resnet18", "yolo_s"]}), "devices[2] (gpu2).running['full']: expected a non-empty string", True),
    "profile mps0": (_profile_slice("mps0"), "profiles[0] (resnet18 on RTX 2080 Ti): 'mps0' is not an MPS slice", False),
    "profile mps101": (_profile_slice("mps101"), "profiles[0] (resnet18 on RTX 2080 Ti): 'mps101' is not an MPS slice", False),
    "profile mps5.5": (_profile_slice("mps5.5"), "profiles[0] (resnet18 on RTX 2080 Ti): 'mps5.5' is not an MPS slice", False),
    "profile mps on a cpu": (_profile_slice("mps50", "cpu"), "profiles[0] (resnet18 on cpu): a CPU has no MPS partitions, got slice 'mps50'", False),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_mps_problem_is_refused_naming_the_item(case: str) -> None:
    mutate, expected, _ = MALFORMED[case]
    raw = mps_problem_dict()
    mutate(raw)
    with pytest.raises(ProblemError) as info:
        problem_from_dict(raw)
    assert expected in str(info.value)


@pytest.mark.parametrize("case", sorted(c for c, (_, _, schema) in MALFORMED.items() if schema))
def test_schema_refuses_what_the_reader_refuses(case: str) -> None:
    mutate, _, _ = MALFORMED[case]
    raw = mps_problem_dict()
    mutate(raw)
    with pytest.raises(SchemaError):
        json_validate(raw, problem_schema())


# ----------------------------------------------------------------------------- capacity model


def test_capacity_on_mps_slices(problem: Problem) -> None:
    gpu0 = problem.device("gpu0")
    assert slice_memory_mb(gpu0, "mps40") == GPU_MEMORY_MB  # partitions share the GPU's memory
    capacity = capacity_for(problem, "resnet50", gpu0, "mps60")
    assert capacity is not None
    assert capacity.batch == 8 and capacity.latency_ms == pytest.approx(19.04)
    assert capacity.capacity_rps == pytest.approx(8000 / 19.04) and capacity.memory_mb == 1640.0
    assert capacity_for(problem, "resnet50", gpu0, "mps50") is None  # not profiled


# ----------------------------------------------------------------------------- a valid plan


def test_valid_mps_plan_passes(problem: Problem) -> None:
    plan = good_mps_plan(problem)
    assert plan_validate(problem, plan) == PlanVerdict(valid=True, errors=(), warnings=())
    assert [i.id for i in plan.instances] == ["gpu0/mps60@0/resnet50", "gpu0/mps40@1/resnet18", "gpu0/mps40@1/yolo_s"]
    assert instance(plan, "gpu0/mps40@1/yolo_s").capacity_rps == pytest.approx(100.0)  # 4 per 40 ms round
    assert instance(plan, "gpu0/mps60@0/resnet50").latency_ms == pytest.approx(20.944)
    assert plan.served_rps == {"classify": 300.0, "detect": 50.0} and plan.gpus_used == 1


def test_valid_mps_plan_survives_json_and_matches_the_schema(problem: Problem) -> None:
    data = json.loads(json.dumps(good_mps_plan(problem).to_dict()))
    json_validate(data, plan_schema())
    shared = data["instances"][1]
    assert shared["id"] == "gpu0/mps40@1/resnet18" and shared["duty_cycle_ms"] == 40.0 and shared["interference_factor"] == 1.05
    assert data["instances"][0]["duty_cycle_ms"] is None
    plan = plan_from_dict(data)
    assert plan == good_mps_plan(problem)
    assert plan_validate(problem, plan).valid


def test_fixed_layout_kept_passes(problem: Problem) -> None:
    rows = [dataclasses.replace(r, device="gpu1") for r in good_rows()]
    verdict = plan_validate(problem, build_plan(problem, rows, {"gpu1": ["mps60@0", "mps40@1"]}))
    assert verdict == PlanVerdict(valid=True, errors=(), warnings=())


def test_a_model_alone_with_a_round_of_its_own_latency_is_todays_rule(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], duty=round(19.04 * 1.1, 6))  # duty = latency: back to back
    plan = build_plan(problem, rows, dict(GOOD_LAYOUT))
    assert plan_validate(problem, plan).valid
    assert instance(plan, "gpu0/mps60@0/resnet50").capacity_rps == pytest.approx(8000 / 20.944)


def test_smaller_batch_warns_only_for_a_model_alone(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], batch=4)  # resnet50 alone could run batch 8
    rows[1] = dataclasses.replace(rows[1], batch=2, assigned_rps=50.0)  # time-shared: no warning
    verdict = plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT)))
    assert verdict.valid
    assert verdict.warnings == ("instance gpu0/mps60@0/resnet50: batch 4 is smaller than the largest usable batch 8 (capacity left unused)",)


# ----------------------------------------------------------------------------- check_slice


def test_partitions_over_100_percent_are_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(), {"gpu0": ["mps60@0", "mps40@1", "mps10@2"]})
    assert_only_error(plan_validate(problem, plan), "device gpu0: layout mps60@0 mps40@1 mps10@2 is not a valid MPS layout",
                      "partitions add up to 110 % of the GPU (at most 100 %)")


def test_slot_not_in_the_layout_is_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], slot="mps60@2")
    assert_only_error(plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT))),
                      "instance gpu0/mps60@2/resnet50: partition mps60@2 is not in the plan's layout for gpu0 (mps60@0 mps40@1)")


def test_share_not_allowed_on_the_device_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", slice="mps80")
    assert_error(plan_validate(problem, plan), "instance gpu0/mps80@0/resnet50: gpu0 does not allow 80 % MPS partitions",
                 "allowed: mps10, mps20, mps40, mps50, mps60, mps100")


def test_negative_start_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", start=-1)
    assert_error(plan_validate(problem, plan), "instance gpu0/mps60@-1/resnet50: an MPS instance needs its partition's index in the layout as start, got -1")


def test_whole_gpu_slice_on_an_mps_gpu_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", slice="full", start=None)
    assert_error(plan_validate(problem, plan), "instance gpu0/full: gpu0 is partitioned with MPS, so it cannot run a whole-GPU 'full' instance")


def test_mig_profile_on_an_mps_gpu_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", slice="3g.20gb")
    assert_error(plan_validate(problem, plan), "instance gpu0/3g.20gb@0: '3g.20gb' is a MIG profile but gpu0 is partitioned with MPS, not MIG")


def test_mps_slice_on_a_whole_gpu_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", device="gpu2")
    assert_error(plan_validate(problem, plan), "instance gpu2/mps60@0/resnet50: gpu2 is a whole GPU (MIG off); its only slice is 'full'")


# ----------------------------------------------------------------------------- check_batch


def test_interference_factor_below_one_is_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], factor=0.9)
    assert_only_error(plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT))),
                      "instance gpu0/mps60@0/resnet50: interference_factor 0.9 must be a finite number >= 1")


def test_interference_factor_not_finite_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", interference_factor=math.inf)
    assert_error(plan_validate(problem, plan), "instance gpu0/mps60@0/resnet50: interference_factor inf must be a finite number >= 1")


def test_latency_without_the_interference_factor_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", latency_ms=19.04)
    assert_only_error(plan_validate(problem, plan), "instance gpu0/mps60@0/resnet50: latency_ms 19.04 does not match the profile's "
                      "19.04 ms at batch 8 x interference_factor 1.1 = 20.944 ms")


def test_alone_over_the_latency_budget_is_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], factor=2.7)  # 19.04 x 2.7 = 51.4 ms > 50 ms
    assert_only_error(plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT))),
                      "instance gpu0/mps60@0/resnet50: batch 8 of resnet50 takes 51.41 ms (interference included), over the latency budget 50 ms")


def test_alone_capacity_is_batch_over_latency(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", capacity_rps=8000 / 19.04)
    assert_only_error(plan_validate(problem, plan), "instance gpu0/mps60@0/resnet50: capacity_rps", "does not match batch/latency = 381.971 rps")


def test_duty_cycle_plus_latency_over_the_slo_is_refused(problem: Problem) -> None:
    # A 95 ms round: 8.4 + 29.4 ms fit, but a classify query may wait 95 ms and then take 8.4 ms > 100 ms.
    plan = build_plan(problem, good_rows(95.0, resnet18=40.0, yolo=40.0), dict(GOOD_LAYOUT))
    assert_only_error(plan_validate(problem, plan), "instance gpu0/mps40@1/resnet18: duty cycle 95 ms + batch latency 8.4 ms = 103.4 ms "
                      "is over 100 ms (2 x 0.5 x SLO 100 ms of classify")


def test_latency_longer_than_the_duty_cycle_is_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[0] = dataclasses.replace(rows[0], duty=15.0)
    assert_only_error(plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT))),
                      "instance gpu0/mps60@0/resnet50: batch 8 of resnet50 takes 20.94 ms, longer than its duty cycle 15 ms")


def test_duty_cycle_must_be_positive(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps60@0/resnet50", duty_cycle_ms=0.0)
    assert_error(plan_validate(problem, plan), "instance gpu0/mps60@0/resnet50: duty_cycle_ms must be a positive number, got 0.0")


def test_time_shared_capacity_is_a_batch_per_round(problem: Problem) -> None:
    plan = replace_instance(good_mps_plan(problem), "gpu0/mps40@1/yolo_s", capacity_rps=4000 / 29.4)
    assert_only_error(plan_validate(problem, plan), "instance gpu0/mps40@1/yolo_s: capacity_rps", "does not match batch/duty cycle = 100 rps")


def test_traffic_over_a_round_capacity_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(resnet18=120.0), dict(GOOD_LAYOUT))
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "instance gpu0/mps40@1/resnet18: assigned 120 rps exceeds its capacity 100 rps")


# ----------------------------------------------------------------------------- per partition


def test_round_that_does_not_fit_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(30.0), dict(GOOD_LAYOUT))
    assert_only_error(plan_validate(problem, plan), "partition mps40@1 of gpu0: the round does not fit: its batches take "
                      "8.4 (resnet18) + 29.4 (yolo_s) = 37.8 ms but the duty cycle is 30 ms")


def test_mismatched_duty_cycles_are_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[2] = dataclasses.replace(rows[2], duty=45.0)
    assert_only_error(plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT))),
                      "partition mps40@1 of gpu0: its models carry different duty cycles "
                      "(gpu0/mps40@1/resnet18: 40 ms, gpu0/mps40@1/yolo_s: 45 ms)")


def test_time_sharing_without_a_duty_cycle_is_refused(problem: Problem) -> None:
    rows = good_rows()
    rows[1] = dataclasses.replace(rows[1], duty=None)
    verdict = plan_validate(problem, build_plan(problem, rows, dict(GOOD_LAYOUT)))
    assert_only_error(verdict, "partition mps40@1 of gpu0: 2 models time-share it", "but gpu0/mps40@1/resnet18 has no duty_cycle_ms")


def test_a_variant_twice_in_one_partition_is_refused(problem: Problem) -> None:
    plan = good_mps_plan(problem)
    plan.instances.append(dataclasses.replace(instance(plan, "gpu0/mps40@1/resnet18"), assigned_rps=0.0))
    assert_error(plan_validate(problem, plan), "instance gpu0/mps40@1/resnet18: variant resnet18 appears twice in partition mps40@1 of gpu0")


# ----------------------------------------------------------------------------- per device


def test_layout_not_largest_first_is_refused(problem: Problem) -> None:
    rows = [dataclasses.replace(r, slot="mps60@1" if r.slot == "mps60@0" else "mps40@0") for r in good_rows()]
    plan = build_plan(problem, rows, {"gpu0": ["mps40@0", "mps60@1"]})
    assert_only_error(plan_validate(problem, plan), "device gpu0: layout mps40@0 mps60@1 is not largest first")


def test_layout_indices_must_be_0_to_n_minus_1(problem: Problem) -> None:
    rows = [dataclasses.replace(r, slot="mps40@2") if r.slot == "mps40@1" else r for r in good_rows()]
    plan = build_plan(problem, rows, {"gpu0": ["mps60@0", "mps40@2"]})
    assert_only_error(plan_validate(problem, plan), "device gpu0: layout mps60@0 mps40@2 is not a valid MPS layout: partition indices must be 0..1")


def test_malformed_layout_entry_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(), {"gpu0": ["mps60@0", "mps40"]})
    assert_error(plan_validate(problem, plan), "layouts[gpu0]: 'mps40' is not an MPS partition such as 'mps60@0'")


def test_missing_layouts_entry_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(), {})
    assert_only_error(plan_validate(problem, plan), "device gpu0: 3 MPS instance(s) (gpu0/mps60@0/resnet50, gpu0/mps40@1/resnet18, "
                      "gpu0/mps40@1/yolo_s) but the plan has no layouts entry for it")


def test_fixed_layout_changed_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(), {**GOOD_LAYOUT, "gpu1": ["mps50@0", "mps50@1"]})
    assert_only_error(plan_validate(problem, plan), "device gpu1: the MPS layout is fixed at 60+40 but the plan wants 50+50 (mps50@0 mps50@1)")


def test_memory_over_the_device_is_refused() -> None:
    raw = mps_problem_dict()
    raw["devices"][0]["memory_mb"] = 4000
    small = problem_from_dict(raw)
    # 1000 + 80 x 8 = 1640, 500 + 40 x 4 = 660, 2000 + 150 x 4 = 2600: 4900 MB > 4000 MB
    assert_only_error(plan_validate(small, good_mps_plan(small)), "device gpu0: its MPS instances need 4900 MB in all "
                      "(gpu0/mps60@0/resnet50: 1640 MB, gpu0/mps40@1/resnet18: 660 MB, gpu0/mps40@1/yolo_s: 2600 MB) but it has 4000 MB")


def test_layouts_for_a_gpu_without_partitions_is_refused(problem: Problem) -> None:
    plan = build_plan(problem, good_rows(), {**GOOD_LAYOUT, "gpu2": ["mps100@0"]})
    assert_only_error(plan_validate(problem, plan), "layouts: gpu2 does not use MIG; it has no partitions (neither MIG nor MPS)")


def test_gpus_used_counts_mps_gpus(problem: Problem) -> None:
    plan = dataclasses.replace(good_mps_plan(problem), gpus_used=0)
    assert_only_error(plan_validate(problem, plan), "gpus_used 0 but instances run on 1 GPU(s)")


# ----------------------------------------------------------------------------- MIG plans unchanged


def test_mig_plan_without_the_new_fields_loads_and_validates_unchanged() -> None:
    mig_problem = problem_from_dict(small_problem_dict())
    plan = good_plan(mig_problem)
    data = json.loads(json.dumps(plan.to_dict()))
    old = copy.deepcopy(data)
    for raw in old["instances"]:
        assert raw["duty_cycle_ms"] is None and raw["interference_factor"] == 1.0
        del raw["duty_cycle_ms"], raw["interference_factor"]
    loaded = plan_from_dict(old)
    assert loaded == plan
    assert [i.id for i in loaded.instances] == [i.id for i in plan.instances]
    assert all(i.duty_cycle_ms is None and i.interference_factor == 1.0 for i in loaded.instances)
    assert plan_validate(mig_problem, loaded) == plan_validate(mig_problem, plan) == PlanVerdict(valid=True)
    json_validate(old, plan_schema())


def test_duty_cycle_on_a_mig_instance_is_refused() -> None:
    mig_problem = problem_from_dict(small_problem_dict())
    plan = good_plan(mig_problem)
    plan = dataclasses.replace(plan, instances=[
        dataclasses.replace(i, duty_cycle_ms=10.0) if i.id == "a100-0/3g.20gb@4" else i for i in plan.instances
    ])
    assert_only_error(plan_validate(mig_problem, plan), "instance a100-0/3g.20gb@4: duty_cycle_ms 10.0 and interference_factor 1.0 "
                      "apply only to MPS partitions, and a100-0 is a MIG GPU")
