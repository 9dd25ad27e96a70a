"""The planners Tessera offers, in one registry: what the CLI (`tessera plan solve --solver`, `tessera
simulate --planner`), the REST API (a plan run's `solver`, `GET /api/v1/planners/`) and the dashboard's
plans page list, and what `engine.solvers.compose` runs.

Each planner is a strategy of one of five kinds:

- `fleet` (proteus, joint, garrison, garrison-demand, fleet) and `baseline` (Proteus's evaluation baselines):
  plan a whole problem on MIG instances, whole GPUs and CPU hosts; `strategy(problem) -> Plan`.
- `mps` (gpulets and the baselines of its evaluation): plan the MPS GPUs; `strategy(problem) -> Plan`.
- `pipeline` (fa2, ipa): plan the problem's pipelines on CPU hosts (`pipelines.pipeline_part_solve`), the
  rest going to the default fleet planner.
- `vertical` (sponge, biscale): plan the CPU applications outside pipelines for in-place vertical
  scaling (`vertical.vertical_part_solve`), biscale the pipelines too; the rest to the default planner.

The composition (which strategy plans which part of a problem, and how the parts are merged) is
`compose.py`'s alone; a strategy never calls the front door back. Strategies load lazily: a planner's
module and its solver libraries are imported when it is first used."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # the CLI reads the registry for its help, without loading the engine's planning modules
    from engine.plans.problem import Plan, Problem

PlannerKind = Literal["fleet", "baseline", "mps", "pipeline", "vertical"]
PLANNER_KINDS: tuple[str, ...] = ("fleet", "baseline", "mps", "pipeline", "vertical")
# The kinds whose strategy plans a whole problem (Problem -> Plan); the others plan a part of it.
WHOLE_KINDS: tuple[str, ...] = ("fleet", "baseline", "mps")

# The planner a plan run, `tessera plan solve` and `plan_solve` use unless told otherwise: the fleet model,
# the one planner that plans every slice kind and workload in one optimisation with a bound (issue 40).
DEFAULT_PLANNER = "fleet"
# What plans what a part planner leaves, and a fleet's MPS GPUs or other devices when the chosen planner is
# of the other kind (compose.py): Proteus's MILP, so that each seed's composition stays its own baseline.
DEFAULT_FLEET_PLANNER = "proteus"
DEFAULT_MPS_PLANNER = "gpulets"
# What plans a problem's pipelines when the chosen planner does not.
DEFAULT_PIPELINE_PLANNER = "fa2"


@dataclass(frozen=True)
class PlannerInfo:
    """One planner: its name, kind, a line for users, the paper it follows, and where its strategy is."""

    name: str
    kind: PlannerKind
    summary: str
    paper: str
    # "module:function" and keyword arguments: the strategy, imported when first used.
    entry: str
    entry_kwargs: dict[str, Any] = field(default_factory=dict)
    # Which pipeline planner plans the problem's pipelines when this one is chosen.
    pipelines_by: str = DEFAULT_PIPELINE_PLANNER
    # Reads ensemble applications itself: garrison plans them by Algorithm 1, fleet counts each whole over its
    # members' rows; the others get one application per ensemble member (ensembles.py).
    reads_ensembles: bool = False
    # Plans MPS GPUs beside the other devices in one model; the others get the two-stage mixed composition.
    plans_mps: bool = False
    # Plans the problem's pipelines inside its own model (with `pipelines_by`'s plans as its options);
    # for the others the composition plans pipelines first, on CPU hosts, and gives them what is left.
    plans_pipelines: bool = False
    # Its plans are replayed by the fleet simulator (`tessera simulate`, engine/simulation/simulator.py).
    simulated: bool = True

    def strategy(self) -> Callable[..., Any]:
        module, function = self.entry.split(":")
        target = getattr(importlib.import_module(module), function)
        if not self.entry_kwargs:
            return target
        kwargs = dict(self.entry_kwargs)
        return lambda *args, **more: target(*args, **kwargs, **more)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "summary": self.summary, "paper": self.paper,
                "pipelines_by": self.pipelines_by, "reads_ensembles": self.reads_ensembles, "plans_mps": self.plans_mps,
                "plans_pipelines": self.plans_pipelines,
                "simulated": self.simulated}


def _sharing(name: str, summary: str) -> PlannerInfo:
    return PlannerInfo(name, "mps", summary, "gpulets (Choi et al., ATC'22)", "engine.solvers.gpulets:sharing_plan_solve", {"solver": name})


PLANNERS: dict[str, PlannerInfo] = {p.name: p for p in (
    PlannerInfo("proteus", "fleet", "Proteus's MILP: variant, placement and batch per MIG instance, whole GPU and CPU host, "
                "fairness first then accuracy", "Proteus (Ahmad et al., ASPLOS'24) §4", "engine.solvers.proteus:proteus_solve"),
    PlannerInfo("joint", "fleet", "Proteus's MILP with the MIG layout of every GPU chosen too",
                "Proteus §4 with Garrison's MIG geometry", "engine.solvers.joint:joint_solve"),
    PlannerInfo("garrison", "fleet", "Garrison's Algorithm 1 as written: GPU instances per model and query size, reading ensembles",
                "Garrison (Wang et al., DAC'24) §4.2", "engine.solvers.garrison:garrison_solve", reads_ensembles=True),
    PlannerInfo("garrison-demand", "fleet", "Garrison's sweet intervals with instances sized to demand",
                "Garrison §4.1, sized by Tessera", "engine.solvers.garrison_demand:garrison_demand_solve"),
    PlannerInfo("fleet", "fleet", "One MILP for the whole fleet: MIG geometry, whole GPUs, CPU hosts and MPS splits and time-shared "
                "patterns, pipelines as FA2 plans at fractions of their demand, ensembles counted whole, fairness first then accuracy, "
                "with a bound for all of it",
                "Proteus §4 with Garrison's geometry, gpulets' partitions and FA2's pipelines (issue 40)",
                "engine.solvers.fleet:fleet_model_solve", reads_ensembles=True, plans_mps=True, plans_pipelines=True),
    PlannerInfo("clipper-ha", "baseline", "Clipper, high accuracy: a static allocation of the most accurate variants",
                "Proteus §6.1.1", "engine.solvers.baselines:clipper_ha_solve"),
    PlannerInfo("clipper-ht", "baseline", "Clipper, high throughput: a static allocation of the fastest variants",
                "Proteus §6.1.1", "engine.solvers.baselines:clipper_ht_solve"),
    PlannerInfo("sommelier", "baseline", "Sommelier: variant swaps on a fixed placement", "Proteus §6.1.1",
                "engine.solvers.baselines:sommelier_solve"),
    PlannerInfo("infaas", "baseline", "INFaaS-Accuracy: a greedy allocation", "Proteus §6.1.1", "engine.solvers.baselines:infaas_solve"),
    _sharing("gpulets", "gpulets' elastic partitioning (Algorithm 1) with GPU scaling (Algorithm 2) on MPS GPUs"),
    _sharing("sbp", "squishy bin packing: whole MPS GPUs time-shared"),
    _sharing("best-fit", "greedy best-fit of models onto MPS partitions"),
    _sharing("ideal", "the exhaustive search over partition splits of every MPS GPU"),
    PlannerInfo("fa2", "pipeline", "FA2: per pipeline stage the batch and replicas with every path within its SLO (P1.3, exact)",
                "thesis P1 (FA2) §p1.4", "engine.solvers.pipelines:pipeline_part_solve", {"solver": "fa2"}, pipelines_by="fa2",
                simulated=False),
    PlannerInfo("ipa", "pipeline", "IPA: per pipeline stage the variant, batch and replicas trading accuracy against cores",
                "thesis P3 (IPA) §p3.4", "engine.solvers.pipelines:pipeline_part_solve", {"solver": "ipa"}, pipelines_by="ipa",
                simulated=False),
    PlannerInfo("sponge", "vertical", "Sponge: CPU instances sized for in-place vertical scaling by the agents' fast loop",
                "thesis P2 (Sponge)", "engine.solvers.vertical:vertical_part_solve", simulated=False),
    PlannerInfo("biscale", "vertical", "Biscale: pipelines on one-core replicas that grow in place, CPU applications as sponge",
                "thesis P4 (Biscale) §p4.4", "engine.solvers.vertical:vertical_part_solve", pipelines_by="biscale", simulated=False),
)}


def planner_names(*kinds: str) -> tuple[str, ...]:
    """Every planner's name (of `kinds` when given), in the registry's order."""
    for kind in kinds:
        if kind not in PLANNER_KINDS:
            raise ValueError(f"unknown planner kind {kind!r}; one of: {', '.join(PLANNER_KINDS)}")
    return tuple(name for name, p in PLANNERS.items() if not kinds or p.kind in kinds)


def planner_get(name: str) -> PlannerInfo:
    """The registered planner `name`; ValueError naming every planner when there is none."""
    try:
        return PLANNERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown solver {name!r}; choose one of: {', '.join(PLANNERS)}") from None


def whole_strategy(name: str) -> Callable[[Problem], Plan]:
    """The Problem -> Plan strategy of a planner that plans whole problems (fleet, baseline or mps)."""
    info = planner_get(name)
    if info.kind not in WHOLE_KINDS:
        raise ValueError(f"{name} plans a part of a problem ({info.kind}), not a whole one")
    return info.strategy()
