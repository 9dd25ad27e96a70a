"""The simulator on MPS partitions (gpulets §4.2-§4.4): time-shared rounds, co-run interference re-timing,
and the oracle choices, on the shared gpulet profiles (engine/reference/gpulet_problem.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.plans.problem import Plan, PlanInstance, RouteEntry
from engine.reference.gpulet_problem import gpulet_mps_problem
from engine.reference.profiles import gpulet_inference_read, gpulet_interference_read, gpulet_mem_util_read
from engine.sharing.interference import InterferenceMeasured, interference_samples_build
from engine.simulation.simulator import SimulationConfig, simulate
from engine.simulation.workload import arrivals_poisson, arrivals_uniform
from engine.solvers.gpulets import sharing_plan_solve

CONFIG = SimulationConfig(batching="nexus", replan_interval_s=None, burst_factor=None, initial_demand="problem", noise_sigma=0.0,
                          record_batches=True)


class ConstantOracle:
    """Every co-location slows both models by the same factor."""

    def __init__(self, factor: float) -> None:
        self.value = factor
        self.calls: list[tuple] = []

    def factor(self, model, batch, percent, corunner, corunner_batch, corunner_percent) -> float:
        self.calls.append((model, batch, percent, corunner, corunner_batch, corunner_percent))
        return self.value


def _trace(rates: dict[str, float], seconds: float, *, uniform: bool = False):
    trace = None
    for i, (model, rate) in enumerate(rates.items()):
        t = arrivals_uniform(rate, seconds, application=model) if uniform else arrivals_poisson(rate, seconds, seed=i, application=model)
        trace = t if trace is None else trace.merge(t)
    return trace


def _plan(problem, instances: list[PlanInstance]) -> Plan:
    served = {a.name: 0.0 for a in problem.applications}
    routing: dict[str, list[RouteEntry]] = {a.name: [] for a in problem.applications}
    for inst in instances:
        served[inst.variant] += inst.assigned_rps
    for inst in instances:
        routing[inst.variant].append(RouteEntry(inst.id, inst.assigned_rps / served[inst.variant]))
    return Plan(status="feasible", solver="hand", objective_kind=problem.options.objective, objective=0.0, bound=None, gap=None,
                solve_seconds=0.0, effective_accuracy=None, served_rps=served, shortfall_rps={a: 0.0 for a in served},
                instances=instances, routing=routing, layouts={})


def _batches_by_partition(result) -> dict[str, list[tuple[float, float, str]]]:
    out: dict[str, list[tuple[float, float, str]]] = {}
    for instance, start, _queries, end in result.batches:
        partition, _, model = instance.rpartition("/")
        out.setdefault(partition, []).append((start, end, model))
    return out


def test_models_sharing_a_partition_run_one_batch_at_a_time_in_rounds():
    problem = gpulet_mps_problem({"resnet50": 200.0, "mobilenet": 200.0}, gpus=1)
    plan = _plan(problem, [
        PlanInstance("gpu0", "mps100", 0, "resnet50", 8, 20.0, 200.0, 200.0, duty_cycle_ms=40.0),
        PlanInstance("gpu0", "mps100", 0, "mobilenet", 8, 15.0, 200.0, 200.0, duty_cycle_ms=40.0),
    ])
    result = simulate(problem, _trace({"resnet50": 200.0, "mobilenet": 200.0}, 5.0, uniform=True), planner=lambda p: plan, config=CONFIG)
    batches = sorted(_batches_by_partition(result)["gpu0/mps100@0"])
    assert len(batches) > 100
    for (s1, e1, _), (s2, _e2, _) in zip(batches, batches[1:]):
        assert s2 >= e1 - 1e-9, "two batches overlapped on one partition"
    # Round slots: resnet50 first, mobilenet at the round start + resnet50's planned latency; a model's
    # batches start a duty cycle apart once the rounds run steadily.
    starts = {m: [s for s, _e, model in batches if model == m] for m in ("resnet50", "mobilenet")}
    gaps = np.diff(starts["resnet50"][5:50])
    assert np.allclose(gaps, 40.0, atol=1e-6)
    phase = starts["resnet50"][5]
    offsets = [(m - phase) % 40.0 for m in starts["mobilenet"][5:50]]
    assert np.allclose(offsets, 20.0, atol=1e-6)
    assert result.summary["slo_violation_ratio"] == 0.0


def test_a_batch_is_slowed_only_while_another_partition_of_its_gpu_runs():
    problem = gpulet_mps_problem({"resnet50": 10.0, "vgg19": 10.0}, gpus=1)
    plan = _plan(problem, [
        PlanInstance("gpu0", "mps60", 0, "resnet50", 1, 10.0, 50.0, 10.0),
        PlanInstance("gpu0", "mps40", 1, "vgg19", 1, 10.0, 50.0, 10.0),
    ])
    solo = {m: problem.profiles_for(m, problem.devices[0].type, s) for m, s in (("resnet50", "mps60"), ("vgg19", "mps40"))}
    solo_ms = {m: min(p.latency_ms for p in points if p.batch == 1) for m, points in solo.items()}
    oracle = ConstantOracle(1.5)
    # One query each, far apart: no overlap, solo latency.
    far = _trace({"resnet50": 1.0, "vgg19": 1.0}, 2.0, uniform=True)
    far = dataclasses.replace(far, time_s=np.array([0.1, 0.6]), application=np.array([0, 1]))
    result = simulate(problem, far, planner=lambda p: plan, config=CONFIG, interference=oracle)
    spans = {i.rpartition("/")[2]: e - s for i, s, _q, e in result.batches}
    assert spans["resnet50"] == pytest.approx(solo_ms["resnet50"])
    assert spans["vgg19"] == pytest.approx(solo_ms["vgg19"])
    assert not oracle.calls
    # Both at once: the shorter is slowed by 1.5 for all of it; the longer for the overlap only.
    together = dataclasses.replace(far, time_s=np.array([0.1, 0.1]), application=np.array([0, 1]))
    result = simulate(problem, together, planner=lambda p: plan, config=CONFIG, interference=oracle)
    spans = {i.rpartition("/")[2]: e - s for i, s, _q, e in result.batches}
    short, long = sorted(solo_ms, key=solo_ms.get)
    assert spans[short] == pytest.approx(1.5 * solo_ms[short])
    overlap = 1.5 * solo_ms[short]
    assert spans[long] == pytest.approx(overlap + (solo_ms[long] - solo_ms[short]))
    by_instance = {x["id"].rpartition("/")[2]: x for x in result.instances}
    assert by_instance[short]["mean_interference"] == pytest.approx(1.5)
    assert by_instance[short]["partition"] == "gpu0/mps60@0" if short == "resnet50" else "gpu0/mps40@1"
    # No oracle: no slowdown.
    result = simulate(problem, together, planner=lambda p: plan, config=CONFIG, interference=None)
    spans = {i.rpartition("/")[2]: e - s for i, s, _q, e in result.batches}
    assert spans == pytest.approx(solo_ms)
    assert result.summary["interference"] == "none"


def test_a_gpulets_plan_keeps_its_slos_in_simulation_with_the_problems_model():
    rates = {"resnet50": 300.0, "vgg19": 150.0, "densenet121": 200.0, "mobilenet": 300.0}
    problem = gpulet_mps_problem(rates)
    plan = sharing_plan_solve(gpulet_mps_problem({m: 1.1 * r for m, r in rates.items()}), "gpulets")
    config = dataclasses.replace(CONFIG, noise_sigma=0.05, record_batches=False)
    result = simulate(problem, _trace(rates, 10.0), planner=lambda p: plan, config=config)
    assert result.summary["interference"] == "problem model"
    assert result.summary["slo_violation_ratio"] < 0.01
    factors = [x["mean_interference"] for x in result.instances if x["mean_interference"] is not None]
    assert factors and min(factors) >= 1.0
    # The same plan judged on GPUs that do not interfere misses nothing more.
    calm = simulate(problem, _trace(rates, 10.0), planner=lambda p: plan, config=config, interference=None)
    assert calm.summary["slo_violation_ratio"] <= result.summary["slo_violation_ratio"]


def test_the_simulator_refuses_a_bad_interference_argument():
    problem = gpulet_mps_problem({"resnet50": 10.0})
    with pytest.raises(ValueError, match="interference"):
        simulate(problem, _trace({"resnet50": 10.0}, 1.0), planner="gpulets", config=CONFIG, interference="measured")
    with pytest.raises(ValueError, match="factor"):
        simulate(problem, _trace({"resnet50": 10.0}, 1.0), planner="gpulets", config=CONFIG, interference=object())


def test_measured_interference_reads_the_co_runs_and_falls_back_elsewhere():
    build = interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read())
    sample = next(s for s in build.samples if s.model == "resnet50" and s.corunner == "vgg19" and s.features.batch == 8)
    fallback = ConstantOracle(1.25)
    measured = InterferenceMeasured(build.samples, fallback=fallback)
    f = sample.features
    assert measured.factor("resnet50", 8, f.partition_pct, "vgg19", f.corunner_batch, 100 - f.partition_pct) == pytest.approx(max(1.0, sample.factor))
    # Batch 5 reads the next measured batch up (8).
    assert measured.measured("resnet50", 5, f.partition_pct, "vgg19", f.corunner_batch) == pytest.approx(max(1.0, sample.factor))
    assert not fallback.calls
    # inception next to vgg19 was never measured (only densenet121, resnet50 and vgg19 were, as model a).
    assert measured.factor("inception", 8, 60, "vgg19", 8, 40) == 1.25
    assert fallback.calls == [("inception", 8, 60, "vgg19", 8, 40)]
    with pytest.raises(ValueError, match="no co-run"):
        InterferenceMeasured(build.samples).factor("inception", 8, 60, "vgg19", 8, 40)


def test_models_on_partitions_take_the_mps_batching_policy():
    """`mps_batching` gives instances on MPS partitions their own policy (the live fleet runs Nexus's there,
    engine.dataplane.rounds.ROUND_BATCHING_POLICY), the others keep `batching`: batches of one leave a
    400 req/s partition hopelessly behind, Nexus's batches at each turn keep it on time."""
    problem = gpulet_mps_problem({"resnet50": 400.0, "mobilenet": 400.0}, gpus=1)
    plan = _plan(problem, [
        PlanInstance("gpu0", "mps100", 0, "resnet50", 8, 20.0, 200.0, 400.0, duty_cycle_ms=40.0),
        PlanInstance("gpu0", "mps100", 0, "mobilenet", 8, 15.0, 200.0, 400.0, duty_cycle_ms=40.0),
    ])
    trace = _trace({"resnet50": 400.0, "mobilenet": 400.0}, 3.0)
    base = dataclasses.replace(CONFIG, batching="fixed", batching_params={"size": 1}, drop_rule="never", record_batches=False)
    fixed = simulate(problem, trace, planner=lambda p: plan, config=base)
    nexus = simulate(problem, trace, planner=lambda p: plan, config=dataclasses.replace(base, mps_batching="nexus"))
    assert fixed.summary["late"] > 0.9 * fixed.summary["queries"]  # a batch of one per turn, never dropped: late
    assert nexus.summary["on_time"] == nexus.summary["queries"]
    with pytest.raises(ValueError):
        simulate(problem, trace, planner=lambda p: plan, config=dataclasses.replace(base, mps_batching="no-such-policy"))
