"""MPS partitions of a GPU (engine/sharing/partitions.py): layouts written "50+30+20", every problem the
validator names, the diff an agent applies, and the models time-sharing one partition."""
from __future__ import annotations

import pytest

from engine.sharing.partitions import (
    MPS_PARTITIONS_DEFAULT,
    InvalidMpsLayout,
    ModelShare,
    MpsPartition,
    model_shares_validate,
    mps_layout_diff,
    mps_layout_format,
    mps_layout_of,
    mps_layout_parse,
    mps_layout_require_valid,
    mps_layout_validate,
)


def test_the_default_set_is_the_papers() -> None:
    assert MPS_PARTITIONS_DEFAULT == (20, 40, 50, 60, 80, 100)


def test_layouts_parse_largest_first_and_format_back() -> None:
    layout = mps_layout_parse("20+50+ 30%")
    assert layout == (MpsPartition(50, 0), MpsPartition(30, 1), MpsPartition(20, 2))
    assert [p.slot for p in layout] == ["mps50@0", "mps30@1", "mps20@2"]
    assert mps_layout_format(layout) == "50+30+20"
    assert mps_layout_format([20, 80]) == "80+20" and mps_layout_format("40+60") == "60+40"
    assert mps_layout_parse("") == () and mps_layout_parse("  ") == () and mps_layout_format(()) == ""


@pytest.mark.parametrize("text", ["100", "50+50", "60+40", "80+20", "40+40+20", "20+20+20+20+20", ""])
def test_format_and_parse_round_trip(text: str) -> None:
    assert mps_layout_format(mps_layout_parse(text)) == text
    assert mps_layout_parse(mps_layout_format(mps_layout_parse(text))) == mps_layout_parse(text)


@pytest.mark.parametrize("text, part", [("50+half", "half"), ("50++50", ""), ("-20+40", "-20"), ("50.5", "50.5")])
def test_a_part_that_is_not_a_whole_percent_is_named(text: str, part: str) -> None:
    with pytest.raises(ValueError, match=f"{part!r} is not a whole percent"):
        mps_layout_parse(text)
    with pytest.raises(ValueError, match="must be written as text"):
        mps_layout_parse(50)  # type: ignore[arg-type]


def test_valid_layouts_have_no_problem() -> None:
    for layout in ([100], [60, 40], [50, 50], [80, 20], [20, 20, 20, 20, 20], [], "50+50", mps_layout_of([60, 40])):
        assert mps_layout_validate(layout) == [], layout
    assert mps_layout_validate([30, 70], allowed=(30, 70)) == []  # a fleet's own set


def test_a_size_outside_the_allowed_set_is_named_with_the_set() -> None:
    assert mps_layout_validate([30, 20]) == ["partition sizes [30] are not allowed (allowed: 20, 40, 50, 60, 80, 100 %)"]
    assert mps_layout_validate([MpsPartition(0, 0)]) == ["partition sizes [0] are not allowed (allowed: 20, 40, 50, 60, 80, 100 %)"]
    assert mps_layout_validate([50.5]) == ["partition sizes [50.5] are not allowed (allowed: 20, 40, 50, 60, 80, 100 %)"]  # type: ignore[list-item]
    assert mps_layout_validate([50], allowed=(30, 70)) == ["partition sizes [50] are not allowed (allowed: 30, 70 %)"]


def test_shares_over_the_gpu_are_named_with_their_sum() -> None:
    assert mps_layout_validate([60, 60]) == ["partitions add up to 120 % of the GPU (at most 100 %)"]
    assert mps_layout_validate("100+20") == ["partitions add up to 120 % of the GPU (at most 100 %)"]


def test_indices_must_be_0_to_n_minus_1_once_each() -> None:
    assert mps_layout_validate([MpsPartition(50, 0), MpsPartition(50, 0)]) == ["partition indices must be 0..1 (repeated: [0])"]
    assert mps_layout_validate([MpsPartition(50, 0), MpsPartition(50, 2)]) == ["partition indices must be 0..1, got [0, 2]"]
    assert mps_layout_validate([MpsPartition(40, 1), MpsPartition(60, 0)]) == []  # order of the list does not matter


def test_every_problem_is_named_at_once() -> None:
    problems = mps_layout_validate([MpsPartition(80, 0), MpsPartition(30, 0), MpsPartition(20, 2)])
    assert problems == [
        "partition sizes [30] are not allowed (allowed: 20, 40, 50, 60, 80, 100 %)",
        "partitions add up to 130 % of the GPU (at most 100 %)",
        "partition indices must be 0..2 (repeated: [0])",
    ]


def test_require_valid_raises_with_every_problem_and_reindexes() -> None:
    with pytest.raises(InvalidMpsLayout, match=r"invalid target '80\+40': partitions add up to 120 %"):
        mps_layout_require_valid([80, 40], "target")
    with pytest.raises(InvalidMpsLayout, match=r"'80\+30': partition sizes \[30\] are not allowed .*; partitions add up to 110 %"):
        mps_layout_require_valid("80+30")
    assert mps_layout_require_valid([MpsPartition(40, 1), MpsPartition(60, 0)]) == (MpsPartition(60, 0), MpsPartition(40, 1))


def test_the_diff_keeps_shares_that_stay() -> None:
    diff = mps_layout_diff([50, 50], [50, 40])
    assert (diff.keep, diff.stop, diff.start) == ((50,), (50,), (40,))
    assert mps_layout_diff([], [100]).start == (100,) and mps_layout_diff("100", "").stop == (100,)
    assert mps_layout_diff([60, 40], [40, 60]).keep == (60, 40) and mps_layout_diff([60, 40], "40+60").empty
    diff = mps_layout_diff("100", "60+20+20")
    assert (diff.keep, diff.stop, diff.start) == ((), (100,), (60, 20, 20)) and not diff.empty


def test_the_diff_refuses_an_invalid_layout_on_either_side() -> None:
    with pytest.raises(InvalidMpsLayout, match="invalid target MPS layout '60\\+60'"):
        mps_layout_diff([100], [60, 60])
    with pytest.raises(InvalidMpsLayout, match="invalid current MPS layout '30'"):
        mps_layout_diff([30], [100])
    assert mps_layout_diff([30], [70], allowed=(30, 70)).start == (70,)


def test_models_time_share_a_partition_within_its_time() -> None:
    shares = [ModelShare("resnet50", 8, 0.5), ModelShare("vgg16", 4, 0.3), ModelShare("mobilenet", 16, 0.2)]
    assert model_shares_validate(shares) == [] and model_shares_validate([]) == []
    assert ModelShare("resnet50", 8).duty_cycle == 1.0
    assert model_shares_validate([ModelShare("a", 1, 0.7), ModelShare("b", 1, 0.4)]) == ["duty cycles add up to 1.1, more than the partition's time (a: 0.7, b: 0.4)"]
    assert model_shares_validate([ModelShare("a", 1, 0.5), ModelShare("a", 2, 0.5)]) == ["models listed more than once: a"]


@pytest.mark.parametrize("args, message", [
    (("", 1, 0.5), "needs a model name"),
    (("m", 0, 0.5), "batch must be a whole number >= 1"),
    (("m", 2.5, 0.5), "batch must be a whole number >= 1"),
    (("m", 1, 0.0), r"duty cycle must be in \(0, 1\]"),
    (("m", 1, 1.5), r"duty cycle must be in \(0, 1\]"),
    (("m", 1, float("nan")), r"duty cycle must be in \(0, 1\]"),
])
def test_a_model_share_refuses_what_cannot_run(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelShare(*args)
