"""Tessera's planning engine: pure Python (typed values in, result objects out) that imports no Django,
Celery, Channels, `apps`, `controlplane` or `workers`; the control plane, the data plane and the
benchmarks all use this one implementation of each algorithm.

Sub-packages, by concern:
    geometry     MIG catalogue, layouts and their validator, mig-parted YAML, data-plane names
    plans        problem and plan values, their JSON schema, the capacity model, the independent validator
    solvers      plan_solve, the registry of planners (fleet, baselines, MPS, pipelines, vertical), the one composition
                 that splits a problem among them and merges their plans, and their MILP plumbing
    pipelines    pipeline programmes: FA2's DP and exact P1.3, IPA, brute-force references
    sharing      MPS partitions: gpulets' latency and interference models and schedulers
    vertical     in-place vertical scaling: Sponge's latency model and controller, Biscale
    ensembles    random ensembles (Garrison): ensemble policies, the per-query draw, frequency table and weighted vote
    dataplane    the policies the data plane runs: adaptive batching, routing tables and query matching
    simulation   discrete-event simulator and workload (trace) generators
    forecasting  short-term demand forecast for re-planning
    reference    reference profiles derived from engine/reference/data and synthetic problem generators
"""
