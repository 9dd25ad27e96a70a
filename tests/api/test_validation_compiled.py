"""The compiled fast path of report validation (apps/core/api/validation.py) against DRF itself: on
generated reports, well-formed and not, it never accepts what DRF refuses, never gives a value other than
DRF's, and does take the well-formed reports agents send (else it would be no faster)."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from apps.core.api.validation import serializer_compile
from apps.telemetry.api.serializers import MetricsReportSerializer, RouterReportSerializer, report_validate

REFUSED = object()

# Values of every JSON type, in and out of the fields' bounds, and strings that DRF would coerce.
ODD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=120), st.sampled_from(["", " ", "12", "1.5", " key ", "a\x00b", "\ud800", "x" * 101, "NaN"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _count(odd):
    return st.one_of(st.integers(min_value=0, max_value=2**31 - 1), odd)


def _runtime(odd):
    return st.fixed_dictionaries(
        {"key": st.one_of(st.text(min_size=1, max_size=100), odd)},
        optional={
            "application": st.one_of(st.sampled_from(["resnet", "", "  bert  "]), odd),
            "variant": st.one_of(st.text(max_size=100), odd),
            "arrivals": _count(odd), "served": _count(odd), "late": _count(odd), "dropped": _count(odd), "queue_length": _count(odd),
            "batches": _count(odd),
            "batch_size_mean": st.one_of(st.floats(min_value=0, max_value=512), odd),
            "latency_p50_ms": st.one_of(st.floats(min_value=0, max_value=1e4), odd),
            "latency_p99_ms": st.one_of(st.floats(min_value=0, max_value=1e4), odd),
        },
    )


def _gpu(odd):
    instance = st.fixed_dictionaries(
        {"placement": st.one_of(st.sampled_from(["1g.5gb@0", "3g.20gb@4"]), odd)},
        optional={"utilization_pct": st.one_of(st.floats(min_value=0, max_value=100), odd),
                  "gr_engine_active_pct": st.one_of(st.floats(min_value=0, max_value=100), odd), "memory_used_mb": _count(odd)},
    )
    return st.fixed_dictionaries(
        {"index": st.one_of(st.integers(min_value=0, max_value=1023), odd)},
        optional={"uuid": st.one_of(st.text(max_size=80), odd), "utilization_pct": st.one_of(st.floats(min_value=0, max_value=100), odd),
                  "memory_used_mb": _count(odd), "power_w": st.one_of(st.floats(min_value=0, max_value=700), odd),
                  "simulated": st.one_of(st.booleans(), odd), "instances": st.one_of(st.lists(instance, max_size=3), odd)},
    )


def _at(odd):
    now = timezone.now()
    return st.one_of(
        st.integers(min_value=-3600, max_value=3600).map(lambda s: (now + timedelta(seconds=s)).isoformat()),
        st.sampled_from([(now + timedelta(days=3)).isoformat(), (now - timedelta(days=400)).isoformat()]) if odd is ODD else odd, odd,
    )


def _metrics_report(odd):
    return st.fixed_dictionaries(
        {"at": _at(odd)},
        optional={"interval_s": st.one_of(st.floats(min_value=0.001, max_value=3600), odd), "dropped_reports": _count(odd),
                  "gpus": st.one_of(st.lists(_gpu(odd), max_size=3), odd), "runtimes": st.one_of(st.lists(_runtime(odd), max_size=4), odd)},
    )


def _sizes(odd):
    keys = st.one_of(st.sampled_from(["1", "2", "64", "4096"]), st.sampled_from(["0", "4097", "01", "x", "-1", " 2"]) if odd is ODD else odd)
    return st.one_of(st.dictionaries(keys, _count(odd), max_size=3), odd)


def _ensemble(odd):
    names = st.one_of(st.sampled_from(["resnet18", "resnet50"]), st.sampled_from(["", "a\x00b", "\ud800", "x" * 101]) if odd is ODD else odd)
    return st.one_of(st.none(), odd, st.fixed_dictionaries({}, optional={
        "queries": _count(odd), "chosen": st.one_of(st.dictionaries(names, _count(odd), max_size=2), odd),
        "voted": st.one_of(st.dictionaries(names, _count(odd), max_size=2), odd), "sizes": _sizes(odd),
        "scheduler": st.one_of(st.sampled_from(["random", "garrison.onnx", ""]), odd)}))


def _router_report(odd):
    application = st.fixed_dictionaries(
        {"application": st.one_of(st.sampled_from(["resnet", "bert"]), odd)},
        optional={"routing_version": st.one_of(st.integers(min_value=0, max_value=99), odd), "arrivals": _count(odd),
                  "no_route": _count(odd), "latency_p99_ms": st.one_of(st.floats(min_value=0, max_value=1e4), odd),
                  "query_sizes": st.one_of(st.none(), _sizes(odd)), "ensemble": _ensemble(odd)},
    )
    return st.fixed_dictionaries({"router": st.one_of(st.just("edge-1"), odd), "at": _at(odd), "applications": st.one_of(st.lists(application, max_size=3), odd)})


def _reports(builder):
    """Half the reports well-formed throughout (no odd value anywhere), half with odd values mixed in."""
    return st.one_of(builder(st.nothing()), builder(ODD))


def _drf(serializer_class, data):
    try:
        return dict(serializer_class().run_validation(data))
    except serializers.ValidationError:
        return REFUSED


def _plain(value):
    """Validated data as plain JSON-able values (DRF's nested OrderedDicts compare equal to dicts anyway)."""
    return json.loads(json.dumps(value, default=str))


@pytest.mark.parametrize("serializer_class, reports", [(MetricsReportSerializer, _metrics_report), (RouterReportSerializer, _router_report)])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_fast_path_agrees_with_drf(serializer_class, reports, data) -> None:
    fast_path_agrees_with_drf(serializer_class, data.draw(_reports(reports)))


def fast_path_agrees_with_drf(serializer_class, report) -> None:
    """The fast path on `report` answers as DRF does (see the module docstring), and so does report_validate."""
    fast = serializer_compile(serializer_class())(report)
    drf = _drf(serializer_class, report)
    if fast is not None:
        assert drf is not REFUSED, f"accepted what DRF refuses: {report!r}"
        assert _plain(fast) == _plain(drf)
    # report_validate (fast path, then DRF) answers exactly as DRF does
    try:
        answered = _plain(report_validate(serializer_class, report))
    except serializers.ValidationError:
        answered = REFUSED
    assert answered == (REFUSED if drf is REFUSED else _plain(drf))


def test_the_fast_path_takes_what_agents_send() -> None:
    at = timezone.now().isoformat()
    report = {"at": at, "interval_s": 1.0, "gpus": [{"index": 0, "uuid": "GPU-1", "utilization_pct": 61.5, "memory_used_mb": 9000,
                                                      "power_w": 251.0, "simulated": True,
                                                      "instances": [{"placement": "1g.5gb@0", "gr_engine_active_pct": 40.0, "memory_used_mb": 1200}]}],
              "runtimes": [{"key": "gpu0/1g.5gb@0", "application": "resnet", "variant": "resnet18", "arrivals": 40, "served": 40, "late": 0,
                            "dropped": 0, "queue_length": 1, "batches": 10, "batch_size_mean": 4.0, "latency_p50_ms": 12.5, "latency_p99_ms": None}]}
    fast = serializer_compile(MetricsReportSerializer())(report)
    assert fast is not None and _plain(fast) == _plain(_drf(MetricsReportSerializer, report))
    assert fast["dropped_reports"] == 0 and fast["runtimes"][0]["latency_p99_ms"] is None
    router = {"router": "edge-1", "at": at, "applications": [{"application": "resnet", "arrivals": 5}]}
    assert serializer_compile(RouterReportSerializer())(router) is not None


def test_a_field_it_does_not_know_goes_to_drf() -> None:
    class Odd(serializers.Serializer):
        email = serializers.EmailField()
        count = serializers.IntegerField(validators=[lambda v: None])

    check = serializer_compile(Odd())
    assert check({"email": "a@example.org", "count": 3}) == {"email": "a@example.org", "count": 3}  # DRF judged each field
    assert check({"email": "not an address", "count": 3}) is None
