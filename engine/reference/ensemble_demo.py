"""The demo's ensemble application as an ensemble scenario, for training the learned scheduler that ships
with the demo (`tessera scheduler train --scenario demo`; issue 20).

`tessera demo` seeds `tabular-ensemble`: four bagged random-feature classifiers
(controlplane/demo_models.py, `ENSEMBLE_MEMBERS`), one CPU runtime each on the demo's CPU host, its
ensemble policy `DEMO_ENSEMBLE_POLICY` with the learned scheduler `demo-ensemble`. The scenario here is
that serving: each member on one instance (level 1: a CPU runtime), its latency per query size 1 ms (the
runtime's own path: frame, queue, encode) plus the members' onnxruntime times, measured on the
development machine (one thread, 2026-11-27; sub-millisecond models: the router, not the model,
dominates), the SLO the demo gives the application, query sizes log-normal 1-64 as in Garrison's
evaluation, at `rate_rps` (default 1,000 a second: about what one member's instance serves, so that the
full ensemble misses the SLO, 52 % of queries late at 1,200, and a random pair keeps it; the size matters).
"""
from __future__ import annotations

from engine.ensembles.policy import ensemble_policy_from_dict
from engine.simulation.ensembles import EnsembleInstance, EnsembleScenario

__all__ = ["DEMO_ENSEMBLE_APPLICATION", "DEMO_ENSEMBLE_POLICY", "DEMO_ENSEMBLE_SLO_MS", "demo_scenario_build"]

DEMO_ENSEMBLE_APPLICATION = "tabular-ensemble"
DEMO_ENSEMBLE_SLO_MS = 25.0
DEMO_ENSEMBLE_POLICY = {
    "mode": "learned", "scheduler": "demo-ensemble", "min_size": 1, "max_size": 4, "vote": "soft",
    "members": [{"variant": "bag-rf-32", "probability": 0.1, "weight": 0.65}, {"variant": "bag-rf-64", "probability": 0.4, "weight": 0.70},
                {"variant": "bag-rf-128", "probability": 0.3, "weight": 0.70}, {"variant": "bag-rf-256", "probability": 0.2, "weight": 0.69}],
}
# onnxruntime, one thread, per query of each size (ms), measured as the module docstring says.
_ONNX_MS = {"bag-rf-32": {1: 0.020, 8: 0.006, 32: 0.007, 64: 0.009}, "bag-rf-64": {1: 0.006, 8: 0.007, 32: 0.008, 64: 0.011},
            "bag-rf-128": {1: 0.006, 8: 0.007, 32: 0.010, 64: 0.013}, "bag-rf-256": {1: 0.007, 8: 0.008, 32: 0.012, 64: 0.017}}
RUNTIME_PATH_MS = 1.0


def demo_scenario_build(*, rate_rps: float = 1000.0, duration_s: float = 60.0) -> EnsembleScenario:
    from engine.reference.ensembles import lognormal_query_sizes

    policy = ensemble_policy_from_dict(DEMO_ENSEMBLE_POLICY)
    instances = tuple(
        EnsembleInstance(f"sim-cpu-01/{name}", name, 1.0, tuple(sorted(times)), tuple(RUNTIME_PATH_MS + times[s] for s in sorted(times)))
        for name, times in _ONNX_MS.items())
    return EnsembleScenario("demo", policy, instances, slo_ms=DEMO_ENSEMBLE_SLO_MS, rate_rps=rate_rps, duration_s=duration_s,
                            query_sizes=lognormal_query_sizes())
