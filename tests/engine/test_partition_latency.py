"""Latency under an MPS partition, L(b, p), and the partitions of gpulets' Algorithm 1: the knee p_eff,
p_req, p_ideal and line 20's largest batch within the SLO (engine/sharing/latency.py)."""
from __future__ import annotations

import pytest

from engine.reference.profiles import gpulet_inference_read
from engine.sharing.latency import (
    KNEE_TOLERANCE_DEFAULT,
    LatencyUnknown,
    PartitionLatencyModel,
    partition_latency_model_from_gpulet,
)
from engine.sharing.partitions import MPS_PARTITIONS_DEFAULT

# Model "m": batch 1 takes 4 ms on 20 %, 2 ms on 50 %, 1.8 ms on 100 %; batch 8 takes 20, 8 and 7 ms.
HAND = PartitionLatencyModel.from_points([
    ("m", 1, 20, 4.0), ("m", 8, 20, 20.0), ("m", 1, 50, 2.0), ("m", 8, 50, 8.0), ("m", 1, 100, 1.8), ("m", 8, 100, 7.0),
])
MEASURED = (20, 50, 100)

# Model "roof": the shape of Figure 4, L = max(floor, work / p): batch 8 is compute-bound up to 50 % (500 / p
# ms, 10 ms floor), batch 1 is flat (5 ms) everywhere.
ROOF = PartitionLatencyModel.from_points(
    [("roof", 8, p, max(10.0, 500.0 / p)) for p in MPS_PARTITIONS_DEFAULT] + [("roof", 1, p, 5.0) for p in MPS_PARTITIONS_DEFAULT]
)


def _bilinear(batch: int, percent: float) -> float:
    # Linear in the batch and in 1 / percent: the interpolation reproduces it exactly between its points.
    return 0.5 + 0.25 * batch + 40.0 * batch / percent


BILINEAR = PartitionLatencyModel.from_points([("b", b, p, _bilinear(b, p)) for b in (1, 8, 32) for p in MEASURED])


@pytest.fixture(scope="module")
def gpulet() -> PartitionLatencyModel:
    points = gpulet_inference_read()  # no skip: the data is bundled in the repository, and a lost copy must fail
    return partition_latency_model_from_gpulet(points)


# --------------------------------------------------------------------------- L(b, p)


def test_measured_points_are_returned_exactly() -> None:
    assert HAND.latency_ms("m", 8, 50) == 8.0 and HAND.latency_ms("m", 1, 20) == 4.0
    assert HAND.throughput_rps("m", 8, 50) == pytest.approx(1000.0)
    assert HAND.models() == ["m"] and HAND.partitions("m") == [20, 50, 100] and HAND.batches("m", 20) == [1, 8]


def test_between_batches_latency_is_linear_in_the_batch() -> None:
    assert HAND.latency_ms("m", 4, 20) == pytest.approx(4 + 16 * 3 / 7)


def test_between_partitions_latency_is_linear_in_one_over_the_percent() -> None:
    # 4 ms on 20 % and 2 ms on 50 % are L = 2/3 + (200/3) / p: 2.33 ms on 40 % (linear in p would say 2.67).
    assert HAND.latency_ms("m", 1, 40) == pytest.approx(2 / 3 + 200 / 3 / 40)
    for batch in (1, 3, 8, 20, 32):
        for percent in (20, 25, 40, 50, 60, 75, 80, 99, 100):
            assert BILINEAR.latency_ms("b", batch, percent) == pytest.approx(_bilinear(batch, percent)), (batch, percent)


