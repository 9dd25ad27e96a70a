"""`tessera load`: drive a router with Poisson traffic that may burst, each request with its remaining
budget in X-Tessera-Deadline-Ms (workers/loadgen.py): the way to watch vertical scaling in the demo."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import typer

from ._common import fail


def load(
    router: str = typer.Option("http://127.0.0.1:8100", envvar="TESSERA_ROUTER", help="Router URL"),
    application: str = typer.Option(None, help="Send to POST /v1/infer/APPLICATION"),
    pipeline: str = typer.Option(None, help="Send to POST /v1/pipelines/PIPELINE/infer instead"),
    rate: float = typer.Option(20.0, help="Base rate, requests per second (Poisson)"),
    duration: float = typer.Option(60.0, help="Seconds to send for"),
    burst_at: float = typer.Option(None, help="Burst from this second"),
    burst_for: float = typer.Option(20.0, help="Burst length, seconds"),
    burst_rate: float = typer.Option(None, help="Rate during the burst (default 10x --rate)"),
    slo_ms: float = typer.Option(20.0, help="End-to-end SLO each request starts with"),
    payload_kb: float = typer.Option(4.0, help="Request size on the network (sets the time the network takes from the budget)"),
    rtt_ms: float = typer.Option(2.0, help="Network round trip taken from every budget"),
    dips: bool = typer.Option(True, help="Bandwidth dips (synthetic trace) that eat into some requests' budgets"),
    input_name: str = typer.Option("input", help="The model input's name"),
    shape: str = typer.Option("1,8", help="The input's shape, comma separated"),
    datatype: str = typer.Option("FP32", help="KServe v2 datatype"),
    concurrency: int = typer.Option(64, min=1, help="Requests in flight at most"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(None, help="Write the per-second counts as CSV here"),
) -> None:
    """Send Poisson traffic (with an optional burst) to an application or pipeline on a router, print per second
    what came back in time, late and failed."""
    import numpy as np

    from workers.loadgen import load_budgets, load_run, load_schedule

    if (application is None) == (pipeline is None):
        raise fail("give one of --application and --pipeline")
    try:
        dims = [int(x) for x in shape.split(",")]
        arrivals = load_schedule(rate_rps=rate, duration_s=duration, burst_at_s=burst_at, burst_for_s=burst_for if burst_at is not None else 0.0,
                                 burst_rps=burst_rate if burst_rate is not None else (10 * rate if burst_at is not None else None), seed=seed)
        budgets = load_budgets(arrivals, slo_ms=slo_ms, payload_kb=payload_kb, rtt_ms=rtt_ms, seed=seed, dips=dips)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    count = int(np.prod(dims))
    data = np.random.default_rng(seed).normal(size=count).round(4).tolist()
    body = json.dumps({"inputs": [{"name": input_name, "shape": dims, "datatype": datatype, "data": data}]}).encode()
    url = f"{router.rstrip('/')}/v1/infer/{application}" if application else f"{router.rstrip('/')}/v1/pipelines/{pipeline}/infer"
    typer.echo(f"sending {len(arrivals)} requests to {url} over {duration:g} s"
               + (f", burst at {burst_at:g} s for {burst_for:g} s" if burst_at is not None else "")
               + f"; budgets: SLO {slo_ms:g} ms less the network ({int((budgets <= 0).sum())} with nothing left)")
    result = load_run(url, body, arrivals, budgets, concurrency=concurrency)
    typer.echo(f"{'second':>6} {'sent':>6} {'ok':>6} {'late':>6} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8}")
    rows = [s.row() for s in result.seconds]
    for r in rows:
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.2f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.2f}"
        typer.echo(f"{r['second']:>6} {r['sent']:>6} {r['ok']:>6} {r['late']:>6} {r['errors']:>6} {p50:>8} {p99:>8}")
    t = result.totals
    total = t["sent"] + t["expired"]
    typer.echo(f"total: {total} requests, {t['ok']} in time, {t['late'] + t['expired']} late ({t['expired']} with no budget left when due), "
               f"{t['errors']} errors, in {result.wall_s:.1f} s")
    if out is not None:
        with out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["second"])
            writer.writeheader()
            writer.writerows(rows)
        typer.echo(f"wrote {out}")
    if t["errors"]:
        raise typer.Exit(1)
