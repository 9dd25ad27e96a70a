"""Workloads: the Trace type, the CSV trace format (exact round trip, strict errors that name the line),
the seeded arrival generators (determinism, mean rates, gamma CV, macro-burst levels, diurnal
peak/trough and spikes), Zipf application popularity, and the `tessera trace` commands."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from controlplane.cli import app
from engine.simulation import workload
from engine.simulation.workload import (
    DiurnalCurve,
    Spike,
    StepCurve,
    Trace,
    TraceFormatError,
    arrivals_diurnal,
    arrivals_from_rate_curve,
    arrivals_gamma,
    arrivals_macro_bursts,
    arrivals_poisson,
    arrivals_uniform,
    rate_curve_diurnal,
    split_zipf,
    trace_for_applications,
    trace_read,
    trace_summary,
    trace_write,
    zipf_shares,
)

APPS = ("resnet", "bert", "yolo")


def trace_of(times, apps, names=APPS, deadlines=None) -> Trace:
    return Trace(np.asarray(times, dtype=float), np.asarray(apps, dtype=np.int32), names, deadlines)


GENERATORS = {
    "uniform": lambda seed: arrivals_uniform(50, 100, seed),
    "poisson": lambda seed: arrivals_poisson(50, 100, seed),
    "gamma": lambda seed: arrivals_gamma(50, 100, 0.05, seed),
    "macro-bursts": lambda seed: arrivals_macro_bursts(20, 80, 10, 0.5, 100, seed),
    "diurnal": lambda seed: arrivals_diurnal(50, 100, seed, day_s=60),
    "split": lambda seed: trace_for_applications("gamma", APPS, 50, 100, seed),
    "independent": lambda seed: trace_for_applications("poisson", APPS, 50, 100, seed, independent=True),
}


# ----------------------------------------------------------------------------- Trace


def test_trace_basics() -> None:
    trace = trace_of([0.0, 0.5, 1.2, 1.2, 3.9], [0, 1, 0, 2, 0])
    assert len(trace) == 5
    assert trace.duration_s == 3.9
    assert trace.counts() == {"resnet": 3, "bert": 1, "yolo": 1}
    assert trace.times_of("resnet").tolist() == [0.0, 1.2, 3.9]
    rates = trace.rate_per_second()
    assert set(rates) == set(APPS)
    assert rates["resnet"].tolist() == [1, 1, 0, 1]
    assert rates["yolo"].tolist() == [0, 1, 0, 0]
    assert trace.total_rate_per_second().tolist() == [2, 2, 0, 1]
    assert trace.total_rate_per_second(2.0).tolist() == [2.0, 0.5]
    assert trace.time_s.dtype == np.float64 and trace.application.dtype == np.int32
    with pytest.raises(ValueError):
        trace.time_s[0] = 1.0  # read-only
    with pytest.raises(KeyError):
        trace.times_of("nope")
    empty = Trace(np.zeros(0), np.zeros(0, dtype=np.int32), ("a",))
    assert len(empty) == 0 and empty.duration_s == 0.0 and empty.rate_per_second()["a"].size == 0


def test_trace_copies_caller_arrays() -> None:
    times = np.array([0.0, 1.0])
    trace = Trace(times, np.array([0, 0]), ("a",))
    times[0] = 5.0
    assert trace.time_s[0] == 0.0


@pytest.mark.parametrize(
    ("times", "apps", "names", "message"),
    [
        ([1.0, 0.5], [0, 0], ("a",), "sorted"),
        ([-1.0, 0.5], [0, 0], ("a",), "non-negative"),
        ([0.0, math.inf], [0, 0], ("a",), "non-finite"),
        ([0.0, 1.0], [0, 1], ("a",), r"\[0, 1\)"),
        ([0.0, 1.0], [0], ("a",), "entries"),
        ([0.0], [0], ("a", "a"), "duplicate"),
        ([0.0], [0], ("a,b",), "comma"),
        ([0.0], [0], (" a",), "whitespace"),
        ([0.0], [0], ("",), "empty"),
        ([0.0], [0.5], ("a",), "integers"),
    ],
)
def test_trace_rejects_bad_arrays(times, apps, names, message) -> None:
    with pytest.raises(ValueError, match=message):
        Trace(np.asarray(times, dtype=float), np.asarray(apps), names)


def test_trace_rejects_bad_deadlines() -> None:
    with pytest.raises(ValueError, match="positive or NaN"):
        trace_of([0.0, 1.0], [0, 0], deadlines=[10.0, -1.0])
    with pytest.raises(ValueError, match="entries"):
        trace_of([0.0, 1.0], [0, 0], deadlines=[10.0])


def test_trace_slice() -> None:
    trace = trace_of([0.0, 0.5, 1.0, 1.5, 2.0], [0, 1, 2, 0, 1], deadlines=[1, 2, 3, 4, 5])
    part = trace.slice(0.5, 1.5)
    assert part.time_s.tolist() == [0.5, 1.0]
    assert part.application.tolist() == [1, 2]
    assert part.deadline_ms.tolist() == [2, 3]
    assert part.applications == APPS
    rebased = trace.slice(1.0, 10.0, rebase=True)
    assert rebased.time_s.tolist() == [0.0, 0.5, 1.0]
    assert len(trace.slice(3.0, 4.0)) == 0
    with pytest.raises(ValueError):
        trace.slice(2.0, 1.0)


def test_trace_merge() -> None:
    first = trace_of([0.0, 1.0, 2.0], [0, 1, 0], names=("a", "b"))
    second = trace_of([0.5, 1.0, 3.0], [0, 1, 1], names=("c", "a"), deadlines=[10.0, 20.0, 30.0])
    merged = first.merge(second)
    assert merged.applications == ("a", "b", "c")
    assert merged.time_s.tolist() == [0.0, 0.5, 1.0, 1.0, 2.0, 3.0]
    names = [merged.applications[i] for i in merged.application]
    assert names == ["a", "c", "b", "a", "a", "a"]  # on the tie at 1.0, the first trace's arrival first
    assert np.array_equal(merged.deadline_ms, [np.nan, 10.0, np.nan, 20.0, np.nan, 30.0], equal_nan=True)
    assert merged.counts() == {"a": 4, "b": 1, "c": 1}
    assert first.merge(Trace(np.zeros(0), np.zeros(0, dtype=np.int32), ("z",))).applications == ("a", "b", "z")


def test_trace_with_deadlines_and_equality() -> None:
    trace = trace_of([0.0, 1.0, 2.0], [0, 1, 2])
    per_app = trace.with_deadlines({"resnet": 50.0, "bert": 80.0})
    assert np.array_equal(per_app.deadline_ms, [50.0, 80.0, np.nan], equal_nan=True)
    assert per_app == trace.with_deadlines({"resnet": 50.0, "bert": 80.0})  # NaN compare equal
    assert per_app != trace
    assert per_app.with_deadlines(None) == trace
    assert trace.with_deadlines(25.0).deadline_ms.tolist() == [25.0] * 3
    with pytest.raises(ValueError, match="unknown"):
        trace.with_deadlines({"gpt": 1.0})
    assert trace != trace_of([0.0, 1.0, 2.0], [0, 1, 1])
    assert trace != Trace(trace.time_s, trace.application, ("resnet", "bert", "yolo", "extra"))


def test_trace_summary() -> None:
    trace = trace_of([0.1, 0.2, 0.3, 1.5, 2.5, 2.6], [0, 0, 1, 0, 2, 2])
    s = trace_summary(trace)
    assert s.queries == 6
    assert s.mean_rate == pytest.approx(2.0)  # 6 queries over the 3 whole seconds covered
    assert s.peak_rate == 3.0 and s.peak_at_s == 0.0
    assert s.counts == {"resnet": 3, "bert": 1, "yolo": 2}
    assert s.shares["resnet"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- CSV


def test_csv_round_trip_is_exact(tmp_path: Path) -> None:
    trace = trace_for_applications("gamma", APPS, 300, 60, seed=4)
    path = tmp_path / "trace.csv"
    trace_write(trace, path)
    assert path.read_text().splitlines()[0] == "time_s,application"
    back = trace_read(path, applications=APPS)
    assert back == trace
    # Without the application list, applications come in order of first appearance: same rows by name.
    default = trace_read(path)
    assert set(default.applications) == set(APPS)
    assert [default.applications[i] for i in default.application] == [APPS[i] for i in trace.application]


def test_csv_round_trip_with_deadlines(tmp_path: Path) -> None:
    trace = trace_of([0.0, 0.1, 1 / 3, 7.25], [0, 1, 2, 0]).with_deadlines({"resnet": 75.0, "yolo": 12.5})
    path = tmp_path / "trace.csv"
    trace_write(trace, path)
    lines = path.read_text().splitlines()
    assert lines[0] == "time_s,application,deadline_ms"
    assert lines[2] == "0.1,bert,"  # no deadline: empty field
    assert trace_read(path, applications=APPS) == trace


def test_csv_round_trip_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    trace_write(Trace(np.zeros(0), np.zeros(0, dtype=np.int32), ("a",)), path)
    back = trace_read(path)
    assert len(back) == 0 and back.applications == ()
    assert trace_read(path, applications=["a"]) == Trace(np.zeros(0), np.zeros(0, dtype=np.int32), ("a",))


def test_csv_read_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "_READ_CHUNK_LINES", 7)
    trace = trace_for_applications("poisson", APPS, 100, 1, seed=2, deadline_ms={"bert": 9.0})
    path = tmp_path / "trace.csv"
    trace_write(trace, path)
    assert trace_read(path, applications=APPS) == trace
    # An unsorted time right at a chunk boundary (row 8 = line 9 follows line 8, the last of chunk one).
    lines = path.read_text().splitlines()
    lines[8] = "0.0" + lines[8][lines[8].index(","):]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"line 9: time_s '0.0' is before") as info:
        trace_read(path)
    assert info.value.line == 9


def test_csv_accepts_crlf_and_no_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(b"time_s,application\r\n0.5,a\r\n1.5,b")
    trace = trace_read(path)
    assert trace.time_s.tolist() == [0.5, 1.5] and trace.applications == ("a", "b")


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        ("", 1, "empty file"),
        ("time,app\n0,a\n", 1, "expected the header"),
        ("time_s,application\n0.5,a\n1.0\n", 3, "expected 2 fields"),
        ("time_s,application\n0.5,a\n\n1.0,a\n", 3, "empty line"),
        ("time_s,application\n0.5,a,3\n", 2, "got 3 field"),
        ("time_s,application\n0.5,a\nsoon,a\n", 3, "'soon' is not a number"),
        ("time_s,application\n0.5,a\n,a\n", 3, "'' is not a number"),
        ("time_s,application\n-0.5,a\n", 2, "negative"),
        ("time_s,application\n0.5,a\nnan,a\n", 3, "not finite"),
        ("time_s,application\n0.5,a\ninf,a\n", 3, "not finite"),
        ("time_s,application\n0.5,a\n2.0,a\n1.0,b\n", 4, "before the previous row's 2.0"),
        ("time_s,application\n0.5,a\n1.0,\n", 3, "empty"),
        ("time_s,application\n0.5,a\n1.0, b\n", 3, "whitespace"),
        ('time_s,application\n0.5,"a"\n', 2, "quote"),
        ("time_s,application,deadline_ms\n0.5,a,10\n1.0,a,-3\n", 3, "'-3' must be a positive number or empty"),
        ("time_s,application,deadline_ms\n0.5,a,\n1.0,a,soon\n", 3, "'soon' is not a number"),
        ("time_s,application,deadline_ms\n0.5,a,\n1.0,a,nan\n", 3, "'nan' must be a positive number or empty"),
        ("time_s,application,deadline_ms\n0.5,a\n", 2, "expected 3 fields"),
    ],
)
def test_csv_errors_name_the_line(tmp_path: Path, content: str, line: int, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        trace_read(path)
    assert info.value.line == line
    assert f"{path}: line {line}: " in str(info.value)
    assert isinstance(info.value, ValueError)


def test_csv_unknown_application_with_fixed_list(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,application\n0.5,resnet\n0.7,gpt\n")
    with pytest.raises(TraceFormatError, match="line 3: unknown application 'gpt'"):
        trace_read(path, applications=APPS)


def test_csv_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        trace_read(tmp_path / "missing.csv")


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False), max_size=40),
    data=st.data(),
)
def test_csv_round_trip_property(tmp_path_factory, gaps, data) -> None:
    times = np.cumsum(np.asarray(gaps, dtype=np.float64))
    apps = data.draw(st.lists(st.integers(0, 2), min_size=len(times), max_size=len(times)))
    deadlines = data.draw(
        st.none()
        | st.lists(
            st.floats(min_value=1e-3, max_value=1e9) | st.just(math.nan), min_size=len(times), max_size=len(times)
        )
    )
    trace = trace_of(times, apps, deadlines=deadlines)
    path = tmp_path_factory.mktemp("prop") / "trace.csv"
    trace_write(trace, path)
    assert trace_read(path, applications=APPS) == trace


# ----------------------------------------------------------------------------- generators


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_generators_are_deterministic_per_seed(kind: str) -> None:
    make = GENERATORS[kind]
    first, again, other = make(7), make(7), make(8)
    assert first == again
    assert len(first) > 0
    assert np.all(np.diff(first.time_s) >= 0) and first.time_s[0] >= 0 and first.time_s[-1] < 100
    if kind != "uniform":  # the uniform process has no randomness
        assert first != other


def test_generators_accept_numpy_seeds() -> None:
    assert arrivals_poisson(10, 10, np.random.SeedSequence(3)) == arrivals_poisson(10, 10, np.random.SeedSequence(3))
    assert len(arrivals_poisson(10, 10, np.random.default_rng(3))) > 0


def test_uniform_is_exact() -> None:
    trace = arrivals_uniform(10, 100)
    assert len(trace) == 1000
    assert np.allclose(np.diff(trace.time_s), 0.1)
    assert trace.total_rate_per_second().tolist() == [10.0] * 100
    assert len(arrivals_uniform(3, 1.0)) == 3  # 0, 1/3, 2/3
    assert len(arrivals_uniform(2.5, 1.0)) == 3  # 0, 0.4, 0.8


@pytest.mark.parametrize(
    ("make", "duration", "expected_rate", "tolerance"),
    [
        (lambda: arrivals_poisson(500, 2000, 1), 2000, 500, 0.01),
        (lambda: arrivals_gamma(500, 2000, 0.05, 1), 2000, 500, 0.03),
        (lambda: arrivals_gamma(500, 2000, 4.0, 1), 2000, 500, 0.01),
        (lambda: arrivals_macro_bursts(100, 400, 50, 0.2, 5000, 1), 5000, 100 * 0.8 + 400 * 0.2, 0.01),
        (lambda: arrivals_diurnal(300, 2880, 1, spikes=0), 2880, 300, 0.01),
        (lambda: arrivals_diurnal(300, 2880, 1, spikes=6), 2880, 300, 0.01),
        (lambda: arrivals_diurnal(300, 1000, 1, day_s=300, peak_to_trough=5), 1000, 300, 0.01),
    ],
)
def test_mean_rates_over_long_durations(make, duration: float, expected_rate: float, tolerance: float) -> None:
    trace = make()
    assert trace.time_s[-1] < duration
    assert len(trace) / duration == pytest.approx(expected_rate, rel=tolerance)


@pytest.mark.parametrize("shape", [0.05, 0.25, 1.0, 4.0])
def test_gamma_cv_is_one_over_sqrt_shape(shape: float) -> None:
    trace = arrivals_gamma(1000, 1000, shape, seed=3)
    gaps = np.diff(trace.time_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.05)
    assert 1 / gaps.mean() == pytest.approx(1000, rel=0.03)


def test_poisson_gaps_are_exponential() -> None:
    gaps = np.diff(arrivals_poisson(1000, 1000, seed=5).time_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)
    assert np.mean(gaps > 1e-3) == pytest.approx(math.exp(-1), abs=0.005)  # P(gap > mean) = 1/e


def test_macro_bursts_have_flat_low_and_high_periods() -> None:
    trace = arrivals_macro_bursts(100, 500, 20, 0.25, 2000, seed=2)
    rate = trace.total_rate_per_second(5.0)  # 4 bins per period: low, low, low, high
    per_phase = rate.reshape(-1, 4)
    assert per_phase[:, :3].mean() == pytest.approx(100, rel=0.02)
    assert per_phase[:, 3].mean() == pytest.approx(500, rel=0.02)


def test_step_curve_rate_and_windows() -> None:
    curve = StepCurve(1.0, 3.0, 10.0, 0.3)
    assert curve.rate(np.array([0.0, 6.9, 7.0, 9.99, 10.0, 17.5])).tolist() == [1, 1, 3, 3, 1, 3]
    assert curve.windows(25.0).tolist() == [0.0, 7.0, 10.0, 17.0, 20.0, 25.0]
    assert curve.mean_rate == pytest.approx(1.6)
    with pytest.raises(ValueError):
        StepCurve(3.0, 1.0, 10.0, 0.5)
    with pytest.raises(ValueError):
        StepCurve(1.0, 3.0, 10.0, 1.5)


def test_diurnal_curve_peak_to_trough_is_as_configured() -> None:
    for ratio in (1.0, 2.0, 3.0, 8.0):
        curve = rate_curve_diurnal(100, 1440, peak_to_trough=ratio, spikes=0)
        values = curve.rate(np.linspace(0, 1440, 200_001))
        assert values.max() / values.min() == pytest.approx(ratio, rel=1e-6)
        assert values.mean() == pytest.approx(100, rel=1e-4)
        assert curve.peak_to_trough == pytest.approx(ratio)
    curve = rate_curve_diurnal(100, 1440, peak_hour=15.0, spikes=0)
    grid = np.arange(1440.0)
    assert grid[np.argmax(curve.rate(grid))] == 900.0  # 15:00 of a 1440 s day
    assert grid[np.argmin(curve.rate(grid))] == 180.0  # 03:00


def test_diurnal_trace_peak_to_trough_is_as_configured() -> None:
    trace = arrivals_diurnal(500, 1440, seed=9, peak_to_trough=3.0, spikes=0)
    per_minute = trace.total_rate_per_second(60.0)  # 24 bins: one per compressed hour
    assert per_minute.size == 24
    # The 60 s bins around 15:00 and 03:00 average the cosine over +-30 s (attenuation < 0.1 %).
    assert per_minute[14:16].mean() / per_minute[2:4].mean() == pytest.approx(3.0 * 0.9963, rel=0.04)
    assert np.argmax(per_minute) in (14, 15) and np.argmin(per_minute) in (2, 3)


def test_diurnal_spikes_raise_the_rate_briefly() -> None:
    spike = Spike(at_s=500.0, height=2.0, rise_s=5.0, decay_s=20.0)
    curve = rate_curve_diurnal(200, 1440, spikes=[spike])
    assert curve.spikes == (spike,)
    top = curve.rate(np.array([505.0]))[0] / curve.base(np.array([505.0]))[0]
    assert top == pytest.approx(3.0)
    assert curve.rate(np.array([499.0]))[0] == pytest.approx(curve.base(np.array([499.0]))[0])
    assert curve.spike_factor(np.array([525.0]))[0] == pytest.approx(1 + 2 * math.exp(-1))
    trace = arrivals_diurnal(200, 1440, seed=1, spikes=[spike])
    per_second = trace.total_rate_per_second()
    baseline = per_second[400:480].mean()
    assert per_second[503:508].mean() > 2.4 * baseline
    assert len(trace) / 1440 == pytest.approx(200, rel=0.01)


def test_random_spikes_are_drawn_from_the_seed() -> None:
    first = rate_curve_diurnal(100, 1440, spikes=4, seed=11)
    assert first.spikes == rate_curve_diurnal(100, 1440, spikes=4, seed=11).spikes
    assert first.spikes != rate_curve_diurnal(100, 1440, spikes=4, seed=12).spikes
    assert len(first.spikes) == 4
    for spike in first.spikes:
        assert 0 <= spike.at_s < 1440 and 0.5 <= spike.height <= 2.0
        assert spike.rise_s == pytest.approx(0.004 * 1440) and 0.01 * 1440 <= spike.decay_s <= 0.03 * 1440


def test_diurnal_bound_is_an_upper_bound() -> None:
    curve = rate_curve_diurnal(100, 3000, peak_to_trough=4.0, spikes=8, seed=5)
    rng = np.random.default_rng(0)
    start = rng.uniform(0, 3000, 2000)
    end = start + rng.uniform(0, 30, 2000)
    bounds = curve.bound(start, end)
    for fraction in np.linspace(0, 1, 11):
        assert np.all(curve.rate(start + fraction * (end - start)) <= bounds * (1 + 1e-12))


def test_thinning_matches_a_known_curve() -> None:
    class Linear:  # lambda(t) = t: expected count t^2 / 2
        def rate(self, t):
            return np.asarray(t, dtype=float)

        def windows(self, duration_s):
            return np.linspace(0, duration_s, 11)

        def bound(self, start, end):
            return np.asarray(end, dtype=float)

    trace = arrivals_from_rate_curve(Linear(), 200.0, seed=3)
    assert len(trace) == pytest.approx(200**2 / 2, rel=0.02)
    assert len(trace.slice(0, 100)) == pytest.approx(100**2 / 2, rel=0.03)


def test_thinning_refuses_a_curve_above_its_bound() -> None:
    class Lying:
        def rate(self, t):
            return np.full(np.shape(t), 10.0)

        def windows(self, duration_s):
            return np.array([0.0, duration_s])

        def bound(self, start, end):
            return np.full(np.shape(start), 5.0)

    with pytest.raises(ValueError, match="exceeds its own bound"):
        arrivals_from_rate_curve(Lying(), 10.0, seed=1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: arrivals_poisson(0, 10),
        lambda: arrivals_poisson(10, -1),
        lambda: arrivals_uniform(math.inf, 10),
        lambda: arrivals_gamma(10, 10, 0),
        lambda: arrivals_macro_bursts(10, 5, 10, 0.5, 10),
        lambda: arrivals_macro_bursts(1, 5, 0, 0.5, 10),
        lambda: arrivals_diurnal(10, 10, peak_to_trough=0.5),
        lambda: arrivals_diurnal(10, 10, spikes=-1),
        lambda: arrivals_diurnal(10, 10, peak_hour=24),
        lambda: arrivals_poisson(1e9, 1e9),
        lambda: DiurnalCurve(1.0, 1.0, 10.0, 0.0),
        lambda: Spike(0.0, 1.0, 0.0, 1.0),
    ],
)
def test_generators_reject_bad_parameters(make) -> None:
    with pytest.raises(ValueError):
        make()


# ----------------------------------------------------------------------------- Zipf and applications


def test_zipf_shares() -> None:
    shares = zipf_shares(4, 1.0)
    harmonic = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert shares.tolist() == pytest.approx([1 / harmonic, 1 / 2 / harmonic, 1 / 3 / harmonic, 1 / 4 / harmonic])
    assert zipf_shares(3, 0.0).tolist() == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError):
        zipf_shares(0)
    with pytest.raises(ValueError):
        zipf_shares(3, -1.0)


@pytest.mark.parametrize("alpha", [1.001, 0.5, 2.0])
def test_split_zipf_shares_follow_alpha(alpha: float) -> None:
    base = arrivals_poisson(2000, 500, seed=1)
    split = split_zipf(base, ["a", "b", "c", "d", "e"], alpha=alpha, seed=2)
    assert np.array_equal(split.time_s, base.time_s)
    counts = split.counts()
    assert counts["a"] / counts["b"] == pytest.approx(2**alpha, rel=0.02)
    assert counts["a"] / counts["c"] == pytest.approx(3**alpha, rel=0.03)
    expected = zipf_shares(5, alpha)
    observed = np.array(list(counts.values())) / len(split)
    assert observed == pytest.approx(expected, abs=0.003)


def test_split_zipf_of_a_total_and_determinism() -> None:
    split = split_zipf(100.0, ["a", "b"], alpha=1.0)
    assert split == pytest.approx({"a": 200 / 3, "b": 100 / 3})
    base = arrivals_uniform(100, 10)
    assert split_zipf(base, APPS, seed=3) == split_zipf(base, APPS, seed=3)
    assert split_zipf(base, APPS, seed=3) != split_zipf(base, APPS, seed=4)
    with pytest.raises(ValueError):
        split_zipf(base, ["a", "a"])
    with pytest.raises(ValueError):
        split_zipf(-1.0, ["a"])


def test_split_zipf_keeps_deadlines() -> None:
    base = arrivals_uniform(10, 1).with_deadlines(30.0)
    assert split_zipf(base, APPS, seed=1).deadline_ms.tolist() == [30.0] * 10


@pytest.mark.parametrize("kind", workload.KINDS)
def test_trace_for_applications_every_kind(kind: str) -> None:
    trace = trace_for_applications(kind, APPS, 400, 600, seed=1)
    assert trace.applications == APPS
    assert len(trace) / 600 == pytest.approx(400, rel=0.1)
    counts = trace.counts()
    assert counts["resnet"] > counts["bert"] > counts["yolo"]


def test_trace_for_applications_independent_streams() -> None:
    trace = trace_for_applications("gamma", APPS, 600, 1000, seed=2, independent=True, shape=0.5)
    counts = trace.counts()
    expected = zipf_shares(3) * 600 * 1000
    assert [counts[n] for n in APPS] == pytest.approx(expected.tolist(), rel=0.03)
    assert np.all(np.diff(trace.time_s) >= 0)


def test_trace_for_applications_params_and_deadlines() -> None:
    trace = trace_for_applications(
        "macro-bursts", ["a"], 100, 400, seed=1, burst_factor=9.0, period_s=40.0, high_fraction=0.5, deadline_ms={"a": 40.0}
    )
    per_phase = trace.total_rate_per_second(20.0).reshape(-1, 2)  # low 20 qps, then high 180 qps
    assert per_phase[:, 1].mean() / per_phase[:, 0].mean() == pytest.approx(9.0, rel=0.1)
    assert len(trace) / 400 == pytest.approx(100, rel=0.05)
    assert np.all(trace.deadline_ms == 40.0)
    with pytest.raises(ValueError, match="unknown trace kind"):
        trace_for_applications("bursty", APPS, 1, 1)
    with pytest.raises(ValueError, match="do not apply"):
        trace_for_applications("poisson", APPS, 1, 1, shape=0.1)
    with pytest.raises(ValueError, match="at least one"):
        trace_for_applications("poisson", [], 1, 1)
    with pytest.raises(ValueError, match="alpha"):
        trace_for_applications("poisson", APPS, 1, 1, zipf_alpha=-2)


# ----------------------------------------------------------------------------- CLI

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_cli_generate_and_show(tmp_path: Path) -> None:
    out = tmp_path / "trace.csv"
    result = run(
        "trace", "generate", "--kind", "gamma", "--rate", "200", "--duration", "120", "--shape", "0.05",
        "--applications", "resnet,bert,yolo", "--zipf-alpha", "1.001", "--seed", "3", "--out", str(out),
    )
    assert result.exit_code == 0, result.output
    trace = trace_read(out, applications=APPS)
    assert trace == trace_for_applications("gamma", APPS, 200, 120, 3, shape=0.05)
    lines = result.stdout.splitlines()
    assert lines[0] == f"trace        {out} (written)"
    assert lines[1] == f"queries      {len(trace)}"
    assert any(line.startswith("mean rate") for line in lines)
    assert any(line.startswith("peak 1 s") for line in lines)
    assert "applications 3" in lines
    assert any(line.split()[0] == "resnet" and line.split()[1].endswith("%") for line in lines)
    shown = run("trace", "show", str(out))
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[1:] == lines[1:]  # same summary, apart from written/read


@pytest.mark.parametrize(
    "extra",
    [
        ["--kind", "uniform"],
        ["--kind", "poisson", "--deadline-ms", "80"],
        ["--kind", "macro-bursts", "--burst-factor", "5", "--period", "20", "--high-fraction", "0.2"],
        ["--kind", "diurnal", "--peak-to-trough", "3", "--spikes", "2", "--day", "60"],
        ["--kind", "poisson", "--independent", "--applications", "a,b"],
    ],
)
def test_cli_generate_kinds(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "t.csv"
    result = run("trace", "generate", "--rate", "50", "--duration", "60", "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    assert len(trace_read(out)) > 0
    if "--deadline-ms" in extra:
        assert "deadlines    " in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "bursty", "--rate", "1", "--duration", "1"], "--kind must be one of"),
        (["--kind", "poisson", "--rate", "0", "--duration", "1"], "--rate must be a positive number"),
        (["--kind", "poisson", "--rate", "1", "--duration", "-5"], "--duration must be a positive number"),
        (["--kind", "poisson", "--rate", "1", "--duration", "1", "--shape", "0.1"], "--shape applies to --kind gamma only"),
        (["--kind", "gamma", "--rate", "1", "--duration", "1", "--shape", "0"], "shape must be a positive number"),
        (["--kind", "poisson", "--rate", "1", "--duration", "1", "--applications", "a,,b"], "--applications"),
        (["--kind", "poisson", "--rate", "1", "--duration", "1", "--applications", "a,a"], "duplicate"),
        (["--kind", "poisson", "--rate", "1", "--duration", "1", "--zipf-alpha", "-1"], "alpha"),
        (["--kind", "poisson", "--rate", "1e9", "--duration", "1e9"], "limit"),
    ],
)
def test_cli_generate_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = run("trace", "generate", "--out", str(tmp_path / "t.csv"), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "t.csv").exists()


def test_cli_show_malformed_or_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,application\n0.5,a\n0.2,a\n")
    result = run("trace", "show", str(bad))
    assert result.exit_code == 2
    assert f"{bad}: line 3: time_s '0.2' is before the previous row's 0.5" in result.output
    missing = run("trace", "show", str(tmp_path / "missing.csv"))
    assert missing.exit_code == 2
    assert "cannot read" in missing.output
