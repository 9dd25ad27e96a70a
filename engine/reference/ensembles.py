"""Garrison's evaluation workloads (DAC'24 §6.1, Table 1; cited in docs/references.md) as
planning problems and ensemble scenarios, on stand-in profiles: the named scenarios that
`tessera scheduler train|evaluate` and benches/ensembles.py run.

Table 1 (transcribed): "Workload Scenario-A: MoblieNet(2), GoogLeNet(2), DenseNet40(6), 100 ms; B:
MoblieNet(2), GoogLeNet(2), VGG11(2), EfficientNet-b0(2), EfficientNet-b3(2), 100 ms; C: VGG11(2),
GoogLeNet(2), MoblieNet(2), DenseNet40(2), ResNet20(6), EfficientNet-b0(2), 150 ms; D: VGG11(2),
MoblieNet(2), GoogLeNet(2), DenseNet40(6), EfficientNet-b0(2), EfficientNet-b3(2), 150 ms", where "(N)
signifies N homogeneous models trained on distinct datasets"; "batch sizes are set to range from 1 to 64"
and log-normal; the testbed is 8 A100s, 56 slices.

Stand-ins, stated: the paper's models are not in engine/reference/data, so each takes the A100 MIG profiles derived
from the gpulets measurements (engine/reference/profiles.py, `gpulet_profiles_derive`: latency scaled
from the covering MPS partition, an illustrative A100 speed-up) of a model of its kind: MobileNet and
EfficientNet-b0 -> mobilenet, GoogLeNet -> inception (GoogLeNet is Inception v1), DenseNet40 ->
densenet121, VGG11 -> vgg16, EfficientNet-b3 -> resnet50, ResNet20 -> resnet50. The N copies of a model
share its profile. Sampling probabilities are uniform (the paper gives none). Query sizes: log-normal
with median 8 and sigma 1, on the integers 1..64 (the paper gives neither parameter). The arrival rate is
`load` times what the full ensemble can serve on the `garrison` plan (every member answers every query),
so that at load > 1 the full ensemble is overloaded, as TritonX(N) is in Figure 7.

Homogeneous allocations (§6.3, Figure 9(a): "we allocate GIs of the same granularity to the ensemble
models"; `homogeneous_scenario`, ours, for benches/ensembles.py): every GPU is cut into GIs of one size g
(1g.5gb x 7, 2g.10gb x 3, 3g.20gb x 2 or 7g.40gb x 1 per A100), and these instances are shared among the
members in proportion to Algorithm 1's own slice shares with GS fixed to g (IR[m, b] = g x L_g[m, b] x
SP[m], normalised per query-size range, weighted by D[b]; `garrison_allocate`), by largest remainder with
at least one instance per member. The paper gives no rule for how it shares same-size GIs among models; we
take its allocator's, so that only the granularity differs from the `garrison` plan.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from engine.plans.problem import Plan, Problem, problem_from_dict
from engine.reference.profiles import GPULET_VARIANT_MEMORY_MB, gpulet_inference_read, gpulet_profiles_derive
from engine.simulation.ensembles import EnsembleScenario, ensemble_scenario_from_plan

__all__ = [
    "GARRISON_STAND_INS",
    "GARRISON_TABLE1",
    "HOMOGENEOUS_SLICES",
    "SCENARIO_NAMES",
    "garrison_table1_problem",
    "homogeneous_scenario",
    "lognormal_query_sizes",
    "scenario_build",
]

A100 = "A100-SXM4-40GB"
# Table 1: scenario -> (SLO ms, ((model, copies), ...)).
GARRISON_TABLE1: dict[str, tuple[float, tuple[tuple[str, int], ...]]] = {
    "A": (100.0, (("mobilenet", 2), ("googlenet", 2), ("densenet40", 6))),
    "B": (100.0, (("mobilenet", 2), ("googlenet", 2), ("vgg11", 2), ("efficientnet-b0", 2), ("efficientnet-b3", 2))),
    "C": (150.0, (("vgg11", 2), ("googlenet", 2), ("mobilenet", 2), ("densenet40", 2), ("resnet20", 6), ("efficientnet-b0", 2))),
    "D": (150.0, (("vgg11", 2), ("mobilenet", 2), ("googlenet", 2), ("densenet40", 6), ("efficientnet-b0", 2), ("efficientnet-b3", 2))),
}
GARRISON_STAND_INS: dict[str, str] = {
    "mobilenet": "mobilenet", "efficientnet-b0": "mobilenet", "googlenet": "inception", "densenet40": "densenet121",
    "vgg11": "vgg16", "efficientnet-b3": "resnet50", "resnet20": "resnet50",
}
SCENARIO_NAMES: tuple[str, ...] = tuple(f"table1-{k.lower()}" for k in GARRISON_TABLE1)
# The homogeneous geometries of an A100-40GB: GI size -> (MIG profile, GIs per GPU).
HOMOGENEOUS_SLICES: dict[str, tuple[str, int]] = {"1g": ("1g.5gb", 7), "2g": ("2g.10gb", 3), "3g": ("3g.20gb", 2), "7g": ("7g.40gb", 1)}


def lognormal_query_sizes(median: float = 8.0, sigma: float = 1.0, largest: int = 64) -> tuple[tuple[int, float], ...]:
    """D over sizes 1..largest: the log-normal's mass on [s - 0.5, s + 0.5), the tails folded into 1 and `largest`."""
    from scipy.stats import lognorm

    dist = lognorm(s=sigma, scale=median)
    edges = np.concatenate(([0.0], np.arange(1, largest) + 0.5, [np.inf]))
    mass = np.diff(dist.cdf(edges))
    mass = mass / mass.sum()
    return tuple((int(s), float(p)) for s, p in zip(range(1, largest + 1), mass) if p > 0)


