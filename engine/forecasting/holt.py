"""Short-term demand forecasting for re-planning (pure Python, no Django).

Method: Holt's linear exponential smoothing (level + trend), optionally with a damped trend (Gardner &
McKenzie, 1985), on a series of per-step rates (normally arrivals per second, one value per second).
With observation y_t::

    level  l_t = alpha * y_t + (1 - alpha) * (l_{t-1} + phi * b_{t-1})
    trend  b_t = beta * (l_t - l_{t-1}) + (1 - beta) * phi * b_{t-1}
    forecast h steps ahead: l_t + (phi + phi^2 + ... + phi^h) * b_t       (clamped at 0)

Why this method: the planner needs the demand a rollout's time ahead (tens of seconds); the data are
noisy per-second Poisson counts on top of a slow diurnal swing with short spikes (see
`workload.rate_curve_diurnal`) or a sustained ramp (a launch, traffic failing over from elsewhere); the
estimate must be cheap (the watch runs every few seconds for every application) and explainable. A level
+ trend model follows a ramp that a moving average or the recent peak lags behind. Seasonal models need
days of history and a day length the control plane does not know. The forecast is not used alone:
`apps.planning.demand` plans for max(peak of the recent window, forecast). The recent peak covers the
noise and the forecast's smoothing; the forecast adds what the peak cannot see, a rise still under way.

The papers: Proteus (ASPLOS'24, §3 and §4) does not forecast: its resource manager re-plans periodically
on observed demand and when a load balancer reports a burst. The Razavi thesis forecasts with an LSTM
(one 25-unit layer and a dense output) that predicts the maximum load of the next 10-20 s from per-second
loads: IPA §P3.3 "Predictor" (2 minutes of history, trained on two weeks of the Twitter trace; its
benefit in §P3.5.5, Figure P3.16) and Biscale §P4.5.1.3 "When" (the next 10 s, to decide when to switch
from vertical to horizontal scaling). Departure: Holt's method needs no training data or training step,
and max(recent peak, forecast) stands in for the thesis's predicted maximum.

Parameters (per one-second step), chosen with `benches/forecast.py` (compressed-day diurnal trace and
ramps, 50 and 500 requests per second, 60 s of history): `alpha` 0.1 (level: about 10 s of memory, which
averages the Poisson noise of per-second counts, 14 % at 50 requests per second), `beta` 0.05 (trend:
about 20 s of memory; 0.1 follows ramps a little better and overshoots spikes much more), `phi` 1 (no
damping). Damping is the better point forecast on the diurnal trace (phi 0.98: about 13 % against 17 %
MAPE 30 s ahead, at 50 rps, against the true rate) because an undamped trend extrapolates a spike's rise;
but inside max(peak, forecast) that overshoot only costs capacity (about 1 to 2 % more at 30 s on the
diurnal trace) while the undamped trend is what covers a ramp (500 rps ramp, 30 s ahead: 85 % of
seconds covered against 76 % damped). `phi` < 1 is there for callers that want the point forecast.
With another `step_s` the smoothing constants are converted so that the memory in seconds stays the
same (`HoltParams.for_step`).

Robustness: missing values (None, NaN, +-inf) are gaps: the state advances one step without an
observation (the level follows the damped trend); negative values are clamped to 0; an empty series (or
one of only gaps) forecasts 0, a single value forecasts itself. The initial level is the mean of the first
few observations and the initial trend is 0, so a short series forecasts about its mean, and the trend
is only learnt from the data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "DEFAULT_PHI",
    "HoltParams",
    "HoltState",
    "forecast_fit_predict",
    "holt_fit",
    "peak_forecast_estimate",
]

DEFAULT_ALPHA = 0.1
DEFAULT_BETA = 0.05
DEFAULT_PHI = 1.0
# The initial level is the mean of (at most) this many first observations.
INIT_POINTS = 3


def _check_unit(value: float, what: str, *, low_open: bool = True) -> float:
    value = float(value)
    if not math.isfinite(value) or value > 1 or value < 0 or (low_open and value == 0):
        bound = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{what} must be in {bound}, got {value!r}")
    return value


@dataclass(frozen=True)
class HoltParams:
    """Smoothing constants per step: `alpha` (level) and `beta` (trend) in (0, 1], `phi` (trend damping)
    in [0, 1]; phi = 1 is Holt's undamped linear trend, phi = 0 no trend at all (simple exponential
    smoothing)."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    phi: float = DEFAULT_PHI

    def __post_init__(self) -> None:
        _check_unit(self.alpha, "alpha")
        _check_unit(self.beta, "beta")
        _check_unit(self.phi, "phi", low_open=False)

    def for_step(self, step_s: float) -> "HoltParams":
        """The constants for steps of `step_s` seconds that keep the same memory in seconds as these
        (which are per one-second step): 1 - (1 - a)^step_s, and phi^step_s."""
        step_s = float(step_s)
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s must be a positive number, got {step_s!r}")
        if step_s == 1.0:
            return self
        return HoltParams(
            alpha=1 - (1 - self.alpha) ** step_s,
            beta=1 - (1 - self.beta) ** step_s,
            phi=self.phi ** step_s,
        )


