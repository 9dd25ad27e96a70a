"""The problem format: round trips through problem_to_dict / problem_from_dict, the reader's refusals (each
naming the offending item), and the JSON Schema agreeing with the reader on malformed documents.

`small_problem_dict()` is the hand-written problem the validator and CLI tests share."""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest

from engine.plans.problem import (
    PLAN_FORMAT_VERSION,
    Plan,
    ProblemError,
    problem_from_dict,
    problem_load,
    problem_to_dict,
)
from engine.plans.schema import SchemaError, json_validate, plan_schema, problem_schema

BATCHES = (1, 2, 4, 8, 16, 32)
# name: (application, accuracy, memory_mb at batch 1, base ms, ms per item, MB per item)
_VARIANTS: dict[str, tuple[str, float, float, float, float, float]] = {
    "resnet18": ("classify", 0.70, 500.0, 2.0, 0.5, 40.0),
    "resnet50": ("classify", 0.76, 1000.0, 4.0, 1.2, 80.0),
    "yolo_s": ("detect", 0.40, 2000.0, 6.0, 2.0, 150.0),
    "yolo_l": ("detect", 0.50, 6000.0, 10.0, 5.0, 400.0),
}
# device type -> {slice: latency factor relative to a whole A100}
_SLICES: dict[str, dict[str, float]] = {
    "A100-SXM4-40GB": {"1g.5gb": 5.0, "2g.10gb": 3.0, "3g.20gb": 2.2, "7g.40gb": 1.0},
    "H100-SXM5-80GB": {"1g.10gb": 3.0, "3g.40gb": 1.4, "7g.80gb": 0.6, "full": 0.55},
    "T4": {"full": 2.5},
    "cpu": {"8": 10.0, "16": 6.0},
}


def small_problem_dict() -> dict[str, Any]:
    """Two applications, four variants; an A100 with a fixed MIG layout, an H100 whose layout is free, a
    whole T4 and a 16-core CPU host. Latency is linear in the batch, memory grows with it (GPUs only)."""
    profiles = []
    for variant, (_, _, mem, base, per, mem_per) in _VARIANTS.items():
        for dtype, slices in _SLICES.items():
            for slice_name, factor in slices.items():
                for b in BATCHES:
                    point: dict[str, Any] = {
                        "variant": variant, "device_type": dtype, "slice": slice_name, "batch": b,
                        "latency_ms": round((base + per * b) * factor, 3),
                    }
                    if dtype != "cpu":
                        point["memory_mb"] = mem + mem_per * b
                    profiles.append(point)
    return {
        "format_version": 1,
        "applications": [
            {"name": "classify", "slo_ms": 100.0, "demand_rps": 900.0, "min_accuracy": 0.72},
            {"name": "detect", "slo_ms": 200.0, "demand_rps": 60.0},
        ],
        "variants": [
            {"name": n, "application": a, "accuracy": acc, "memory_mb": m} for n, (a, acc, m, *_rest) in _VARIANTS.items()
        ],
        "devices": [
            {"name": "a100-0", "type": "A100-SXM4-40GB", "mig": True,
             "layout": ["2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"], "fixed_layout": True},
            {"name": "h100-0", "type": "H100-SXM5-80GB", "mig": True},
            {"name": "t4-0", "type": "T4", "memory_mb": 15360},
            {"name": "cpu-0", "type": "cpu", "cores": 16},
        ],
        "profiles": profiles,
        "options": {"time_limit_s": 10},
    }


# ----------------------------------------------------------------------------- round trip


def test_round_trip_is_stable() -> None:
    problem = problem_from_dict(small_problem_dict())
    once = problem_to_dict(problem)
    again = problem_from_dict(json.loads(json.dumps(once)))
    assert again == problem
    assert problem_to_dict(again) == once


def test_round_trip_keeps_devices_and_options() -> None:
    raw = small_problem_dict()
    raw["options"] = {"objective": "min-gpus", "mip_gap": 0.01, "solver": "cbc", "threads": 2,
                      "reconfiguration_penalty": 0.5, "latency_budget_fraction": 0.4, "time_limit_s": 3,
                      "headroom_target": 1.5}
    problem = problem_from_dict(problem_to_dict(problem_from_dict(raw)))
    a100 = problem.device("a100-0")
    assert a100.mig and a100.fixed_layout
    assert [str(p) for p in a100.layout or ()] == ["2g.10gb@0", "1g.5gb@2", "1g.5gb@3", "3g.20gb@4"]
    assert a100.memory_mb == 40960  # from the MIG catalogue
    assert problem.device("cpu-0").cores == 16
    assert problem.device("t4-0").memory_mb == 15360
    assert problem.options.objective == "min-gpus" and problem.options.latency_budget_fraction == 0.4
    assert problem.options.headroom_target == 1.5
    assert problem.application("classify").min_accuracy == 0.72


