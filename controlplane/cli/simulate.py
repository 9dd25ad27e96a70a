"""`tessera simulate`: replay a trace on a planned fleet (discrete-event simulation)."""
from __future__ import annotations

from pathlib import Path

import typer

from engine.solvers.registry import PLANNERS

from ._common import EXIT_INVALID, fail, number, problem_read

# The planners whose plans the fleet simulator replays (pipelines and vertical scaling have their own).
SIMULATE_PLANNERS = tuple(name for name, info in PLANNERS.items() if info.simulated)
# engine.dataplane.batching.BATCHING_POLICIES and REFERENCE_BATCHING_POLICIES, spelt out so that `--help` loads no
# engine module (a test keeps them equal).
SIMULATE_BATCHING = ("proteus", "quantile", "aimd", "nexus", "max-delay", "fixed", "proteus-artefact")


def _batching_params(pairs: list[str] | None) -> dict:
    """`key=value` pairs; values are read as JSON where they parse (numbers, lists), else kept as text."""
    import json

    params: dict = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"--batching-param must be key=value, got {pair!r}")
        try:
            params[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip()] = raw
    return params


def simulate(
    problem_path: Path = typer.Option(..., "--problem", help="Problem JSON (fleet, variants, profiles, SLOs)"),
    trace_path: Path = typer.Option(..., "--trace", help="Trace CSV: time_s,application[,deadline_ms]"),
    planner: str = typer.Option("proteus", "--planner", help="|".join(SIMULATE_PLANNERS)),
    batching: str = typer.Option("nexus", "--batching", help="|".join(SIMULATE_BATCHING)),
    batching_param: list[str] = typer.Option(None, "--batching-param", help="Policy parameter key=value (repeatable), e.g. size=4"),
    routing: str = typer.Option("weights", "--routing", help="weights (plan weights, alias tables) | matching (Garrison) | even (the Proteus artefact's: uniform over routed instances)"),
    queue_order: str = typer.Option("fifo", "--queue-order", help="fifo | edf"),
    drop_rule: str = typer.Option("deadline", "--drop-rule", help="never | deadline | slo-1x | slo-2x"),
    noise: float = typer.Option(0.05, "--noise", help="Log-normal sigma of the service-time noise (mean-preserving)"),
    replan_every: float = typer.Option(30.0, "--replan-every", help="Re-planning interval in seconds (0: never)"),
    burst_factor: float = typer.Option(1.5, "--burst-factor", help="Re-plan when an application's 1 s demand exceeds the plan's by this factor (0: off)"),
    reconfig_delay: float = typer.Option(5.0, "--reconfig-delay", help="Seconds a newly created instance serves nothing"),
    initial_demand: str = typer.Option("trace", "--initial-demand", help="trace (first interval of the trace) | problem"),
    headroom: float = typer.Option(1.2, "--headroom", help="Plan for the estimated demand times this (1.2 keeps instances off 100% load)"),
    demand_estimate: str = typer.Option("peak", "--demand-estimate", help="mean (rate over the window) | peak (max of the window's busiest second and a Holt forecast, as the live control loop)"),
    demand_window: float = typer.Option(0.0, "--demand-window", help="Seconds of arrivals a re-plan looks at (0: 60 for peak, the re-planning interval for mean)"),
    forecast_horizon: float = typer.Option(0.0, "--forecast-horizon", help="peak: also the Holt forecast this many seconds ahead"),
    seed: int = typer.Option(1, "--seed"),
    out: Path = typer.Option(None, "--out", help="Write summary.json, per_second.csv and plots.png here"),
) -> None:
    """Replay a trace on a planned fleet (discrete-event simulation, closed loop with the planner) and print
    the summary: SLO violations, effective accuracy, latency. Exit 0, or 2 for malformed input."""
    if planner not in SIMULATE_PLANNERS:
        raise fail(f"--planner must be one of {', '.join(SIMULATE_PLANNERS)}, got {planner!r}")
    if batching not in SIMULATE_BATCHING:
        raise fail(f"--batching must be one of {', '.join(SIMULATE_BATCHING)}, got {batching!r}")
    from engine.simulation.simulator import SimulationConfig
    from engine.simulation.simulator import simulate as simulate_run
    from engine.simulation.workload import trace_read

    try:
        config = SimulationConfig(
            batching=batching, batching_params=_batching_params(batching_param), queue_order=queue_order, drop_rule=drop_rule,
            noise_sigma=noise, seed=seed, replan_interval_s=replan_every or None, burst_factor=burst_factor or None,
            reconfiguration_delay_s=reconfig_delay, routing=routing, initial_demand=initial_demand, demand_headroom=headroom,
            demand_estimate=demand_estimate, demand_window_s=demand_window or None, forecast_horizon_s=forecast_horizon,
        )
    except ValueError as exc:
        raise fail(str(exc)) from exc
    problem = problem_read(problem_path)
    try:
        trace = trace_read(trace_path)
    except OSError as exc:
        raise fail(f"cannot read trace {trace_path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # TraceFormatError
        raise fail(str(exc)) from exc
    try:
        result = simulate_run(problem, trace, planner=planner, config=config)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    except RuntimeError as exc:
        raise fail(str(exc), EXIT_INVALID) from exc
    s = result.summary

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.2%}"

    typer.echo(f"simulated    {s['queries']} queries over {s['duration_s']:.1f} s ({planner} + {batching}, routing {routing})")
    typer.echo(f"on time      {s['on_time']}   late {s['late']}   dropped {s['dropped']} "
               f"(expired {s['dropped_expired']}, no capacity {s['dropped_no_capacity']}, unfinished {s['dropped_unfinished']})")
    typer.echo(f"SLO violations {pct(s['slo_violation_ratio'])}   throughput {s['throughput_qps']:.6g} q/s")
    typer.echo(f"accuracy     {number(s['effective_accuracy'], '.4f')} effective   max drop {number(s['max_accuracy_drop'], '.4f')}")
    typer.echo(f"latency      p50 {number(s['latency_p50_ms'], '.3f')} ms   p99 {number(s['latency_p99_ms'], '.3f')} ms")
    typer.echo(f"plans        {s['plans_applied']} applied, {s['replans']} re-plans ({s['replans_interval']} on the interval, {s['replans_burst']} on a burst)")
    typer.echo(f"instances    {s['instances_created']}   mean utilisation {pct(s['mean_utilisation'])}   mean batch {number(s['mean_batch'], '.2f')}")
    typer.echo(f"speed        {s['simulated_queries_per_wall_s']:.0f} simulated queries per wall second (planner {s['planner_wall_s']:.2f} s apart)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(result.to_json() + "\n")
        result.write_csv(out / "per_second.csv")
        try:
            result.plot(out / "plots.png")
            plotted = "plots.png"
        except ImportError:
            plotted = "no plots.png (matplotlib is not installed: pip install -e '.[bench]')"
        typer.echo(f"written      {out}/summary.json, per_second.csv, {plotted}")
