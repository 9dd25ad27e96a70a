"""Inference pipelines (FA2, IPA; Razavi's thesis, docs/references.md):
applications whose queries run through several DNNs along execution paths, each path with its own SLO and
rate. Pure Python, no Django.

- `problem`: the typed problem (stages with a fitted latency model and the profile it was fitted to,
  execution paths) and plan values;
- `transform`: FA2's graph transformation (sharing degree, SLO split by intensity);
- `fa2`: FA2's dynamic programme over time slots, on the paper's fitted model;
- `exact`: the integer programme P1.3 solved exactly with PuLP/HiGHS on the profiled latencies (fa2's
  default in a fleet plan);
- `ipa`: IPA (P3.10), solved exactly by a dynamic programme over the stages (and by HiGHS, to cross-check);
- `baselines`: DS2-style (batch 1) and InferLine-style (greedy batch increase);
- `brute`: random profiled pipelines (chains, forks, joins, DAGs) and P1.3's optimum by enumeration, the
  reference `exact` is tested against;
- `validate`: checks any pipeline plan against the problem on the profiled latencies, independently of
  the solver that made it."""