def test_problem_to_dict_matches_the_schema() -> None:
    json_validate(problem_to_dict(problem_from_dict(small_problem_dict())), problem_schema())
    json_validate(small_problem_dict(), problem_schema())


def test_problem_load_reads_a_file_and_refuses_bad_json(tmp_path) -> None:
    good = tmp_path / "p.json"
    good.write_text(json.dumps(small_problem_dict()))
    assert len(problem_load(good).devices) == 4
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProblemError, match="not valid JSON"):
        problem_load(bad)


def test_nvml_names_and_integer_cpu_slices_are_normalised() -> None:
    raw = small_problem_dict()
    raw["devices"][0]["type"] = "NVIDIA A100-SXM4-40GB"
    for p in raw["profiles"]:
        if p["device_type"] == "cpu":
            p["slice"] = int(p["slice"])
    problem = problem_from_dict(raw)
    assert problem.device("a100-0").type == "A100-SXM4-40GB"
    assert problem.profiles_for("resnet18", "cpu", "16")


# ----------------------------------------------------------------------------- refusals

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = raw
        for part in head:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return mutate


def _append(key: str, item: dict[str, Any]) -> Mutation:
    return lambda raw: raw[key].append(item)


def _duplicate_profile(raw: dict[str, Any]) -> None:
    raw["profiles"].append(dict(raw["profiles"][3], latency_ms=99.0))


