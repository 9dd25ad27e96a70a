"""The runtime process: one serving instance (a GPU, a MIG instance, or a CPU allotment), or the models that
time-share one MPS partition, behind the router's frame protocol.

    python -m workers.runtime.server --spec SPEC.json --listen 127.0.0.1:0 --ready-file PATH

Start-up: read the spec (workers/runtime/spec.py), load each model (workers/runtime/loading.py: an
`OnnxSession`, its sha256 checked, or a `SimulatedSession`), warm it, start its batcher
(workers/runtime/served.py), bind, and only then write the endpoint `tcp://HOST:PORT` to the ready file,
atomically: the agent polls for it. A runtime that cannot start writes no ready file, prints
`tessera-runtime: error: ...` on stderr and exits 2. SIGTERM / SIGINT: drain (at most
`--drain-timeout-s`), close, exit 0.

The frames, per op, and the spec's fields are described in docs/dataplane.md ("Router ↔ runtime frames",
"The runtime process and its spec"). This module is the process: `RuntimeServer` routes each frame to the
model it names (a partition serves several: workers/runtime/partition.py) or answers for the process
(`drain`, a partition's own `health`/`stats`/`metrics`); one connection's reads and writes are
workers/runtime/connection.py's.

The hot path does not log, does not copy binary tensors (the arrays alias the frame's body; a query that
carries its own batch axis and runs alone goes to the model as it is), and hops threads at most once per
query: to the batcher's worker thread, which runs the batch and writes the answers itself. A query that
arrives alone (no other frame in the same read) at an idle instance of a cheap model (a batch of one
planned at most 1 ms, `INLINE_MAX_MS`), which the policy runs at once, runs on the event loop's thread
without the hop; everything else, and so every batch a policy forms under load, goes to the worker.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Mapping, Sequence

from workers.metrics import PROMETHEUS_CONTENT_TYPE, exposition_merge
from workers.runtime.connection import FrameConnection, socket_configure
from workers.runtime.partition import PartitionRounds, PartitionTurns
from workers.runtime.served import JSON_CT, NOT_CPU_RUNTIME, ServedModel
from workers.runtime.spec import (BatchingSpec, PartitionSpec, RuntimeSpec, RuntimeSpecError, ready_file_write, spec_from_dict,
                                  spec_load)
from workers.runtime.loading import session_load
from workers.runtime.vertical import process_cpus
from workers.wire import UNKNOWN_INSTANCE, error_body

# The spec's and the model's names stay importable from here, where the process's users always found them.
__all__ = ["UNKNOWN_INSTANCE", "BatchingSpec", "PartitionSpec", "RuntimeServer", "RuntimeSpec", "RuntimeSpecError", "ServedModel",
           "ready_file_write", "main", "session_load", "spec_from_dict", "spec_load"]

log = logging.getLogger("tessera.runtime")


class RuntimeServer:
    """The frame server around the process's models (docs/dataplane.md, "Router ↔ runtime frames"): one `ServedModel` for a
    single-model spec, one per model for a partition spec, with the partition's `turns`. `sessions`
    (partition) or `session` (single model) replace what the spec would load (tests); `record_turns` keeps
    the partition's turn timeline. `start(host, port)` binds and returns the endpoint; `wait_closed()`
    returns once a shutdown finished."""

    def __init__(self, spec: RuntimeSpec | PartitionSpec, session: Any | None = None, *, sessions: Mapping[str, Any] | None = None,
                 record_turns: bool = False) -> None:
        self.spec = spec
        self.started = time.monotonic()
        self.draining = False
        self.cpus_allowed = process_cpus()  # what a resize may pin to: the CPUs the process was started with
        self._drain_waiters: list[tuple[FrameConnection, Any, asyncio.TimerHandle | None]] = []
        self.turns: PartitionTurns | PartitionRounds | None
        if isinstance(spec, PartitionSpec):
            self.partition: PartitionSpec | None = spec
            sessions = sessions or {}
            if spec.duty_cycle_ms is None:  # work-conserving turns
                self.turns = PartitionTurns([m.key for m in spec.models], None, record=record_turns)
                self.models = [ServedModel(self, m, sessions.get(m.key), self.turns, field_prefix=f"models[{i}].")
                               for i, m in enumerate(spec.models)]
            else:  # the plan's duty-cycle rounds drive the batchers
                self.models = [ServedModel(self, m, sessions.get(m.key), field_prefix=f"models[{i}].", round_driven=True)
                               for i, m in enumerate(spec.models)]
                self.turns = PartitionRounds([m.round_member for m in self.models], spec.duty_cycle_ms, record=record_turns)
        else:
            self.partition = None
            self.turns = None
            self.models = [ServedModel(self, spec, session)]
        self._by_key = {m.spec.key: m for m in self.models}
        self._by_instance = {m.instance: m for m in self.models}
        self.simulated = all(m.simulated for m in self.models)
        self._connections: set[FrameConnection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._closed: asyncio.Event | None = None
        self.endpoint: str | None = None

    @property
    def in_flight(self) -> int:
        """Queries taken and not answered yet (queued or in a batch), every model's."""
        return sum(m.in_flight for m in self.models)

    def model(self, key: str) -> ServedModel:
        """The model served under `key` (KeyError: none)."""
        return self._by_key[key]

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the batchers, bind, serve; returns the endpoint `tcp://HOST:PORT`."""
        self._loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        for model in self.models:
            model.batcher.start()
        if isinstance(self.turns, PartitionRounds):
            self.turns.start()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._loop.add_reader(listener.fileno(), self._accept)
        sockname = listener.getsockname()
        self.endpoint = f"tcp://{_host_str(sockname[0])}:{sockname[1]}"
        return self.endpoint

    def _accept(self) -> None:
        assert self._listener is not None and self._loop is not None
        while True:
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next readiness
                log.warning("accept failed: %s", exc)
                return
            socket_configure(sock)
            conn = FrameConnection(sock, loop=self._loop, handle=self.frame_handle, on_close=self._connections.discard)
            self._connections.add(conn)
            conn.start()

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop taking queries, wait (at most `drain_timeout_s`) for what is queued and in flight, close."""
        self.draining = True
        deadline = time.monotonic() + drain_timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for conn in list(self._connections):
            conn.close()
        if isinstance(self.turns, PartitionRounds):
            self.turns.close(timeout=5.0)  # first: its batch in flight completes before the batchers fail the rest
        for model in self.models:
            model.batcher.close(timeout=5.0)
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        assert self._closed is not None
        await self._closed.wait()

    # ------------------------------------------------------------------ frames (event loop thread)

    def frame_handle(self, conn: FrameConnection, header: dict, body: bytes) -> None:
        op = header.get("op")
        rid = header.get("id")
        if op == "drain":  # the whole process, whatever the frame names
            self._drain(conn, header)
            return
        if op not in _MODEL_OPS:
            self._error(conn, rid, 400, "unknown_op", f"unknown op {op!r}; known: infer, health, stats, metrics, resize, drain")
            return
        model, unknown = self._select(header)
        reader = header.get("reader") if op == "stats" else None
        if reader is not None and not isinstance(reader, str):
            self._error(conn, rid, 400, "malformed", f"'reader' must be a name, got {reader!r}")
            return
        if model is None:
            if unknown is not None:
                self._error(conn, rid, 404, UNKNOWN_INSTANCE, unknown)
            elif op == "health":
                conn.send(self._partition_health(rid))
            elif op == "stats":
                conn.send({"id": rid, "status": 200, "models": [m.stats_item(reader) for m in self.models]})
            elif op == "resize":
                self._error(conn, rid, 409, NOT_CPU_RUNTIME, f"partition {self.spec.key} cannot be resized: an MPS partition's "
                            "models run on a GPU; only CPU runtimes change their cores in place")
            elif op == "metrics":
                text = exposition_merge(m.stats.exposition() for m in self.models)
                conn.send({"id": rid, "status": 200, "content_type": PROMETHEUS_CONTENT_TYPE}, text)
            else:
                self._error(conn, rid, 404, UNKNOWN_INSTANCE, f"partition {self.spec.key} serves {len(self.models)} models: an infer "
                            f"frame names one by 'key' ({', '.join(self._by_key)}) or 'instance' ({', '.join(self._by_instance)})")
            return
        if op == "infer":
            model.infer(conn, header, body)
        elif op == "health":
            conn.send(model.health(rid))
        elif op == "stats":
            conn.send({"id": rid, "status": 200, "stats": model.stats_item(reader)})
        elif op == "resize":
            model.resize(conn, header)
        else:
            conn.send({"id": rid, "status": 200, "content_type": PROMETHEUS_CONTENT_TYPE}, model.stats.exposition())

    def _select(self, header: dict) -> tuple[ServedModel | None, str | None]:
        """(the model a frame is for, None); (None, why) when it names a model not served here; (None, None)
        when a partition's frame names none. A single-model runtime takes every frame as its model's,
        whatever key or instance it names (as it always has). A partition's frame names its model by "key"
        (the runtime key, `<partition key>/<slot>`), else by "instance" (the fleet instance id; for a model
        whose spec has no instance, any `<host>/<model key>`)."""
        if self.partition is None:
            return self.models[0], None
        key = header.get("key")
        if key:
            model = self._by_key.get(key)
            if model is None:
                return None, f"partition {self.spec.key} serves no model {key!r}; it serves {', '.join(self._by_key)}"
            return model, None
        instance = header.get("instance")
        if instance:
            model = self._by_instance.get(instance)
            if model is None and isinstance(instance, str):
                suffixed = [m for k, m in self._by_key.items() if m.spec.instance is None and instance.endswith("/" + k)]
                model = suffixed[0] if len(suffixed) == 1 else None
            if model is None:
                return None, f"partition {self.spec.key} serves no instance {instance!r}; it serves {', '.join(self._by_instance)}"
            return model, None
        return None, None

    def _error(self, conn: FrameConnection, rid: Any, status: int, code: str, message: str) -> None:
        """An error frame not about one model (a single-model runtime's names its model, as always)."""
        if self.partition is None:
            self.models[0].error(conn, rid, status, code, message)
            return
        conn.send({"id": rid, "status": status, "code": code, "message": message, "application": None, "variant": None,
                   "simulated": self.simulated, "content_type": JSON_CT}, error_body(status, code, message))

    def _partition_health(self, rid: Any) -> dict:
        """`health` without a key on a partition runtime: the partition, and each model as its keyed health
        answers it (without id and status), with its turns on the partition."""
        assert self.partition is not None and self.turns is not None
        models = []
        for model in self.models:
            item = model.health(None)
            del item["id"], item["status"]
            item["turns"] = self.turns.counters(model.spec.key)
            models.append(item)
        return {
            "id": rid, "status": 200, "state": "draining" if self.draining else "ready", "key": self.partition.key,
            "instance": self.partition.instance or self.partition.key, "partition_percent": self.partition.partition_percent,
            "duty_cycle_ms": self.partition.duty_cycle_ms, "device_uuid": self.partition.device_uuid, "simulated": self.simulated,
            "queue_length": sum(item["queue_length"] for item in models), "in_flight": sum(item["in_flight"] for item in models),
            "running": self.turns.holder, "waiting": self.turns.waiting(), "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started, 3), "models": models,
        }

    def _drain(self, conn: FrameConnection, header: dict) -> None:
        self.draining = True
        rid = header.get("id")
        if self.in_flight == 0:
            conn.send({"id": rid, "status": 200, "state": "drained"})
            return
        timer = None
        entry: list = []
        timeout_ms = header.get("timeout_ms")
        if isinstance(timeout_ms, (int, float)) and not isinstance(timeout_ms, bool) and timeout_ms >= 0:
            timer = self._loop.call_later(timeout_ms / 1000.0, self._drain_timeout, entry)  # type: ignore[union-attr]
        waiter = (conn, rid, timer)
        entry.append(waiter)
        self._drain_waiters.append(waiter)
        if self.in_flight == 0:  # answered meanwhile (the worker threads)
            self._drained()

    def _drain_timeout(self, entry: list) -> None:
        waiter = entry[0]
        if waiter in self._drain_waiters:
            self._drain_waiters.remove(waiter)
            conn, rid, _ = waiter
            in_flight = self.in_flight
            conn.send({"id": rid, "status": 504, "code": "drain_timeout", "state": "draining", "in_flight": in_flight,
                       "message": f"{in_flight} queries still queued or in flight"})

    def query_answered(self) -> None:
        """A query was answered (any thread): a drain waiting for the last one is answered on the loop."""
        if self._drain_waiters and self.in_flight == 0:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._drained)

    def _drained(self) -> None:
        if self.in_flight:
            return
        waiters, self._drain_waiters = self._drain_waiters, []
        for conn, rid, timer in waiters:
            if timer is not None:
                timer.cancel()
            conn.send({"id": rid, "status": 200, "state": "drained"})


