"""One model a runtime process serves (`ServedModel`): its session, batcher and stats, the way of its
queries (checked on arrival, batched, run on the batcher's worker thread, answered from there), its
`health` and `stats` answers, and its in-place resize (CPU runtimes; issue 19). The frames are described in
docs/dataplane.md, "Router ↔ runtime frames"."""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from engine.dataplane.batching import batching_policy_make, policy_latency_function
from engine.dataplane.rounds import round_batch_cap
from workers.metrics import RuntimeStats
from workers.runtime.batcher import BatcherClosed, DeadlineExceeded, InstanceBatcher
from workers.runtime.connection import GATHER_BYTES, FrameConnection
from workers.runtime.inputs import input_signature, inputs_check
from workers.runtime.loading import is_cpu_runtime, onnx_session_build, profile_measure, session_load
from workers.runtime.partition import PartitionTurns, RoundMember
from workers.runtime.simulated import SimulatedSession, profile_points, vertical_points
from workers.runtime.spec import RuntimeSpec, RuntimeSpecError, batching_margin_ms
from workers.runtime.vertical import ArrivalLog, VerticalSpec, affinity_apply, process_cpus, vertical_model_parse, vertical_parse
from workers.wire import FRAME_PREFIX, WRONG_MODEL, RequestedOutputs, WireError, error_body, request_decode, response_encode

if TYPE_CHECKING:
    from workers.runtime.server import RuntimeServer

__all__ = ["JSON_CT", "NOT_CPU_RUNTIME", "OVERSUBSCRIBED_CORES_MAX", "SESSION_CACHE_MAX", "ServedModel"]

log = logging.getLogger("tessera.runtime")

JSON_CT = "application/json"


def query_rows(inputs: dict, batched: bool) -> int:
    """The rows a query carries: its batch axis's length when every input has one (a client's own batch), else
    one. The batcher counts them against the plan's `max_batch` and the profile's latency, which count rows."""
    if not batched or not inputs:
        return 1
    first = next(iter(inputs.values()))
    return max(1, int(first.shape[0])) if getattr(first, "ndim", 0) else 1


class _Query:
    __slots__ = ("inputs", "batched", "arrival_ms", "deadline_ms", "end_ms", "compute_ms", "start_ms")

    def __init__(self, inputs: dict, batched: bool, arrival_ms: float, deadline_ms: float) -> None:
        self.inputs = inputs
        self.batched = batched  # every input carries its own batch axis (the model can take it as it is)
        self.arrival_ms = arrival_ms
        self.deadline_ms = deadline_ms
        self.start_ms = self.end_ms = self.compute_ms = 0.0



class _Prepared:
    """A session ready to serve at one core count: what a batch reads, as one object, so that a swap (one
    attribute store) is never seen half done. `points`: the latency profile the batching policy plans with
    at these cores when no vertical model says it (the spec's at its own cores, else measured on the session),
    `model`: the vertical model a simulated session was built with (its service time)."""

    __slots__ = ("cores", "session", "run_direct", "points", "model")

    def __init__(self, cores: int, session: Any, run_direct: Any, points: list | None, model: Any = None) -> None:
        self.cores = cores
        self.session = session
        self.run_direct = run_direct
        self.points = points
        self.model = model


# Sessions kept per model, by core count, the active one included (least recently used goes first): a resize
# back to a recent size swaps at once. Each ONNX session holds its own copy of the weights and an idle
# thread pool of cores - 1 threads.
SESSION_CACHE_MAX = 4
# A resize of a spec with `cpu_oversubscribe` may ask for up to this many cores, whatever the CPUs.
OVERSUBSCRIBED_CORES_MAX = 256
_UNSET = object()
NOT_CPU_RUNTIME = "not_cpu_runtime"
# A query may run on the event loop's thread (no hand-off to the batcher's worker) when a batch of one is
# planned to take at most this long: the loop reads nothing else meanwhile. TESSERA_RUNTIME_INLINE_MAX_MS
# sets it (0: never; benches/dataplane.py measures with and without).
INLINE_MAX_MS = float(os.environ.get("TESSERA_RUNTIME_INLINE_MAX_MS", "1.0"))