def test_outside_the_profiled_range_is_refused_not_extrapolated() -> None:
    with pytest.raises(LatencyUnknown, match=r"m on 50 %: batch 9 is outside the profiled 1..8"):
        HAND.latency_ms("m", 9, 50)
    with pytest.raises(LatencyUnknown, match=r"m on 40 % \(between the profiled 20 % and 50 %\): batch 0 is outside the profiled 1..8"):
        HAND.latency_ms("m", 0, 40)
    with pytest.raises(LatencyUnknown, match=r"m: 10 % of the GPU is outside the profiled partitions 20..100 %"):
        HAND.latency_ms("m", 1, 10)
    with pytest.raises(LatencyUnknown, match=r"m: 101 % of the GPU is outside"):
        HAND.throughput_rps("m", 1, 101)
    with pytest.raises(LatencyUnknown, match=r"no profile of bert \(model unknown; profiled: m\)"):
        HAND.latency_ms("bert", 1, 50)
    with pytest.raises(LatencyUnknown, match=r"no profile of m on 40 % of the GPU \(profiled: \[20, 50, 100\]\)"):
        HAND.batches("m", 40)


def test_batches_are_known_only_where_both_neighbouring_partitions_have_them() -> None:
    model = PartitionLatencyModel.from_points([("x", 1, 20, 5.0), ("x", 16, 20, 50.0), ("x", 1, 50, 3.0), ("x", 8, 50, 9.0)])
    assert model.batch_range("x", 20) == (1, 16) and model.batch_range("x", 40) == (1, 8)
    with pytest.raises(LatencyUnknown, match="batch 12 is outside the profiled 1..8"):
        model.latency_ms("x", 12, 40)


