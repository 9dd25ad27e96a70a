"""The profiler: latency of one model at each batch size (and, on CPUs, thread count) on one device.

`profile_sweep` measures in the calling process: per batch size, a few warm-up runs, then timed runs until
both `min_iterations` and `min_time_s` are reached (at most `max_iterations`), giving p50 and p99 latency,
throughput (rows served per second of measured time) and the resident memory the session added. Each
thread count is swept in a fresh process (`python -m workers.profiler`), so that memory is measured from a
clean baseline and onnxruntime's thread pools do not carry over; GPU sweeps run with the MIG device (or
GPU) pinned through CUDA_VISIBLE_DEVICES, as the runtimes are, and fail where CUDA does not run the model
(an onnxruntime without the CUDA provider, or a provider that did not load) rather than report the CPU's
figures as the GPU's.

`profiling_request_run` carries out one of the control plane's profiling requests on this host: it
reports progress as it goes and posts the measured points as `Profile` rows. Simulated GPUs cannot be
profiled (they compute nothing); such a request fails and says so.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["DEFAULT_BATCH_SIZES", "ProfilingError", "profile_sweep", "profile_sweep_subprocess", "profiling_request_run"]

log = logging.getLogger("tessera.profiler")

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)

_DTYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint64)": np.uint64, "tensor(uint32)": np.uint32, "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class ProfilingError(RuntimeError):
    pass


def _rss_mb() -> float:
    """Resident memory of this process in MiB (Linux /proc; 0 where it is not available)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


# String inputs (tensor(string), the protocol's BYTES) are fed random ASCII words of this many characters
# unless the profiling request declares another length: a text model's latency depends on it.
DEFAULT_STRING_LENGTH = 16
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


def _feed(session, batch: int, rng: np.random.Generator, string_length: int = DEFAULT_STRING_LENGTH) -> dict[str, np.ndarray]:
    feed = {}
    for spec in session.get_inputs():
        shape = [batch] + [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape[1:]]
        if spec.type == "tensor(string)":
            count = int(np.prod(shape))
            letters = rng.choice(_LETTERS, size=(count, string_length))
            words = np.empty(count, dtype=object)
            words[:] = [row.tobytes().decode("ascii") for row in letters]
            feed[spec.name] = words.reshape(shape)
            continue
        if spec.type not in _DTYPES:
            raise ProfilingError(f"input {spec.name!r} is {spec.type}: the profiler cannot feed it")
        dtype = _DTYPES[spec.type]
        if np.issubdtype(dtype, np.floating):
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feed[spec.name] = np.zeros(shape, dtype=dtype)
    return feed


def timed_runs(run: Callable[[], Any], *, warmup: int = 3, min_iterations: int = 20, min_time_s: float = 0.5, max_iterations: int = 2000,
               sync: Callable[[], Any] = lambda: None) -> list[float]:
    """The profiler's timing rule, one batch size: `warmup` untimed runs, then timed runs (ms each) until both
    `min_iterations` runs and `min_time_s` seconds are done, at most `max_iterations`. `sync` waits for the
    device after each run (CUDA is asynchronous); scripts/gpu_check.py times PyTorch models by the same rule."""
    for _ in range(warmup):
        run()
    sync()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_iterations and (len(samples) < min_iterations or time.perf_counter() - started < min_time_s):
        t0 = time.perf_counter()
        run()
        sync()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return samples


