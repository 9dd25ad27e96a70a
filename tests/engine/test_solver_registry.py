"""One registry of planners (engine/solvers/registry.py), one composition (engine/solvers/compose.py), one
time budget for a whole solve, and no strategy that calls the front door back (issue 39, part 3)."""
from __future__ import annotations

import ast
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli import app as cli_app
from controlplane.cli.simulate import SIMULATE_PLANNERS
from engine.plans.problem import problem_from_dict
from engine.plans.validate import plan_validate
from engine.solvers import registry
from engine.solvers.gpulets import SHARING_SOLVERS
from engine.solvers.pipelines import PIPELINE_SOLVERS
from engine.solvers.registry import DEFAULT_PLANNER, PLANNER_KINDS, PLANNERS, planner_get, planner_names
from engine.solvers.solve import plan_solve

from .test_mixed_fleet import mixed_problem_dict as mixed_raw
from .test_pipeline_planning import _raw as pipeline_raw

ROOT = Path(__file__).resolve().parents[2]


def test_every_planner_has_a_known_kind_a_loadable_strategy_and_a_paper() -> None:
    assert len(PLANNERS) == len(set(PLANNERS)) and list(PLANNERS) == list(planner_names())
    for name, info in PLANNERS.items():
        assert info.name == name and info.kind in PLANNER_KINDS and info.summary and info.paper
        assert callable(info.strategy()), name
        assert info.pipelines_by in PIPELINE_SOLVERS
    assert planner_names("mps") == SHARING_SOLVERS == ("gpulets", "sbp", "best-fit", "ideal")
    assert planner_names("baseline") == ("clipper-ha", "clipper-ht", "sommelier", "infaas")
    assert [n for n, p in PLANNERS.items() if p.reads_ensembles] == ["garrison", "fleet"]
    assert [n for n, p in PLANNERS.items() if p.plans_pipelines] == ["fleet"]
    with pytest.raises(ValueError, match="unknown solver 'nope'; choose one of: proteus, joint"):
        planner_get("nope")
    with pytest.raises(ValueError, match="unknown planner kind"):
        planner_names("gpu")


def test_the_cli_and_the_simulator_read_the_registry() -> None:
    result = CliRunner().invoke(cli_app, ["plan", "solvers"])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.output.splitlines()] == list(PLANNERS)
    assert SIMULATE_PLANNERS == tuple(n for n, p in PLANNERS.items() if p.simulated)
    bad = CliRunner().invoke(cli_app, ["plan", "solve", "--problem", "x.json", "--solver", "nope"])
    assert bad.exit_code == 2 and ", ".join(PLANNERS) in bad.output


def test_no_strategy_may_import_the_front_door_or_the_composition() -> None:
    """The import-linter contract (tests/test_project.py runs it) names every module of engine/solvers but
    the front door and the composition: a new strategy cannot slip past it."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (forbidden,) = [c for c in contracts if c.get("forbidden_modules") == ["engine.solvers.solve", "engine.solvers.compose"]]
    modules = {f"engine.solvers.{p.stem}" for p in (ROOT / "engine/solvers").glob("*.py") if p.stem not in ("__init__", "solve", "compose")}
    assert set(forbidden["source_modules"]) == modules
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["engine.solvers"] for c in contracts)
    # And no strategy names plan_solve at all, not even through a dynamic import.
    for path in (ROOT / "engine/solvers").glob("*.py"):
        if path.stem in ("solve", "compose", "__init__"):
            continue
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert "plan_solve" not in names and "plan_compose" not in names, path


def test_one_time_budget_is_shared_by_every_solve_of_a_composed_plan(monkeypatch) -> None:
    """A mixed fleet's plan solves four stages: their time limits add up to the budget, no more."""
    seen: list[tuple[float, float]] = []  # (when the solve began, its time limit)
    real = registry.PlannerInfo.strategy

    def recording(self):
        strategy = real(self)
        if self.kind not in ("fleet", "mps"):
            return strategy

        def solve(problem, *args, **kwargs):
            seen.append((time.perf_counter(), problem.options.time_limit_s))
            return strategy(problem, *args, **kwargs)
        return solve

    monkeypatch.setattr(registry.PlannerInfo, "strategy", recording)
    problem = problem_from_dict(mixed_raw())
    started = time.perf_counter()
    plan = plan_solve(problem, "proteus", time_limit_s=8.0)
    assert len(seen) == 4, seen
    # Each solve may run until the budget's end at most: an equal share of what is left for the solves to come.
    assert all(began + limit <= started + 8.0 + 1e-3 for began, limit in seen), seen
    assert seen[0][1] == pytest.approx(2.0, abs=0.2) and seen[-1][1] <= 8.0 - (seen[-1][0] - started) + 1e-3
    assert plan_validate(problem, plan).valid


def test_a_composed_plan_claims_no_optimum_and_measures_its_objective_on_the_whole() -> None:
    problem = problem_from_dict(mixed_raw())
    plan = plan_solve(problem, "proteus")
    assert plan.status == "feasible" and plan.bound is None and plan.gap is None
    demand = problem.total_demand_rps
    expected = sum(plan.served_rps[a] * acc for a, acc in plan.accuracy_by_application.items()) / demand
    assert plan.objective == pytest.approx(expected)
    # Pipelines beside another application: each part proved optimal, the whole split before solving is not.
    pipelines = problem_from_dict(pipeline_raw())
    plan = plan_solve(pipelines, "fa2")
    assert plan.status == "feasible" and "fa2 optimal" in plan.notes[0] and "the whole is feasible" in plan.notes[0]


def test_one_strategy_on_a_whole_problem_keeps_its_own_status_bound_and_gap() -> None:
    raw = pipeline_raw()
    raw.update(pipelines=[], applications=[a for a in raw["applications"] if a["name"] == "other"],
               variants=[v for v in raw["variants"] if v["name"] == "oth"], profiles=[p for p in raw["profiles"] if p["variant"] == "oth"])
    problem = problem_from_dict(raw)
    plan = plan_solve(problem, "proteus")
    assert plan.solver == "proteus" and plan.status == "optimal" and plan.bound is not None
    # sponge where no CPU application can scale ("oth" is profiled at one core count): proteus's plan stands.
    scaled = plan_solve(problem, "sponge")
    assert scaled.solver == "sponge+proteus" and scaled.status == "optimal" and scaled.bound == plan.bound
    assert any("no variant has CPU profiles at two or more core counts" in n for n in scaled.notes)
    assert plan_validate(problem, scaled).valid


def test_the_default_planner_is_the_fleet_model_everywhere() -> None:
    """The engine's front door and the CLI default to the one planner that plans every slice kind and
    workload in one model (issue 40; a plan run's default: tests/planning/test_api.py); the seeds'
    planners are chosen by name."""
    import inspect

    info = planner_get(DEFAULT_PLANNER)
    assert DEFAULT_PLANNER == "fleet" and info.plans_mps and info.plans_pipelines
    assert inspect.signature(plan_solve).parameters["solver"].default == DEFAULT_PLANNER
    result = CliRunner().invoke(cli_app, ["plan", "solve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "[default: fleet]" in result.output
