"""ListField in the compiled fast path of report validation (apps/core/api/validation.py): on generated
values of every JSON type it answers as DRF does (the same list, or hands the value to DRF, which refuses
it), whatever the field's bounds (allow_empty, min_length, max_length, allow_null, its child's own); it
takes a well-formed list itself, without DRF's machinery; and a metrics report with CPU runtimes' `cpus`
and `resizes` is validated as DRF validates it."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from apps.core.api.validation import serializer_compile
from apps.telemetry.api.serializers import MetricsReportSerializer, report_validate

from .test_validation_compiled import ODD, REFUSED, _at, _count, _drf, _gpu, _plain, fast_path_agrees_with_drf


class Lists(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=10), max_length=3, required=False)
    names = serializers.ListField(child=serializers.CharField(max_length=5), allow_empty=False, required=False, default=list)
    at_least_two = serializers.ListField(child=serializers.FloatField(min_value=0.0), min_length=2, required=False)
    nullable = serializers.ListField(child=serializers.BooleanField(), allow_null=True, required=False, default=None)
    null_items = serializers.ListField(child=serializers.IntegerField(allow_null=True), required=False)
    nested = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField(max_value=5), max_length=2), required=False)
    anything = serializers.ListField(required=False)  # no child: DRF's _UnvalidatedField


ITEMS = st.one_of(ODD, st.integers(min_value=-2, max_value=12), st.text(max_size=7), st.floats(min_value=-1, max_value=5))
VALUES = st.one_of(ODD, st.lists(ITEMS, max_size=4), st.lists(st.lists(ITEMS, max_size=3), max_size=3))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.fixed_dictionaries({}, optional={name: VALUES for name in Lists().fields}))
def test_the_fast_path_agrees_with_drf_on_lists(data) -> None:
    fast = serializer_compile(Lists())(data)
    drf = _drf(Lists, data)
    if fast is not None:
        assert drf is not REFUSED, f"accepted what DRF refuses: {data!r}"
        assert _plain(fast) == _plain(drf)


def test_a_well_formed_list_is_taken_without_drf(monkeypatch) -> None:
    """The lists are validated by the compiled checks themselves: DRF's ListField is never asked."""
    asked: list[object] = []
    run_validation = serializers.ListField.run_validation

    def counted(field, data=serializers.empty):
        asked.append(data)
        return run_validation(field, data)

    monkeypatch.setattr(serializers.ListField, "run_validation", counted)
    data = {"ids": [0, 10], "names": ["ab"], "at_least_two": [0.5, 1], "nullable": None, "null_items": [None, 3], "nested": [[1, 5], []],
            "anything": [{"a": 1}, "b"]}
    fast = serializer_compile(Lists())(data)
    assert fast == {**data, "at_least_two": [0.5, 1.0]} and asked == []
    assert serializer_compile(Lists())({"ids": [11]}) is None  # out of its child's bounds: DRF's to refuse
    assert asked == []


# --------------------------------------------------------------------------- a metrics report's CPU fields


def _resize(odd):
    return st.fixed_dictionaries(
        {"at": _at(odd), "by": st.one_of(st.sampled_from(["vertical", "desired"]), odd), "outcome": st.one_of(st.sampled_from(["ok", "failed"]), odd),
         "cores": st.one_of(st.integers(min_value=1, max_value=64), odd)},
        optional={"from_cores": st.one_of(st.none(), st.integers(min_value=1, max_value=64), odd),
                  "from_max_batch": st.one_of(st.none(), st.integers(min_value=1, max_value=64), odd),
                  "max_batch": st.one_of(st.none(), st.integers(min_value=1, max_value=64), odd), "cpus": _cpus(odd),
                  "resize_ms": st.one_of(st.none(), st.floats(min_value=0, max_value=1e4), odd),
                  "prepared": st.one_of(st.none(), st.booleans(), odd), "reason": st.one_of(st.text(max_size=40), odd)},
    )


def _cpus(odd):
    return st.one_of(st.none(), st.lists(st.one_of(st.integers(min_value=0, max_value=255), odd), max_size=4), odd)


def _cpu_runtime(odd):
    return st.fixed_dictionaries(
        {"key": st.one_of(st.sampled_from(["cpu0/0", "cpu0/1"]), odd)},
        optional={"application": st.one_of(st.just("tabular"), odd), "arrivals": _count(odd),
                  "cores": st.one_of(st.none(), st.integers(min_value=1, max_value=64), odd),
                  "max_batch": st.one_of(st.none(), st.integers(min_value=1, max_value=64), odd),
                  "cpus": _cpus(odd), "resizes": st.one_of(st.lists(_resize(odd), max_size=3), odd)},
    )


def _report(odd):
    return st.fixed_dictionaries({"at": _at(odd)}, optional={"gpus": st.one_of(st.lists(_gpu(odd), max_size=1), odd),
                                                          "runtimes": st.one_of(st.lists(_cpu_runtime(odd), max_size=3), odd)})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(report=st.one_of(_report(st.nothing()), _report(ODD)))
def test_the_fast_path_agrees_with_drf_on_cpu_runtimes(report) -> None:
    fast_path_agrees_with_drf(MetricsReportSerializer, report)


@pytest.mark.parametrize("cpus", [[0, 1, 2, 3], None])
def test_what_an_agent_sends_for_a_cpu_runtime_is_kept(cpus) -> None:
    at = "2026-11-29T10:00:00+00:00"
    resize = {"at": at, "by": "vertical", "outcome": "ok", "from_cores": 1, "from_max_batch": 4, "cores": 2, "max_batch": 4, "cpus": cpus,
              "resize_ms": 3.2, "prepared": False}
    runtime = {"key": "cpu0/0", "cores": 2, "max_batch": 4, "cpus": cpus, "resizes": [resize]}
    from django.utils import timezone

    report = {"at": timezone.now().isoformat(), "runtimes": [runtime]}
    validated = report_validate(MetricsReportSerializer, report)["runtimes"][0]
    assert validated["cpus"] == cpus and validated["resizes"][0]["cpus"] == cpus and validated["resizes"][0]["reason"] == ""
    assert validated["resizes"][0]["at"].isoformat() == at and validated["resizes"][0]["from_cores"] == 1
