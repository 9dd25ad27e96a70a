"""The short-term demand forecast (engine/forecasting/holt.py): Holt's level + trend on known series
(constant, linear ramp, step), gaps, zeros and short series, parameter checks, and a smoke run of
benches/forecast.py."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine.forecasting.holt import HoltParams, forecast_fit_predict, holt_fit, peak_forecast_estimate

REPO = Path(__file__).resolve().parents[2]


def test_constant_series_forecasts_the_constant_at_every_horizon():
    series = [40.0] * 120
    for horizon in (0, 1, 10, 60, 600):
        assert forecast_fit_predict(series, horizon) == pytest.approx(40.0)


def test_linear_ramp_is_extrapolated_along_its_slope():
    slope = 2.0
    series = [100.0 + slope * t for t in range(300)]
    last = series[-1]
    for horizon in (10, 30, 60):
        assert forecast_fit_predict(series, horizon) == pytest.approx(last + slope * horizon, rel=0.01)


def test_damped_trend_extrapolates_less_than_the_line_and_more_than_the_last_value():
    series = [100.0 + 2.0 * t for t in range(300)]
    damped = forecast_fit_predict(series, 60, phi=0.95)
    assert series[-1] < damped < series[-1] + 2.0 * 60


def test_falling_ramp_is_clamped_at_zero():
    series = [max(0.0, 100.0 - 5.0 * t) for t in range(15)]  # 100 down to 30
    assert forecast_fit_predict(series, 60) == 0.0


def test_step_up_is_followed_within_its_memory():
    series = [50.0] * 100 + [150.0] * 60
    assert forecast_fit_predict(series, 0) == pytest.approx(150.0, rel=0.05)
    # Shortly after the step the level is between the two and the trend points up.
    state = holt_fit([50.0] * 100 + [150.0] * 3)
    assert 50.0 < state.level < 150.0 and state.trend > 0
    assert state.predict(30) > state.level


def test_noise_is_smoothed():
    series = [100.0 + (10.0 if t % 2 else -10.0) for t in range(200)]
    assert forecast_fit_predict(series, 10) == pytest.approx(100.0, abs=3.0)


@pytest.mark.parametrize("series, expected", [([], 0.0), ([None, float("nan")], 0.0), ([7.0], 7.0), ([4.0, 6.0], 5.0), ([0.0] * 10, 0.0)])
def test_short_and_empty_series(series, expected):
    assert forecast_fit_predict(series, 30) == pytest.approx(expected)


def test_gaps_advance_the_state_without_an_observation():
    ramp = [10.0 + t for t in range(200)]
    with_gaps = [None if t % 7 == 3 else v for t, v in enumerate(ramp)]
    with_gaps[-5:-1] = [float("nan"), None, float("inf"), None]
    assert forecast_fit_predict(with_gaps, 10) == pytest.approx(forecast_fit_predict(ramp, 10), rel=0.02)
    state = holt_fit([20.0] * 50 + [None] * 10)
    assert state.observations == 50 and state.steps == 60 and state.predict(0) == pytest.approx(20.0)


def test_negative_values_count_as_zero():
    assert forecast_fit_predict([-5.0] * 20, 10) == 0.0
    assert forecast_fit_predict([10.0, -3.0, 10.0] * 20, 0) == pytest.approx(forecast_fit_predict([10.0, 0.0, 10.0] * 20, 0))


def test_step_s_keeps_the_memory_in_seconds():
    per_second = [100.0 + 1.0 * t for t in range(300)]
    per_five = [sum(per_second[i:i + 5]) / 5 for i in range(0, 300, 5)]  # 5-second means, at their middles
    # The 5 s series' last value is the mean of seconds 295..299 (297): the forecast from there.
    assert forecast_fit_predict(per_five, 30, step_s=5.0) == pytest.approx(per_second[-1] - 2 + 30, rel=0.02)
    params = HoltParams(alpha=0.1, beta=0.05, phi=0.9).for_step(2.0)
    assert params.alpha == pytest.approx(1 - 0.9 ** 2) and params.phi == pytest.approx(0.81)


@pytest.mark.parametrize("kwargs", [{"alpha": 0}, {"alpha": 1.5}, {"beta": -0.1}, {"phi": 1.01}, {"alpha": math.nan}])
def test_parameters_are_checked(kwargs):
    with pytest.raises(ValueError):
        forecast_fit_predict([1.0, 2.0], 10, **kwargs)


def test_horizon_and_step_are_checked():
    with pytest.raises(ValueError):
        forecast_fit_predict([1.0], -1)
    with pytest.raises(ValueError):
        forecast_fit_predict([1.0], 10, step_s=0)


@pytest.mark.timeout(60)
def test_forecast_bench_quick(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benches" / "forecast.py"), "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=55,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with (tmp_path / "forecast.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["scenario"] for r in rows} == {"diurnal", "ramp"}
    assert {r["horizon_s"] for r in rows} == {"10", "30", "60"}
    assert {"last", "window peak", "holt", "max(peak, holt)"} <= {r["predictor"] for r in rows}
    for r in rows:
        assert 0.0 <= float(r["coverage"]) <= 1.0 and float(r["mape_true"]) >= 0.0
    # The peak (and so the planner's max) covers at least as many seconds as the forecast alone.
    by = {(r["scenario"], r["horizon_s"], r["predictor"]): float(r["coverage"]) for r in rows}
    for scenario in ("diurnal", "ramp"):
        for h in ("10", "30", "60"):
            assert by[(scenario, h, "max(peak, holt)")] >= max(by[(scenario, h, "holt")], by[(scenario, h, "window peak")])
    assert (tmp_path / "forecast.png").exists() or "PNG skipped" in result.stdout


def test_peak_forecast_estimate_is_the_larger_of_the_window_peak_and_the_forecast() -> None:
    flat = [10.0, 30.0, 10.0, 10.0]
    peak, forecast, estimate = peak_forecast_estimate(flat, 5.0)
    assert peak == 30.0 and forecast == pytest.approx(forecast_fit_predict(flat, 5.0)) and estimate == 30.0
    ramp = [float(10 * k) for k in range(60)]
    peak, forecast, estimate = peak_forecast_estimate(ramp, 30.0)
    assert peak == 590.0 and forecast > peak and estimate == forecast
    assert peak_forecast_estimate([], 10.0) == (0.0, 0.0, 0.0)
    assert peak_forecast_estimate([None, float("nan")], 10.0) == (0.0, 0.0, 0.0)
