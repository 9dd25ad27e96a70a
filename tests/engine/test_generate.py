"""Tests for engine.reference: problem generation and the gpulet derivation of reference profiles."""
from __future__ import annotations

import pytest

from engine.geometry.catalogue import mig_catalogue_load
from engine.plans.capacity import capacity_for, cpu_slice
from engine.plans.problem import CPU_DEVICE_TYPE, FULL_SLICE, Problem, problem_from_dict, problem_to_dict
from engine.reference.generate import DEVICE_TYPE_ORDER, mig_fleet_problem, proteus_sized_problem
from engine.reference.profiles import (
    GPULET_DERIVED_SPEEDUP,
    GPULET_GPU_MODEL,
    gpulet_inference_read,
    gpulet_partition_for,
    gpulet_profiles_derive,
    gpulet_profiles_derived,
)


@pytest.fixture(scope="module")
def points():
    return gpulet_inference_read()


def _profiled(problem: Problem) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in problem.profiles:
        out.setdefault(p.variant, set()).add(p.device_type)
    return out


# --------------------------------------------------------------------------- derivation


def test_partition_rule_rounds_up_to_a_measured_partition():
    assert [gpulet_partition_for(100 * c / 7) for c in (1, 2, 3, 4, 7)] == [20, 40, 50, 60, 100]
    with pytest.raises(ValueError):
        gpulet_partition_for(101)


def test_2080ti_profiles_are_the_measurements(points):
    derived = gpulet_profiles_derive(points, GPULET_GPU_MODEL, models=["resnet50"])
    measured = {p.batch: p.latency_ms for p in points if p.model == "resnet50" and p.partition_pct == 100}
    assert {d.point.slice for d in derived} == {FULL_SLICE}
    assert {d.point.batch: d.point.latency_ms for d in derived} == measured
    assert all(d.measured and d.detail.startswith("measured:") for d in derived)


def test_mig_slice_latency_is_partition_over_share_over_speedup(points):
    spec = mig_catalogue_load().gpu_model_get("A100-SXM4-40GB")
    rows = {(d.point.slice, d.point.batch): d for d in gpulet_profiles_derive(points, spec.name, models=["vgg16"])}
    measured = {(p.batch, p.partition_pct): p.latency_ms for p in points if p.model == "vgg16"}
    one = rows[("1g.5gb", 8)]
    assert one.partition_pct == 20 and not one.measured and one.detail.startswith("derived:")
    assert one.point.latency_ms == pytest.approx(measured[(8, 20)] * (20 / (100 / 7)) / GPULET_DERIVED_SPEEDUP[spec.name])
    assert rows[(FULL_SLICE, 8)].point.latency_ms == pytest.approx(measured[(8, 100)] / GPULET_DERIVED_SPEEDUP[spec.name])
    slices = {s for s, _ in rows}
    assert slices == {FULL_SLICE} | {p.name for p in spec.profiles if not p.media_extensions}
    # Every GPU with a stated speed-up derives; a catalogue GPU without one (the illustrative table covers the
    # GPUs of the reference fleets, not every MIG GPU) is refused, never derived at a made-up speed.
    for name in GPULET_DERIVED_SPEEDUP:
        assert gpulet_profiles_derived(points, name, models=["mobilenet"])
    unstated = [n for n in mig_catalogue_load().gpu_model_names if n not in GPULET_DERIVED_SPEEDUP]
    assert "A30-24GB" in unstated
    with pytest.raises(ValueError, match="no stated speed-up for A30-24GB"):
        gpulet_profiles_derived(points, "A30-24GB", models=["mobilenet"])
    assert gpulet_profiles_derived(points, "A30-24GB", 1.5, models=["mobilenet"])


# --------------------------------------------------------------------------- generators


def test_proteus_sized_problem_is_deterministic_and_sized(points):
    a = proteus_sized_problem(40, 4, 46, 9, seed=3, points=points)
    b = proteus_sized_problem(40, 4, 46, 9, seed=3, points=points)
    c = proteus_sized_problem(40, 4, 46, 9, seed=4, points=points)
    assert a == b and problem_to_dict(a) == problem_to_dict(b)
    assert a != c
    assert (len(a.devices), len(a.variants), len(a.applications)) == (40, 46, 9)
    assert {d.type for d in a.devices} == set(DEVICE_TYPE_ORDER[:4])
    assert sum(d.type == CPU_DEVICE_TYPE for d in a.devices) == 10 and not any(d.mig for d in a.devices)