# (mutation, what the reader's message must contain, whether the schema also refuses it)
MALFORMED: dict[str, tuple[Mutation, str, bool]] = {
    "unknown application": (_set("variants.1.application", "segment"), "variants[1] (resnet50): unknown application 'segment'", False),
    "duplicate application": (_append("applications", {"name": "detect", "slo_ms": 50, "demand_rps": 1}), "application 'detect' is listed twice", False),
    "duplicate variant": (_append("variants", {"name": "yolo_s", "application": "detect", "accuracy": 0.3}), "variant 'yolo_s' is listed twice", False),
    "duplicate device": (_append("devices", {"name": "t4-0", "type": "T4"}), "device 't4-0' is listed twice", False),
    "negative demand": (_set("applications.1.demand_rps", -5), "applications[1] (detect).demand_rps: must be >= 0", True),
    "zero slo": (_set("applications.0.slo_ms", 0), "applications[0] (classify).slo_ms: must be > 0", True),
    "accuracy above 1": (_set("variants.2.accuracy", 1.2), "variants[2] (yolo_s).accuracy: must be <= 1", True),
    "min accuracy above 1": (_set("applications.0.min_accuracy", 72), "applications[0] (classify).min_accuracy: must be <= 1", True),
    "MIG on a non-catalogue GPU": (_set("devices.2.mig", True), "devices[2] (t4-0): MIG requested but 'T4' is not in the MIG catalogue", False),
    "invalid layout": (_set("devices.0.layout", ["3g.20gb@0", "3g.20gb@2"]), "devices[0] (a100-0).layout: 3g.20gb@2: start 2 is not a legal start", False),
    "overlapping layout": (_set("devices.0.layout", ["4g.20gb@0", "2g.10gb@2"]), "devices[0] (a100-0).layout", False),
    "malformed placement": (_set("devices.0.layout", ["3g.20gb"]), "devices[0] (a100-0).layout: malformed placement '3g.20gb'", True),
    "layout without MIG": (_set("devices.2.layout", ["3g.20gb@0"]), "devices[2] (t4-0): a layout is given but mig is false", True),
    "CPU without cores": (lambda raw: raw["devices"][3].pop("cores"), "devices[3] (cpu-0): missing 'cores'", True),
    "CPU with zero cores": (_set("devices.3.cores", 0), "devices[3] (cpu-0).cores: must be >= 1", True),
    "duplicate profile point": (_duplicate_profile, "profiles[", False),
    "profile of unknown variant": (_set("profiles.0.variant", "vgg16"), "profiles[0]: unknown variant 'vgg16'", False),
    "profile slice not on the GPU": (_set("profiles.6.slice", "2g.20gb"), "profiles[6]: '2g.20gb' is not a MIG profile of A100-SXM4-40GB", False),
    "fractional batch": (_set("profiles.0.batch", 1.5), "profiles[0].batch: must be a whole number", True),
    "missing variants": (lambda raw: raw.pop("variants"), "problem: missing 'variants'", True),
    "unknown option": (_set("options.speed", "fast"), "options: unknown keys ['speed']", True),
    "unknown objective": (_set("options.objective", "min-cost"), "options.objective", True),
    "headroom target below 1": (_set("options.headroom_target", 0.8), "options.headroom_target: must be >= 1, got 0.8", True),
    "headroom target above 10": (_set("options.headroom_target", 12), "options.headroom_target: must be <= 10, got 12", True),
    "headroom target not a number": (_set("options.headroom_target", "1.5"), "options.headroom_target: expected a finite number", True),
    "future version": (_set("format_version", 2), "format_version 2 is not supported", True),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_problem_is_refused_naming_the_item(case: str) -> None:
    mutate, expected, _ = MALFORMED[case]
    raw = small_problem_dict()
    mutate(raw)
    with pytest.raises(ProblemError) as info:
        problem_from_dict(raw)
    assert expected in str(info.value)


def test_duplicate_profile_message_names_the_point() -> None:
    raw = small_problem_dict()
    _duplicate_profile(raw)
    with pytest.raises(ProblemError, match=r"a second profile for resnet18 on A100-SXM4-40GB/1g.5gb at batch 8"):
        problem_from_dict(raw)


@pytest.mark.parametrize("case", sorted(c for c, (_, _, schema) in MALFORMED.items() if schema))
def test_schema_refuses_what_the_reader_refuses(case: str) -> None:
    mutate, _, _ = MALFORMED[case]
    raw = small_problem_dict()
    mutate(raw)
    with pytest.raises(SchemaError):
        json_validate(raw, problem_schema())


def test_schema_error_points_at_the_path() -> None:
    raw = small_problem_dict()
    raw["applications"][1]["demand_rps"] = -5
    raw["devices"][3].pop("cores")
    with pytest.raises(SchemaError) as info:
        json_validate(raw, problem_schema(), what="problem")
    message = str(info.value)
    assert message.startswith("problem does not match its schema")
    assert "applications[1].demand_rps: -5 is less than the minimum of 0" in message
    assert "devices[3]: 'cores' is a required property" in message


def test_schema_refuses_misspelt_keys_the_reader_would_ignore() -> None:
    raw = small_problem_dict()
    raw["applications"][0]["slo"] = 100
    with pytest.raises(SchemaError, match=r"applications\[0\]: Additional properties are not allowed \('slo' was unexpected\)"):
        json_validate(raw, problem_schema())


def test_schema_accepts_minimal_problem_like_the_reader() -> None:
    raw = {
        "applications": [{"name": "a", "slo_ms": 10, "demand_rps": 1}],
        "variants": [{"name": "v", "application": "a", "accuracy": 0.5}],
        "devices": [{"name": "c", "type": "cpu", "cores": 4}],
        "profiles": [{"variant": "v", "device_type": "cpu", "slice": 4, "batch": 1, "latency_ms": 2}],
    }
    json_validate(raw, problem_schema())
    problem = problem_from_dict(raw)
    assert problem.options.latency_budget_fraction == 0.5


def test_plan_schema_accepts_plan_to_dict() -> None:
    plan = Plan(
        status="optimal", solver="test", objective_kind="max-accuracy", objective=0.7, bound=0.7, gap=0.0,
        solve_seconds=0.1, effective_accuracy=None, served_rps={"a": 0.0}, shortfall_rps={"a": 1.0},
        instances=[], routing={"a": []}, layouts={"g": ["3g.20gb@0"]},
    )
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["format_version"] == PLAN_FORMAT_VERSION
    json_validate(data, plan_schema())
    broken = copy.deepcopy(data)
    broken["instances"] = [{"device": "g"}]
    with pytest.raises(SchemaError, match=r"instances\[0\]: 'slice' is a required property"):
        json_validate(broken, plan_schema(), what="plan")