@pytest.mark.parametrize("point, message", [
    (("m", 0, 50, 1.0), "batch must be a whole number >= 1"),
    (("m", 1, 0, 1.0), r"partition must be a whole percent in 1..100"),
    (("m", 1, 120, 1.0), r"partition must be a whole percent in 1..100"),
    (("m", 1, 50, 0.0), "latency must be a positive number of ms"),
    (("m", 1, 50, float("nan")), "latency must be a positive number of ms"),
])
def test_a_point_that_cannot_be_a_measurement_is_named(point: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionLatencyModel.from_points([point])


def test_a_point_measured_twice_differently_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\(m, batch 1, 50 %\): measured twice \(2.0 ms and 2.5 ms\)"):
        PartitionLatencyModel.from_points([("m", 1, 50, 2.0), ("m", 1, 50, 2.5)])


def test_on_the_shared_data_every_measured_point_is_exact(gpulet) -> None:
    points = gpulet_inference_read()
    assert len(gpulet.models()) == 10 and all(gpulet.partitions(m) == list(MPS_PARTITIONS_DEFAULT) for m in gpulet.models())
    for p in points:
        assert gpulet.latency_ms(p.model, p.batch, p.partition_pct) == p.latency_ms


def test_on_the_shared_data_interpolation_is_monotone_where_the_data_are(gpulet) -> None:
    checked = 0
    for model in gpulet.models():
        for batch in gpulet.batches(model, 20):
            for low, high in zip(MPS_PARTITIONS_DEFAULT, MPS_PARTITIONS_DEFAULT[1:]):
                at_low, at_high = gpulet.latency_ms(model, batch, low), gpulet.latency_ms(model, batch, high)
                if at_low >= at_high:  # more GPU, not slower: so is every partition between
                    values = [gpulet.latency_ms(model, batch, p) for p in range(low, high + 1)]
                    assert all(a >= b for a, b in zip(values, values[1:])) and at_high <= min(values) <= max(values) <= at_low
                    checked += 1
        for percent in MPS_PARTITIONS_DEFAULT:
            batches = gpulet.batches(model, percent)
            for small, large in zip(batches, batches[1:]):
                if gpulet.latency_ms(model, small, percent) <= gpulet.latency_ms(model, large, percent):
                    values = [gpulet.latency_ms(model, b, percent) for b in range(small, large + 1)]
                    assert all(a <= b for a, b in zip(values, values[1:]))
                    checked += 1
    assert checked > 500


# --------------------------------------------------------------------------- Algorithm 1, line 20


def test_largest_batch_within_the_budget() -> None:
    choice = HAND.largest_batch_within("m", 20, 10.0)
    assert (choice.percent, choice.batch) == (20, 3) and choice.latency_ms == pytest.approx(4 + 16 * 2 / 7)
    assert choice.throughput_rps == pytest.approx(3000 / choice.latency_ms)
    assert HAND.largest_batch_within("m", 50, 10.0).batch == 8
    assert HAND.largest_batch_within("m", 50, 10.0, interference=1.5).batch == 6  # 1.5 x 6.29 ms fits, 1.5 x 7.14 does not
    assert HAND.largest_batch_within("m", 50, 10.0, interference=1.5).latency_ms == pytest.approx(1.5 * (2 + 6 * 5 / 7))
    assert HAND.largest_batch_within("m", 20, 3.0) is None
    assert HAND.largest_batch_within("m", 20, 10.0, batches=[1, 2, 4, 8]).batch == 2  # only the batches a batcher may use
    with pytest.raises(LatencyUnknown, match="batch 16 is outside"):
        HAND.largest_batch_within("m", 20, 100.0, batches=[1, 16])
    with pytest.raises(ValueError, match="interference factor must be a positive number"):
        HAND.largest_batch_within("m", 20, 10.0, interference=0.0)


def test_on_the_shared_data_the_largest_batch_is_the_last_that_fits(gpulet) -> None:
    for model in ("resnet50", "vgg19", "mobilenet"):
        for percent in (20, 50, 100):
            for budget in (10.0, 25.0, 60.0):
                alone = gpulet.largest_batch_within(model, percent, budget)
                crowded = gpulet.largest_batch_within(model, percent, budget, interference=1.3)
                if alone is None:
                    assert crowded is None
                    continue
                assert alone.latency_ms <= budget
                assert all(gpulet.latency_ms(model, b, percent) > budget for b in range(alone.batch + 1, 65))
                assert crowded is None or (crowded.batch <= alone.batch and crowded.latency_ms <= budget)


# --------------------------------------------------------------------------- p_eff (the knee), p_req, p_ideal


def test_the_knee_of_a_roofline_curve_is_where_it_flattens() -> None:
    # Batch 8: 16 req/s per percent on 20, 40 and 50 % (compute-bound), 13.3 on 60 %: the knee is 50 %.
    knee = ROOF.partition_knee("roof", 8)
    assert (knee.percent, knee.batch, knee.latency_ms) == (50, 8, 10.0) and knee.throughput_per_percent == pytest.approx(16.0)
    assert ROOF.partition_knee("roof", 8, tolerance=0.0).percent == 50
    assert ROOF.partition_knee("roof", 8, tolerance=0.2).percent == 60  # 13.3 is within 20 % of 16
    assert ROOF.partition_knee("roof", 1).percent == 20  # flat: more GPU buys nothing
    assert ROOF.partition_knee("roof", 8, slo_ms=11.0).percent == 50
    assert ROOF.partition_knee("roof", 1, slo_ms=11.0).percent == 20
    assert ROOF.partition_knee("roof", 8, slo_ms=9.0) is None  # no partition meets it
    assert ROOF.partition_knee("roof", 8, slo_ms=16.0, interference=1.5).percent == 50  # 15 ms from 50 % up
    assert ROOF.partition_knee("roof", 8, slo_ms=14.0, interference=1.5) is None
    assert ROOF.partition_knee("roof", 8, partitions=(20, 40)).percent == 40


def test_the_knee_refuses_what_it_cannot_answer() -> None:
    with pytest.raises(ValueError, match="needs a batch or an SLO"):
        ROOF.partition_knee("roof", None)
    with pytest.raises(ValueError, match=r"knee tolerance must be in \[0, 1\)"):
        ROOF.partition_knee("roof", 8, tolerance=1.0)
    with pytest.raises(LatencyUnknown, match="10 % of the GPU is outside"):
        ROOF.partition_knee("roof", 8, partitions=(10, 50))


def test_p_eff_p_req_and_p_ideal_on_a_hand_profile() -> None:
    # Within 10 ms: 20 % fits batch 3 (8.57 ms, 350/s: 17.5/s per percent), 50 % batch 8 (1000/s: 20/s per
    # percent), 100 % batch 8 (1143/s: 11.4/s per percent) -> p_eff = 50 % at batch 8.
    eff = HAND.partition_efficient("m", 10.0, partitions=MEASURED)
    assert (eff.percent, eff.batch) == (50, 8)
    assert HAND.partition_knee("m", None, slo_ms=10.0, partitions=MEASURED) == eff
    assert HAND.partition_efficient("m", 10.0, partitions=MEASURED, tolerance=0.15).percent == 50  # 17.5 is in, 50 % larger
    assert HAND.partition_efficient("m", 1.0, partitions=MEASURED) is None
    assert HAND.partition_required("m", 300.0, 10.0, partitions=MEASURED).percent == 20  # 350/s on 20 % is enough
    assert HAND.partition_required("m", 5000.0, 10.0, partitions=MEASURED) is None  # more than any one partition
    assert HAND.partition_ideal("m", 300.0, 10.0, partitions=MEASURED).percent == 20  # p_req < p_eff: do not over-provision
    assert HAND.partition_ideal("m", 900.0, 10.0, partitions=MEASURED).percent == 50  # p_req (50 %) is p_eff
    assert HAND.partition_ideal("m", 5000.0, 10.0, partitions=MEASURED).percent == 50  # several gpulets, each the efficient size


def _efficiency(model: PartitionLatencyModel, name: str, batch: int, percent: int) -> float:
    return model.throughput_rps(name, batch, percent) / percent


@pytest.mark.parametrize("name", ["resnet50", "vgg19", "densenet121", "mobilenet"])
def test_on_the_shared_data_the_knee_has_the_best_throughput_per_percent(gpulet, name: str) -> None:
    for batch in (1, 8, 32):
        knee = gpulet.partition_knee(name, batch)
        assert knee is not None and knee.percent in MPS_PARTITIONS_DEFAULT and knee.batch == batch
        best = max(_efficiency(gpulet, name, batch, p) for p in MPS_PARTITIONS_DEFAULT)
        assert knee.throughput_per_percent >= best * (1 - KNEE_TOLERANCE_DEFAULT)
        # ... and beyond it, efficiency has fallen off: diminishing returns.
        assert all(_efficiency(gpulet, name, batch, p) < best * (1 - KNEE_TOLERANCE_DEFAULT) for p in MPS_PARTITIONS_DEFAULT if p > knee.percent)


def test_on_the_shared_data_the_knees_at_batch_8(gpulet) -> None:
    # Compute-bound vgg keeps 91 % of its best efficiency up to 60 %; the others lose more than 10 % past 20 %.
    assert {m: gpulet.partition_knee(m, 8).percent for m in ("vgg16", "vgg19", "resnet50", "densenet121")} == {
        "vgg16": 60, "vgg19": 60, "resnet50": 20, "densenet121": 20}
    # An SLO the small partition misses moves the knee up: resnet50 takes 12.5 ms on 20 %, 7.0 ms on 40 %.
    assert gpulet.partition_knee("resnet50", 8, slo_ms=10.0).percent == 40


def test_on_the_shared_data_p_eff_is_the_knee_over_batches_within_the_slo(gpulet) -> None:
    for name in gpulet.models():
        for slo in (25.0, 50.0):
            eff = gpulet.partition_efficient(name, slo)
            assert eff is not None and eff.percent in MPS_PARTITIONS_DEFAULT and eff.latency_ms <= slo
            others = [gpulet.largest_batch_within(name, p, slo) for p in MPS_PARTITIONS_DEFAULT]
            best = max(o.throughput_per_percent for o in others if o is not None)
            assert eff.throughput_per_percent >= best * (1 - KNEE_TOLERANCE_DEFAULT)
            ideal = gpulet.partition_ideal(name, 50.0, slo)
            assert ideal is not None and ideal.percent <= eff.percent  # a low rate never gets more than p_eff
