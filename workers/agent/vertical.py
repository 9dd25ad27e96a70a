"""The agent's fast vertical loop (issue 19; Sponge, Razavi's thesis P2 §p2.3.1, and the vertical half of
Biscale, P4): every `interval_s` (about a second), each CPU runtime whose desired state has a `vertical`
block is sized in place from what it measured, next to the data path and without the control plane.

One tick:

1. Observe. For every CPU runtime that runs as desired, read `{"op": "stats", "reader": "vertical"}`: its
   cores, batch cap, CPUs, the arrival rate and the remaining budgets of its queued and recent requests over
   the fast loop's own interval (the metrics loop's interval is not disturbed).
2. Decide. For a runtime with a `vertical` block (policy sponge or biscale: both are sized by Sponge's rule
   here), the engine's controller (`engine.vertical.controller.sponge_step`: the fewest cores, then the
   smallest batch, that keep every queued request within its budget, each recent arrival within the worst a
   new request meets, and serve 1.25x the measured rate, `RATE_HEADROOM`) within its
   min_cores..max_cores and batch 1..the block's max_batch (else the runtime's max_batch, or its largest
   profiled batch when above; never above the limit the runtime reports). A pipeline stage's budgets are
   what the requests have left less the block's `reserve_ms` (the later stages' planned time).
   Then hysteresis (`engine.vertical.controller.ShrinkDwell`, issue 44): a decision for more cores is taken
   at once, one for fewer only after `shrink_after` decisions in a row said fewer would do (default
   `SHRINK_AFTER_INTERVALS`, 5; `TESSERA_AGENT_VERTICAL_SHRINK_AFTER`; 1 is Sponge's shrink at once), and then
   to the most cores those intervals wanted; meanwhile the runtime keeps its cores with the controller's batch
   at them. So a load near a boundary resizes a runtime at most once per dwell, not every interval.
3. Share the host. The runtimes of a host never hold more cores in all than the host has
   (`host_cores`: the CPUs the agent may run on). CPU runtimes without a `vertical` block keep their cores
   (the desired `cpu_threads`); the rest is shared among the vertical ones max-min fairly (`cores_share`:
   each first gets its min_cores, then spare cores go one at a time to the runtime holding the fewest of
   those that want more, ties to the earlier key), first for what each needs this interval, then what is left
   to the cores a held shrink keeps (a runtime that needs cores gets them before one that has not shrunk
   yet). A runtime granted fewer cores than it wants is asked again for its batch at the granted cores (its
   controller with max_cores = the grant).
4. Pin. With `pin_cpus` and room for it, each vertical runtime is pinned to CPUs of its own
   (`cpus_assign`: stable, a runtime that shrinks keeps its lowest CPUs, one that grows takes the lowest
   free ones), so that vertical runtimes do not share cores; runtimes without a `vertical` block are not
   pinned (they run on the CPUs they were started with).
5. Resize. Shrinks first, then grows (the host's total never goes over its cores in between), each one
   `resize` frame (workers/runtime/served.py) and one Operation `runtime.resize`, and an entry for the
   metrics report (`resizes_take`).

Between ticks (issue 42: react within the second a dip or a burst starts), every `pressure_s` (0.1 s) each
vertical runtime's queue is read again (`{"op": "stats", "reader": "pressure"}`, a window of its own) and
`engine.vertical.controller.sponge_pressure_step` asks whether the size it has now would make a queued or
just-arrived request late where more cores would not: then it grows at once, within the cores the host has
spare (never taken from another runtime), and its dwell starts again. It never shrinks, so the events
cannot make a runtime flap: shrinking stays the tick's, held by the dwell. The simulator runs the same
check on every arrival (`SpongePolicy(events=True)`).

Only local state is used: the desired state the agent last read (kept on disk), the supervisor's records
and the runtimes themselves; a control plane that is away changes nothing here.

The reconciler's in-place resizes (a desired `cpu_threads` or `vertical` change) go through `desired_resize`,
under the same lock, so that they keep the host's budget and the pinning too: a runtime without a `vertical`
block that grows first shrinks the vertical ones to make room (they grow back within the budget on later
ticks); a vertical runtime starts from its desired `cpu_threads` as far as the budget allows.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from engine.vertical.controller import (SHRINK_AFTER_INTERVALS, ShrinkDwell, VerticalAction, VerticalObservation, sponge_pressure_step,
                                       sponge_step)

from .desired import DesiredRuntime, DesiredState
from .reconcile import Operation, resize_detail, resize_frame
from .supervisor import RuntimeProcess, RuntimeSupervisor

__all__ = ["VerticalScaler", "cores_share", "cpus_assign"]

log = logging.getLogger("tessera.agent")

# The measured rate is sized for with this headroom, as the planners size for 1.25x demand: an instance
# sized for exactly the mean rate queues past its budgets on every Poisson burst (benches/vertical.py).
RATE_HEADROOM = 1.25
# How long a resize may take: a cold one builds and warms an onnxruntime session.
RESIZE_TIMEOUT_S = 60.0
# Resizes kept per runtime for the next metrics report (a report that cannot go out keeps them).
RESIZES_KEPT = 256
# How often the queues are checked between ticks for a grow that cannot wait (0: not at all).
PRESSURE_S = 0.1


def cores_share(wants: dict[str, tuple[int, int]], budget: int) -> dict[str, int]:
    """Max-min fair cores (see the module docstring): `wants` is key -> (min_cores, wanted cores), `budget` the
    cores there are. Every key gets at least its min (when the mins alone do not fit, one core each and then
    the rest fairly: no runtime runs on nothing) and at most what it wants; the total stays within the budget
    whenever the mins fit."""
    if not wants:
        return {}
    floors = {k: max(1, min(lo, want)) for k, (lo, want) in wants.items()}
    if sum(floors.values()) > budget:
        floors = {k: 1 for k in wants}
    grant = dict(floors)
    left = budget - sum(grant.values())
    while left > 0:
        hungry = [k for k, (_lo, want) in wants.items() if grant[k] < want]
        if not hungry:
            break
        k = min(hungry, key=lambda key: (grant[key], key))
        grant[k] += 1
        left -= 1
    return grant


def cpus_assign(held: dict[str, tuple[int, ...]], grants: dict[str, int], host_cpus: list[int]) -> dict[str, tuple[int, ...]] | None:
    """Disjoint CPUs for each key, `grants[key]` of them, from `host_cpus`, keeping what each `held` as far as
    it can (a key that shrinks keeps its lowest; one that grows takes the lowest free). None when the grants do
    not fit the CPUs (then nothing is pinned)."""
    if sum(grants.values()) > len(host_cpus):
        return None
    allowed = set(host_cpus)
    taken: set[int] = set()
    out: dict[str, list[int]] = {}
    for key in sorted(grants):
        keep = [c for c in sorted(held.get(key, ())) if c in allowed and c not in taken][: grants[key]]
        out[key] = keep
        taken.update(keep)
    free = [c for c in sorted(host_cpus) if c not in taken]
    for key in sorted(grants):
        need = grants[key] - len(out[key])
        out[key] = sorted(out[key] + free[:need])
        free = free[need:]
    return {key: tuple(cpus) for key, cpus in out.items()}


class VerticalScaler:
    """See the module docstring. `desired()` is the desired state the agent follows (None: nothing to do),
    `host_cores` the host's core count (or a function giving it), `host_cpus` the CPU ids to pin to (default:
    the agent's own affinity mask). `call(record, header, timeout_s)` sends a control frame (default: the
    supervisor's `request`); `controller` is `sponge_step`'s signature (tests pass a fake); `shrink_after` the
    intervals a smaller size must have been enough before a runtime shrinks (`ShrinkDwell`)."""

    def __init__(
        self,
        *,
        supervisor: RuntimeSupervisor,
        desired: Callable[[], DesiredState | None],
        host_cores: int | Callable[[], int],
        on_operation: Callable[[Operation], None] | None = None,
        interval_s: float = 1.0,
        pin_cpus: bool = True,
        host_cpus: list[int] | None = None,
        call: Callable[[RuntimeProcess, dict, float], dict] | None = None,
        controller: Callable[..., VerticalAction] = sponge_step,
        shrink_after: int = SHRINK_AFTER_INTERVALS,
        pressure_s: float = PRESSURE_S,
    ) -> None:
        self.supervisor = supervisor
        self.desired = desired
        self._host_cores = host_cores
        self.on_operation = on_operation
        self.interval_s = float(interval_s)
        self.pin_cpus = pin_cpus
        if host_cpus is None:
            from workers.runtime.vertical import process_cpus

            found = process_cpus()
            host_cpus = sorted(found) if found is not None else []
        self.host_cpus = list(host_cpus)
        self.call = call or (lambda record, header, timeout_s: supervisor.request(record, header, timeout_s=timeout_s))
        self.controller = controller
        ShrinkDwell(shrink_after)  # refuses a bad value here, not at the first tick
        self.shrink_after = shrink_after
        self.pressure_s = float(pressure_s)
        self._rates: dict[str, float] = {}  # each vertical runtime's rate at the last tick: what a check between ticks sizes for
        self._dwells: dict[str, ShrinkDwell] = {}  # each vertical runtime's hysteresis
        self._lock = threading.Lock()  # one sizing decision at a time: the fast loop's ticks and the reconciler's resizes
        self.sizes: dict[str, dict[str, Any]] = {}  # key -> {"cores", "max_batch", "cpus"} as the runtime last said
        self._pinned: dict[str, tuple[int, ...]] = {}  # the CPUs given to each vertical runtime
        self._resizes: dict[str, list[dict]] = {}
        self._resizes_lock = threading.Lock()  # not `_lock`: the metrics loop must not wait behind a cold resize
        self.last_actions: dict[str, VerticalAction] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pressure_thread: threading.Thread | None = None
        self._errors: dict[str, str] = {}  # a runtime's last failure, logged once until it changes

    @property
    def host_cores(self) -> int:
        return int(self._host_cores() if callable(self._host_cores) else self._host_cores)

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(self.tick, self.interval_s), name="tessera-agent-vertical", daemon=True)
            self._thread.start()
        if self._pressure_thread is None and self.pressure_s > 0:
            self._pressure_thread = threading.Thread(target=self._run, args=(self.pressure, self.pressure_s), name="tessera-agent-pressure",
                                                     daemon=True)
            self._pressure_thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for thread in (self._thread, self._pressure_thread):
            if thread is not None:
                thread.join(timeout_s)

    def _run(self, step: Callable[[], Any], period_s: float) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = max(next_at + period_s, time.monotonic())
            try:
                step()
            except Exception:  # the fast loop must never take the agent down
                log.exception("vertical loop %s failed", getattr(step, "__name__", "step"))

    # ------------------------------------------------------------------ one tick

    def _cpu_runtimes(self) -> list[tuple[DesiredRuntime, RuntimeProcess]]:
        """The desired CPU runtimes that run as desired (same restart fingerprint), by key."""
        desired = self.desired()
        if desired is None:
            return []
        running = self.supervisor.running()
        out = []
        for runtime in desired.process_runtimes:
            record = running.get(runtime.key)
            if runtime.device_kind == "cpu" and record is not None and record.fingerprint == runtime.fingerprint:
                out.append((runtime, record))
        return sorted(out, key=lambda item: item[0].key)

    def _observe(self, runtime: DesiredRuntime, record: RuntimeProcess) -> dict | None:
        try:
            reply = self.call(record, {"op": "stats", "reader": "vertical"}, 2.0)
        except (OSError, ValueError) as exc:
            self._error(runtime.key, f"no stats: {exc}")
            return None
        stats = reply.get("stats") if reply.get("status") == 200 else None
        if not isinstance(stats, dict) or not isinstance(stats.get("cores"), int):
            self._error(runtime.key, f"no stats: {reply}")
            return None
        self._errors.pop(runtime.key, None)
        self.sizes[runtime.key] = {"cores": stats["cores"], "max_batch": stats.get("max_batch"), "cpus": stats.get("cpus")}
        cpus = stats.get("cpus")
        if runtime.key not in self._pinned and isinstance(cpus, list) and len(cpus) == stats["cores"] and len(cpus) < len(self.host_cpus):
            self._pinned[runtime.key] = tuple(cpus)  # pinned before this agent (re)started: keep those CPUs
        return stats

    def tick(self) -> list[dict]:
        """One pass of the loop (see the module docstring); returns the resizes it made (the runtimes' answers)."""
        runtimes = self._cpu_runtimes()
        with self._lock:
            observed: dict[str, dict] = {}
            for runtime, record in runtimes:
                stats = self._observe(runtime, record)
                if stats is not None:
                    observed[runtime.key] = stats
            vertical = [(r, rec) for r, rec in runtimes if r.vertical is not None and r.key in observed]
            self._rates = {r.key: float(observed[r.key].get("rate_rps") or 0.0) for r, _rec in vertical}
            fixed = sum(self._cores_of(r) for r, _rec in runtimes if r.vertical is None)
            budget = self.host_cores - fixed
            actions: dict[str, VerticalAction] = {}
            needs: dict[str, int] = {}  # the cores each needs this interval, before hysteresis
            for runtime, _record in vertical:
                lo, hi = runtime.vertical.min_cores, max(runtime.vertical.min_cores, min(runtime.vertical.max_cores, max(1, budget)))  # type: ignore[union-attr]
                stats = observed[runtime.key]
                need = self._decide(runtime, stats, lo, hi)
                needs[runtime.key] = need.cores
                dwell = self._dwells.setdefault(runtime.key, ShrinkDwell(self.shrink_after))
                actions[runtime.key] = dwell.settle(need, min(max(int(stats["cores"]), lo), hi),
                                                    lambda cores, runtime=runtime, stats=stats: self._decide(runtime, stats, cores, cores))
            wanted = {r.key for r, _rec in runtimes if r.vertical is not None}
            self._dwells = {k: d for k, d in self._dwells.items() if k in wanted}
            # Needs first, then what is left to the cores held shrinks keep.
            grants = cores_share({r.key: (r.vertical.min_cores, needs[r.key]) for r, _rec in vertical}, budget)  # type: ignore[union-attr]
            spare = budget - sum(grants.values())
            for runtime, _record in vertical:
                extra = max(0, min(actions[runtime.key].cores - grants[runtime.key], spare))
                grants[runtime.key] += extra
                spare -= extra
            for runtime, _record in vertical:
                grant = grants[runtime.key]
                if grant < actions[runtime.key].cores:  # the host is short: the best batch at the cores it gets
                    actions[runtime.key] = self._decide(runtime, observed[runtime.key], min(runtime.vertical.min_cores, grant), grant)  # type: ignore[union-attr]
                self.last_actions[runtime.key] = actions[runtime.key]
            if budget < sum(r.vertical.min_cores for r, _rec in vertical):  # type: ignore[union-attr]
                self._error("host", f"the runtimes without a vertical block take {fixed} of the host's {self.host_cores} cores: "
                                    "the vertical ones are held at what is left (at least 1 core each)")
            pins = self._pins({key: grants[key] for key in grants})
            plan = []
            for runtime, record in vertical:
                action, now = actions[runtime.key], observed[runtime.key]
                cores = grants[runtime.key]
                cpus = pins.get(runtime.key) if pins is not None else None
                changed = (cores != now["cores"] or action.batch != now.get("max_batch")
                           or (cpus is not None and list(cpus) != now.get("cpus")))
                if changed:
                    plan.append((cores - now["cores"], runtime, record, cores, action, cpus))
            done = []
            for _delta, runtime, record, cores, action, cpus in sorted(plan, key=lambda item: (item[0], item[1].key)):  # shrinks first
                frame = resize_frame(runtime, cores, cpus=list(cpus) if cpus is not None else None, max_batch=action.batch)
                reply = self._resize(record, runtime.key, frame, by="vertical", reason=f"{action.status}: {action.reason}")
                if reply.get("status") == 200:
                    done.append(reply)
            return done

    def pressure(self) -> list[dict]:
        """The check between ticks (see the module docstring): grows that cannot wait for the next tick, within
        the cores the host has spare; returns the resizes it made."""
        desired = self.desired()
        if desired is None or not any(r.vertical is not None and r.device_kind == "cpu" for r in desired.process_runtimes):
            return []  # ten times a second: a host without vertical runtimes reads nothing else
        runtimes = self._cpu_runtimes()
        with self._lock:
            vertical = [(r, rec) for r, rec in runtimes if r.vertical is not None]
            spare = self.host_cores - sum(self._cores_of(r) for r, _rec in runtimes)
            done = []
            for runtime, record in vertical:
                if spare <= 0:
                    break
                try:
                    reply = self.call(record, {"op": "stats", "reader": "pressure"}, 1.0)
                except (OSError, ValueError):
                    continue  # the tick reports a runtime that does not answer
                stats = reply.get("stats") if reply.get("status") == 200 else None
                if not isinstance(stats, dict) or not isinstance(stats.get("cores"), int):
                    continue
                cores = int(stats["cores"])
                hi = min(runtime.vertical.max_cores, cores + spare)  # type: ignore[union-attr]
                stats = {**stats, "rate_rps": self._rates.get(runtime.key, stats.get("rate_rps") or 0.0)}
                action = sponge_pressure_step(runtime.vertical.model, self._observation(runtime, stats),  # type: ignore[union-attr]
                                              max_cores=hi, max_batch=self._batch_limit(runtime, stats))
                if action is None or action.cores <= cores:
                    continue
                action = VerticalAction(action.cores, action.batch, True, action.status, f"between ticks: {action.reason}", action.late,
                                        action.expired)
                pins = self._pins({**{r.key: self._cores_of(r) for r, _rec in vertical}, runtime.key: action.cores})
                cpus = pins.get(runtime.key) if pins is not None else None
                frame = resize_frame(runtime, action.cores, cpus=list(cpus) if cpus is not None else None, max_batch=action.batch)
                reply = self._resize(record, runtime.key, frame, by="vertical", reason=f"{action.status}: {action.reason}")
                if reply.get("status") == 200:
                    spare -= action.cores - cores
                    self._dwells.setdefault(runtime.key, ShrinkDwell(self.shrink_after)).reset()
                    self.last_actions[runtime.key] = action
                    done.append(reply)
            return done

    def _observation(self, runtime: DesiredRuntime, stats: dict) -> VerticalObservation:
        """What the controller sees of a runtime from its `stats`: budgets less the block's reserve (the later
        stages' planned time), the rate with `RATE_HEADROOM`."""
        assert runtime.vertical is not None
        reserve = runtime.vertical.reserve_ms
        budgets = tuple(float(b) - reserve for b in stats.get("budgets_ms") or ())
        queued = stats.get("queued_budgets")
        return VerticalObservation(cores=int(stats["cores"]), batch=int(stats.get("max_batch") or 1),
                                   rate_rps=float(stats.get("rate_rps") or 0.0) * RATE_HEADROOM, budgets_ms=budgets,
                                   queued=queued if isinstance(queued, int) and 0 <= queued <= len(budgets) else None)

    @staticmethod
    def _batch_limit(runtime: DesiredRuntime, stats: dict) -> int:
        limit = runtime.batch_limit
        if isinstance(stats.get("max_batch_limit"), int):  # a runtime started with an older block may allow less
            limit = max(1, min(limit, stats["max_batch_limit"]))
        return limit

    def _decide(self, runtime: DesiredRuntime, stats: dict, min_cores: int, max_cores: int) -> VerticalAction:
        assert runtime.vertical is not None
        max_cores = max(max_cores, min_cores)
        observation = self._observation(runtime, stats)
        limit = self._batch_limit(runtime, stats)
        action = self.controller(runtime.vertical.model, observation, min_cores=min_cores, max_cores=max_cores, max_batch=limit)
        # Keep the decision within what this tick allows (an idle runtime keeps its size, which may be above it).
        cores = min(max(action.cores, min_cores), max_cores)
        batch = min(max(action.batch, 1), limit)
        if (cores, batch) != (action.cores, action.batch):
            action = VerticalAction(cores, batch, (cores, batch) != (observation.cores, observation.batch), action.status,
                                    action.reason, action.late, action.expired)
        return action

    def _cores_of(self, runtime: DesiredRuntime) -> int:
        """A runtime's cores as it last said, else what the desired state gives it."""
        known = self.sizes.get(runtime.key, {}).get("cores")
        return int(known) if isinstance(known, int) else int(runtime.cpu_threads or 1)

    def _pins(self, grants: dict[str, int]) -> dict[str, tuple[int, ...]] | None:
        if not self.pin_cpus or not self.host_cpus or not grants:
            return None
        pins = cpus_assign(self._pinned, grants, self.host_cpus)
        if pins is not None:
            self._pinned = {**{k: v for k, v in self._pinned.items() if k not in grants}, **pins}
        return pins

    def _error(self, key: str, message: str) -> None:
        if self._errors.get(key) != message:
            log.warning("vertical loop: %s: %s", key, message)
        self._errors[key] = message

    # ------------------------------------------------------------------ resizing

    def _resize(self, record: RuntimeProcess, key: str, frame: dict, *, by: str, reason: str = "") -> dict:
        """Send one resize (lock held), record its Operation and its report entry; the runtime's answer with
        `before` (the sizes it had), `status` 200 when it was resized."""
        before = dict(self.sizes.get(key) or {})
        try:
            reply = self.call(record, frame, RESIZE_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            reply = {"status": None, "message": f"{type(exc).__name__}: {exc}"}
        at = datetime.now(timezone.utc).isoformat()
        ok = reply.get("status") == 200
        entry = {"at": at, "by": by, "reason": reason[:500], "outcome": "ok" if ok else "failed", "from_cores": before.get("cores"),
                 "from_max_batch": before.get("max_batch"), "cores": frame["cores"], "max_batch": frame.get("max_batch"),
                 "cpus": reply.get("cpus") if ok else frame.get("cpus"), "resize_ms": reply.get("resize_ms"),
                 "prepared": reply.get("prepared")}
        with self._resizes_lock:
            kept = self._resizes.setdefault(key, [])
            kept.append(entry)
            del kept[:-RESIZES_KEPT]
        if ok:
            self.sizes[key] = {"cores": reply.get("cores"), "max_batch": reply.get("max_batch"), "cpus": reply.get("cpus")}
            detail = resize_detail(before, reply) + (f" ({by}) {reason}" if reason else f" ({by})")
        else:
            detail = f"{frame['cores']} cores, batch {frame.get('max_batch')}: {reply.get('message') or reply} ({by})"
        if by == "vertical":  # the reconciler records its own
            self._operation(Operation(at, "runtime.resize", key, "ok" if ok else "failed", detail[:500]))
        reply = dict(reply)
        reply["before"] = before
        return reply

    def _operation(self, op: Operation) -> None:
        (log.info if op.outcome == "ok" else log.warning)("%s %s: %s %s", op.action, op.target, op.outcome, op.detail)
        if self.on_operation is not None:
            self.on_operation(op)

    def desired_resize(self, record: RuntimeProcess, runtime: DesiredRuntime) -> dict:
        """The reconciler's resize of a CPU runtime whose `cpu_threads` or `vertical` changed (see the module
        docstring); the runtime's answer with `before` (`{"status": None, "message"}` when it did not answer)."""
        runtimes = self._cpu_runtimes()
        with self._lock:
            try:
                health = self.call(record, {"op": "health"}, 5.0)
                if isinstance(health.get("cores"), int):
                    self.sizes[runtime.key] = {"cores": health["cores"], "max_batch": health.get("max_batch"), "cpus": health.get("cpus")}
            except (OSError, ValueError):
                pass
            others = [(r, rec) for r, rec in runtimes if r.key != runtime.key]
            cores = int(runtime.cpu_threads or 1)
            if runtime.vertical is not None:
                cores = min(max(cores, runtime.vertical.min_cores), runtime.vertical.max_cores)
                free = self.host_cores - sum(self._cores_of(r) for r, _rec in others)
                cores = max(min(cores, free), min(runtime.vertical.min_cores, max(free, 1)), 1)
            else:
                self._make_room(others, self.host_cores - cores)
            cpus = None
            if runtime.vertical is not None:
                grants = {r.key: self._cores_of(r) for r, _rec in others if r.vertical is not None}
                grants[runtime.key] = cores
                pins = self._pins(grants)
                cpus = list(pins[runtime.key]) if pins is not None else None
            else:
                self._pinned.pop(runtime.key, None)
            return self._resize(record, runtime.key, resize_frame(runtime, cores, cpus=cpus), by="desired")

    def _make_room(self, others: list[tuple[DesiredRuntime, RuntimeProcess]], room: int) -> None:
        """Shrink vertical runtimes (the largest first, never below their min_cores) until the others hold at most
        `room` cores (lock held)."""
        excess = sum(self._cores_of(r) for r, _rec in others) - room
        vertical = [(r, rec) for r, rec in others if r.vertical is not None]
        while excess > 0:
            shrinkable = [(r, rec) for r, rec in vertical if self._cores_of(r) > r.vertical.min_cores]  # type: ignore[union-attr]
            if not shrinkable:
                break
            runtime, record = max(shrinkable, key=lambda item: (self._cores_of(item[0]), item[0].key))
            cores = self._cores_of(runtime) - 1
            grants = {r.key: self._cores_of(r) for r, _rec in vertical}
            grants[runtime.key] = cores
            pins = self._pins(grants)
            max_batch = self.sizes.get(runtime.key, {}).get("max_batch")
            frame = resize_frame(runtime, cores, cpus=list(pins[runtime.key]) if pins is not None else None,
                                 max_batch=max_batch if isinstance(max_batch, int) else None)
            reply = self._resize(record, runtime.key, frame, by="vertical", reason="making room for a runtime the desired state grows")
            if reply.get("status") != 200:
                break
            excess -= 1

    def resizes_take(self, key: str) -> list[dict]:
        """The resizes of runtime `key` since the last call (for the metrics report)."""
        with self._resizes_lock:
            return self._resizes.pop(key, [])
