"""FA2's scaling by dynamic programming (Razavi's thesis P1 §p1.4.5, Algorithm 1), transcribed.

On the transformed graph (`engine/pipelines/transform.py`: a forest, every DNN with at most one
predecessor), OPT(s, t) is the fewest instances DNN s and everything after it need within a time budget t:

- Case 1, no successors (P1.5): OPT(s, t) = min over b with l_s(b) <= t of ceil(lambda_s / h_s(b));
- Case 2, successors M (P1.7): OPT(s, t) = min over b with l_s(b) <= t of ceil(lambda_s / h_s(b)) +
  sum over m in M of OPT(m, t_m), where t_m = min{SLA_p, t - l_s(b)} when m is the first DNN of path p,
  and t - l_s(b) otherwise;
- an artificial node s0 precedes the first DNNs; the answer is OPT(s0, t_max), t_max = max_p SLA_p.

Time runs in slots of 1 ms (`slot_ms`); "we iterate over all the DNNs in a reversed order of the
topologically sorted dataflow graph, the possible time budget, and the batch size", fill the table with
P1.5 / P1.7 and backtrack from OPT(s0, t_max) to each DNN's batch size and instance count. O(|S| * t_max *
b_max * |S|) time, |S| * t_max table entries.

Where this departs, and why:
- a stage's time l_s(b) = d_s(b) + q_s(b) is rounded *up* to whole slots, so every plan the DP returns
  meets every SLO on the continuous model (the paper does not say how it rounds);
- each candidate also costs delta * b, P1.3's batch penalty, so among equal instance counts the smallest
  batches win (the paper states the penalty in the programme, not in the recursion);
- each budget is the whole vector over t at once (NumPy), not one t at a time: the same table, faster;
- where several paths start at the same DNN, t_m takes the smallest of their SLAs (the recursion's min
  over the paths m starts), which is what "the first DNN on path p" gives when p is any of them;
- below a fork, the recursion hands every branch the budget of the tightest path through the fork (OBJD
  starts three paths of Table P1.3, with SLAs of 3020, 3095 and 3505 ms: NSFW -> FACR would be planned for
  3020). Here, when every path through the fork started at the same DNN (so that the time spent so far is
  the same on all of them), a branch gets back the difference between the tightest SLA through the fork
  and the tightest SLA through the branch (`_branch_slack`); otherwise it gets nothing back, as in the
  paper. Either way each budget stays at most the time any path through that DNN has left, so every plan
  is still within every SLO; with the paper's rule FA2 needed more instances than InferLine's greedy on
  the Table P1.3 paths (tests/engine/test_pipelines.py)."""
from __future__ import annotations

import math
import time

import numpy as np

from engine.pipelines.problem import PipelinePlan, PipelineProblem, StageDecision, plan_objective
from engine.pipelines.transform import TransformedGraph, fa2_graph_transform

__all__ = ["fa2_solve"]


def _slots(ms: float, slot_ms: float) -> int:
    return math.ceil(ms / slot_ms - 1e-9)