@lru_cache(maxsize=8)
def _profiles(model: str) -> tuple[dict[str, Any], ...]:
    derived = gpulet_profiles_derive(gpulet_inference_read(), A100, models=[model])
    return tuple({"device_type": d.point.device_type, "slice": d.point.slice, "batch": d.point.batch, "latency_ms": d.point.latency_ms}
                 for d in derived if d.point.slice != "full")


def garrison_table1_problem(scenario: str, *, gpus: int = 8, demand_rps: float = 100.0, mode: str = "random",
                            min_size: int = 1, max_size: int | None = None) -> Problem:
    """Table 1's scenario ("A".."D") on `gpus` simulated A100s (see the module docstring)."""
    key = scenario.upper().removeprefix("TABLE1-")
    if key not in GARRISON_TABLE1:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIO_NAMES)}")
    slo_ms, models = GARRISON_TABLE1[key]
    variants, profiles = [], []
    for model, copies in models:
        stand_in = GARRISON_STAND_INS[model]
        for i in range(copies):
            name = f"{model}-{i}"
            variants.append({"name": name, "application": "defend", "accuracy": 0.9, "memory_mb": GPULET_VARIANT_MEMORY_MB.get(stand_in, 1000.0)})
            profiles += [{"variant": name, **p} for p in _profiles(stand_in)]
    names = [v["name"] for v in variants]
    ensemble = {"mode": mode, "members": {n: 1.0 / len(names) for n in names}, "min_size": min_size, "max_size": max_size or len(names)}
    if mode == "learned":
        ensemble["scheduler"] = f"table1-{key.lower()}"
    return problem_from_dict({
        "applications": [{"name": "defend", "slo_ms": slo_ms, "demand_rps": demand_rps,
                          "query_sizes": {str(s): p for s, p in lognormal_query_sizes()}, "ensemble": ensemble}],
        "variants": variants, "profiles": profiles,
        "devices": [{"name": f"a100-{i}", "type": A100, "mig": True} for i in range(gpus)],
    })


def full_ensemble_capacity_rps(problem: Problem, plan: Plan) -> float:
    """Queries a second the plan serves when every member answers every query: the least, over members, of
    its instances' queries a second at the mean query size."""
    app = problem.application("defend")
    size = app.mean_query_size
    capacity: dict[str, float] = {m: 0.0 for m in app.ensemble.variants} if app.ensemble else {}
    for inst in plan.instances:
        device = problem.device(inst.device)
        points = problem.profiles_for(inst.variant, device.type, inst.slice)
        latency = float(np.interp(size, [p.batch for p in points], [p.latency_ms for p in points]))
        capacity[inst.variant] = capacity.get(inst.variant, 0.0) + 1000.0 / latency
    return min(capacity.values()) if capacity else 0.0


