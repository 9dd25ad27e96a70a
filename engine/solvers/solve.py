"""The front door of every planner: `plan_solve(problem, solver=...)`. It checks the options a caller
overrides, describes the problem's GPU models to the catalogue while it plans, and hands the problem to
the composition (engine/solvers/compose.py) with the registered planner (engine/solvers/registry.py)."""
from __future__ import annotations

import dataclasses
import time

from engine.geometry.catalogue import mig_catalogue_extended
from engine.plans.problem import OBJECTIVES, SOLVERS, Plan, Problem
from engine.solvers.compose import plan_compose
from engine.solvers.registry import DEFAULT_PLANNER, planner_get

__all__ = ["plan_solve"]


def plan_solve(
    problem: Problem,
    solver: str = DEFAULT_PLANNER,
    *,
    objective: str | None = None,
    time_limit_s: float | None = None,
    mip_gap: float | None = None,
    backend: str | None = None,
) -> Plan:
    """Plan `problem` with the registered planner `solver` (`engine.solvers.registry.planner_names()`).
    `objective`, `time_limit_s` (one budget for the whole solve, every part of a composed plan included),
    `mip_gap` and `backend` (the MILP library: highs | cbc) override the problem's options for this solve.
    A problem where nothing at all can be served still comes back as a Plan, with status `infeasible` and
    notes saying why. ValueError for an unknown solver or a bad override."""
    started = time.perf_counter()  # the time limit counts from here, the checks below included
    chosen = planner_get(solver)
    overrides: dict[str, object] = {}
    if objective is not None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of: {', '.join(OBJECTIVES)}")
        overrides["objective"] = objective
    if backend is not None:
        if backend not in SOLVERS:
            raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(SOLVERS)}")
        overrides["solver"] = backend
    if time_limit_s is not None:
        if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
        overrides["time_limit_s"] = float(time_limit_s)
    if mip_gap is not None:
        if isinstance(mip_gap, bool) or not isinstance(mip_gap, (int, float)) or not 0 <= mip_gap <= 1:
            raise ValueError(f"mip_gap must be within 0..1, got {mip_gap!r}")
        overrides["mip_gap"] = float(mip_gap)
    if overrides:
        problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, **overrides))
    with mig_catalogue_extended(problem.gpu_models):
        return plan_compose(problem, chosen, started=started)
