#!/usr/bin/env python
"""Demand forecasting for re-planning: how well the Holt forecast (engine/forecasting/holt.py), and
what the planner is sized on, max(peak of the last W s, forecast), predict the per-second demand 10, 30
and 60 s ahead, against two naive predictors. No paper figure: the Razavi thesis's predictor is an LSTM
(IPA §P3.5.5, Figure P3.16; Biscale §P4.5.1.3, Figure P4.5), which this bench does not run. A script,
not a test (its smoke run is tests/planning/test_forecast.py).

    .venv/bin/python benches/forecast.py            # full run (a few seconds)
    .venv/bin/python benches/forecast.py --quick    # smoke run: one trace per scenario
    options: --out DIR (default bench-results), --seeds N (default 3), --rates 50,500, --window W (default 60)

Writes DIR/forecast.csv (one row per scenario, mean rate, horizon and predictor, averaged over the seeds)
and DIR/forecast.png (needs matplotlib).

Scenarios, each at mean rates R (default 50 and 500 requests per second) and seeds 0..N-1:

- diurnal: `workload.rate_curve_diurnal(R, 1440 s, seed=rng)` then `arrivals_from_rate_curve` with the same
  `default_rng(seed)` (exactly what `arrivals_diurnal(R, 1440, seed)` draws: a day compressed into 1440 s,
  peak-to-trough 2, three random spikes), binned into per-second counts.
- ramp: a sustained rise (a launch, or traffic failing over from elsewhere): R for 300 s, then linear to
  3 R over 60, 180 or 300 s (seed 0, 1, 2, cycling), then flat; 900 s. Per-second counts are drawn
  directly, Poisson(lambda(t + 0.5)).

At every second t from W-1 on, each predictor sees the counts y[..t] and predicts y[t+h]:

- last:               y[t]
- window peak:        max(y[t-W+1..t])
- holt:               forecast_fit_predict(y[t-W+1..t], h) with the default parameters (alpha 0.1, beta
                      0.05, no damping), fitted on the same W s that demand_for_planning fits on
- holt φ=0.98:        the same with a damped trend (the better point forecast on the diurnal trace)
- max(peak, holt):    what apps.planning.demand.demand_for_planning plans for
- max(peak, holt φ=0.98): the same with the damped forecast, to show what the damping trades

Columns: MAPE against the observed count y[t+h] (seconds with y[t+h] > 0) and against the true rate
lambda(t+h) (the Poisson noise of one second's count is a floor no predictor beats against the observed
count: about 1/sqrt(R)); coverage = the fraction of seconds where the prediction >= y[t+h] (1 - coverage is
the under-provisioning risk of sizing on the prediction), and the same against lambda(t+h); over =
mean(prediction) / mean(y[t+h]) - 1, the capacity the prediction costs.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere, installed or not
    sys.path.insert(0, str(REPO))

from _common import PNG_SKIPPED, csv_rows_write, figure_write, pyplot_load  # noqa: E402

from engine.forecasting.holt import HoltParams, holt_fit  # noqa: E402
from engine.simulation.workload import arrivals_from_rate_curve, rate_curve_diurnal  # noqa: E402

DAY_S = 1440.0
RAMP_S = (900, 300, (60, 180, 300), 3.0)  # duration, start of the rise, rise durations by seed, factor
HORIZONS = (10, 30, 60)
SCENARIOS = ("diurnal", "ramp")
DAMPED_PHI = 0.98
PREDICTORS = ("last", "window peak", "holt", "holt φ=0.98", "max(peak, holt)", "max(peak, holt φ=0.98)")
CSV_FIELDS = ("scenario", "mean_rps", "horizon_s", "predictor", "window_s", "seeds", "points", "mape_observed", "mape_true",
              "coverage", "coverage_true", "over", "alpha", "beta", "phi")


def diurnal_series(mean_rps: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-second arrival counts of the compressed day, and the curve's rate at each second's middle."""
    rng = np.random.default_rng(seed)
    curve = rate_curve_diurnal(mean_rps, DAY_S, seed=rng)
    trace = arrivals_from_rate_curve(curve, DAY_S, rng)
    counts = trace.total_rate_per_second().astype(np.float64)
    true_rate = curve.rate(np.arange(len(counts), dtype=np.float64) + 0.5)
    return counts, true_rate


