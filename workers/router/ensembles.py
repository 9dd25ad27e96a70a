"""Random ensembles at the router (issue 20; Garrison, DAC'24, §3 steps 1-3 and §5; cited
in docs/references.md): for an application whose routing table carries an `ensemble` policy
(mode random or learned), each query is answered by several of its variants, drawn per query, and their
answers are combined by weighted vote.

One query:
1. Its size (rows: the first dimension of its first input) is counted for the planner's D[b].
2. The scheduler picks the members: the policy's random ensemble (engine.ensembles.sampling.ensemble_draw)
   or the learned policy (engine.ensembles.scheduler.LearnedScheduler, an ONNX file run by onnxruntime),
   over the members that have a ready route now (a member without one cannot answer; the draw's
   probabilities are renormalised over the others). A learned policy that cannot be loaded falls back to
   the random ensemble, and the report says so.
3. The query goes to every chosen member at once, each to one of that member's instances by the routing
   table's weights (the Dispatcher, as for one variant: retries, stale routes, the deadline); each member's
   answer is only ever its own variant's.
4. At the deadline (the SLO, or the client's sooner deadline) the router stops waiting: a member that has
   not answered is left out of the vote and never delays the answer past it. With no member answered in
   time the query is dropped (504 `deadline_exceeded`).
5. The vote (engine.ensembles.vote.ensemble_vote, the one implementation the simulator uses too) over each
   output the voters returned: soft, the weighted mean; hard, the weighted plurality of each row's top class
   (outputs (rows, classes)). The answer has the members' output names and shapes, the vote's scores, and
   says which members voted (`parameters.ensemble` and `X-Tessera-Variant: a+b+c`).
6. The frequency table (engine.ensembles.sampling.SamplingFrequencies) counts each query's chosen members;
   every report carries this interval's chosen and voted counts, ensemble sizes and query sizes.

7. Each member's instance is chosen by Garrison's instance routing (§5.3, `queries_match_instances` with the
   normalised usage time U = L_k x D: the query matched to the member's instances at least granularity-
   weighted serving time, within the deadline), D from the estimator below and L_k the instance's GI size
   (its MIG profile's compute slices, read from the instance's name; 1 for a CPU runtime or a whole GPU).
   Departs from the paper: one query is matched at a time, as it arrives (the paper matches a model's
   waiting queue; the router keeps none), and a whole GPU counts as one slice, since the router does not
   know its model; within one member those are rarely mixed.

The learned scheduler's state needs what the router knows of its members' instances: `MemberEstimator`
keeps, per instance, the queries in flight and the mean compute time the runtimes report per query-size
range, so S_t (the time until a member's least busy instance is free) is in-flight x mean compute time, and
S_p its measured latency per range (0 until measured). Departs from the paper's estimator, which knows each
instance's queue exactly: the router does not see the runtimes' queues.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.dataplane.routing import NoRouteAvailable, queries_match_instances
from engine.ensembles import POLICIES_DIR
from engine.ensembles.policy import EnsembleError, EnsembleMember, EnsemblePolicy, ensemble_policy_from_dict
from engine.ensembles.sampling import SamplingFrequencies
from engine.ensembles.scheduler import EnsembleScheduler, LearnedScheduler, RandomEnsembleScheduler, SchedulerView
from engine.ensembles.vote import ensemble_vote
from workers.router.asgi import InferHeaders
from workers.wire import WireError, request_decode, response_decode, response_encode

if TYPE_CHECKING:
    from workers.metrics import ApplicationStats
    from workers.router.dispatch import Dispatcher
    from workers.router.table import Application

__all__ = ["MemberEstimator", "RouterEnsemble", "ensemble_build", "ensemble_infer", "instance_level"]

log = logging.getLogger("tessera.router")

# Where learned policies named by a table are looked for: TESSERA_SCHEDULER_DIR, else the shipped ones.
SCHEDULER_DIR_ENV = "TESSERA_SCHEDULER_DIR"
# The query sizes the learned scheduler's S_p columns use when its spec is not known (powers of two to 64).
DEFAULT_RANGE_SIZES = (1, 3, 7, 15, 31, 63)
_EWMA = 0.2


class MemberEstimator:
    """Per instance: queries in flight, and the mean compute time per query-size range (EWMA of what the
    runtimes report)."""

    def __init__(self, range_sizes: tuple[int, ...]) -> None:
        self.range_sizes = range_sizes
        self.in_flight: dict[str, int] = {}
        self.compute_ms: dict[tuple[str, int], float] = {}  # (instance, range index) -> EWMA ms

    def _range(self, size: int) -> int:
        for i, top in enumerate(self.range_sizes):
            if size <= top:
                return i
        return len(self.range_sizes) - 1

    def started(self, instance: str) -> None:
        self.in_flight[instance] = self.in_flight.get(instance, 0) + 1

    def finished(self, instance: str, size: int, compute_ms: float | None) -> None:
        self.in_flight[instance] = max(0, self.in_flight.get(instance, 0) - 1)
        if compute_ms is not None and compute_ms > 0:
            key = (instance, self._range(size))
            held = self.compute_ms.get(key)
            self.compute_ms[key] = compute_ms if held is None else (1 - _EWMA) * held + _EWMA * compute_ms

    def instance_choose(self, instances: list[str], size: int, budget_ms: float) -> str:
        """Garrison's instance routing for one query of `size` rows among `instances` (see the module
        docstring, step 7): least L_k x D_k, D_k the estimated wait plus this query's compute, within
        `budget_ms` where any instance makes it."""
        r = self._range(size)
        known = [v for (i, rr), v in self.compute_ms.items() if rr == r and i in instances]
        fallback = sum(known) / len(known) if known else 1.0
        waits, service = [], []
        for i in instances:
            own = [v for (ii, _rr), v in self.compute_ms.items() if ii == i]
            mean = sum(own) / len(own) if own else fallback
            waits.append(self.in_flight.get(i, 0) * mean)
            service.append(self.compute_ms.get((i, r), fallback))
        ((_, k),) = queries_match_instances([budget_ms], waits, service, levels=[instance_level(i) for i in instances], now_ms=0.0)
        return instances[k]

    def view(self, members: tuple[str, ...], instances: dict[str, list[str]], size: int, recent: tuple[int, ...],
             bias: tuple[float, ...], slo_ms: float) -> SchedulerView:
        remaining, latency = [], []
        for member in members:
            own = instances.get(member) or []
            if not own:
                remaining.append(10 * slo_ms)
                latency.append(tuple(10 * slo_ms for _ in self.range_sizes))
                continue
            rows = [[self.compute_ms.get((i, r), 0.0) for r in range(len(self.range_sizes))] for i in own]
            best = [min(col) for col in zip(*rows)]
            mean = [float(np.mean([v for v in row if v > 0])) if any(v > 0 for v in row) else 0.0 for row in rows]
            remaining.append(min(self.in_flight.get(i, 0) * m for i, m in zip(own, mean)))
            latency.append(tuple(best))
        return SchedulerView(size, tuple(remaining), tuple(latency), recent, bias)


@dataclass
class RouterEnsemble:
    """An application's ensemble at the router: its policy, scheduler, frequency table and estimator. Kept
    across table refreshes while the policy is the same (the frequency table must not restart every second)."""

    policy: EnsemblePolicy
    scheduler: EnsembleScheduler
    scheduler_note: str  # what the report says drew the ensembles
    config: str  # the table's ensemble block, canonical JSON: a changed block builds a new one
    frequencies: SamplingFrequencies
    estimator: MemberEstimator
    recent_sizes: list[int] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    history: int = 16

    def choose(self, size: int, ready: dict[str, list[str]], slo_ms: float) -> tuple[str, ...]:
        """The members for a query of `size` rows, among those with ready instances (`ready`: member -> instances)."""
        policy = self.policy
        live = [m for m in policy.members if m.probability > 0 and ready.get(m.variant)]
        if not live:
            return ()
        if len(live) < sum(1 for m in policy.members if m.probability > 0):
            # Renormalise over the members that can answer; bounds shrink with them.
            total = sum(m.probability for m in live)
            members = tuple(EnsembleMember(m.variant, m.probability / total, m.weight) for m in live)
            policy = EnsemblePolicy(policy.mode if policy.mode != "learned" else "random", members,
                                    min(policy.min_size, len(live)), min(policy.max_size, len(live)), policy.vote)
            return RandomEnsembleScheduler(policy).choose(_empty_view(), self.rng)
        spec_members = tuple(m.variant for m in policy.members if m.probability > 0)
        frequencies = self.frequencies.frequencies()
        bias = tuple(frequencies.get(m, 0.0) - policy.probabilities.get(m, 0.0) for m in spec_members)
        view = self.estimator.view(spec_members, ready, size, tuple(self.recent_sizes[-self.history:]), bias, slo_ms)
        return self.scheduler.choose(view, self.rng)

    def record(self, size: int, chosen: tuple[str, ...]) -> None:
        self.frequencies.record(chosen)
        self.recent_sizes.append(size)
        del self.recent_sizes[:-self.history]


_MIG_PROFILE = re.compile(r"/(?:\d+c\.)?(\d+)g\.[0-9]+gb")


def instance_level(instance: str) -> float:
    """An instance's granularity L_k: its MIG profile's compute slices ("host/gpu0/3g.40gb@4" -> 3), else 1."""
    found = _MIG_PROFILE.search(instance)
    return float(found.group(1)) if found else 1.0


def _empty_view() -> SchedulerView:
    return SchedulerView(1, (), (), (), ())


def _scheduler_dir() -> Path:
    configured = os.environ.get(SCHEDULER_DIR_ENV)
    return Path(configured) if configured else POLICIES_DIR


def ensemble_build(name: str, raw: object, previous: RouterEnsemble | None = None) -> RouterEnsemble | None:
    """The table's `ensemble` block -> the router's ensemble (None for none, or mode single); `previous` is
    kept when the block is unchanged. Raises ValueError when the block does not parse."""
    if raw is None:
        return None
    config = json.dumps(raw, sort_keys=True)
    if previous is not None and previous.config == config:
        return previous
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: ensemble must be an object")
    block = dict(raw)
    members = block.get("members")
    if isinstance(members, list):  # the table's members carry variant_id beside the name; the policy needs names
        block["members"] = [{k: v for k, v in m.items() if k != "variant_id"} if isinstance(m, dict) else m for m in members]
    try:
        policy = ensemble_policy_from_dict(block)
    except EnsembleError as exc:
        raise ValueError(f"{name}: ensemble: {exc}") from None
    if policy.mode == "single":
        return None
    scheduler: EnsembleScheduler = RandomEnsembleScheduler(policy)
    note = scheduler.name
    range_sizes = DEFAULT_RANGE_SIZES
    history = 16
    if policy.mode == "learned":
        path = Path(policy.scheduler or "")
        if not path.suffix:
            path = path.with_suffix(".onnx")
        if not path.is_absolute():
            path = _scheduler_dir() / path
        try:
            learned = LearnedScheduler(path, policy)
        except (OSError, ValueError, KeyError) as exc:
            note = f"{scheduler.name}: the learned policy {policy.scheduler!r} could not be loaded ({type(exc).__name__}: {exc})"
            log.warning("%s: %s", name, note)
        else:
            scheduler, note = learned, learned.name
            range_sizes, history = learned.spec.range_sizes, learned.spec.history
    return RouterEnsemble(policy, scheduler, note, config, SamplingFrequencies(policy.variants, window=1000),
                          MemberEstimator(tuple(range_sizes)), history=history)


def _query_rows(body: bytes, header_length: int | None) -> tuple[int, str | None, object]:
    """The query's rows (the first dimension of its first input), its id and what it asked of the outputs."""
    request_id, tensors, requested = request_decode(body, header_length)
    first = next(iter(tensors.values()))
    return (int(first.shape[0]) if first.ndim else 1), request_id, requested


