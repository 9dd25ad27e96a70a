"""plan_validate on hand-built plans: a correct plan passes, and each kind of fault is reported with a
message naming the instance, application or device at fault."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from engine.plans.problem import Plan, PlanInstance, Problem, RouteEntry, plan_from_dict, problem_from_dict
from engine.plans.validate import PlanVerdict, plan_validate
from engine.solvers.assemble import Assignment, plan_assemble

from .test_problem_format import small_problem_dict

A100_LAYOUT = ["2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]


@pytest.fixture(scope="module")
def problem() -> Problem:
    return problem_from_dict(small_problem_dict())


def good_plan(problem: Problem) -> Plan:
    """classify (900 rps) on resnet50 across three MIG instances, detect (60 rps) on a T4 and a 1g.5gb;
    the A100 keeps its fixed layout (1g.5gb@3 idle), the H100 gets one 3g.40gb."""
    return plan_assemble(
        problem,
        [
            Assignment("a100-0", "3g.20gb", 4, "resnet50", 300.0),
            Assignment("a100-0", "2g.10gb", 0, "resnet50", 200.0),
            Assignment("h100-0", "3g.40gb", 0, "resnet50", 400.0),
            Assignment("t4-0", "full", None, "yolo_l", 50.0),
            Assignment("a100-0", "1g.5gb", 2, "yolo_s", 10.0),
        ],
        status="optimal", solver="hand", objective=0.0, bound=0.0, gap=0.0, solve_seconds=0.0,
        layouts={"a100-0": A100_LAYOUT, "h100-0": ["3g.40gb@0"]},
    )


def instance(plan: Plan, iid: str) -> PlanInstance:
    return next(i for i in plan.instances if i.id == iid)


def replace_instance(plan: Plan, iid: str, **changes: Any) -> Plan:
    instances = [dataclasses.replace(i, **changes) if i.id == iid else i for i in plan.instances]
    return dataclasses.replace(plan, instances=instances)


def assert_error(verdict: PlanVerdict, *fragments: str) -> None:
    assert not verdict.valid, "expected the plan to be refused"
    assert any(all(f in e for f in fragments) for e in verdict.errors), f"no error with {fragments!r} in {verdict.errors}"


# ----------------------------------------------------------------------------- correct plans


def test_correct_plan_passes(problem: Problem) -> None:
    plan = good_plan(problem)
    verdict = plan_validate(problem, plan)
    assert verdict == PlanVerdict(valid=True, errors=(), warnings=())
    assert plan.served_rps == {"classify": 900.0, "detect": 60.0}
    assert str(verdict) == "valid"


def test_correct_plan_survives_json_round_trip(problem: Problem) -> None:
    plan = plan_from_dict(json.loads(json.dumps(good_plan(problem).to_dict())))
    assert plan_validate(problem, plan).valid


def test_plan_with_reported_shortfall_is_valid(problem: Problem) -> None:
    plan = plan_assemble(
        problem,
        [Assignment("a100-0", "3g.20gb", 4, "resnet50", 300.0), Assignment("cpu-0", "16", None, "yolo_s", 52.0)],
        status="feasible", solver="hand", objective=None, bound=None, gap=None, solve_seconds=0.0,
        layouts={"a100-0": A100_LAYOUT},
    )
    assert plan.shortfall_rps == {"classify": 600.0, "detect": 8.0}
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors


def test_empty_infeasible_plan_reporting_all_demand_short_is_valid(problem: Problem) -> None:
    plan = plan_assemble(problem, [], status="infeasible", solver="hand", objective=None, bound=None, gap=None, solve_seconds=0.0)
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert any("infeasible" in w for w in verdict.warnings)


def test_fixed_layout_without_layouts_entry_is_read_as_kept(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.layouts.pop("a100-0")
    assert plan_validate(problem, plan).valid


def test_smaller_batch_is_a_warning(problem: Problem) -> None:
    plan = good_plan(problem)
    # resnet50 on 3g.20gb: largest usable batch 15 (48.4 ms); batch 8 is legal but wasteful.
    latency = (4.0 + 1.2 * 8) * 2.2
    plan = replace_instance(plan, "a100-0/3g.20gb@4", batch=8, latency_ms=latency, capacity_rps=8000 / latency, assigned_rps=250.0)
    plan = replace_instance(plan, "h100-0/3g.40gb@0", assigned_rps=450.0)
    plan.routing["classify"] = [RouteEntry(e.instance, {"a100-0/3g.20gb@4": 250 / 900, "a100-0/2g.10gb@0": 200 / 900, "h100-0/3g.40gb@0": 450 / 900}[e.instance]) for e in plan.routing["classify"]]
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert any("a100-0/3g.20gb@4: batch 8 is smaller than the largest usable batch 15" in w for w in verdict.warnings)


# ----------------------------------------------------------------------------- MIG geometry


def test_overlapping_instances_are_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    extra = dataclasses.replace(instance(plan, "h100-0/3g.40gb@0"), slice="2g.20gb", start=2, assigned_rps=0.0)
    cap = 10 * 1000 / 48.0  # resnet50 on 2g.20gb is not profiled on the H100: use a profiled slice instead
    extra = dataclasses.replace(extra, slice="1g.10gb", start=2, batch=10, latency_ms=48.0, capacity_rps=cap)
    plan = dataclasses.replace(plan, instances=plan.instances + [extra], layouts={**plan.layouts, "h100-0": ["3g.40gb@0", "1g.10gb@2"]})
    assert_error(plan_validate(problem, plan), "device h100-0", "1g.10gb@2", "overlaps", "3g.40gb@0")


def test_overlap_is_found_from_instances_alone(problem: Problem) -> None:
    plan = good_plan(problem)
    extra = dataclasses.replace(instance(plan, "h100-0/3g.40gb@0"), slice="1g.10gb", start=3, batch=10, latency_ms=48.0, capacity_rps=10000 / 48.0, assigned_rps=0.0)
    layouts = dict(plan.layouts)
    layouts.pop("h100-0")
    plan = dataclasses.replace(plan, instances=plan.instances + [extra], layouts=layouts)
    assert_error(plan_validate(problem, plan), "device h100-0", "overlaps")


def test_illegal_start_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan = replace_instance(plan, "h100-0/3g.40gb@0", start=2)
    plan.routing["classify"] = [RouteEntry(e.instance.replace("3g.40gb@0", "3g.40gb@2"), e.weight) for e in plan.routing["classify"]]
    plan.layouts["h100-0"] = ["3g.40gb@2"]
    assert_error(plan_validate(problem, plan), "device h100-0", "start 2 is not a legal start for 3g.40gb")


def test_changing_a_fixed_layout_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.layouts["a100-0"] = ["2g.10gb@0", "1g.10gb@2", "3g.20gb@4"]
    plan = replace_instance(plan, "a100-0/1g.5gb@2", slice="1g.10gb")  # not profiled either; the layout error is what matters
    assert_error(plan_validate(problem, plan), "device a100-0: the layout is fixed at 2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4", "1g.10gb@2")


def test_instance_outside_the_plans_layout_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.layouts["h100-0"] = ["7g.80gb@0"]
    assert_error(plan_validate(problem, plan), "instance h100-0/3g.40gb@0", "not in the plan's layout for h100-0")


def test_instance_outside_a_fixed_layout_is_refused_without_layouts_entry(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.layouts.pop("a100-0")
    extra = dataclasses.replace(instance(plan, "a100-0/1g.5gb@2"), start=6, assigned_rps=0.0)
    plan = dataclasses.replace(plan, instances=plan.instances + [extra])
    assert_error(plan_validate(problem, plan), "instance a100-0/1g.5gb@6", "not in the fixed layout of a100-0")


def test_two_instances_on_one_whole_gpu_are_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    t4 = instance(plan, "t4-0/full")
    plan = dataclasses.replace(plan, instances=plan.instances + [dataclasses.replace(t4, assigned_rps=0.0)])
    assert_error(plan_validate(problem, plan), "instance t4-0/full: listed twice")


def test_two_core_counts_on_one_cpu_are_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    cpu = [
        PlanInstance("cpu-0", "16", None, "resnet18", 12, 48.0, 250.0, 0.0),
        PlanInstance("cpu-0", "8", None, "resnet18", 6, 50.0, 120.0, 0.0),
    ]
    plan = dataclasses.replace(plan, instances=plan.instances + cpu)
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "device cpu-0: 2 instances", "one CPU host")
    assert any("cpu-0/8: runs on 8 cores but cpu-0 has a profile for 16" in w for w in verdict.warnings)


def test_slice_not_on_the_device_type_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_plan(problem), "a100-0/2g.10gb@0", slice="2g.20gb")
    assert_error(plan_validate(problem, plan), "instance a100-0/2g.20gb@0", "'2g.20gb' is not a MIG profile of A100-SXM4-40GB")


def test_mig_slice_on_a_whole_gpu_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_plan(problem), "t4-0/full", slice="3g.20gb", start=0)
    assert_error(plan_validate(problem, plan), "instance t4-0/3g.20gb@0", "whole GPU")


def test_cpu_with_more_cores_than_the_host_is_refused(problem: Problem) -> None:
    plan = dataclasses.replace(good_plan(problem))
    plan.instances.append(PlanInstance("cpu-0", "32", None, "resnet18", 12, 48.0, 250.0, 0.0))
    assert_error(plan_validate(problem, plan), "instance cpu-0/32: uses 32 cores but cpu-0 has 16")


def test_unknown_device_and_variant_are_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.instances.append(PlanInstance("gpu-9", "full", None, "resnet18", 1, 1.0, 1000.0, 0.0))
    plan.instances.append(PlanInstance("cpu-0", "16", None, "vgg16", 1, 1.0, 1000.0, 0.0))
    plan.layouts["t4-0"] = ["3g.20gb@0"]
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "instance gpu-9/full: unknown device 'gpu-9'")
    assert_error(verdict, "instance cpu-0/16: unknown variant 'vgg16'")
    assert_error(verdict, "layouts: t4-0 does not use MIG")


# ----------------------------------------------------------------------------- batch, latency, memory


def test_batch_over_half_the_slo_is_refused(problem: Problem) -> None:
    # resnet50 on 3g.20gb at batch 20: (4 + 1.2*20) * 2.2 = 61.6 ms > 50 ms = SLO 100 / 2.
    latency = (4.0 + 1.2 * 20) * 2.2
    plan = replace_instance(good_plan(problem), "a100-0/3g.20gb@4", batch=20, latency_ms=latency, capacity_rps=20000 / latency, assigned_rps=300.0)
    assert_error(plan_validate(problem, plan), "instance a100-0/3g.20gb@4: batch 20 of resnet50 takes 61.6 ms, over the latency budget 50 ms", "SLO 100 ms of classify")


def test_latency_budget_fraction_is_honoured() -> None:
    raw = small_problem_dict()
    raw["options"]["latency_budget_fraction"] = 0.4  # 40 ms for classify: batch 15 (48.4 ms) no longer fits
    problem = problem_from_dict(raw)
    plan = good_plan(problem_from_dict(small_problem_dict()))
    assert_error(plan_validate(problem, plan), "instance a100-0/3g.20gb@4", "over the latency budget 40 ms (0.4 x SLO 100 ms")


def test_memory_too_big_for_the_slice_is_refused(problem: Problem) -> None:
    # yolo_l needs 6400 MB at batch 1; a 1g.5gb instance has 4864 MiB (4.75 GiB).
    plan = replace_instance(good_plan(problem), "a100-0/1g.5gb@2", variant="yolo_l", batch=1, latency_ms=75.0, capacity_rps=1000 / 75.0, assigned_rps=10.0)
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "instance a100-0/1g.5gb@2: yolo_l needs 6400 MB at batch 1 but the 1g.5gb slice has 4864 MB")


def test_memory_of_a_whole_gpu_is_its_own(problem: Problem) -> None:
    # yolo_s at batch 16 on the T4: (6 + 2*16) * 2.5 = 95 ms within 100 ms, 4400 MB within 15360 MB.
    latency = (6.0 + 2.0 * 16) * 2.5
    plan = replace_instance(good_plan(problem), "t4-0/full", variant="yolo_s", batch=16, latency_ms=latency, capacity_rps=16000 / latency)
    plan.accuracy_by_application.pop("detect")
    plan.effective_accuracy = (900 * 0.76 + 60 * 0.4) / 960
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert any("t4-0/full: batch 16 is smaller than the largest usable batch 17" in w for w in verdict.warnings)
    raw = small_problem_dict()
    raw["devices"][2]["memory_mb"] = 4000
    assert_error(plan_validate(problem_from_dict(raw), plan), "instance t4-0/full: yolo_s needs 4400 MB at batch 16 but the full slice has 4000 MB")


def test_batch_outside_the_profiled_range_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_plan(problem), "h100-0/3g.40gb@0", batch=64)
    assert_error(plan_validate(problem, plan), "instance h100-0/3g.40gb@0: batch 64 is outside the profiled range 1..32")


def test_misstated_latency_and_capacity_are_refused(problem: Problem) -> None:
    plan = replace_instance(good_plan(problem), "h100-0/3g.40gb@0", latency_ms=30.0, capacity_rps=900.0)
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "instance h100-0/3g.40gb@0: latency_ms 30.0 does not match the profile's 49.28 ms at batch 26")
    assert_error(verdict, "instance h100-0/3g.40gb@0: capacity_rps 900.0 does not match batch/latency")


def test_unprofiled_slice_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.layouts["h100-0"] = ["4g.40gb@0"]
    plan = replace_instance(plan, "h100-0/3g.40gb@0", slice="4g.40gb")
    assert_error(plan_validate(problem, plan), "instance h100-0/4g.40gb@0: no latency profile for resnet50 on H100-SXM5-80GB/4g.40gb")


# ----------------------------------------------------------------------------- traffic and routing


def test_traffic_over_capacity_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan = replace_instance(plan, "a100-0/3g.20gb@4", assigned_rps=400.0, capacity_rps=400.0)
    plan = replace_instance(plan, "h100-0/3g.40gb@0", assigned_rps=300.0)
    plan.routing["classify"] = [RouteEntry(e.instance, {"a100-0/3g.20gb@4": 4 / 9, "a100-0/2g.10gb@0": 2 / 9, "h100-0/3g.40gb@0": 3 / 9}[e.instance]) for e in plan.routing["classify"]]
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "instance a100-0/3g.20gb@4: assigned 400 rps exceeds its capacity 309.917 rps")


def test_capacity_tolerance_is_relative(problem: Problem) -> None:
    plan = good_plan(problem)
    cap = instance(plan, "t4-0/full").capacity_rps  # 60 rps for yolo_l on the T4
    plan = replace_instance(plan, "t4-0/full", assigned_rps=cap * (1 + 1e-8))
    plan = replace_instance(plan, "a100-0/1g.5gb@2", assigned_rps=0.0)
    plan.served_rps["detect"] = cap * (1 + 1e-8)
    plan.routing["detect"] = [RouteEntry("t4-0/full", 1.0)]
    plan.accuracy_by_application["detect"] = 0.5
    plan.effective_accuracy = (900 * 0.76 + plan.served_rps["detect"] * 0.5) / (900 + plan.served_rps["detect"])
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors


@pytest.mark.parametrize(
    "routing, fragments",
    [
        ({"a100-0/3g.20gb@4": -0.1, "a100-0/2g.10gb@0": 0.5, "h100-0/3g.40gb@0": 0.6}, ("routing[classify] -> a100-0/3g.20gb@4: weight must be a non-negative number, got -0.1",)),
        ({"a100-0/3g.20gb@4": 0.5, "a100-0/2g.10gb@0": 0.5, "h100-0/3g.40gb@0": 0.5}, ("routing[classify]: weights sum to 1.5, not 1",)),
        ({"a100-0/3g.20gb@4": 1 / 3, "a100-0/2g.10gb@0": 2 / 9, "h100-0/3g.40gb@0": 4 / 9, "t4-0/full": 0.0}, ("routing[classify] -> t4-0/full", "runs yolo_l, a variant of detect, not of classify")),
        ({"a100-0/3g.20gb@4": 1 / 3, "a100-0/2g.10gb@0": 2 / 9, "h100-0/3g.40gb@9": 4 / 9}, ("routing[classify] -> h100-0/3g.40gb@9: no such instance in the plan",)),
        ({"a100-0/3g.20gb@4": 0.5, "a100-0/2g.10gb@0": 0.05, "h100-0/3g.40gb@0": 0.45}, ("routing[classify] -> a100-0/3g.20gb@4: weight 0.5 does not match the instance's share 0.333333",)),
        ({"a100-0/3g.20gb@4": 1 / 3, "a100-0/2g.10gb@0": 2 / 3}, ("instance h100-0/3g.40gb@0: assigned 400 rps of classify but missing from its routing",)),
    ],
    ids=["negative", "sum", "wrong-application", "unknown-instance", "not-the-share", "missing"],
)
def test_bad_routing_weights_are_refused(problem: Problem, routing: dict[str, float], fragments: tuple[str, ...]) -> None:
    plan = good_plan(problem)
    plan.routing["classify"] = [RouteEntry(i, w) for i, w in routing.items()]
    assert_error(plan_validate(problem, plan), *fragments)


def test_routing_an_unserved_application_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.routing["detect"] = [RouteEntry("t4-0/full", 1.0)]
    plan = replace_instance(plan, "t4-0/full", assigned_rps=0.0)
    plan = replace_instance(plan, "a100-0/1g.5gb@2", assigned_rps=0.0)
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "routing[detect]: routes traffic (weights sum to 1) but no instance is assigned any")
    assert_error(verdict, "application detect: served_rps 60 does not equal the traffic assigned to its instances, 0")


def test_served_rps_must_equal_assigned_traffic(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.served_rps["classify"] = 950.0
    plan.shortfall_rps["classify"] = -50.0
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "application classify: served_rps 950 does not equal the traffic assigned to its instances, 900")
    assert_error(verdict, "application classify: negative shortfall -50")


def test_misreported_shortfall_is_refused(problem: Problem) -> None:
    plan = good_plan(problem)
    plan = replace_instance(plan, "h100-0/3g.40gb@0", assigned_rps=100.0)
    plan.served_rps["classify"] = 600.0
    plan.routing["classify"] = [RouteEntry(e.instance, {"a100-0/3g.20gb@4": 0.5, "a100-0/2g.10gb@0": 1 / 3, "h100-0/3g.40gb@0": 1 / 6}[e.instance]) for e in plan.routing["classify"]]
    verdict = plan_validate(problem, plan)  # shortfall still says 0
    assert_error(verdict, "application classify: shortfall misreported: served 600 + shortfall 0 != demand 900 (shortfall should be 300)")


def test_serving_more_than_the_demand_is_refused(problem: Problem) -> None:
    plan = replace_instance(good_plan(problem), "h100-0/3g.40gb@0", assigned_rps=500.0)
    assert_error(plan_validate(problem, plan), "application classify: 1000 rps assigned but its demand is 900 rps")


def test_gpus_used_is_recounted(problem: Problem) -> None:
    plan = good_plan(problem)
    assert plan.gpus_used == 3
    plan.gpus_used = 2
    assert_error(plan_validate(problem, plan), "gpus_used 2 but instances run on 3 GPU(s)")


# ----------------------------------------------------------------------------- accuracy


def test_min_accuracy_is_enforced_when_the_plan_claims_full_service(problem: Problem) -> None:
    plan = plan_assemble(
        problem,
        [Assignment("h100-0", "7g.80gb", 0, "resnet18", 900.0), Assignment("t4-0", "full", None, "yolo_l", 60.0)],
        status="optimal", solver="hand", objective=None, bound=None, gap=None, solve_seconds=0.0,
        layouts={"a100-0": A100_LAYOUT, "h100-0": ["7g.80gb@0"]},
    )
    assert_error(plan_validate(problem, plan), "application classify: accuracy 0.7 is below its min_accuracy 0.72 although the plan claims full service")


def test_min_accuracy_shortfall_is_only_a_warning(problem: Problem) -> None:
    plan = plan_assemble(
        problem,
        [Assignment("h100-0", "7g.80gb", 0, "resnet18", 500.0), Assignment("t4-0", "full", None, "yolo_l", 60.0)],
        status="feasible", solver="hand", objective=None, bound=None, gap=None, solve_seconds=0.0,
        layouts={"h100-0": ["7g.80gb@0"]},
    )
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert any("min_accuracy" in w and "shortfall" in w for w in verdict.warnings)


def test_effective_accuracy_is_recomputed(problem: Problem) -> None:
    plan = good_plan(problem)
    expected = (900 * 0.76 + 50 * 0.5 + 10 * 0.4) / 960
    assert plan.effective_accuracy == pytest.approx(expected)
    plan.effective_accuracy = 0.8
    plan.accuracy_by_application["detect"] = 0.5
    verdict = plan_validate(problem, plan)
    assert_error(verdict, f"effective_accuracy 0.8 does not match the recomputed {expected:.6g}")
    assert_error(verdict, "application detect: accuracy_by_application 0.5 does not match the recomputed 0.483333")


def test_verdict_lists_every_fault_in_its_text(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.gpus_used = 7
    plan.effective_accuracy = 0.1
    verdict = plan_validate(problem, plan)
    text = str(verdict)
    assert text.startswith("invalid (2 errors)")
    assert "error: gpus_used 7" in text and "error: effective_accuracy 0.1" in text


# ----------------------------------------------------------------------------- MIG switched off


def _mig_off_plan(problem: Problem) -> Plan:
    return plan_assemble(
        problem,
        [Assignment("h100-0", "full", None, "resnet50", 900.0), Assignment("t4-0", "full", None, "yolo_l", 60.0)],
        status="optimal", solver="hand", objective=None, bound=None, gap=None, solve_seconds=0.0,
        layouts={"a100-0": A100_LAYOUT, "h100-0": []},
    )


def test_mig_gpu_run_whole_with_mig_off_is_valid(problem: Problem) -> None:
    verdict = plan_validate(problem, _mig_off_plan(problem))
    assert verdict.valid, verdict.errors


def test_whole_gpu_instance_beside_mig_instances_is_refused(problem: Problem) -> None:
    plan = _mig_off_plan(problem)
    plan.layouts["h100-0"] = ["3g.40gb@4"]
    extra = PlanInstance("h100-0", "3g.40gb", 4, "resnet50", 26, 49.28, 26000 / 49.28, 0.0)
    plan = dataclasses.replace(plan, instances=plan.instances + [extra])
    verdict = plan_validate(problem, plan)
    assert_error(verdict, "device h100-0: h100-0/full runs the whole GPU (MIG off) alongside h100-0/3g.40gb@4")
    assert_error(verdict, "device h100-0: h100-0/full runs the whole GPU (MIG off) but the plan wants the layout 3g.40gb@4")


def test_fixed_layout_gpu_cannot_run_whole(problem: Problem) -> None:
    plan = good_plan(problem)
    plan.instances.append(PlanInstance("a100-0", "full", None, "resnet18", 32, 18.0, 32000 / 18.0, 0.0))
    assert_error(plan_validate(problem, plan), "instance a100-0/full: a100-0 has a fixed MIG layout, so it cannot run as a whole GPU")
