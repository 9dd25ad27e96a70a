"""The gpulets interference model (engine/sharing/interference.py) and the readers of shared/data/gpulet's
co-run and utilisation files (engine/reference/profiles.py)."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from engine.reference.profiles import (
    GpuletCorun,
    GpuletMemUtil,
    GpuletPoint,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
)
from engine.sharing.interference import (
    INTERFERENCE_FORM_DEFAULT,
    CorunSample,
    InterferenceModel,
    interference_cross_validate_by_pair,
    interference_errors,
    interference_forms_compare,
    interference_model_evaluate,
    interference_model_fit,
    interference_samples_build,
    interference_split_random,
)


@pytest.fixture(scope="module")
def samples() -> list[CorunSample]:
    build = interference_samples_build(gpulet_inference_read(), gpulet_interference_read(), gpulet_mem_util_read())
    assert build.skipped == {}  # every co-run of the shared data joins its solo latency and both utilisations
    return build.samples


def test_the_readers_keep_valid_rows_and_name_a_malformed_line(tmp_path: Path) -> None:
    corun = gpulet_interference_read()
    assert len(corun) == 3675 and all(0 < c.partition_pct < 100 for c in corun)
    assert corun[0] == GpuletCorun("vgg19", 1, 20, "vgg19", 1, 132.94, pytest.approx(7.52))
    assert len(gpulet_mem_util_read()) == 455
    path = tmp_path / "interference.csv"
    path.write_text("vgg19,1,20,vgg19,1,throughput,132.94,latency,0.00752,1\nvgg19,1,20,vgg19,1,throughput,1,latency,0.1,0\n")
    assert len(gpulet_interference_read(path)) == 1  # flag 0: not a valid measurement
    path.write_text("vgg19,1,20,vgg19,1,throughput,132.94,latency,0.00752,1\nvgg19,1,20\n")
    with pytest.raises(ValueError, match=r"interference.csv:2: 3 fields, expected 10"):
        gpulet_interference_read(path)
    path.write_text("vgg19,one,20,mem_util,7,l2_util,7,0\n")
    with pytest.raises(ValueError, match=r":1: invalid literal"):
        gpulet_mem_util_read(path)


def test_samples_join_solo_latency_and_the_corunners_utilisation_on_the_rest_of_the_gpu() -> None:
    solo = [GpuletPoint("a", 4, 40, 100.0, 10.0)]
    util = [GpuletMemUtil("a", 4, 40, 30.0, 20.0), GpuletMemUtil("b", 8, 60, 50.0, 40.0)]
    corun = [GpuletCorun("a", 4, 40, "b", 8, 80.0, 12.5), GpuletCorun("a", 4, 40, "b", 2, 80.0, 12.0),
             GpuletCorun("a", 1, 40, "b", 8, 80.0, 3.0)]
    build = interference_samples_build(solo, corun, util)
    assert build.skipped == {"no utilisation of the co-runner": 1, "no solo latency": 1}
    (s,) = build.samples
    assert (s.l2_a, s.mem_a, s.l2_b, s.mem_b, s.factor) == (20.0, 30.0, 40.0, 50.0, 1.25)


def _synthetic(coefficients: tuple[float, ...], n: int = 200) -> list[CorunSample]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        l2a, l2b, mema, memb = (rng.uniform(0, 60) for _ in range(4))
        factor = sum(c * x for c, x in zip(coefficients, (l2a / 100, l2b / 100, mema / 100, memb / 100, 1.0)))
        out.append(CorunSample(f"m{i % 3}", 1, 50, f"c{i % 2}", 1, l2a, l2b, mema, memb, 5.0, factor))
    return out


def test_the_paper_form_recovers_known_coefficients() -> None:
    truth = (0.4, 0.9, 0.2, 0.6, 1.0)
    model = interference_model_fit(_synthetic(truth), form="paper")
    assert model.coefficients == pytest.approx(truth, abs=1e-9)
    assert max(interference_errors(model, _synthetic(truth))) < 1e-9
    assert model.predict(l2_a=0, l2_b=0, mem_a=0, mem_b=0, partition_pct=50, batch=1, corunner_batch=1) == pytest.approx(1.0)


def test_a_prediction_is_never_below_one_and_an_unknown_form_is_refused() -> None:
    speedup = InterferenceModel("paper", (0.0, 0.0, 0.0, 0.0, 0.5))
    assert speedup.predict(l2_a=10, l2_b=10, mem_a=10, mem_b=10, partition_pct=50, batch=1, corunner_batch=1) == 1.0
    with pytest.raises(ValueError, match="unknown interference form 'cubic'"):
        interference_model_fit(_synthetic((0, 0, 0, 0, 1.0)), form="cubic")


def test_the_random_split_is_seeded_and_disjoint(samples) -> None:
    train, validate = interference_split_random(samples, seed=3)
    again = interference_split_random(samples, seed=3)
    assert (train, validate) == again and len(validate) == round(0.3 * len(samples))
    assert len(train) + len(validate) == len(samples) and not set(map(id, train)) & set(map(id, validate))
    assert interference_split_random(samples, seed=4)[1] != validate


def test_the_report_quantiles_on_a_hand_example() -> None:
    model = InterferenceModel("paper", (0.0, 0.0, 0.0, 0.0, 1.0))  # predicts 1.0 everywhere
    held = [CorunSample("a", 1, 50, "b", 1, 0, 0, 0, 0, 1.0, f) for f in (1.0, 1.25, 2.0)]
    report = interference_model_evaluate(model, held, held, split="hand")
    assert report.errors == pytest.approx((0.0, 0.2, 0.5)) and report.p50 == pytest.approx(0.2) and report.max == pytest.approx(0.5)


def test_on_the_shared_data_the_default_form_beats_the_papers_on_pairs_it_never_saw(samples) -> None:
    paper = interference_cross_validate_by_pair(samples, form="paper")
    default = interference_cross_validate_by_pair(samples, form=INTERFERENCE_FORM_DEFAULT)
    assert paper.n_validate == default.n_validate == len(samples)
    # The quoted baseline (about 9 / 33 / 39 % at p50/p90/p95) is the paper's form here ...
    assert 0.05 < paper.p50 < 0.12 and 0.28 < paper.p90 < 0.36
    # ... and the default does better at every quantile the issue asks for.
    assert default.p50 < paper.p50 and default.p90 < paper.p90 - 0.05 and default.p95 < paper.p95
    assert all(math.isfinite(r.p95) for r in interference_forms_compare(samples))