async def ensemble_infer(dispatcher: "Dispatcher", app: "Application", stats: "ApplicationStats", request: InferHeaders,
                         body: bytes, t0: float, budget_ms: float) -> tuple[int, dict, bytes, str]:
    """One query to an ensemble application (see the module docstring): (status, answer header, body, the
    members that voted joined by '+'); raises `DispatchError` when the router answers itself."""
    from workers.router.dispatch import DispatchError, MemberStats  # dispatch imports table, which imports this module

    ensemble = app.ensemble
    assert ensemble is not None
    try:
        rows, request_id, requested = _query_rows(body, request.header_length)
    except WireError as exc:
        stats.failed()
        raise DispatchError(400, "malformed", str(exc)) from None
    stats.query_size(rows)
    now = time.monotonic()
    excluded = dispatcher.choice.excluded(app, now)
    ready: dict[str, list[str]] = {}
    for instance, route in app.routes.items():
        if instance not in excluded and route.weight > 0:
            ready.setdefault(route.variant, []).append(instance)
    chosen = ensemble.choose(rows, ready, app.slo_ms)
    if not chosen:
        stats.no_route()
        raise DispatchError(503, "no_route", f"{app.name}: no member of the ensemble has an instance that can take the query now")
    ensemble.record(rows, chosen)
    member_stats = MemberStats(stats)
    estimator = ensemble.estimator

    def choose(member: str, excluded) -> str:
        candidates = [i for i in ready.get(member, []) if i not in excluded]
        if not candidates:
            raise NoRouteAvailable(f"{app.name}: no instance of member {member!r} can take the query now")
        left_ms = (t0 + budget_ms / 1000.0 - time.monotonic()) * 1000.0
        return estimator.instance_choose(candidates, rows, left_ms)

    async def ask(member: str):
        sent: list[str] = []  # the instances tried (a retry tries another)
        reply: dict | None = None

        def started(instance: str) -> None:
            sent.append(instance)
            estimator.started(instance)

        try:
            status, reply, reply_body, variant = await dispatcher.dispatch(app, member_stats, body, request.content_type, request.header_length,
                                                                           t0, budget_ms, variant=member, on_instance=started,
                                                                           choose=lambda excluded: choose(member, excluded))
        except asyncio.CancelledError:  # the ensemble's deadline: left out of the vote, counted at its instance
            if sent:
                member_stats.dropped((time.monotonic() - t0) * 1000.0, variant=member, instance=sent[-1])
            raise
        finally:
            for i, instance in enumerate(sent):
                compute = (reply.get("compute_us") or 0.0) / 1000.0 if reply is not None and i == len(sent) - 1 else 0.0
                estimator.finished(instance, rows, compute or None)
        return status, reply, reply_body, variant

    tasks = {asyncio.ensure_future(ask(m)): m for m in chosen}
    remaining = t0 + budget_ms / 1000.0 - time.monotonic()
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, remaining))
    for task in pending:  # past the deadline: left out of the vote
        task.cancel()
    if pending:
        await asyncio.wait(pending)  # let each count itself at its instance
    outputs: dict[str, dict[str, np.ndarray]] = {}
    for task in done:
        member = tasks[task]
        if task.cancelled() or task.exception() is not None:
            continue  # counted by the dispatcher (no route, dropped, failed)
        status, reply, reply_body, _variant = task.result()
        if status != 200:
            continue
        try:
            _doc, tensors = response_decode(reply_body, reply.get("header_length"))
        except WireError:
            member_stats.failed(0.0, variant=member)
            continue
        outputs[member] = tensors
    latency_ms = (time.monotonic() - t0) * 1000.0
    voters = tuple(m for m in chosen if m in outputs)
    stats.ensemble_answered(chosen, voters, ensemble.scheduler_note)
    if not voters:
        stats.dropped(latency_ms)
        raise DispatchError(504, "deadline_exceeded", f"{app.name}: no member of the ensemble ({', '.join(chosen)}) answered by the deadline "
                                                      f"({budget_ms:g} ms)")
    try:
        voted = _vote({m: outputs[m] for m in voters}, ensemble.policy)
    except (EnsembleError, ValueError) as exc:
        stats.failed(latency_ms)
        raise DispatchError(502, "upstream_error", f"{app.name}: the members' answers cannot be combined: {exc}") from None
    parameters = {"ensemble": {"chosen": list(chosen), "voted": list(voters), "vote": ensemble.policy.vote, "scheduler": ensemble.scheduler_note}}
    body_out, header_length = response_encode(request_id, voted, model_name=app.name, parameters=parameters, binary=requested)
    stats.answered(latency_ms, latency_ms > budget_ms)
    reply = {"content_type": "application/json" if header_length is None else "application/octet-stream", "header_length": header_length}
    return 200, reply, body_out, "+".join(voters)


def _vote(outputs: dict[str, dict[str, np.ndarray]], policy: EnsemblePolicy) -> dict[str, np.ndarray]:
    """Per output name every voter returned: the vote's scores, in the members' shape."""
    names = [n for n in next(iter(outputs.values())) if all(n in o for o in outputs.values())]
    if not names:
        raise ValueError("the members returned no output in common")
    voted = {}
    for name in names:
        arrays = {m: np.asarray(o[name]) for m, o in outputs.items()}
        shape = next(iter(arrays.values())).shape
        if policy.vote == "hard" and len(shape) != 2:
            raise ValueError(f"the hard vote needs (rows, classes) outputs; {name!r} has shape {list(shape)}")
        flat = {m: a.reshape(shape[0], -1) if a.ndim > 1 else a.reshape(1, -1) for m, a in arrays.items()}
        result = ensemble_vote(flat, policy.weights, policy.vote)
        voted[name] = result.scores.reshape(shape)
    return voted

