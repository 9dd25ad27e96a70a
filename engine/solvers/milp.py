"""Shared PuLP plumbing for the MILP planners: which solver runs (HiGHS through highspy, CBC as fallback),
and what came out of it (status, objective, best bound, relative gap) in the engine's own terms.

HiGHS is driven through `pulp.HiGHS` (the highspy API class), so the solved `highspy.Highs` object stays
reachable as `lp.solverModel` and its info gives the MIP dual bound. CBC runs as a command; its bound is
read from the summary it prints at the end of its log ("Lower bound" / "Upper bound"), which is only
printed when a solve stops before proving optimality."""
from __future__ import annotations

import math
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Literal, Mapping

import pulp

from engine.plans.problem import PlanStatus, SolveOptions

# What a single solve says about itself: `no-solution` means the solver stopped (time limit, error)
# without an incumbent, which is not a proof of infeasibility.
SolveState = Literal["optimal", "feasible", "infeasible", "no-solution"]

_CBC_BOUND_RE = re.compile(r"^(Lower|Upper) bound:\s*(\S+)", re.MULTILINE)
_CBC_OBJECTIVE_RE = re.compile(r"^Objective value:\s*(\S+)", re.MULTILINE)
_CBC_RESULT_RE = re.compile(r"^Result - (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class SolveOutcome:
    """One MILP solve, in the objective's own sense (a maximisation's bound is an upper bound)."""

    state: SolveState
    objective: float | None
    bound: float | None
    gap: float | None  # |objective - bound| / max(|objective|, 1e-9); None without an incumbent
    seconds: float
    backend: str  # "highs" or "cbc", the one that actually ran

    @property
    def has_solution(self) -> bool:
        return self.state in ("optimal", "feasible")


def highs_available() -> bool:
    try:
        return bool(pulp.HiGHS(msg=False).available())
    except Exception:  # highspy missing or broken: PuLP raises at construction in some versions
        return False


def backend_choose(options: SolveOptions) -> tuple[str, list[str]]:
    """The backend that will run, and a note when it is not the one asked for."""
    if options.solver == "highs" and not highs_available():
        return "cbc", ["HiGHS (highspy) is not available; solved with CBC instead"]
    return options.solver, []


class SolverFailed(RuntimeError):
    """The MILP solver itself failed (not: found no solution in time, or proved infeasibility)."""


class HiGHSWithStart(pulp.HiGHS):
    """`pulp.HiGHS` plus a MIP start: PuLP's highspy class has no warm start (only HiGHS_CMD does), and a
    lexicographic stage should start from the previous stage's plan, which satisfies it by construction."""

    def __init__(self, *args: object, start: Mapping[str, float] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.start = dict(start or {})

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.threads is not None:
            import highspy

            # HiGHS keeps one thread scheduler per process and refuses a solve that asks for another thread
            # count once it exists; a long-lived worker solving with different settings must reset it.
            highspy.Highs.resetGlobalScheduler(True)
        if self.start:
            import numpy as np

            # Column indices are assigned by buildSolverModel, which runs just before this.
            pairs = [(v.index, self.start[v.name]) for v in lp.variables() if v.name in self.start]
            if pairs:
                index = np.array([i for i, _ in pairs], dtype=np.int32)
                value = np.array([x for _, x in pairs], dtype=np.float64)
                lp.solverModel.setSolution(len(pairs), index, value)  # a rejected start only costs the try
        super().callSolver(lp)


def solver_build(
    options: SolveOptions, backend: str, *, time_limit_s: float, log_path: str | None = None, start: Mapping[str, float] | None = None
) -> pulp.LpSolver:
    """A PuLP solver configured from the options: quiet, time-limited, with the requested relative gap."""
    time_limit_s = max(0.01, float(time_limit_s))
    gap = float(options.mip_gap)
    if backend == "highs":
        return HiGHSWithStart(msg=False, timeLimit=time_limit_s, gapRel=gap, threads=options.threads, start=start)
    if backend == "cbc":
        # CBC reads a start from the variables' initial values (set by the caller) with warmStart.
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=gap, threads=options.threads, logPath=log_path, warmStart=bool(start))
    raise ValueError(f"unknown MILP backend {backend!r}; choose 'highs' or 'cbc'")


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None or not math.isfinite(objective) or not math.isfinite(bound):
        return None
    return abs(objective - bound) / max(abs(objective), 1e-9)


def milp_solve(
    lp: pulp.LpProblem, options: SolveOptions, *, time_limit_s: float, backend: str | None = None, start: Mapping[str, float] | None = None
) -> SolveOutcome:
    """Solve `lp` and report how it went. The variables hold the incumbent afterwards when there is one.
    `start` (variable name -> value) is a MIP start: a known feasible point to begin from."""
    backend = backend or backend_choose(options)[0]
    started = time.perf_counter()
    if backend == "highs":
        outcome_read = _highs_solve(lp, options, time_limit_s, start)
    else:
        outcome_read = _cbc_solve(lp, options, time_limit_s, start)
    state, objective, bound = outcome_read
    seconds = time.perf_counter() - started
    if state == "optimal" and bound is None:
        bound = objective
    gap = relative_gap(objective, bound) if state in ("optimal", "feasible") else None
    if state == "optimal" and gap is not None and gap < 1e-9:
        gap = 0.0
    return SolveOutcome(state=state, objective=objective, bound=bound, gap=gap, seconds=seconds, backend=backend)


def _objective_value(lp: pulp.LpProblem) -> float | None:
    value = pulp.value(lp.objective)
    return None if value is None else float(value)


def _highs_solve(
    lp: pulp.LpProblem, options: SolveOptions, time_limit_s: float, start: Mapping[str, float] | None
) -> tuple[SolveState, float | None, float | None]:
    import highspy

    lp.solve(solver_build(options, "highs", time_limit_s=time_limit_s, start=start))
    model = lp.solverModel
    status = model.getModelStatus()
    info = model.getInfo()
    statuses = highspy.HighsModelStatus
    # primal_solution_status 2 = feasible point held; a time-limited MIP without incumbent has none.
    has_point = info.primal_solution_status == 2
    if status == statuses.kOptimal:
        state: SolveState = "optimal"
    elif status in (statuses.kInfeasible, statuses.kUnboundedOrInfeasible):
        return "infeasible", None, None
    elif status in (statuses.kTimeLimit, statuses.kIterationLimit, statuses.kInterrupt, statuses.kSolutionLimit,
                    statuses.kObjectiveBound, statuses.kObjectiveTarget):
        if not has_point:
            return "no-solution", None, None
        state = "feasible"
    else:
        # An error (model, presolve, solve, memory) is not "no solution in time": say what HiGHS said.
        raise SolverFailed(f"HiGHS stopped with status {model.modelStatusToString(status)!r}")
    objective = _objective_value(lp)
    # PuLP hands HiGHS a minimisation (objective negated for maximise) without the objective's constant.
    sense = -1.0 if lp.sense == pulp.LpMaximize else 1.0
    raw_bound = float(info.mip_dual_bound)
    is_mip = any(v.cat == pulp.LpInteger for v in lp.variables())
    bound = sense * raw_bound + float(lp.objective.constant) if is_mip and math.isfinite(raw_bound) else None
    return state, objective, bound


def _cbc_solve(
    lp: pulp.LpProblem, options: SolveOptions, time_limit_s: float, start: Mapping[str, float] | None
) -> tuple[SolveState, float | None, float | None]:
    if start:
        for var in lp.variables():
            if var.name in start:
                var.setInitialValue(start[var.name], check=False)
    handle, log_path = tempfile.mkstemp(prefix="tessera-cbc-", suffix=".log")
    os.close(handle)
    try:
        lp.solve(solver_build(options, "cbc", time_limit_s=time_limit_s, log_path=log_path, start=start))
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            log = fh.read()
    finally:
        try:
            os.unlink(log_path)
        except OSError:
            pass
    if lp.status == pulp.LpStatusInfeasible or lp.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible", None, None
    if lp.sol_status == pulp.LpSolutionOptimal:
        state: SolveState = "optimal"
    elif lp.sol_status == pulp.LpSolutionIntegerFeasible:
        state = "feasible"
    else:
        return "no-solution", None, None
    objective = _objective_value(lp)
    bound = None
    found = _CBC_BOUND_RE.search(log)
    logged_objective = _CBC_OBJECTIVE_RE.search(log)
    if found and logged_objective:
        try:
            # CBC prints the bound in the problem's sense; PuLP's value adds any objective constant, so
            # shift the bound by the same offset between PuLP's value and CBC's.
            bound = float(found.group(2)) + ((objective or 0.0) - float(logged_objective.group(1)))
        except ValueError:
            bound = None
    result = _CBC_RESULT_RE.search(log)
    if state == "feasible" and result and result.group(1).startswith("Optimal"):
        state = "optimal"
    return state, objective, bound


def status_combine(*states: SolveState) -> PlanStatus:
    """A sequence of solves is optimal only if every stage was; infeasible if the last could not solve."""
    if not states or states[-1] not in ("optimal", "feasible"):
        return "infeasible"
    return "optimal" if all(s == "optimal" for s in states) else "feasible"
