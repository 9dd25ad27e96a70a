"""`tessera scheduler`: train the learned ensemble scheduler on a named scenario and evaluate it against
the baselines in the simulator (Garrison, DAC'24, §5; engine/ensembles/training.py)."""
from __future__ import annotations

import csv
import json
import math
import shlex
import sys
from pathlib import Path

import typer

from ._common import EXIT_INVALID, fail

scheduler_app = typer.Typer(help="The learned ensemble scheduler: train it on a named scenario, evaluate it against the baselines.",
                            no_args_is_help=True)
# engine.reference.ensembles.SCENARIO_NAMES and the demo's (engine/reference/ensemble_demo.py), spelt out so that
# `--help` loads no engine module (a test keeps them equal).
TABLE1_SCENARIOS = ("table1-a", "table1-b", "table1-c", "table1-d")
SCENARIOS = (*TABLE1_SCENARIOS, "demo")
ROUTING = ("garrison", "earliest", "least-loaded", "size-threshold")


def _policies_dir() -> Path:
    from engine.ensembles import POLICIES_DIR

    return POLICIES_DIR


def _scenario(name: str, load: float, duration: float):
    if name not in SCENARIOS:
        raise fail(f"--scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")
    if not (math.isfinite(load) and load > 0) or not (math.isfinite(duration) and duration > 0):
        raise fail("--load and --duration must be numbers > 0")
    if name == "demo":  # `--load` scales the demo scenario's rate (1,000 queries a second at 1)
        from engine.reference.ensemble_demo import demo_scenario_build

        return None, None, demo_scenario_build(rate_rps=1000.0 * load, duration_s=duration)
    from engine.reference.ensembles import scenario_build

    return scenario_build(name, load=load, duration_s=duration)


@scheduler_app.command("train")
def scheduler_train_cmd(
    scenario: str = typer.Option(..., "--scenario", help="|".join(SCENARIOS)),
    timesteps: int = typer.Option(100_000, "--timesteps", help="Queries to train on (PPO steps)"),
    seed: int = typer.Option(0, "--seed"),
    load: float = typer.Option(1.2, "--load", help="Arrival rate over what the full ensemble serves on the garrison plan (demo: x 1,000 queries/s)"),
    routing: str = typer.Option("garrison", "--routing", help="|".join(ROUTING)),
    w1: float = typer.Option(1.0, "--w1", help="Reward weight w1 (Garrison §5.2)"),
    w2: float = typer.Option(None, "--w2", help="Reward weight w2 on timeouts (default: the largest query size)"),
    out: Path = typer.Option(None, "--out", help="Write OUT.onnx and OUT.json (default: the shipped policies folder, named after the scenario)"),
) -> None:
    """Train a policy with PPO (needs the train extra: make train-deps) and write it as ONNX. Exit 0, 1 when
    the extra is missing, 2 for malformed input."""
    if timesteps < 1:
        raise fail("--timesteps must be >= 1")
    if routing not in ROUTING:
        raise fail(f"--routing must be one of {', '.join(ROUTING)}, got {routing!r}")
    _problem, _plan, built = _scenario(scenario, load, 60.0)
    from engine.ensembles.training import scheduler_train

    target = out or _policies_dir() / scenario
    command = "tessera scheduler train " + " ".join(shlex.quote(a) for a in sys.argv[3:]) if sys.argv[1:3] == ["scheduler", "train"] else None
    weight2 = float(built.spec().max_size) if w2 is None else w2
    try:
        result = scheduler_train(built, target, timesteps=timesteps, seed=seed, routing=routing, w1=w1, w2=weight2, command=command)
    except RuntimeError as exc:
        raise fail(str(exc), EXIT_INVALID) from None
    typer.echo(f"wrote {result.path} and {result.path.with_suffix('.json')} ({result.timesteps:,} steps in {result.seconds:.0f} s; "
               f"mean reward over the last rollout {result.mean_reward_last:.4g})")
    typer.echo(f"reward per query on evaluation episodes it never trained on: {result.reward_untrained:.4g} untrained, "
               f"{result.reward_trained:.4g} trained; the actor's weights moved {100 * result.weight_change:.1f} %")


@scheduler_app.command("evaluate")
def scheduler_evaluate_cmd(
    scenario: str = typer.Option(..., "--scenario", help="|".join(SCENARIOS)),
    policy: Path = typer.Option(None, "--policy", help="The learned policy (.onnx); default: the shipped one for the scenario, when there is one"),
    load: float = typer.Option(1.2, "--load"),
    duration: float = typer.Option(60.0, "--duration", help="Simulated seconds per run"),
    seeds: str = typer.Option("1", "--seeds", help="Comma-separated seeds, one run each"),
    sizes: str = typer.Option("", "--sizes", help="Fixed ensemble sizes to compare, comma-separated"),
    routing: str = typer.Option("garrison", "--routing", help="|".join(ROUTING)),
    out: Path = typer.Option(None, "--out", help="Write the runs as CSV here"),
) -> None:
    """Simulate the learned policy beside the full ensemble and random ensembles; print p99, SLO
    violations, mean ensemble size and the sampling bias."""
    if routing not in ROUTING:
        raise fail(f"--routing must be one of {', '.join(ROUTING)}, got {routing!r}")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        size_list = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise fail("--seeds and --sizes are comma-separated whole numbers") from None
    _problem, _plan, built = _scenario(scenario, load, duration)
    if any(not 1 <= k <= len(built.members) for k in size_list):
        raise fail(f"--sizes must be within 1..{len(built.members)}")
    if policy is None and (_policies_dir() / f"{scenario}.onnx").exists():
        policy = _policies_dir() / f"{scenario}.onnx"
    if policy is not None and not policy.exists():
        raise fail(f"--policy {policy} does not exist")
    from engine.ensembles.training import scheduler_evaluate

    runs = scheduler_evaluate(built, policy_path=policy, routing=routing, seeds=seed_list or [1], fixed_sizes=size_list)
    rows = [{"scenario": scenario, "load": load, "seed": seed, **run.summary()} for run, seed in zip(runs, (seed_list or [1]) * len(runs))]
    typer.echo(f"{scenario}: {len(built.members)} members, SLO {built.slo_ms:g} ms, {built.rate_rps:,.0f} queries/s, {len(built.instances)} instances")
    typer.echo(f"{'scheduler':<28} {'p99 ms':>8} {'violations':>10} {'ensemble':>9} {'voted':>6} {'bias':>7}")
    for r in rows:
        typer.echo(f"{r['scheduler']:<28} {r['p99_ms']:>8.1f} {r['violation_ratio']:>10.2%} {r['mean_ensemble']:>9.2f} {r['mean_voted']:>6.2f} {r['bias']:>7.4f}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        typer.echo(f"wrote {out}")
    if policy is not None:
        meta = json.loads(policy.with_suffix(".json").read_text())
        typer.echo(f"policy {policy}: {meta.get('algorithm', '?')}, {meta.get('timesteps', '?')} steps, seed {meta.get('seed', '?')}")