def ramp_series(rate_rps: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    duration, start, rises, factor = RAMP_S
    rise = rises[seed % len(rises)]
    t = np.arange(duration, dtype=np.float64) + 0.5
    true_rate = rate_rps * (1 + (factor - 1) * np.clip((t - start) / rise, 0.0, 1.0))
    counts = np.random.default_rng(seed).poisson(true_rate).astype(np.float64)
    return counts, true_rate


def predictions(counts: np.ndarray, window: int, params: HoltParams) -> dict[str, dict[int, np.ndarray]]:
    """predictions[name][h][i]: the prediction made at second t = window - 1 + i for second t + h."""
    ts = np.arange(window - 1, len(counts))
    damped = HoltParams(params.alpha, params.beta, DAMPED_PHI)
    holt = {h: np.empty(len(ts)) for h in HORIZONS}
    holt_d = {h: np.empty(len(ts)) for h in HORIZONS}
    for i, t in enumerate(ts):
        history = counts[t - window + 1:t + 1].tolist()
        state, state_d = holt_fit(history, params), holt_fit(history, damped)
        for h in HORIZONS:
            holt[h][i] = state.predict(h)
            holt_d[h][i] = state_d.predict(h)
    peaks = np.lib.stride_tricks.sliding_window_view(counts, window).max(axis=1)
    last = counts[ts]
    return {
        "last": {h: last for h in HORIZONS},
        "window peak": {h: peaks for h in HORIZONS},
        "holt": holt,
        "holt φ=0.98": holt_d,
        "max(peak, holt)": {h: np.maximum(peaks, holt[h]) for h in HORIZONS},
        "max(peak, holt φ=0.98)": {h: np.maximum(peaks, holt_d[h]) for h in HORIZONS},
    }


def scores(pred: np.ndarray, actual: np.ndarray, true_rate: np.ndarray) -> dict[str, float]:
    seen = actual > 0
    return {
        "mape_observed": float(np.mean(np.abs(pred[seen] - actual[seen]) / actual[seen])),
        "mape_true": float(np.mean(np.abs(pred - true_rate) / true_rate)),
        "coverage": float(np.mean(pred >= actual)),
        "coverage_true": float(np.mean(pred >= true_rate)),
        "over": float(np.mean(pred) / np.mean(actual) - 1.0),
        "points": int(len(actual)),
    }


def run(rates: list[float], seeds: list[int], window: int, params: HoltParams) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    sums: dict[tuple[str, float, int, str], dict[str, float]] = {}
    examples: dict[str, Any] = {}
    for scenario in SCENARIOS:
        make = diurnal_series if scenario == "diurnal" else ramp_series
        for rate in rates:
            for seed in seeds:
                counts, true_rate = make(rate, seed)
                preds = predictions(counts, window, params)
                t0 = window - 1
                for h in HORIZONS:
                    m = len(counts) - t0 - h  # predictions whose target second is inside the trace
                    actual, truth = counts[t0 + h:t0 + h + m], true_rate[t0 + h:t0 + h + m]
                    for name in PREDICTORS:
                        acc = sums.setdefault((scenario, rate, h, name), {"points": 0})
                        for k, v in scores(preds[name][h][:m], actual, truth).items():
                            acc[k] = acc.get(k, 0.0) + (v if k == "points" else v / len(seeds))
                examples.setdefault(scenario, {"rate": rate, "seed": seed, "counts": counts, "true_rate": true_rate,
                                               "preds": preds, "t0": t0})
    rows = [
        {"scenario": scenario, "mean_rps": rate, "horizon_s": h, "predictor": name, "window_s": window, "seeds": len(seeds),
         "alpha": params.alpha, "beta": params.beta, "phi": DAMPED_PHI if "φ=" in name else params.phi, **acc}
        for (scenario, rate, h, name), acc in sums.items()
    ]
    return rows, examples


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'scenario':<8} {'rate':>5} {'h s':>4} {'predictor':<22} {'MAPE obs %':>10} {'MAPE true %':>11} "
             f"{'cover obs %':>11} {'cover true %':>12} {'over %':>7}"]
    previous = None
    for r in rows:
        key = (r["scenario"], r["mean_rps"], r["horizon_s"])
        if previous is not None and key != previous:
            lines.append("")
        previous = key
        lines.append(
            f"{r['scenario']:<8} {r['mean_rps']:>5g} {r['horizon_s']:>4} {r['predictor']:<22} {100 * r['mape_observed']:>10.1f} "
            f"{100 * r['mape_true']:>11.1f} {100 * r['coverage']:>11.1f} {100 * r['coverage_true']:>12.1f} {100 * r['over']:>+7.1f}"
        )
    return lines