@pytest.mark.parametrize(
    "sizes", [(10, 4, 46, 9), (160, 4, 46, 9), (40, 4, 450, 9), (40, 4, 46, 3), (40, 4, 46, 17), (7, 7, 17, 17), (3, 1, 5, 2)]
)
def test_proteus_sized_problem_round_trips_and_is_servable(points, sizes):
    n_devices, n_types, n_variants, n_apps = sizes
    problem = proteus_sized_problem(n_devices, n_types, n_variants, n_apps, seed=0, points=points)
    assert (len(problem.devices), len({d.type for d in problem.devices}), len(problem.variants), len(problem.applications)) == sizes
    assert problem_from_dict(problem_to_dict(problem)) == problem
    profiled = _profiled(problem)
    assert all(profiled.get(v.name) for v in problem.variants), "every variant has profiles on some device type"
    for app in problem.applications:
        assert app.demand_rps > 0 and app.slo_ms > 0
        # The fastest variant fits somewhere within the SLO, so demand is servable.
        assert any(
            capacity_for(problem, v.name, d, cpu_slice(problem, v.name, d) if d.is_cpu else FULL_SLICE)
            for v in problem.variants_of(app.name)
            for d in problem.devices
            if not d.is_cpu or cpu_slice(problem, v.name, d)
        )


def test_load_scales_demand(points):
    low = proteus_sized_problem(20, 4, 46, 9, seed=1, load=0.35, points=points)
    high = proteus_sized_problem(20, 4, 46, 9, seed=1, load=0.7, points=points)
    assert high.total_demand_rps == pytest.approx(2 * low.total_demand_rps, rel=1e-4)


def test_generators_refuse_impossible_sizes(points):
    with pytest.raises(ValueError):
        proteus_sized_problem(40, 4, 5, 9, seed=0, points=points)
    with pytest.raises(ValueError):
        proteus_sized_problem(3, 4, 46, 9, seed=0, points=points)
    with pytest.raises(ValueError):
        mig_fleet_problem(2, current_layout=["4g.20gb@0", "4g.20gb@4"], points=points)


@pytest.mark.parametrize("n_gpus", [8, 64])
def test_mig_fleet_problem(points, n_gpus):
    problem = mig_fleet_problem(n_gpus, seed=2, current_layout=["3g.20gb@0", "3g.20gb@4"], points=points)
    assert problem == mig_fleet_problem(n_gpus, seed=2, current_layout=["3g.20gb@0", "3g.20gb@4"], points=points)
    assert len(problem.devices) == n_gpus and len(problem.applications) == 6 and len(problem.variants) == 24
    assert all(d.mig and not d.fixed_layout and d.type == "A100-SXM4-40GB" for d in problem.devices)
    assert all([str(p) for p in d.layout] == ["3g.20gb@0", "3g.20gb@4"] for d in problem.devices)
    assert problem_from_dict(problem_to_dict(problem)) == problem
    profiled = _profiled(problem)
    assert all(profiled.get(v.name) == {"A100-SXM4-40GB"} for v in problem.variants)
    slices = {p.slice for p in problem.profiles}
    assert {"full", "1g.5gb", "3g.20gb", "7g.40gb"} <= slices and "1g.5gb+me" not in slices


def test_mig_fleet_problem_other_models_and_per_gpu_layouts(points):
    problem = mig_fleet_problem(2, "H200-141GB", n_applications=3, seed=0, current_layout=[["7g.141gb@0"], ["3g.71gb@0", "3g.71gb@4"]], points=points)
    assert [len(d.layout) for d in problem.devices] == [1, 2]
    assert problem_from_dict(problem_to_dict(problem)) == problem
    assert mig_fleet_problem(3, "H100-PCIE-80GB", seed=0, points=points).devices[0].layout is None
