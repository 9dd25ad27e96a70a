"""Planners. `solve.plan_solve` is the front door; `registry` lists every planner (its kind, paper and
strategy); `compose` decides how a problem is split among planners and merges their plans; `assemble`
turns decisions into a Plan, computing served traffic, shortfall and routing one way for all. The
strategies: `proteus`, `joint`, `garrison`, `garrison_demand` and `baselines` (MIG instances, whole GPUs,
CPU hosts; their MILPs in `model` and `milp`), `gpulets` (MPS GPUs), `pipelines` (fa2, ipa, biscale's
pipelines), `vertical` (sponge), `mixed` (MPS GPUs beside others), `ensembles` (one application per
member), `spare` (idle devices' spare capacity), `hosts` (CPU cores shared by parts), `budget` (the
one time budget every solve of a plan shares). Rule: a strategy
never calls `plan_solve`; nothing outside the solvers imports a solver module but `solve` and `registry`
(tests and benches may call a strategy directly)."""