def profile_sweep(
    model: Path | bytes,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    cpu_threads: int = 1,
    providers: Sequence[str] | None = None,
    warmup: int = 3,
    min_iterations: int = 20,
    min_time_s: float = 0.5,
    max_iterations: int = 2000,
    progress: Callable[[int, dict], None] | None = None,
    seed: int = 0,
    string_length: int = DEFAULT_STRING_LENGTH,
) -> list[dict[str, Any]]:
    """Measure every batch size in this process; one dict per batch size (see the module docstring)."""
    import onnxruntime as ort

    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ProfilingError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if cpu_threads < 1:
        raise ProfilingError(f"cpu_threads must be >= 1, got {cpu_threads}")
    if not 1 <= string_length <= 1 << 16:
        raise ProfilingError(f"string_length must be 1..65536, got {string_length}")
    baseline = _rss_mb()
    options = ort.SessionOptions()
    options.intra_op_num_threads = cpu_threads
    options.inter_op_num_threads = 1
    data = model if isinstance(model, (bytes, bytearray)) else Path(model).read_bytes()
    wanted = list(providers or ["CPUExecutionProvider"])
    available = set(ort.get_available_providers())
    chosen = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
    session = ort.InferenceSession(bytes(data), sess_options=options, providers=chosen)
    if "CUDAExecutionProvider" in wanted:
        # A GPU's profile measured on the CPU would plan the GPU at the CPU's speed: refuse instead.
        from workers.runtime.session import CudaUnavailableError, cuda_active_check

        try:
            cuda_active_check(session.get_providers(), available=sorted(available), where="profiling on a GPU")
        except CudaUnavailableError as exc:
            raise ProfilingError(str(exc)) from None
    rng = np.random.default_rng(seed)
    outputs = [o.name for o in session.get_outputs()]
    points: list[dict[str, Any]] = []
    for n, batch in enumerate(sorted(set(int(b) for b in batch_sizes))):
        feed = _feed(session, batch, rng, string_length)
        samples = timed_runs(lambda feed=feed: session.run(outputs, feed), warmup=warmup, min_iterations=min_iterations, min_time_s=min_time_s,
                             max_iterations=max_iterations)
        elapsed = sum(samples) / 1000.0
        point = {
            "batch_size": batch,
            "latency_p50_ms": float(np.percentile(samples, 50)),
            "latency_p99_ms": float(np.percentile(samples, 99)),
            "throughput_rps": batch * len(samples) / elapsed if elapsed > 0 else None,
            "memory_mb": max(0, round(_rss_mb() - baseline)),
            "iterations": len(samples),
            "providers": session.get_providers(),
        }
        points.append(point)
        if progress is not None:
            progress(n + 1, point)
    return points


def profile_sweep_subprocess(
    model_path: Path,
    *,
    batch_sizes: Sequence[int],
    cpu_threads: int = 1,
    device_uuid: str | None = None,
    min_time_s: float = 0.5,
    progress: Callable[[dict], None] | None = None,
    timeout_s: float = 1800.0,
    string_length: int = DEFAULT_STRING_LENGTH,
) -> list[dict[str, Any]]:
    """`profile_sweep` in a fresh process (see the module docstring); `progress` sees each point."""
    cmd = [sys.executable, "-m", "workers.profiler", "--model", str(model_path), "--threads", str(cpu_threads),
           "--batch-sizes", ",".join(str(b) for b in batch_sizes), "--min-time", str(min_time_s), "--string-length", str(string_length)]
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(cpu_threads)
    if device_uuid is not None:
        cmd += ["--providers", "CUDAExecutionProvider,CPUExecutionProvider"]
        env["CUDA_VISIBLE_DEVICES"] = device_uuid
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # nosec B603 - this Python, our module, an argument list
    points = []
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    for line in process.stdout:
        point = json.loads(line)
        points.append(point)
        if progress is not None:
            progress(point)
        if time.monotonic() > deadline:
            process.kill()
            raise ProfilingError(f"profiling took longer than {timeout_s:.0f} s")
    stderr = process.stderr.read() if process.stderr else ""
    if process.wait() != 0:
        raise ProfilingError(f"profiler process failed: {_failure_reason(stderr)}")
    return points