_MODEL_OPS = frozenset(("infer", "health", "stats", "metrics", "resize"))


def _host_str(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen_parse(text: str) -> tuple[str, int]:
    host, sep, port = text.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise RuntimeSpecError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


def _served_str(spec: RuntimeSpec | PartitionSpec) -> str:
    if isinstance(spec, PartitionSpec):
        models = ", ".join(f"{m.key} {m.application}/{m.variant}" for m in spec.models)
        return f"MPS partition {spec.partition_percent}%: {models}"
    return f"{spec.application}/{spec.variant}"


async def _serve(server: RuntimeServer, host: str, port: int, ready_file: str | None, drain_timeout_s: float) -> None:
    endpoint = await server.start(host, port)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task] = []

    def stop() -> None:
        if not stopping:
            log.info("signal received: draining, then exiting")
            stopping.append(loop.create_task(server.shutdown(drain_timeout_s)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not on the main thread / platform
            pass
    if ready_file:
        ready_file_write(ready_file, endpoint)
    log.info("runtime %s (%s%s) serving on %s", server.spec.key, _served_str(server.spec), ", simulated" if server.simulated else "", endpoint)
    await server.wait_closed()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.runtime.server", description="A Tessera runtime process (one serving instance).")
    parser.add_argument("--spec", required=True, help="the runtime spec (JSON: RuntimeSpec's fields, or PartitionSpec's with 'models')")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free port)")
    parser.add_argument("--ready-file", default=None, help="where to write tcp://HOST:PORT once serving")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0, help="how long SIGTERM waits for queued queries")
    parser.add_argument("--log-level", default=os.environ.get("TESSERA_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # The event loop and the batcher's thread share the GIL: a short switch interval keeps a batch that
    # just finished from waiting behind the loop for the default 5 ms.
    sys.setswitchinterval(0.0005)
    try:
        spec = spec_load(args.spec)
        host, port = _listen_parse(args.listen)
        models = spec.models if isinstance(spec, PartitionSpec) else [spec]
        log.info("runtime %s starting: %s (%s)", spec.key, _served_str(spec),
                 ", ".join("simulated" if m.simulated else f"model {m.artifact_path}" for m in models))
        server = RuntimeServer(spec)
    except Exception as exc:  # the spec, the artifact (checksum), the model, the policy: the agent reports it
        print(f"tessera-runtime: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    # Everything loaded so far lives as long as the process: keep it out of the collector's way (fewer and
    # shorter full collections on the hot path).
    gc.collect()
    gc.freeze()
    loop = _event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_serve(server, host, port, args.ready_file, args.drain_timeout_s))
    except OSError as exc:
        print(f"tessera-runtime: error: cannot listen on {args.listen}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
