"""Loading what a runtime serves: the spec's session (an `OnnxSession` on the artifact, its sha256 checked
and warm, or a `SimulatedSession` that serves in its profile's time), a latency profile measured on a
session started without one, and whether the runtime is a CPU runtime (the ones a resize may change)."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from workers.runtime.simulated import SimulatedSession, profile_points
from workers.runtime.spec import RuntimeSpec
from workers.runtime.vertical import vertical_parse

__all__ = ["is_cpu_runtime", "onnx_session_build", "profile_measure", "session_load"]


def session_load(spec: RuntimeSpec) -> Any:
    """The spec's session: a SimulatedSession, or an OnnxSession on the artifact (sha256 checked), warm."""
    if spec.simulated:
        if spec.vertical is not None:  # its service time is Sponge's l(b, c) at its cores
            vertical = vertical_parse(spec.vertical)
            limit = max([spec.max_batch, vertical.max_batch or 1] + [p.batch for p in profile_points(spec.profile)])
            return SimulatedSession(spec.profile, limit, vertical=vertical.model, cores=spec.cpu_threads)
        return SimulatedSession(spec.profile, spec.max_batch)
    if spec.device_uuid and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device_uuid
    return onnx_session_build(spec, cores=spec.cpu_threads, max_batch=spec.max_batch)


def onnx_session_build(spec: RuntimeSpec, *, cores: int, max_batch: int) -> Any:
    """An OnnxSession on the spec's artifact with `cores` intra-op threads, warmed up at batches 1 and
    `max_batch` (the start-up's session, and each a resize builds)."""
    from workers.runtime.session import OnnxSession  # onnxruntime only where a real model is served

    assert spec.artifact_path is not None
    session = OnnxSession(spec.artifact_path, sha256=spec.sha256, intra_op_threads=cores, device_uuid=spec.device_uuid)
    session.warmup(sorted({1, max_batch}))
    return session


def profile_measure(session: Any, max_batch: int, signature: dict) -> list[dict[str, Any]]:
    """A latency profile measured on the session at batches 1 and `max_batch` (the median of 5 runs of
    zero-filled inputs of the model's `signature`): a real runtime started without one."""
    points = []
    for b in sorted({1, max_batch}):
        feed = []
        for _ in range(b):
            feed.append({name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in dims[1:]], dtype=dt or np.float32)
                         for name, (dt, dims) in signature.items()})
        times = []
        for _ in range(5):
            t = time.perf_counter()
            session.run_batch(feed)
            times.append((time.perf_counter() - t) * 1000.0)
        points.append({"batch": b, "latency_ms": sorted(times)[len(times) // 2]})
    return points


def is_cpu_runtime(spec: RuntimeSpec, session: Any) -> bool:
    """A CPU runtime: its key names a CPU (`cpu0/1`); a key that is no fleet key: no GPU named and no CUDA."""
    from engine.geometry import names

    try:
        return names.runtime_key_parse(spec.key).kind == "cpu"
    except ValueError:
        return spec.device_uuid is None and "CUDAExecutionProvider" not in list(getattr(session, "providers", []))
