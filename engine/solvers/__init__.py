"""Planners: `solve.plan_solve` dispatches to proteus, joint, garrison or a baseline. Rule: solvers build
plans from `engine.plans` values; nothing outside the solvers imports a solver module but `solve`."""
