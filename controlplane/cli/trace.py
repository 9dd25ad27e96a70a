"""`tessera trace`: generate synthetic query-arrival traces, summarise trace files."""
from __future__ import annotations

from pathlib import Path

import typer

from ._common import fail

trace_app = typer.Typer(help="Query-arrival traces: generate synthetic workloads, summarise trace files.", no_args_is_help=True)
TRACE_KINDS = ("uniform", "poisson", "gamma", "macro-bursts", "diurnal")  # = workload.KINDS


def _trace_summary_echo(trace, path: Path, verb: str) -> None:
    from engine.simulation.workload import trace_summary

    s = trace_summary(trace)
    typer.echo(f"trace        {path} ({verb})")
    typer.echo(f"queries      {s.queries}")
    typer.echo(f"duration     {s.duration_s:.6g} s (last arrival)")
    typer.echo(f"mean rate    {s.mean_rate:.6g} qps")
    typer.echo(f"peak 1 s     {s.peak_rate:.6g} qps (second {s.peak_at_s:.0f})")
    if trace.deadline_ms is not None:
        import numpy as np

        with_deadline = int(np.count_nonzero(~np.isnan(trace.deadline_ms)))
        typer.echo(f"deadlines    {with_deadline} of {s.queries} queries")
    typer.echo(f"applications {len(trace.applications)}")
    width = max((len(name) for name in trace.applications), default=0)
    for name, share in s.shares.items():
        typer.echo(f"  {name:<{width}}  {share:7.2%}  {s.counts[name]}")


@trace_app.command("generate")
def trace_generate_cmd(
    kind: str = typer.Option(..., "--kind", help="|".join(TRACE_KINDS)),
    rate: float = typer.Option(..., "--rate", help="Mean total arrival rate, queries per second"),
    duration: float = typer.Option(..., "--duration", help="Trace length in seconds"),
    out: Path = typer.Option(..., "--out", help="Write the trace CSV here"),
    shape: float = typer.Option(None, "--shape", help="gamma: shape of the inter-arrival gamma (default 0.05; CV = 1/sqrt(shape))"),
    applications: str = typer.Option("default", "--applications", help="Comma-separated application names, most popular first"),
    zipf_alpha: float = typer.Option(1.001, "--zipf-alpha", help="Zipf exponent of application popularity"),
    seed: int = typer.Option(1, "--seed"),
    independent: bool = typer.Option(False, "--independent", help="One process per application (independent bursts) instead of splitting one"),
    deadline_ms: float = typer.Option(None, "--deadline-ms", help="Give every query this deadline (adds the deadline_ms column)"),
    burst_factor: float = typer.Option(None, "--burst-factor", help="macro-bursts: high rate / low rate (default 4)"),
    period: float = typer.Option(None, "--period", help="macro-bursts: seconds per low+high period (default 60)"),
    high_fraction: float = typer.Option(None, "--high-fraction", help="macro-bursts: fraction of each period at the high rate (default 0.25)"),
    peak_to_trough: float = typer.Option(None, "--peak-to-trough", help="diurnal: peak / trough of the daily curve (default 2)"),
    spikes: int = typer.Option(None, "--spikes", help="diurnal: number of random spikes (default 3)"),
    day: float = typer.Option(None, "--day", help="diurnal: seconds of trace per compressed day (default 1440)"),
) -> None:
    """Generate a seeded synthetic trace, write it as CSV and print a summary. Exit 2 for bad input."""
    from engine.simulation.workload import trace_for_applications, trace_write

    if kind not in TRACE_KINDS:
        raise fail(f"--kind must be one of {', '.join(TRACE_KINDS)}, got {kind!r}")
    for option, value in (("--rate", rate), ("--duration", duration)):
        if not value > 0 or value == float("inf"):
            raise fail(f"{option} must be a positive number, got {value:g}")
    given = {
        "--shape": ("gamma", "shape", shape),
        "--burst-factor": ("macro-bursts", "burst_factor", burst_factor),
        "--period": ("macro-bursts", "period_s", period),
        "--high-fraction": ("macro-bursts", "high_fraction", high_fraction),
        "--peak-to-trough": ("diurnal", "peak_to_trough", peak_to_trough),
        "--spikes": ("diurnal", "spikes", spikes),
        "--day": ("diurnal", "day_s", day),
    }
    params = {}
    for option, (for_kind, name, value) in given.items():
        if value is None:
            continue
        if for_kind != kind:
            raise fail(f"{option} applies to --kind {for_kind} only")
        params[name] = value
    names = [name.strip() for name in applications.split(",")]
    if not all(names):
        raise fail(f"--applications must be comma-separated non-empty names, got {applications!r}")
    try:
        trace = trace_for_applications(
            kind, names, rate, duration, seed, zipf_alpha=zipf_alpha, independent=independent, deadline_ms=deadline_ms, **params
        )
    except ValueError as exc:
        raise fail(str(exc)) from exc
    try:
        trace_write(trace, out)
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror or exc}") from exc
    _trace_summary_echo(trace, out, "written")


@trace_app.command("show")
def trace_show_cmd(path: Path = typer.Argument(..., help="Trace CSV: time_s,application[,deadline_ms]")) -> None:
    """Summarise a trace file: queries, mean and peak 1 s rate, per-application shares. Exit 2 when the file is missing or malformed (the message names the line)."""
    from engine.simulation.workload import trace_read

    try:
        trace = trace_read(path)
    except ValueError as exc:  # TraceFormatError, including unreadable files
        raise fail(str(exc)) from exc
    _trace_summary_echo(trace, path, "read")