def _failure_reason(stderr: str) -> str:
    """What a failed profiler process said: its exception's last line (the reason), whole, rather than the
    tail of a traceback cut wherever a character limit fell."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    if not lines:
        return "it exited without saying why"
    reason = lines[-1]
    for prefix in ("workers.profiler.ProfilingError: ", "ProfilingError: "):
        reason = reason.removeprefix(prefix)
    return reason[:1000]


def profiling_request_run(request: dict, *, client: Any, backend: Any, cache_dir: Path) -> list[dict]:
    """Carry out one profiling request (docs/dataplane.md): progress while it runs, then the results."""
    from engine.geometry.catalogue import mig_catalogue_load
    from engine.geometry.layout import placement_parse

    rid = request["id"]
    device = str(request.get("device", "cpu0"))
    batch_sizes = list(request.get("batch_sizes") or DEFAULT_BATCH_SIZES)
    artifact = request.get("artifact")

    def fail(message: str) -> list[dict]:
        log.warning("profiling request %s failed: %s", rid, message)
        client.profiling_progress(rid, status="failed", progress=0, log=message, error=message)
        return []

    if not artifact:
        return fail("the variant has no ONNX artifact to profile")
    client.profiling_progress(rid, status="running", progress=0, log=f"profiling on {device}: batch sizes {batch_sizes}")
    try:
        model_path = client.artifact_fetch(artifact, cache_dir)
    except Exception as exc:
        return fail(f"artifact download failed: {exc}")
    runs: list[tuple[int, str | None, str, str, int | None]] = []  # (threads, device uuid, device type, slice, cores)
    if device.startswith("cpu"):
        cores = backend.cpu_cores()
        threads = [t for t in (request.get("cpu_threads") or [1, 2, 4]) if 1 <= t <= cores] or [1]
        runs = [(t, None, request.get("device_type") or "cpu", "", t) for t in threads]
    else:
        index = int(device[3:])
        gpu = next((g for g in backend.gpus() if g.index == index), None)
        if gpu is None:
            return fail(f"{device}: no such GPU on this host")
        if gpu.simulated:
            return fail(f"{device} is a simulated GPU: it computes nothing, so it cannot be profiled; import profiles for it instead")
        spec = mig_catalogue_load().gpu_model_find(gpu.model_name)
        device_type = request.get("device_type") or (spec.name if spec else gpu.model_name)
        placement = request.get("placement") or ""
        if placement:
            wanted = placement_parse(placement)
            instance = next((i for i in gpu.instances if i.placement == wanted), None)
            if instance is None:
                return fail(f"{device}: no MIG instance {placement} (create it through the desired state first)")
            runs = [(1, instance.uuid, device_type, wanted.profile, None)]
        else:
            if gpu.mig_enabled:
                return fail(f"{device} has MIG enabled: name the MIG instance (placement) to profile")
            runs = [(1, gpu.uuid, device_type, "full", None)]
    total = len(runs) * len(batch_sizes)
    done = 0
    profiles: list[dict] = []
    for threads, device_uuid, device_type, slice_name, cores in runs:
        def progress(point: dict) -> None:
            nonlocal done
            done += 1
            pct = min(99, int(100 * done / total))
            where = f"{cores} threads" if cores else (slice_name or device_type)
            client.profiling_progress(rid, status="running", progress=pct,
                                      log=f"{where} batch {point['batch_size']}: p50 {point['latency_p50_ms']:.3f} ms, p99 {point['latency_p99_ms']:.3f} ms")

        try:
            points = profile_sweep_subprocess(model_path, batch_sizes=batch_sizes, cpu_threads=threads, device_uuid=device_uuid, progress=progress,
                                              string_length=int(request.get("string_length") or DEFAULT_STRING_LENGTH))
        except ProfilingError as exc:
            return fail(str(exc))
        for point in points:
            profiles.append({
                "device_type": device_type, "slice": slice_name, "cpu_cores": cores, "batch_size": point["batch_size"],
                "latency_p50_ms": point["latency_p50_ms"], "latency_p99_ms": max(point["latency_p99_ms"], point["latency_p50_ms"]),
                "throughput_rps": point["throughput_rps"], "memory_mb": point["memory_mb"],
            })
    client.profiling_results(rid, profiles)
    return profiles


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile one ONNX model: one JSON line per batch size.")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", default=",".join(str(b) for b in DEFAULT_BATCH_SIZES))
    parser.add_argument("--providers", default="CPUExecutionProvider")
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--string-length", type=int, default=DEFAULT_STRING_LENGTH, help="characters per string input element")
    args = parser.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]

    def emit(_n: int, point: dict) -> None:
        sys.stdout.write(json.dumps(point) + "\n")
        sys.stdout.flush()

    profile_sweep(args.model, batch_sizes=batch_sizes, cpu_threads=args.threads, providers=args.providers.split(","),
                  min_time_s=args.min_time, progress=emit, string_length=args.string_length)
    return 0


if __name__ == "__main__":
    sys.exit(main())