@dataclass
class HoltState:
    """The smoothed level and trend after `observations` values (and `steps` steps, gaps included)."""

    params: HoltParams
    level: float = 0.0
    trend: float = 0.0
    observations: int = 0
    steps: int = 0

    def _damped_steps(self, h: float) -> float:
        """phi + phi^2 + ... + phi^h (h may be fractional)."""
        phi = self.params.phi
        if h <= 0:
            return 0.0
        if phi >= 1.0:
            return h
        return phi * (1 - phi ** h) / (1 - phi)

    def update(self, value: Optional[float]) -> None:
        """One step: an observation, or a gap (None / NaN / inf)."""
        self.steps += 1
        y = _clean(value)
        a, b, phi = self.params.alpha, self.params.beta, self.params.phi
        if y is None:
            if self.observations:
                self.level = max(self.level + phi * self.trend, 0.0)
                self.trend *= phi
            return
        if self.observations == 0:
            self.level, self.trend = y, 0.0
        elif self.observations < INIT_POINTS:
            # Warm-up: the level is the running mean of the first observations; no trend yet.
            n = self.observations
            self.level = (self.level * n + y) / (n + 1)
        else:
            previous = self.level
            self.level = a * y + (1 - a) * (previous + phi * self.trend)
            self.trend = b * (self.level - previous) + (1 - b) * phi * self.trend
        self.observations += 1

    def predict(self, steps_ahead: float) -> float:
        """The forecast `steps_ahead` steps after the last one (0: the current level), never negative."""
        if not self.observations:
            return 0.0
        steps_ahead = max(float(steps_ahead), 0.0)
        return max(self.level + self._damped_steps(steps_ahead) * self.trend, 0.0)


def _clean(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    try:
        y = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(y):
        return None
    return y if y > 0 else 0.0


def holt_fit(series: Iterable[Optional[float]], params: HoltParams | None = None) -> HoltState:
    """The Holt state after smoothing `series` (oldest first) with `params` (per step)."""
    state = HoltState(params=params or HoltParams())
    for value in series:
        state.update(value)
    return state


def forecast_fit_predict(
    series: Sequence[Optional[float]],
    horizon_s: float,
    step_s: float = 1.0,
    *,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    phi: float = DEFAULT_PHI,
) -> float:
    """The rate expected `horizon_s` seconds after the last value of `series`, a sequence of rates (e.g.
    arrivals per second) one every `step_s` seconds, oldest first. `alpha`, `beta` and `phi` are per
    one-second step whatever `step_s` is (see `HoltParams.for_step`). Gaps and short series: see the
    module docstring."""
    horizon_s = float(horizon_s)
    if not (math.isfinite(horizon_s) and horizon_s >= 0):
        raise ValueError(f"horizon_s must be a non-negative number, got {horizon_s!r}")
    params = HoltParams(alpha=alpha, beta=beta, phi=phi).for_step(step_s)
    return holt_fit(series, params).predict(horizon_s / float(step_s))


def peak_forecast_estimate(series: Sequence[Optional[float]], horizon_s: float) -> tuple[float, float, float]:
    """The demand a plan is sized for from a window of per-second rates, oldest first: (peak of the window,
    Holt forecast `horizon_s` ahead (0: the smoothed level now), max of the two). The one estimate of the live
    control loop (apps.planning.demand) and the simulator's "peak" demand estimate. Gaps are skipped for the
    peak; an empty or all-gap window gives zeros."""
    values = [v for v in (_clean(x) for x in series) if v is not None]
    if not values:
        return 0.0, 0.0, 0.0
    peak = max(values)
    forecast = forecast_fit_predict(series, horizon_s)
    return peak, forecast, max(peak, forecast)