class ServedModel:
    """One model a runtime process serves: its spec, session, batcher and stats, and the way of its queries
    (checks, the batch run on the batcher's worker thread, the answers). A single-model runtime has one; a
    partition runtime one per model, their batchers taking turns on the partition (`turns`, work-conserving)
    or driven by its duty-cycle rounds (`round_driven`; `round_member` is what the rounds need).

    A CPU model can be resized in place (`resize`, issue 19): its sessions are kept per core count
    (`SESSION_CACHE_MAX`), one built in a background thread while the active one serves, and the swap is
    one store of `_active`, which each batch reads once, taken under the batcher's lock together with the
    new batch cap and latency function."""

    def __init__(self, server: "RuntimeServer", spec: RuntimeSpec, session: Any | None = None, turns: PartitionTurns | None = None,
                 *, field_prefix: str = "", round_driven: bool = False) -> None:
        self.server = server
        self.spec = spec
        self.instance = spec.instance or spec.key
        self.vertical: VerticalSpec | None = vertical_parse(spec.vertical) if spec.vertical is not None else None
        self.model = self.vertical.model if self.vertical is not None else None  # l(b, c) the policy plans with, if any
        session = session if session is not None else session_load(spec)
        self.simulated = bool(getattr(session, "simulated", False))
        self.is_cpu = is_cpu_runtime(spec, session) and server.partition is None
        if self.vertical is not None and not self.is_cpu:
            raise RuntimeSpecError(f"spec field '{field_prefix}vertical': vertical scaling is for CPU runtimes only ({spec.key} is not one)")
        self.signature = input_signature(session)
        profile = spec.profile or (None if self.model is not None and self.simulated else profile_measure(session, spec.max_batch, self.signature))
        points = profile_points(profile) if profile else []
        # The largest batch a resize may ask for: the plan's cap, the largest profiled batch or the vertical
        # block's max_batch, whichever is largest.
        self.batch_limit = max([spec.max_batch] + [p.batch for p in points]
                               + ([self.vertical.max_batch] if self.vertical is not None and self.vertical.max_batch else []))
        self.cores = spec.cpu_threads
        self.cpus: frozenset[int] | None = server.cpus_allowed  # the process's CPUs until a resize pins it
        self._active = _Prepared(self.cores, session, getattr(session, "run", None) if self.signature else None, points or None,
                                 self.model if self.simulated else None)
        self._sessions: dict[int, _Prepared] = {self.cores: self._active}  # by core count, least recently used first
        self._resize_queue: Any = None  # the resize thread's work (started on the first resize)
        self.resizes = 0
        latency_ms = self._latency_function(self._active)
        # One registry per model: `metrics` with a key answers for that model alone, as a single-model runtime.
        self.stats = RuntimeStats()
        self.instance_stats = self.stats.instance(
            key=spec.key, application=spec.application, variant=spec.variant, instance=self.instance, simulated=self.simulated)
        self.arrivals = ArrivalLog(time.monotonic() * 1000.0)
        b = spec.batching
        try:
            policy = batching_policy_make(b.policy, **b.params)
            self.batcher = InstanceBatcher(
                policy, latency_ms=latency_ms, max_batch=spec.max_batch, execute=self._execute, drop_rule=b.drop_rule,
                slo_ms=b.slo_ms, queue_order=b.queue_order,
                margin_ms=b.margin_ms if b.margin_ms is not None else batching_margin_ms(b.slo_ms), inline_max_ms=INLINE_MAX_MS,
                turn=None if turns is None else functools.partial(turns.turn, spec.key), round_driven=round_driven,
            )
        except (ValueError, TypeError) as exc:
            raise RuntimeSpecError(f"spec field '{field_prefix}batching': {exc}") from None
        # In a round: the plan's turn (its batch's latency on the partition, interference included), else
        # the profile's at the planned batch; a turn may run up to the largest profiled batch.
        self.round_member = RoundMember(
            key=spec.key, batcher=self.batcher, turn_ms=spec.turn_ms if spec.turn_ms is not None else float(latency_ms(spec.max_batch)),
            cap=round_batch_cap(spec.max_batch, (p.batch for p in points)))
        self.instance_stats.queue_length_source(self.batcher.__len__)
        self.turns = turns
        self.in_flight = 0
        self._count_lock = threading.Lock()
        self._params_default = {"variant": spec.variant, "instance": self.instance, "simulated": self.simulated}
        self._reply_head = ('{"status":200,"application":%s,"variant":%s,"simulated":%s,"content_type":' % (
            json.dumps(spec.application), json.dumps(spec.variant), "true" if self.simulated else "false")).encode()

    @property
    def session(self) -> Any:
        """The session batches run on now."""
        return self._active.session

    def _latency_function(self, prepared: _Prepared) -> Any:
        """The batching policy's latency function at `prepared`'s cores: Sponge's l(b, c) when a vertical model
        is set, else the session's profile points."""
        if self.model is not None:
            points = vertical_points(self.model, prepared.cores, self.batch_limit)
        else:
            points = prepared.points or []
        latency_ms, _ = policy_latency_function(points, self.batch_limit)
        return latency_ms

    # ------------------------------------------------------------------ the batcher's side (worker thread)

    def _execute(self, queries: list[_Query]) -> list[Any]:
        active = self._active  # read once: a resize swaps it between batches, never within one
        start = time.monotonic()  # on a partition: once the turn is granted (the batcher takes it around this call)
        if len(queries) == 1 and queries[0].batched and active.run_direct is not None:
            # One query that already has its batch axis: the model takes its arrays as they are
            # (run_batch would stack and split for nothing).
            outputs = [active.run_direct(queries[0].inputs)]
        else:
            outputs = active.session.run_batch([q.inputs for q in queries])
        end = time.monotonic()
        start_ms, end_ms = start * 1000.0, end * 1000.0
        compute_ms = end_ms - start_ms
        self.instance_stats.batch(len(queries), compute_ms)
        for q in queries:
            q.start_ms = start_ms
            q.end_ms = end_ms
            q.compute_ms = compute_ms
        return outputs

    # ------------------------------------------------------------------ frames (event loop thread)

    def error(self, conn: FrameConnection, rid: Any, status: int, code: str, message: str) -> None:
        conn.send({"id": rid, "status": status, "code": code, "message": message, "application": self.spec.application,
                   "variant": self.spec.variant, "simulated": self.simulated, "content_type": JSON_CT}, error_body(status, code, message))

    def health(self, rid: Any) -> dict:
        health = {
            "id": rid, "status": 200, "state": "draining" if self.server.draining else "ready", "key": self.spec.key,
            "application": self.spec.application, "variant": self.spec.variant, "instance": self.instance,
            "simulated": self.simulated, "providers": list(getattr(self.session, "providers", [])), "max_batch": self.batcher.max_batch,
            "queue_length": len(self.batcher), "in_flight": self.in_flight, "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.server.started, 3), "counters": self.instance_stats.totals(),
        }
        if self.is_cpu:  # what a resize changes (GPU runtimes keep their shape)
            health.update(cores=self.cores, cpus=sorted(self.cpus) if self.cpus is not None else None, max_batch_limit=self.batch_limit,
                          resizes=self.resizes, vertical=self.vertical.to_dict() if self.vertical else None,
                          vertical_model=dataclasses.asdict(self.model) if self.model is not None else None)
        return health

    def stats_item(self, reader: str | None) -> dict:
        """The `stats` answer's item. Without a reader (the agent's metrics loop): the interval's report
        (`InstanceStats.snapshot_and_reset`, which starts a new interval) with the sizes and Sponge's signals
        added; a named reader (the agent's fast vertical loop: "vertical") gets the sizes and signals over its
        own interval, and resets nothing else."""
        now_ms = time.monotonic() * 1000.0
        rate, budgets, interval_s, arrivals, queued = self.arrivals.read(reader or "", now_ms, self.batcher.queued_deadlines_ms())
        if reader:
            item: dict[str, Any] = {"key": self.spec.key, "application": self.spec.application, "variant": self.spec.variant,
                                    "arrivals": arrivals, "queue_length": len(self.batcher), "interval_s": round(interval_s, 6)}
        else:
            item = self.instance_stats.snapshot_and_reset()
        item["cores"] = self.cores if self.is_cpu else None
        item["max_batch"] = self.batcher.max_batch
        item["max_batch_limit"] = self.batch_limit
        item["cpus"] = sorted(self.cpus) if self.is_cpu and self.cpus is not None else None
        item["rate_rps"] = round(rate, 3)
        item["budgets_ms"] = budgets
        item["queued_budgets"] = queued
        return item

    # ------------------------------------------------------------------ resize (issue 19: vertical scaling in place)

    def resize(self, conn: FrameConnection, header: dict) -> None:
        """A `resize` frame (event loop thread): checked here (400 and nothing changes), done on the resize
        thread (the new session is built there while the active one serves), answered from there."""
        rid = header.get("id")
        received = time.monotonic()
        if not self.is_cpu:
            where = "an MPS partition's models run on a GPU" if self.server.partition is not None else "it runs on a GPU"
            self.error(conn, rid, 409, NOT_CPU_RUNTIME, f"instance {self.instance} cannot be resized: {where}; only CPU runtimes "
                       "change their cores in place (a GPU instance is resized by the plan: a new instance)")
            return
        try:
            request = self._resize_parse(header)
        except ValueError as exc:
            self.error(conn, rid, 400, "bad_resize", str(exc))
            return
        if self._resize_queue is None:
            import queue

            self._resize_queue = queue.SimpleQueue()
            # A daemon thread, not an executor: a resize left behind never holds the process's exit.
            threading.Thread(target=self._resize_worker, name="tessera-resize", daemon=True).start()
        self._resize_queue.put((conn, rid, request, received))

    def _resize_parse(self, header: dict) -> tuple[int, int, frozenset[int] | None, Any]:
        """(cores, max_batch, cpus, model) of a resize frame; ValueError saying what is wrong."""
        cores = header.get("cores")
        allowed = self.server.cpus_allowed
        limit = OVERSUBSCRIBED_CORES_MAX if self.spec.cpu_oversubscribe else (len(allowed) if allowed else (os.cpu_count() or 1))
        if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= limit:
            why = ("the spec allows oversubscription" if self.spec.cpu_oversubscribe
                   else "the CPUs this process may run on; a spec with cpu_oversubscribe: true allows more")
            raise ValueError(f"'cores' must be an integer in 1..{limit} ({why}), got {cores!r}")
        max_batch = header.get("max_batch")
        if max_batch is None:
            max_batch = self.batcher.max_batch
        elif isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= self.batch_limit:
            raise ValueError(f"'max_batch' must be an integer in 1..{self.batch_limit} (the largest of the spec's max_batch, its "
                             f"largest profiled batch and its vertical max_batch), got {max_batch!r}")
        cpus = header.get("cpus")
        if cpus is not None:
            if not isinstance(cpus, list) or not cpus or any(isinstance(c, bool) or not isinstance(c, int) for c in cpus) or len(set(cpus)) != len(cpus):
                raise ValueError(f"'cpus' must be a non-empty list of distinct CPU ids, got {cpus!r}")
            if allowed is not None and not set(cpus) <= allowed:
                raise ValueError(f"'cpus' {sorted(set(cpus) - allowed)} are not among the CPUs this process may run on {sorted(allowed)}")
            if len(cpus) != cores and not self.spec.cpu_oversubscribe:
                raise ValueError(f"'cpus' names {len(cpus)} CPUs for {cores} cores; give one CPU per core (or leave 'cpus' out)")
            cpus = frozenset(cpus)
        model: Any = _UNSET
        if "model" in header:
            model = None if header["model"] is None else vertical_model_parse(header["model"], "'model'")
        return cores, max_batch, cpus, model

    def _resize_worker(self) -> None:
        while True:
            conn, rid, request, received = self._resize_queue.get()
            try:
                reply = self._resize_run(request, received)
            except Exception as exc:  # the new session could not be built: nothing changed
                log.warning("resize of %s failed: %s: %s", self.instance, type(exc).__name__, exc)
                self.error(conn, rid, 500, "resize_failed", f"the resize failed and nothing changed: {type(exc).__name__}: {exc}")
                continue
            reply["id"] = rid
            conn.send(reply)

    def _resize_run(self, request: tuple[int, int, frozenset[int] | None, Any], received: float) -> dict:
        """Prepare the session for the new cores (cached, or built now while the active one serves), pin the
        threads, then swap between batches; the reply of docs/dataplane.md's `resize`."""
        cores, max_batch, cpus, model = request
        if model is not _UNSET and model != self.model:
            self.model = model
            # A simulated session's service time is its model: the cached ones are of the old model.
            for key in [k for k, p in self._sessions.items() if self.simulated and p is not self._active]:
                del self._sessions[key]
        prepared_entry = self._sessions.get(cores)
        if prepared_entry is not None and self.simulated and prepared_entry.model != self.model:
            prepared_entry = None
        prepared = prepared_entry is not None
        if prepared_entry is None:
            prepared_entry = self._session_build(cores, max_batch)
        self._sessions.pop(cores, None)
        self._sessions[cores] = prepared_entry  # the most recently used last
        latency_ms = self._latency_function(prepared_entry)
        target = cpus if cpus is not None else self.server.cpus_allowed
        affinity_error = affinity_apply(target) if target is not None else "this platform does not report the process's CPUs"

        def swap() -> None:
            self._active = prepared_entry
            self.cores = cores
            self.cpus = target if affinity_error is None else process_cpus()

        self.batcher.reconfigure(max_batch=max_batch, latency_ms=latency_ms, apply=swap)
        resize_ms = (time.monotonic() - received) * 1000.0
        while len(self._sessions) > SESSION_CACHE_MAX:
            oldest = next(k for k, p in self._sessions.items() if p is not self._active)
            del self._sessions[oldest]  # a batch still running on it holds its own reference
        self.resizes += 1
        return {"status": 200, "key": self.spec.key, "cores": cores, "max_batch": max_batch,
                "cpus": sorted(self.cpus) if self.cpus is not None else None, "resize_ms": round(resize_ms, 3), "prepared": prepared,
                "affinity_error": affinity_error, "vertical_model": self.model is not None}

    def _session_build(self, cores: int, max_batch: int) -> _Prepared:
        """A session at `cores`, warm, with its latency profile when no model says it (resize thread)."""
        spec = self.spec
        if self.simulated:
            session = SimulatedSession(spec.profile, self.batch_limit, vertical=self.model, cores=cores)
            return _Prepared(cores, session, None, profile_points(spec.profile) or None, self.model)
        session = onnx_session_build(spec, cores=cores, max_batch=max_batch)
        points = None
        if self.model is None:
            # The spec's profile was measured at its own cores; at others the session is measured now.
            points = (profile_points(spec.profile) if spec.profile and cores == spec.cpu_threads
                      else profile_points(profile_measure(session, self.batch_limit, self.signature)))
        return _Prepared(cores, session, session.run if self.signature else None, points)

    def infer(self, conn: FrameConnection, header: dict, body: bytes) -> None:
        rid = header.get("id")
        application, variant = header.get("application"), header.get("variant")
        if (application and application != self.spec.application) or (variant and variant != self.spec.variant):
            # The router's route is stale (the slot now serves another model): refuse before anything runs.
            self.error(conn, rid, 409, WRONG_MODEL, f"instance {self.instance} serves "
                       f"{self.spec.application}/{self.spec.variant}, not {application or '?'}/{variant or '?'}")
            return
        if self.server.draining:
            self.error(conn, rid, 503, "draining", f"instance {self.instance} is draining")
            return
        arrival_ms = time.monotonic() * 1000.0
        try:
            request_id, inputs, binary = request_decode(body, header.get("header_length"))
            batched = inputs_check(self.signature, inputs) if self.signature else False
        except WireError as exc:
            self.error(conn, rid, 400, "malformed", str(exc))
            return
        budget = header.get("deadline_ms")
        deadline_ms = arrival_ms + (float(budget) if budget is not None else self.spec.batching.slo_ms)
        query = _Query(inputs, batched, arrival_ms, deadline_ms)
        self.instance_stats.arrival()
        self.arrivals.add(arrival_ms, deadline_ms)
        with self._count_lock:
            self.in_flight += 1
        context = (conn, rid, header)
        try:
            # The answer is encoded and sent from the thread that resolves the query (the batcher's worker).
            # A cheap model's query that arrives alone at an idle instance runs right here (`inline`: the
            # batcher decides as always, and hands everything else to its worker); more frames of this read
            # waiting behind it would wait for the run, so then it goes to the worker.
            self.batcher.submit(query, arrival_ms=arrival_ms, deadline_ms=deadline_ms, inline=not conn.more, rows=query_rows(inputs, batched),
                                done=lambda result, exc: self._infer_done(context, query, request_id, binary, result, exc))
        except BatcherClosed:
            with self._count_lock:
                self.in_flight -= 1
            self.instance_stats.failed()
            self.error(conn, rid, 503, "draining", "the instance is shutting down")

    def _infer_done(self, context: tuple, query: _Query, request_id: str | None, binary: RequestedOutputs, result: Any, exc: BaseException | None) -> None:
        """A query's answer (any thread; usually the batcher's worker, right after its batch)."""
        conn, rid, header = context
        now_ms = time.monotonic() * 1000.0
        latency = now_ms - query.arrival_ms
        stats = self.instance_stats
        try:
            if exc is None:
                params = self._params_default
                instance, version = header.get("instance"), header.get("routing_version")
                if instance or version is not None:
                    params = dict(params)
                    if instance:
                        params["instance"] = instance
                    if version is not None:
                        params["routing_version"] = version
                try:
                    result = binary.select(result)
                except WireError as err:  # an output the model does not have: the request's fault
                    stats.failed(latency)
                    self.error(conn, rid, 400, "malformed", str(err))
                    return
                try:
                    body, header_length = response_encode(request_id, result, model_name=self.spec.application,
                                                          model_version=self.spec.model_version, parameters=params, binary=binary)
                except WireError as err:
                    stats.failed(latency)
                    self.error(conn, rid, 500, "internal", f"cannot encode the outputs: {err}")
                else:
                    stats.served(latency, query.start_ms - query.arrival_ms, query.compute_ms, query.end_ms > query.deadline_ms + 1e-6)
                    rid_json = b"%d" % rid if type(rid) is int else json.dumps(rid).encode()  # the router's ids are ints
                    # The query's time queued and computing, for the router's statistics (the protocol's stats extension).
                    timing = b'"queue_us":%d,"compute_us":%d' % (int((query.start_ms - query.arrival_ms) * 1000.0), int(query.compute_ms * 1000.0))
                    if header_length is None:
                        tail = b'"application/json","header_length":null,%s,"id":%s}' % (timing, rid_json)
                    else:
                        tail = b'"application/octet-stream","header_length":%d,%s,"id":%s}' % (header_length, timing, rid_json)
                    head = self._reply_head + tail
                    if len(body) > GATHER_BYTES:
                        conn.send_bytes(FRAME_PREFIX.pack(len(head), len(body)) + head, body)
                    else:
                        conn.send_bytes(b"".join((FRAME_PREFIX.pack(len(head), len(body)), head, body)))
            elif isinstance(exc, DeadlineExceeded):
                stats.dropped(latency, latency)
                self.error(conn, rid, 504, "deadline_exceeded", f"the query cannot meet its deadline ({exc.rule!r} drop rule at the instance)")
            elif isinstance(exc, BatcherClosed):
                stats.failed(latency)
                self.error(conn, rid, 503, "draining", "the instance shut down before serving the query")
            else:
                stats.failed(latency, reason="BACKEND")
                self.error(conn, rid, 500, "internal", f"the model failed: {type(exc).__name__}: {exc}")
        finally:
            with self._count_lock:
                self.in_flight -= 1
            self.server.query_answered()