def scenario_build(name: str, *, load: float = 1.2, duration_s: float = 60.0, gpus: int = 8) -> tuple[Problem, Plan, EnsembleScenario]:
    """A named scenario (`SCENARIO_NAMES`): its problem, the `garrison` plan (Algorithm 1) and the ensemble
    scenario on that plan at `load` x the full ensemble's capacity."""
    from engine.solvers.garrison import garrison_solve

    if name not in SCENARIO_NAMES:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIO_NAMES)}")
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a number > 0, got {load!r}")
    problem = garrison_table1_problem(name, gpus=gpus)
    plan = garrison_solve(problem)
    rate = load * full_ensemble_capacity_rps(problem, plan)
    return problem, plan, ensemble_scenario_from_plan(problem, plan, "defend", rate_rps=rate, duration_s=duration_s, name=name)


def homogeneous_scenario(problem: Problem, gi: str, *, rate_rps: float, duration_s: float, gpus: int = 8,
                         name: str | None = None, application: str = "defend") -> EnsembleScenario:
    """The ensemble scenario on a homogeneous allocation (see the module docstring): `gpus` A100s cut into
    GIs of size `gi` ("1g", "2g", "3g" or "7g"), shared among the members by Algorithm 1 with GS fixed to
    that size. Raises ValueError when there are fewer GIs than members (7g: 8 GIs for 10 or 16 members):
    a member without an instance could never answer."""
    from engine.ensembles.sizes import query_size_ranges
    from engine.geometry.catalogue import mig_catalogue_load
    from engine.simulation.ensembles import EnsembleInstance
    from engine.solvers.garrison import garrison_allocate

    if gi not in HOMOGENEOUS_SLICES:
        raise ValueError(f"gi must be one of {', '.join(HOMOGENEOUS_SLICES)}, got {gi!r}")
    slice_name, per_gpu = HOMOGENEOUS_SLICES[gi]
    app = problem.application(application)
    if app.ensemble is None:
        raise ValueError(f"{application} has no ensemble policy")
    sampling = {m.variant: m.probability for m in app.ensemble.members if m.probability > 0}
    total = gpus * per_gpu
    if total < len(sampling):
        raise ValueError(f"{total} GIs of {slice_name} for {len(sampling)} members: a member would have no instance")
    level = float(mig_catalogue_load().gpu_model_get(A100).profile_get(slice_name).compute_slices)
    ranges = query_size_ranges(app.query_sizes)
    points = {m: problem.profiles_for(m, A100, slice_name) for m in sampling}
    latency = {(m, i): float(np.interp(r.size, [p.batch for p in points[m]], [p.latency_ms for p in points[m]]))
               for m in sampling for i, r in enumerate(ranges)}
    n = garrison_allocate({key: level for key in latency}, latency, {i: r.share for i, r in enumerate(ranges)}, sampling, level * total)
    wanted = {m: sum(v for (mm, _), v in n.items() if mm == m) for m in sampling}
    scale = (total - len(sampling)) / max(sum(wanted.values()), 1e-12)
    extra = {m: wanted[m] * scale for m in sampling}  # one instance each first, the rest by share
    counts = {m: 1 + math.floor(extra[m] + 1e-9) for m in sampling}
    for m in sorted(sampling, key=lambda m: (-(extra[m] - math.floor(extra[m] + 1e-9)), m)):
        if sum(counts.values()) >= total:
            break
        counts[m] += 1
    instances = []
    for gpu_slot, m in enumerate(m for m in sampling for _ in range(counts[m])):
        gpu, position = divmod(gpu_slot, per_gpu)
        instances.append(EnsembleInstance(f"a100-{gpu}/{slice_name}#{position}/{m}", m, level,
                                          tuple(p.batch for p in points[m]), tuple(p.latency_ms for p in points[m])))
    return EnsembleScenario(name or f"{application} on all {slice_name}", app.ensemble, tuple(instances), slo_ms=app.slo_ms,
                            rate_rps=rate_rps, duration_s=duration_s, query_sizes=app.query_sizes or ((1, 1.0),))
