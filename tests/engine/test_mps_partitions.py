"""MPS partitions of a GPU (engine/sharing/partitions.py) and latency under a partition, with p_eff, p_req
and p_ideal of gpulets' Algorithm 1 (engine/sharing/latency.py)."""
from __future__ import annotations

import pytest

from engine.reference.profiles import gpulet_inference_read
from engine.sharing.latency import LatencyUnknown, PartitionLatencyModel, partition_latency_model_from_gpulet
from engine.sharing.partitions import (
    InvalidMpsLayout,
    MpsPartition,
    mps_layout_diff,
    mps_layout_format,
    mps_layout_of,
    mps_layout_parse,
    mps_layout_require_valid,
    mps_layout_validate,
)


def test_layouts_parse_largest_first_and_format_back() -> None:
    layout = mps_layout_parse("20+50+ 30%")
    assert layout == (MpsPartition(50, 0), MpsPartition(30, 1), MpsPartition(20, 2))
    assert [p.slot for p in layout] == ["mps50@0", "mps30@1", "mps20@2"]
    assert mps_layout_format(layout) == "50+30+20" and mps_layout_parse("") == () and mps_layout_format(()) == ""
    with pytest.raises(ValueError, match="'half' is not a whole percent"):
        mps_layout_parse("50+half")


def test_every_problem_of_a_layout_is_named() -> None:
    assert mps_layout_validate(mps_layout_of([60, 40])) == []
    assert mps_layout_validate([100]) == [] and mps_layout_validate([]) == []
    problems = mps_layout_validate([80, 30, 20])
    assert problems == ["partition sizes [30] are not allowed (allowed: 20, 40, 50, 60, 80, 100 %)",
                        "partitions add up to 130 % of the GPU (at most 100 %)"]
    assert mps_layout_validate([30, 70], allowed=(30, 70)) == []  # a fleet's own set
    assert mps_layout_validate([MpsPartition(50, 0), MpsPartition(50, 0)]) == ["partition indices must be 0..1 (repeated: [0])"]
    with pytest.raises(InvalidMpsLayout, match=r"invalid target '80\+40': partitions add up to 120 %"):
        mps_layout_require_valid([80, 40], "target")


def test_the_diff_keeps_shares_that_stay() -> None:
    diff = mps_layout_diff([50, 50], [50, 40])
    assert (diff.keep, diff.stop, diff.start) == ((50,), (50,), (40,))
    assert mps_layout_diff([], [100]).start == (100,) and mps_layout_diff([60, 40], [40, 60]).keep == (60, 40)
    with pytest.raises(InvalidMpsLayout):
        mps_layout_diff([100], [60, 60])


@pytest.fixture(scope="module")
def gpulet() -> PartitionLatencyModel:
    return partition_latency_model_from_gpulet(gpulet_inference_read())


HAND = PartitionLatencyModel.from_points([
    # model "m": batch 1 takes 4 ms on 20 %, 2 ms on 50 %; batch 8 takes 20 ms on 20 %, 8 ms on 50 %, 7 ms on 100 %
    ("m", 1, 20, 4.0), ("m", 8, 20, 20.0), ("m", 1, 50, 2.0), ("m", 8, 50, 8.0), ("m", 1, 100, 1.8), ("m", 8, 100, 7.0),
])


def test_latency_is_measured_or_linear_between_batches_and_refused_outside() -> None:
    assert HAND.latency_ms("m", 8, 50) == 8.0 and HAND.latency_ms("m", 4, 20) == pytest.approx(4 + 16 * 3 / 7)
    assert HAND.throughput_rps("m", 8, 50) == pytest.approx(1000.0)
    with pytest.raises(LatencyUnknown, match=r"batch 9 is outside the profiled 1..8"):
        HAND.latency_ms("m", 9, 50)
    with pytest.raises(LatencyUnknown, match=r"no profile of m on 40 % of the GPU \(profiled: \[20, 50, 100\]\)"):
        HAND.latency_ms("m", 1, 40)


def test_p_eff_p_req_and_p_ideal_on_a_hand_profile() -> None:
    # Within 10 ms: 20 % fits batch 3 (8.57 ms, 350/s: 17.5/s per percent), 50 % batch 8 (1000/s: 20/s per
    # percent), 100 % batch 8 (1143/s: 11.4/s per percent) -> p_eff = 50 %.
    eff = HAND.partition_efficient("m", 10.0)
    assert (eff.percent, eff.batch) == (50, 8)
    assert HAND.largest_batch_within("m", 20, 10.0).batch == 3
    assert HAND.largest_batch_within("m", 50, 10.0, interference=1.5).batch == 6  # 1.5 x 6.29 ms fits, 1.5 x 7.14 does not
    assert HAND.largest_batch_within("m", 20, 3.0) is None
    assert HAND.partition_required("m", 300.0, 10.0).percent == 20  # 350/s on 20 % is enough
    assert HAND.partition_required("m", 5000.0, 10.0) is None  # more than any one partition
    assert HAND.partition_ideal("m", 300.0, 10.0).percent == 20  # p_req < p_eff: do not over-provision
    assert HAND.partition_ideal("m", 900.0, 10.0).percent == 50  # p_req (50 %) is p_eff
    assert HAND.partition_ideal("m", 5000.0, 10.0).percent == 50  # several gpulets, each the efficient size


def test_on_the_shared_data_the_knee_is_the_best_throughput_per_percent(gpulet) -> None:
    assert len(gpulet.models()) == 10 and all(gpulet.partitions(m) == [20, 40, 50, 60, 80, 100] for m in gpulet.models())
    for model in gpulet.models():
        for slo in (25.0, 50.0):
            eff = gpulet.partition_efficient(model, slo)
            assert eff is not None and eff.percent in (20, 40, 50, 60, 80, 100)
            for percent in gpulet.partitions(model):
                other = gpulet.largest_batch_within(model, percent, slo)
                assert other is None or other.throughput_rps / percent <= eff.throughput_rps / eff.percent * (1 + 1e-9)
    # A tighter SLO moves the knee of vgg19 to a larger partition (small batches leave a small partition idle).
    assert gpulet.partition_efficient("vgg19", 10.0).percent > gpulet.partition_efficient("vgg19", 100.0).percent
