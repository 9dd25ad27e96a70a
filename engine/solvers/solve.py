"""One entry point for every planner: `plan_solve(problem, solver=...)`."""
from __future__ import annotations

import dataclasses
from typing import Callable

from engine.geometry.catalogue import mig_catalogue_extended
from engine.plans.problem import OBJECTIVES, SOLVERS, Plan, Problem

# garrison is Algorithm 1 of Garrison (DAC'24) as written; garrison-demand sizes its instances to demand.
PLANNERS: tuple[str, ...] = ("proteus", "joint", "garrison", "garrison-demand")
# The allocation baselines the simulator compares the planners against (solvers/baselines.py).
BASELINES: tuple[str, ...] = ("clipper-ha", "clipper-ht", "sommelier", "infaas")
# The MPS planners (solvers/gpulets.py): gpulets' elastic partitioning and the baselines of its evaluation.
SHARING: tuple[str, ...] = ("gpulets", "sbp", "best-fit", "ideal")
# The pipeline planners (solvers/pipelines.py): FA2 and IPA plan the problem's pipelines on CPU hosts,
# proteus the other applications on the devices left.
PIPELINES: tuple[str, ...] = ("fa2", "ipa")
# What plans a problem's pipelines when the chosen solver is not a pipeline planner.
PIPELINE_DEFAULT = "fa2"
# The vertical planners (solvers/vertical.py): CPU applications sized for in-place vertical scaling by the
# agents' fast loop (Sponge); biscale plans pipelines by Biscale (solvers/pipelines.py) and the flat CPU
# applications as sponge does; proteus the rest.
VERTICAL: tuple[str, ...] = ("sponge", "biscale")


def _planner_get(solver: str) -> Callable[[Problem], Plan]:
    # Imported lazily: a planner's module (and its solver libraries) loads only when it is used.
    if solver == "proteus":
        from engine.solvers.proteus import proteus_solve

        return proteus_solve
    if solver == "joint":
        from engine.solvers.joint import joint_solve

        return joint_solve
    if solver == "garrison":
        from engine.solvers.garrison import garrison_solve

        return garrison_solve
    if solver == "garrison-demand":
        from engine.solvers.garrison_demand import garrison_demand_solve

        return garrison_demand_solve
    if solver in BASELINES:
        from engine.solvers.baselines import BASELINE_SOLVERS

        return BASELINE_SOLVERS[solver]
    if solver in SHARING:
        from engine.solvers.gpulets import sharing_plan_solve

        return lambda problem: sharing_plan_solve(problem, solver)
    if solver in PIPELINES:
        from engine.solvers.pipelines import pipeline_fleet_solve

        return lambda problem: pipeline_fleet_solve(problem, solver)
    if solver in VERTICAL:
        from engine.solvers.vertical import vertical_fleet_solve

        return lambda problem: vertical_fleet_solve(problem, solver)
    raise ValueError(f"unknown solver {solver!r}; choose one of: {', '.join(PLANNERS + BASELINES + SHARING + PIPELINES + VERTICAL)}")


def plan_solve(problem: Problem, solver: str = "proteus", **kwargs) -> Plan:
    """Plan `problem` with `solver` (see `_plan_solve`), with the problem's GPU models described from NVML
    known to the catalogue while it plans."""
    with mig_catalogue_extended(problem.gpu_models):
        return _plan_solve(problem, solver, **kwargs)


def _plan_solve(
    problem: Problem,
    solver: str = "proteus",
    *,
    objective: str | None = None,
    time_limit_s: float | None = None,
    mip_gap: float | None = None,
    backend: str | None = None,
) -> Plan:
    """Plan with `solver` (proteus | joint | garrison | garrison-demand, or a baseline: clipper-ha | clipper-ht | sommelier |
    infaas, or an MPS planner: gpulets | sbp | best-fit | ideal, or a pipeline planner: fa2 | ipa, or a
    vertical planner: sponge | biscale). `objective`, `time_limit_s`, `mip_gap` and `backend`
    (the MILP library: highs | cbc) override the problem's options for this solve. A problem where nothing
    at all can be served still comes back as a Plan, with status `infeasible` and notes saying why.
    A fleet with MPS GPUs and other devices both is planned in two stages, `solver` taking the devices
    of its kind and the other kind's default the rest (engine/solvers/mixed.py). A problem with pipelines has
    them planned as a whole by `solver` when it is fa2 or ipa, else by fa2, and the other applications by
    `solver` (proteus for fa2 and ipa) on the devices the pipelines leave (engine/solvers/pipelines.py). An
    application served by random ensembles is planned one application per member by every planner but
    garrison, which reads ensembles itself (engine/solvers/ensembles.py)."""
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
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
        overrides["time_limit_s"] = float(time_limit_s)
    if mip_gap is not None:
        if not 0 <= mip_gap <= 1:
            raise ValueError(f"mip_gap must be within 0..1, got {mip_gap!r}")
        overrides["mip_gap"] = float(mip_gap)
    planner = _planner_get(solver)
    if overrides:
        problem = dataclasses.replace(problem, options=dataclasses.replace(problem.options, **overrides))
    if solver != "garrison":
        from engine.solvers.ensembles import ensemble_plan_merge, ensemble_problem_split, ensembles_to_split

        if ensembles_to_split(problem):
            # One application per ensemble member for the planners that serve a query with one variant.
            return ensemble_plan_merge(problem, _plan_solve(ensemble_problem_split(problem), solver))
    if problem.pipelines and solver not in PIPELINES + ("biscale",):
        # Pipelines are always planned as a whole (FA2 by default); `solver` plans the other applications.
        from engine.solvers.pipelines import pipeline_fleet_solve

        return pipeline_fleet_solve(problem, PIPELINE_DEFAULT, rest_solver=solver)
    from engine.solvers.mixed import fleet_is_mixed, mixed_plan_solve

    if fleet_is_mixed(problem) and solver not in PIPELINES + VERTICAL:
        return mixed_plan_solve(problem, solver, sharing_solvers=SHARING, planner_get=_planner_get)
    return planner(problem)
