"""Property: whatever small problem a planner is given, every plan it returns passes the independent
validator, for every planner and both objectives.

Problems are random: 1-3 applications with 1-3 variants each; 1-4 devices mixing MIG A100-SXM4-40GB and
H100-SXM5-80GB GPUs (no layout, a free layout, or a fixed one), whole GPUs and a CPU host; monotone latency
profiles (random batch sizes, latency increasing with the batch, slower on smaller slices), with memory
per batch on some variants."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.layout import mig_layouts_enumerate
from engine.plans.problem import OBJECTIVES, Problem, plan_from_dict, problem_from_dict
from engine.plans.schema import json_validate, plan_schema, problem_schema
from engine.plans.validate import plan_validate
from engine.solvers.solve import plan_solve

MIG_MODELS = ("A100-SXM4-40GB", "H100-SXM5-80GB")
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def _layouts(model: str) -> list[list[str]]:
    return [[str(p) for p in layout] for layout in mig_layouts_enumerate(model) if layout]


LAYOUTS = {model: _layouts(model) for model in MIG_MODELS}


@st.composite
def devices(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 4))
    kinds = draw(st.lists(st.sampled_from(["mig", "mig", "whole", "cpu"]), min_size=count, max_size=count))
    if kinds.count("cpu") > 1:  # one CPU host at most
        kinds = [k for k in kinds if k != "cpu"] + ["cpu"]
    out: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        name = f"d{i}"
        if kind == "cpu":
            out.append({"name": name, "type": "cpu", "cores": draw(st.sampled_from([8, 16]))})
        elif kind == "whole":
            gpu = draw(st.sampled_from(["A100-SXM4-40GB", "T4"]))
            device: dict[str, Any] = {"name": name, "type": gpu}
            if gpu == "T4":
                device["memory_mb"] = 15360
            out.append(device)
        else:
            model = draw(st.sampled_from(MIG_MODELS))
            device = {"name": name, "type": model, "mig": True}
            layout_kind = draw(st.sampled_from(["none", "free", "fixed"]))
            if layout_kind != "none":
                device["layout"] = draw(st.sampled_from(LAYOUTS[model]))
                device["fixed_layout"] = layout_kind == "fixed"
            out.append(device)
    return out


def _slices(device: dict[str, Any]) -> dict[str, float]:
    """Slices profiled on a device's type, with a latency factor (smaller slices are slower)."""
    if device["type"] == "cpu":
        return {"4": 24.0, "8": 14.0, "16": 8.0}
    if device["type"] in MIG_MODELS:
        model = mig_catalogue_load().gpu_model_get(device["type"])
        factors = {p.name: model.compute_slices / p.compute_slices for p in model.profiles}
        return {**factors, "full": 0.95}
    return {"full": 2.5}


@st.composite
def problems(draw: st.DrawFn) -> dict[str, Any]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))  # the numbers; hypothesis draws the structure
    fleet = draw(devices())
    applications, variants = [], []
    for a in range(draw(st.integers(1, 3))):
        app = {
            "name": f"app{a}",
            "slo_ms": draw(st.sampled_from([30.0, 50.0, 100.0, 200.0, 400.0])),
            "demand_rps": draw(st.sampled_from([0.0, 5.0, 50.0, 200.0, 800.0, 3000.0])),
        }
        if draw(st.integers(0, 3)) == 0:
            app["min_accuracy"] = draw(st.sampled_from([0.3, 0.6, 0.75, 0.9]))
        applications.append(app)
        for v in range(draw(st.integers(1, 3))):
            variants.append({"name": f"app{a}.v{v}", "application": app["name"], "accuracy": round(rng.uniform(0.3, 0.95), 3),
                             "memory_mb": round(rng.uniform(100, 9000))})
    profiles = []
    types_done: set[str] = set()
    for device in fleet:
        if device["type"] in types_done:
            continue
        types_done.add(device["type"])
        for variant in variants:
            base, slope = rng.uniform(1, 15), rng.uniform(0.1, 8)
            memory_per_item = rng.choice([None, rng.uniform(5, 400)])
            for slice_name, factor in _slices(device).items():
                if rng.random() < 0.15:
                    continue  # not every variant is profiled everywhere
                batches = sorted(rng.sample(BATCH_SIZES, rng.randint(1, len(BATCH_SIZES))))
                latency = 0.0
                for b in batches:
                    # Monotone: never below the previous point, jittered around a line in the batch size.
                    latency = max(latency * 1.001 + 0.001, (base + slope * b) * factor * rng.uniform(0.9, 1.3))
                    point: dict[str, Any] = {"variant": variant["name"], "device_type": device["type"], "slice": slice_name,
                                             "batch": b, "latency_ms": round(latency, 4)}
                    if memory_per_item is not None and device["type"] != "cpu":
                        point["memory_mb"] = round(variant["memory_mb"] + memory_per_item * b, 1)
                    profiles.append(point)
    options = {
        "time_limit_s": 5,
        "latency_budget_fraction": draw(st.sampled_from([0.5, 0.5, 0.4, 1.0])),
        "reconfiguration_penalty": draw(st.sampled_from([0.0, 0.0, 0.01])),
    }
    return {"format_version": 1, "applications": applications, "variants": variants, "devices": fleet,
            "profiles": profiles, "options": options}


def _check(raw: dict[str, Any], solver: str) -> None:
    json_validate(raw, problem_schema())
    problem: Problem = problem_from_dict(raw)
    note(json.dumps(raw))
    for objective in OBJECTIVES:
        plan = plan_solve(problem, solver, objective=objective, time_limit_s=5)
        data = json.loads(json.dumps(plan.to_dict()))
        note(f"{solver} {objective}: {json.dumps(data)}")
        verdict = plan_validate(problem, plan)
        assert verdict.valid, f"{solver}/{objective} plan invalid: {verdict.errors}"
        json_validate(data, plan_schema())
        # What a file holds must validate the same as the object did.
        assert plan_validate(problem, plan_from_dict(data)).valid


PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("solver", ["proteus", "joint", "garrison"])
def test_every_plan_passes_the_validator(solver: str) -> None:
    @PROPERTY_SETTINGS
    @given(raw=problems())
    def check(raw: dict[str, Any]) -> None:
        _check(raw, solver)

    check()
