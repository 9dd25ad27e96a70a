"""Inference pipelines (FA2, IPA; Razavi's thesis, docs/references.md):
applications whose queries run through several DNNs along execution paths, each path with its own SLO and
rate. Pure Python, no Django.

- `problem`: the typed problem (stages with a fitted latency model, execution paths) and plan values;
- `transform`: FA2's graph transformation (sharing degree, SLO split by intensity);
- `fa2`: FA2's dynamic programme over time slots;
- `exact`: the same integer programme (P1.3) solved exactly with PuLP/HiGHS, for comparison;
- `baselines`: DS2-style (batch 1) and InferLine-style (greedy batch increase);
- `validate`: checks any pipeline plan against the problem, independently of the solver that made it."""