def plot(rows: list[dict[str, Any]], examples: dict[str, Any], window: int, path: Path) -> str:
    plt = pyplot_load()
    if plt is None:
        return PNG_SKIPPED.format(name=path.name)
    fig, axes = plt.subplots(2, 2, figsize=(15, 8.5), gridspec_kw={"width_ratios": [2.2, 1]})
    h = 30
    for row, scenario in enumerate(SCENARIOS):
        ex = examples[scenario]
        counts, true_rate, t0 = ex["counts"], ex["true_rate"], ex["t0"]
        ax = axes[row][0]
        seconds = np.arange(len(counts))
        ax.plot(seconds, counts, color="0.75", lw=0.6, label="observed (per second)")
        ax.plot(seconds, true_rate, color="black", lw=1.0, label="true rate")
        targets = np.arange(t0 + h, len(counts))
        for name, colour in (("holt", "tab:blue"), ("max(peak, holt)", "tab:red")):
            ax.plot(targets, ex["preds"][name][h][:len(targets)], color=colour, lw=0.9, label=f"{name}, made {h} s before")
        ax.set_xlabel("trace second")
        ax.set_ylabel("arrivals / s")
        ax.set_title(f"{scenario}: mean {ex['rate']:g} rps, seed {ex['seed']}, window {window} s", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[row][1]
        markers = {"last": "o", "window peak": "s", "holt": "^", "holt φ=0.98": "<", "max(peak, holt)": "D", "max(peak, holt φ=0.98)": "v"}
        rates = sorted({r["mean_rps"] for r in rows})
        for name in PREDICTORS:
            for rate, style in zip(rates, ("-", "--", ":")):
                rs = sorted((r for r in rows if r["scenario"] == scenario and r["predictor"] == name and r["mean_rps"] == rate),
                            key=lambda r: r["horizon_s"])
                ax.plot([100 * r["over"] for r in rs], [100 * (1 - r["coverage"]) for r in rs], style, marker=markers[name],
                        color=f"C{PREDICTORS.index(name)}", label=f"{name}, {rate:g} rps")
        ax.set_xlabel("over-provisioning: mean prediction / mean actual - 1 (%)")
        ax.set_ylabel("under-provisioned seconds (%)")
        ax.set_title(f"{scenario}: horizons {', '.join(map(str, HORIZONS))} s (further ahead: higher)", fontsize=9)
        ax.legend(fontsize=6)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    return figure_write(plt, fig, path, "Demand forecast for re-planning (benches/forecast.py)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one trace per scenario (50 rps, seed 0): a smoke run")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results")
    parser.add_argument("--seeds", type=int, default=3, help="traces per scenario and rate, seeds 0..N-1 (default 3)")
    parser.add_argument("--rates", type=str, default="50,500", help="comma-separated mean rates in rps (default 50,500)")
    parser.add_argument("--window", type=int, default=60, help="peak window and Holt history in seconds (default 60)")
    args = parser.parse_args(argv)
    rates = [50.0] if args.quick else [float(x) for x in args.rates.split(",")]
    seeds = [0] if args.quick else list(range(args.seeds))
    params = HoltParams()
    t_start = time.perf_counter()
    print("Demand forecast benchmark (benches/forecast.py)" + (" --quick smoke run" if args.quick else ""))
    print(f"Scenarios: diurnal = rate_curve_diurnal(R, {DAY_S:g} s) (a compressed day, peak/trough 2, 3 spikes); "
          f"ramp = R, then to {RAMP_S[3]:g} R over {'/'.join(map(str, RAMP_S[2]))} s by seed. R = {', '.join(f'{r:g}' for r in rates)} rps; "
          f"seeds {', '.join(map(str, seeds))}.")
    print(f"Holt: alpha {params.alpha:g}, beta {params.beta:g}, phi {params.phi:g}, fitted on the last {args.window} s; "
          f"window peak over the last {args.window} s of per-second counts. Horizons {', '.join(map(str, HORIZONS))} s.")
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}.")
    rows, examples = run(rates, seeds, args.window, params)
    for line in table(rows):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    path = csv_rows_write(args.out / "forecast.csv", rows, CSV_FIELDS)
    print(f"wrote {path} ({len(rows)} rows) in {time.perf_counter() - t_start:.1f} s")
    print(plot(rows, examples, args.window, args.out / "forecast.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
