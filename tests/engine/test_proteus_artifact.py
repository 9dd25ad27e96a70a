"""Proteus's artefact as Tessera's problem and traces (engine/reference/proteus_artifact.py), and the bench
that replays its traces (benches/proteus_traces.py), on a miniature checkout with the artefact's file
layout that the tests write themselves (two families, a few variants, short traces): the real checkout is
not in CI."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.plans.problem import CPU_DEVICE_TYPE
from engine.plans.validate import plan_validate
from engine.reference.profiles import reference_data_dir
from engine.reference.proteus_artifact import (
    PROTEUS_SCENARIOS,
    ProteusArtefactError,
    proteus_problem,
    proteus_recorded_figures,
    proteus_trace,
)
from engine.solvers.solve import plan_solve

REPO = Path(__file__).resolve().parents[2]

# (model, accelerator, batch, p50 ms): resnet on all three, a Hugging Face id on CPU and Ampere only.
PROFILES = [
    *[(m, a, b, base * (1 + 0.5 * (b - 1)))
      for m, base0 in (("resnet18_v1", 4.0), ("resnet50_v1", 9.0))
      for a, base in (("onnxruntime_cpu", base0 * 6), ("onnxruntime_gpu_ampere", base0), ("onnxruntime_gpu_pascal", base0 * 2))
      for b in (1, 2, 4, 8, 16)],
    *[("prajjwal1/bert-tiny", a, b, base * b) for a, base in (("onnxruntime_cpu", 5.0), ("onnxruntime_gpu_ampere", 1.0)) for b in (1, 2, 4, 8)],
    ("roberta-base", "onnxruntime_gpu_ampere", 1, 30.0),
    ("roberta-base", "onnxruntime_gpu_ampere", 1, 12.0),  # a repeated key: the later row wins, as in the artefact
]


def checkout_write(root: Path, *, seconds: int = 20, rate: float = 40.0, seed: int = 0) -> Path:
    (root / "profiling").mkdir(parents=True)
    with (root / "profiling" / "aggregate_profiled.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Model", "Accel", "Trials", "batchsize", "50th_pct", "90th_pct", "avg_latency(ms)", "Min", "Max", "Accuracy", "Normalized_Accuracy"])
        for model, accel, batch, ms in PROFILES:
            writer.writerow([model, accel, 1000, batch, ms, ms * 1.1, ms, ms * 0.9, ms * 2, 90, 95])
    variants = root / "traces" / "model_variants"
    variants.mkdir(parents=True)
    (variants / "resnet").write_text("resnet18_v1,89.53547084\nresnet50_v1,100")
    (variants / "bert").write_text("prajjwal1/bert-tiny,85.95041322\nroberta-base,100\n")
    (variants / ".DS_Store").write_text("ignored")
    rng = np.random.default_rng(seed)
    for folder in PROTEUS_SCENARIOS.values():
        traces = root / "traces" / "twitter" / "asplos" / folder / "300"
        traces.mkdir(parents=True)
        for family, share in (("resnet", 0.7), ("bert", 0.3)):
            times = np.sort(rng.uniform(0, seconds * 1000.0, int(seconds * rate * share))).round()
            (traces / f"{family}.txt").write_text("".join(f"{int(t)},1,300\n" for t in times))
    return root


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    return checkout_write(tmp_path / "proteus")


def test_problem_from_the_artefact(checkout: Path) -> None:
    problem = proteus_problem(checkout)
    assert [a.name for a in problem.applications] == ["bert", "resnet"]
    assert all(a.slo_ms == 300.0 for a in problem.applications)
    assert problem.options.latency_budget_fraction == 0.5
    assert {v.name: v.accuracy for v in problem.variants} == pytest.approx(
        {"prajjwal1--bert-tiny": 0.8595041322, "roberta-base": 1.0, "resnet18_v1": 0.8953547084, "resnet50_v1": 1.0})
    # 10 each of CPU, Ampere, VPU (a CPU host with the CPU profile) and Pascal.
    kinds = {}
    for d in problem.devices:
        kinds[d.type] = kinds.get(d.type, 0) + 1
    assert kinds == {CPU_DEVICE_TYPE: 20, "GPU_AMPERE": 10, "GPU_PASCAL": 10}
    points = {(p.variant, p.device_type, p.batch): p.latency_ms for p in problem.profiles}
    assert max(b for _, _, b in points) == 8  # batch 16 is not one of the artefact's batch sizes
    assert points[("roberta-base", "GPU_AMPERE", 1)] == 12.0  # the later row
    assert ("prajjwal1--bert-tiny", "GPU_PASCAL", 1) not in points  # not profiled there: not runnable
    assert points[("resnet50_v1", CPU_DEVICE_TYPE, 4)] == pytest.approx(9.0 * 6 * 2.5)


def test_trace_merges_families_in_time_order(checkout: Path) -> None:
    problem = proteus_problem(checkout)
    names = tuple(a.name for a in problem.applications)
    trace = proteus_trace(checkout, "bursty", applications=names)
    rows = {f: np.loadtxt(checkout / "traces/twitter/asplos/zipf_exponential_bursty/300" / f"{f}.txt", delimiter=",", ndmin=2) for f in names}
    assert trace.time_s.size == sum(len(r) for r in rows.values())  # every row kept
    assert np.all(np.diff(trace.time_s) >= 0)
    for index, family in enumerate(names):
        assert np.array_equal(np.sort(trace.time_s[trace.application == index]), np.sort(rows[family][:, 0] / 1000.0))
    assert np.all(trace.deadline_ms == 300.0)


def test_bad_checkouts_are_refused_with_the_file_named(tmp_path: Path, checkout: Path) -> None:
    with pytest.raises(ProteusArtefactError, match="is .* a checkout of github.com/UMass-LIDS/Proteus"):
        proteus_problem(tmp_path / "nowhere")
    with pytest.raises(ProteusArtefactError, match="unknown scenario"):
        proteus_trace(checkout, "steady")
    (checkout / "traces/model_variants/resnet").write_text("resnet18_v1\n")
    with pytest.raises(ProteusArtefactError, match="resnet: line 1: expected 'variant,accuracy'"):
        proteus_problem(checkout)
    (checkout / "traces/model_variants/resnet").write_text("resnet18_v1,89.5\n")
    (checkout / "traces/twitter/asplos/medium-normal_load/300/resnet.txt").write_text("12,1\n")
    with pytest.raises(ProteusArtefactError, match="resnet.txt: expected rows"):
        proteus_trace(checkout, "mnl")


def test_the_converted_problem_plans_and_validates(checkout: Path) -> None:
    problem = proteus_problem(checkout, demand_rps={"resnet": 300.0, "bert": 200.0})
    plan = plan_solve(problem, "proteus")
    verdict = plan_validate(problem, plan)
    assert verdict.valid, verdict.errors
    assert plan.shortfall_rps == {"bert": 0.0, "resnet": 0.0}
    # Spare capacity is filled, as the artefact's ILP gives every device a variant.
    assert len({i.device for i in plan.instances}) == 40


def test_recorded_figures_are_read_from_the_shared_data() -> None:
    rows = proteus_recorded_figures(reference_data_dir() / "proteus" / "recorded_figures.csv")
    proteus = {r.scenario: r for r in rows if r.system == "proteus"}
    assert set(proteus) == set(PROTEUS_SCENARIOS)
    assert all(0 < r.slo_violation_ratio < 1 and 90 < r.effective_accuracy <= 100 and r.served <= r.demand for r in proteus.values())


def test_bench_runs_on_a_checkout(checkout: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(REPO / "benches" / "proteus_traces.py"), "--proteus", str(checkout), "--quick", "--jobs", "1",
         "--out", str(out), "--write-inputs"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with (out / "proteus_traces.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    ours = [r for r in rows if "(recorded)" not in r["system"]]
    assert {r["scenario"] for r in ours} == set(PROTEUS_SCENARIOS)
    assert {r["system"] for r in ours} == {"proteus (a)", "(a), the artefact's batching", "(a), its batching and routing", "(a), Tessera's spread", "(a), idle devices", "tessera (b)",
                                          "(b), quantile batching", "(b), previous defaults"}
    for r in ours:
        assert int(r["demand"]) > 0 and 0 <= float(r["slo_violation_ratio"]) <= 1 and float(r["violations_vs_proteus"]) >= 0
        # The artefact's accounting (late only past 1000 ms) never counts more violations than the SLO's.
        assert 0 <= float(r["violation_ratio_late_1000ms"]) <= float(r["slo_violation_ratio"]) + 1e-12
    assert "Goals (Proteus's recorded figures as the peer):" in run.stdout
    assert (out / "proteus" / "problem.json").is_file() and (out / "proteus" / "zipf.csv").is_file()
    # The written inputs replay with the CLI.
    cli = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "simulate", "--problem", str(out / "proteus" / "problem.json"),
         "--trace", str(out / "proteus" / "zipf.csv"), "--replan-every", "10",
         "--batching", "quantile", "--demand-estimate", "mean"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert "SLO violations" in cli.stdout
    png = out / "proteus_traces.png"
    assert png.is_file() or "PNG skipped" in run.stdout