def fa2_solve(problem: PipelineProblem, *, slot_ms: float = 1.0, graph: TransformedGraph | None = None) -> PipelinePlan:
    """Each stage's batch and instance count by FA2 (see the module docstring). `graph`: a transformation
    already made (default: `fa2_graph_transform(problem)`)."""
    if not (math.isfinite(slot_ms) and slot_ms > 0):
        raise ValueError(f"slot_ms must be a finite number > 0, got {slot_ms!r}")
    started = time.perf_counter()
    graph = graph or fa2_graph_transform(problem)
    delta = problem.batch_penalty()
    horizon = _slots(max(seg.slo_ms for seg in graph.segments), slot_ms)
    # cap_m: the budget a DNN that starts segments may use at most: the smallest of their SLOs, in slots
    # (rounded down, so that a plan within the slots is within the SLO).
    cap: dict[str, int] = {}
    for seg in graph.segments:
        first = seg.stages[0]
        cap[first] = min(cap.get(first, horizon), math.floor(seg.slo_ms / slot_ms + 1e-9))
    slack = _branch_slack(graph, slot_ms)
    opt: dict[str, np.ndarray] = {}
    choice: dict[str, np.ndarray] = {}
    budgets = np.arange(horizon + 1)
    for name in reversed(_forest_order(graph)):
        stage = problem.by_name[name]
        best = np.full(horizon + 1, np.inf)
        chosen = np.zeros(horizon + 1, dtype=np.int32)
        kids = graph.children[name]
        # Batches below the smallest profiled one have no latency the validator can read (no extrapolation).
        smallest = stage.latency.profile[0][0] if stage.latency.profile else 1
        for b in range(smallest, stage.max_batch + 1):
            spent = problem.time_at_stage_ms(name, b)
            if not math.isfinite(spent):
                break  # q_s(b) is infinite from here on (a stage without traffic)
            used = _slots(spent, slot_ms)
            if used > horizon:
                break  # d_s grows with b: larger batches fit no budget either
            rest = budgets[: horizon + 1 - used]  # the time left after this stage, for t = used .. horizon
            value = np.full(rest.shape, problem.instances_needed(name, b) + delta * b)
            for kid in kids:
                value = value + opt[kid][np.minimum(rest + slack[(name, kid)], cap.get(kid, horizon))]
            better = value < best[used:]
            best[used:][better] = value[better]
            chosen[used:][better] = b
        opt[name], choice[name] = best, chosen
    roots = graph.roots()
    infeasible = [r for r in roots if not math.isfinite(opt[r][cap.get(r, horizon)])]
    notes = tuple(f"removed edge {u} -> {v} (ingress aggregator), its paths' SLOs split by intensity" for u, v in graph.removed)
    if infeasible:
        return PipelinePlan(
            solver="fa2", status="infeasible", decisions={}, objective=None, runtime_s=time.perf_counter() - started,
            notes=notes + (f"no batch sizes fit the SLOs of the paths from {', '.join(infeasible)} (at {slot_ms:g} ms slots)",))
    decisions: dict[str, StageDecision] = {}
    stack = [(r, cap.get(r, horizon)) for r in roots]
    while stack:  # backtrack from OPT(s0, t_max)
        name, budget = stack.pop()
        b = int(choice[name][budget])
        decisions[name] = StageDecision(name, b, problem.instances_needed(name, b))
        left = budget - _slots(problem.time_at_stage_ms(name, b), slot_ms)
        stack.extend((kid, min(left + slack[(name, kid)], cap.get(kid, horizon))) for kid in graph.children[name])
    return PipelinePlan(solver="fa2", status="feasible", decisions=decisions, objective=plan_objective(problem, decisions),
                        runtime_s=time.perf_counter() - started, notes=notes)


def _branch_slack(graph: TransformedGraph, slot_ms: float) -> dict[tuple[str, str], int]:
    """Per edge s -> m of the forest, in whole slots: how much more time than the tightest path through s
    the paths continuing into m have left, when every path through s started at the same DNN (then they
    have all spent the same time by s); 0 otherwise (the paper's rule)."""
    through: dict[str, list] = {}
    for seg in graph.segments:
        for stage in seg.stages:
            through.setdefault(stage, []).append(seg)
    slack: dict[tuple[str, str], int] = {}
    for parent, kids in graph.children.items():
        segs = through.get(parent, [])
        same_start = len({seg.stages[0] for seg in segs}) == 1
        tightest = min(seg.slo_ms for seg in segs) if segs else 0.0
        for kid in kids:
            onward = [seg.slo_ms for seg in segs if kid in seg.stages and seg.stages.index(kid) == seg.stages.index(parent) + 1]
            slack[(parent, kid)] = math.floor((min(onward) - tightest) / slot_ms + 1e-9) if same_start and onward else 0
    return slack


def _forest_order(graph: TransformedGraph) -> list[str]:
    """Parents before children (a topological order of the forest)."""
    order: list[str] = []
    stack = list(reversed(graph.roots()))
    while stack:
        name = stack.pop()
        order.append(name)
        stack.extend(reversed(graph.children[name]))
    return order
