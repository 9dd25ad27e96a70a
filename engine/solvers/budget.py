"""The one time budget of a solve (`options.time_limit_s`), shared by every solve a plan is composed of: each
gets an equal share of what is left before the deadline for the solves still to come (compose.py, mixed.py,
pipelines.py)."""
from __future__ import annotations

import dataclasses
import time

from engine.plans.problem import Problem

__all__ = ["MIN_SHARE_S", "budget_share", "problem_timed"]

# The least time a solve is given, even when earlier ones used up the budget.
MIN_SHARE_S = 0.01


def budget_share(deadline: float, solves_left: int) -> float:
    """Seconds for the next of `solves_left` solves: an equal share of what is left before `deadline`
    (a time.perf_counter() value)."""
    return max(MIN_SHARE_S, (deadline - time.perf_counter()) / max(1, solves_left))


def problem_timed(problem: Problem, deadline: float, solves_left: int) -> Problem:
    """`problem` with `budget_share(deadline, solves_left)` as its time limit."""
    share = budget_share(deadline, solves_left)
    return dataclasses.replace(problem, options=dataclasses.replace(problem.options, time_limit_s=share))
