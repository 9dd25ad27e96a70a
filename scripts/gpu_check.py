#!/usr/bin/env python3
"""First contact with a real GPU (issue 45): one command, at most about 8 minutes, that measures what Tessera
needs to know of a GPU host and writes it as a few CSV and JSON files.

    python3 scripts/gpu_check.py --out gpu-check           # on the GPU host, from a clone of this repository
    python3 scripts/gpu_check.py --out /tmp/rehearsal --cpu-rehearsal --model tab=tests-model.onnx:8
                                                           # the same steps on the CPU, labelled so (see below)

Nothing here changes a device setting: MIG mode is read, never set; the only process it starts on the GPU
besides its own measurements is an MPS control daemon with its own pipe and log folders, stopped at the end.

Steps, each reported as ok, skipped (with the reason) or failed (with the error) in summary.json and on the
console; a step that cannot run on this machine is skipped, never imitated:

1. probe (probe.json): driver and CUDA versions, every GPU's name, UUID, memory, PCI id and MIG mode, onnxruntime's
   version and execution providers, PyTorch's CUDA, whether the MPS control program is on the PATH; and the
   agent's `nvml` backend discovery: the very report an agent on this host sends (`Agent.actual_state`), with
   a telemetry sample.
2. models (models.csv, models/*.onnx): ONNX exports of torchvision architectures of the demo's families (random
   weights: latency does not depend on them; the accuracy recorded is the published top-1 of the reference
   weights, `GPULET_TOP1_ACCURACY` in engine/reference/profiles.py, from torchvision's documentation), plus any
   model given with --model.
3. profiles (profiles.csv): every model at batches 1-64 on the whole GPU, through Tessera's own profiler
   (workers/profiler.py: a fresh process pinned to the GPU, the CUDA provider required) where onnxruntime has the
   CUDA provider. Where it has not (onnxruntime's CPU build; onnxruntime-gpu could not travel), the
   architectures are measured through PyTorch on the same GPU with the same warm-up and timing rule, each row
   labelled `torch-cuda`, and summary.json says the ONNX CUDA path is unverified.
4. mps (mps_solo.csv, mps_corun.csv, mps_interference.csv): where the MPS control program is there and MIG is off,
   a daemon started through Tessera's `MpsControl` (the agent's own), each of up to four models alone on 3-4 SM
   percentages, then pairs on complementary partitions, both processes measuring over the same window. A co-run's
   factor is its latency over the same model's alone at the same batch and percentage; the interference model's
   forms (engine/sharing/interference.py) are validated on them by pair, as for the RTX 2080 Ti, where their
   features were measured (DRAM activity from NVML's GPM during each solo run; NVML reports no L2 utilisation,
   so the forms that need it are listed as not validated).
5. e2e (e2e.json, e2e_load.csv): the embedded control plane (SQLite, in-process tasks) in a folder of its own, the
   real agent (`nvml` backend, whole-GPU mode, no MIG change), a router, one model deployed with `tessera app
   deploy` (profiled by the agent on the GPU, planned, approved, rolled out) and --e2e-seconds of load at
   --e2e-rps against its SLO: served, p50, p99, violations, and the plan's prediction beside them. It needs the
   control plane's packages (Django and the rest) in this Python; where they are missing it is skipped and
   says which (carry them as wheels: docs/gpu-check.md).

--cpu-rehearsal runs steps 3-5 on the CPU instead (onnxruntime's CPU provider, the simulated backend for the
agent, a fake or absent MPS control program), every row labelled `rehearsal-cpu`: a check of the script and the
product's path before GPU time is spent, never a measurement of a GPU.

summary.json carries the provenance (UTC date, host, driver, command, git commit) and per step its status,
reason, seconds and files. Exit status: 0 when every step ran or was skipped for a stated reason, 1 when a step
failed, 2 with --require-gpu when no GPU answered.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

# torchvision constructor, ONNX input side, and the key of the published accuracy (GPULET_TOP1_ACCURACY) of the
# demo's families (engine/reference/profiles.py: the gpulets models).
ARCHITECTURES: dict[str, tuple[str, int, str]] = {
    "resnet50": ("resnet50", 224, "resnet50"),
    "resnet101": ("resnet101", 224, "resnet101"),
    "resnet152": ("resnet152", 224, "resnet152"),
    "vgg16": ("vgg16", 224, "vgg16"),
    "vgg19": ("vgg19", 224, "vgg19"),
    "densenet121": ("densenet121", 224, "densenet121"),
    "densenet169": ("densenet169", 224, "densenet169"),
    "densenet201": ("densenet201", 224, "densenet201"),
    "inception_v3": ("inception_v3", 299, "inception"),
    "mobilenet_v2": ("mobilenet_v2", 224, "mobilenet"),
}
DEFAULT_ARCHITECTURES = ("resnet50", "resnet101", "vgg16", "densenet121", "inception_v3", "mobilenet_v2")
ACCURACY_SOURCE = "published ImageNet top-1 of torchvision's reference weights (torchvision model documentation)"
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
MPS_PERCENTS = (25, 50, 75)
MPS_BATCHES = (1, 8)
MPS_MODELS = 4
MPS_PAIRS = 4
E2E_MODEL = "resnet50"

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
TORCH_CUDA, ORT_CUDA, REHEARSAL = "torch-cuda", "onnxruntime-cuda", "rehearsal-cpu"
# The PyTorch path on the CPU: --cpu-rehearsal --rehearse-torch checks it before GPU time is spent on it.
REHEARSAL_TORCH = "rehearsal-torch-cpu"
RUNTIMES = (ORT_CUDA, TORCH_CUDA, REHEARSAL, REHEARSAL_TORCH)
CUDA = "CUDAExecutionProvider"

PROFILE_FIELDS = ["model", "architecture", "runtime", "device", "gpu_uuid", "batch", "latency_p50_ms", "latency_p99_ms",
                  "throughput_rps", "iterations", "memory_mb", "memory_measure", "accuracy_top1", "providers"]
SOLO_FIELDS = ["model", "runtime", "percent", "batch", "latency_p50_ms", "latency_p99_ms", "iterations",
               "sm_active_pct", "dram_active_pct"]
CORUN_FIELDS = ["model", "batch", "percent", "corunner", "corunner_batch", "runtime", "latency_p50_ms", "latency_p99_ms",
                "iterations", "solo_p50_ms", "factor", "corunner_p50_ms", "corunner_factor"]


# ----------------------------------------------------------------------------------------------- records

@dataclass
class StepResult:
    """What a step did: `status` ok/skipped/failed, `reason` (why skipped, or the error), its files."""

    status: str
    reason: str = ""
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckModel:
    """A model the check measures: its ONNX file, the input it takes (one tensor, per query, without the batch
    axis), and where it comes from (`architecture`: torchvision's constructor, for the PyTorch path)."""

    name: str
    path: Path
    input_name: str
    input_shape: tuple[int, ...]
    architecture: str | None = None
    accuracy: float | None = None

    @property
    def input_size(self) -> int:
        return int(np.prod(self.input_shape))


@dataclass
class GpuFound:
    index: int
    uuid: str
    name: str
    memory_mb: float
    mig_enabled: bool


@dataclass
class Probe:
    """What the probe learnt that decides the other steps."""

    gpus: list[GpuFound]
    gpu_reason: str  # why there is no GPU ("" when there is one)
    ort_providers: list[str]
    torch_cuda: bool
    torch_reason: str
    mps_control: str | None
    device_type: str | None  # the first GPU's catalogue name (H200-141GB), as the control plane plans it

    @property
    def gpu(self) -> GpuFound | None:
        return self.gpus[0] if self.gpus else None


class StepSkipped(Exception):
    """A step cannot run on this machine, for the reason given."""


# ----------------------------------------------------------------------------------------------- helpers

def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,  # nosec B603 B607 - git, fixed arguments
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _csv_write(path: Path, rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return path.name


def _json_write(path: Path, doc: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return path.name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nvml_module(nvml: Any = None) -> Any:
    if nvml is not None:
        return nvml
    import pynvml

    return pynvml


# ----------------------------------------------------------------------------------------------- 1. probe

def probe_run(out: Path, *, nvml: Any = None, mps_control: str | None = None) -> tuple[StepResult, Probe]:
    """Read the machine (see the module docstring); write probe.json. `nvml`: the pynvml module (a fake in tests)."""
    doc: dict[str, Any] = {"date": _now(), "host": socket.gethostname(), "python": sys.version.split()[0]}
    gpus: list[GpuFound] = []
    gpu_reason = ""
    try:
        nv = _nvml_module(nvml)
    except ImportError as exc:
        nv, gpu_reason = None, f"nvidia-ml-py (pynvml) is not installed: {exc}"
    if nv is not None:
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound (no driver), DriverNotLoaded, NoPermission
            gpu_reason = f"no NVIDIA driver answers (NVML: {exc})"
        else:
            try:
                doc["driver_version"] = _text(_optional(lambda: nv.nvmlSystemGetDriverVersion()))
                cuda = _optional(lambda: nv.nvmlSystemGetCudaDriverVersion())
                doc["cuda_driver_version"] = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"
                doc["nvml_version"] = _text(_optional(lambda: nv.nvmlSystemGetNVMLVersion()))
                doc["gpus"] = []
                for index in range(nv.nvmlDeviceGetCount()):
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    record = _gpu_record(nv, handle, index)
                    doc["gpus"].append(record)
                    gpus.append(GpuFound(index, record["uuid"], record["name"], record["memory_mb"], bool(record["mig_current"])))
                if not gpus:
                    gpu_reason = "NVML answers but counts no GPU"
            finally:
                with contextlib.suppress(Exception):
                    nv.nvmlShutdown()
    doc["gpu_absent_reason"] = gpu_reason or None

    try:
        import onnxruntime as ort

        ort_providers = list(ort.get_available_providers())
        doc["onnxruntime"] = {"version": ort.__version__, "providers": ort_providers, "cuda_provider": CUDA in ort_providers}
    except ImportError as exc:
        ort_providers = []
        doc["onnxruntime"] = {"error": str(exc)}
    torch_cuda, torch_reason = False, ""
    try:
        import torch

        # Only asks the driver: no CUDA context in this process, which would sit on the GPU beside the MPS clients.
        torch_cuda = bool(torch.cuda.is_available())
        doc["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch_cuda}
        torch_reason = "" if torch_cuda else "PyTorch sees no CUDA device"
    except ImportError as exc:
        torch_reason = f"PyTorch is not installed: {exc}"
        doc["torch"] = {"error": str(exc)}
    try:
        import torchvision

        doc["torchvision"] = torchvision.__version__
    except ImportError:
        doc["torchvision"] = None
    from workers.agent.backends.mps import MPS_CONTROL

    control = shutil.which(mps_control or MPS_CONTROL)
    doc["mps_control"] = control
    doc["nvidia_smi"] = shutil.which("nvidia-smi")

    device_type = None
    if gpus:
        from engine.geometry.catalogue import mig_catalogue_load

        spec = mig_catalogue_load().gpu_model_find(gpus[0].name)
        device_type = spec.name if spec else gpus[0].name
        doc["agent_report"], doc["agent_telemetry"] = _agent_report(out, nvml=nvml)
    doc["device_type"] = device_type
    files = [_json_write(out / "probe.json", doc)]
    probe = Probe(gpus, gpu_reason, ort_providers, torch_cuda, torch_reason, control, device_type)
    summary = (f"{len(gpus)} GPU(s): {', '.join(g.name for g in gpus)}" if gpus else f"no GPU: {gpu_reason}")
    return StepResult(OK, summary, files, details={"driver": doc.get("driver_version"), "device_type": device_type}), probe


def _optional(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and functions an older pynvml lacks
        return None


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _gpu_record(nv: Any, handle: Any, index: int) -> dict[str, Any]:
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    mig = _optional(lambda: nv.nvmlDeviceGetMigMode(handle))
    pci = _optional(lambda: nv.nvmlDeviceGetPciInfo(handle))
    return {
        "index": index, "name": _text(nv.nvmlDeviceGetName(handle)), "uuid": _text(nv.nvmlDeviceGetUUID(handle)),
        "memory_mb": round(memory.total / (1 << 20)), "mig_current": None if mig is None else int(mig[0]),
        "mig_pending": None if mig is None else int(mig[1]),
        "pci_device_id": None if pci is None else f"0x{pci.pciDeviceId:08X}",
        "pci_bus_id": None if pci is None else _text(pci.busId),
        "compute_capability": _optional(lambda: ".".join(str(v) for v in nv.nvmlDeviceGetCudaComputeCapability(handle))),
    }


def _agent_report(out: Path, *, nvml: Any = None) -> tuple[dict, list[dict]]:
    """The report an agent on this host sends (docs/dataplane.md "Actual state"), from the nvml backend, and one
    telemetry sample. The agent is built as `tessera agent` builds it, and only asked to report: it reconciles
    nothing (no desired state), so no device is touched."""
    from workers.agent.agent import Agent
    from workers.agent.backends.nvml import NvmlBackend

    state = out / "agent-probe"
    options: dict[str, Any] = {"mps_dir": Path(tempfile.mkdtemp(prefix="tgc-mps-"))}
    if nvml is not None:
        options["nvml"] = nvml
    backend = NvmlBackend(**options)
    agent = Agent(backend=backend, state_dir=state, desired_file=state / "no-desired-state.json")
    report = agent.actual_state()
    telemetry = [asdict(t) for t in backend.telemetry()]
    return report, telemetry


# ----------------------------------------------------------------------------------------------- 2. models

def models_export(out: Path, architectures: Sequence[str]) -> tuple[StepResult, list[CheckModel]]:
    """ONNX exports of `architectures` (random weights, batch axis dynamic, opset 17), on the CPU."""
    try:
        import torch
        import torchvision
    except ImportError as exc:
        raise StepSkipped(f"PyTorch and torchvision are needed to export the architectures: {exc}") from None
    from engine.reference.profiles import GPULET_TOP1_ACCURACY

    folder = out / "models"
    folder.mkdir(parents=True, exist_ok=True)
    models, rows, errors = [], [], []
    for arch in architectures:
        constructor, side, accuracy_key = ARCHITECTURES[arch]
        path = folder / f"{arch}.onnx"
        started = time.monotonic()
        try:
            kwargs = {"weights": None}
            if arch == "inception_v3":
                kwargs["aux_logits"] = False  # the serving graph: no auxiliary classifier
                kwargs["init_weights"] = False  # random weights either way; skips scipy's slow truncated normal
            net = getattr(torchvision.models, constructor)(**kwargs).eval()
            example = torch.randn(1, 3, side, side)
            _onnx_export(torch, net, example, path)
        except Exception as exc:
            errors.append(f"{arch}: {type(exc).__name__}: {exc}")
            continue
        data = path.read_bytes()
        model = CheckModel(arch, path, "input", (3, side, side), arch, GPULET_TOP1_ACCURACY.get(accuracy_key))
        models.append(model)
        rows.append({"model": arch, "file": f"models/{path.name}", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                     "input": f"input[batch,3,{side},{side}] FP32", "accuracy_top1": model.accuracy, "accuracy_source": ACCURACY_SOURCE,
                     "export_s": round(time.monotonic() - started, 1), "torch": torch.__version__, "torchvision": torchvision.__version__})
    files = [_csv_write(out / "models.csv", rows, list(rows[0]) if rows else ["model"])]
    if errors and not models:
        return StepResult(FAILED, "; ".join(errors), files), models
    return StepResult(OK, f"{len(models)} exported" + (f"; failed: {'; '.join(errors)}" if errors else ""), files), models


def _onnx_export(torch: Any, net: Any, example: Any, path: Path) -> None:
    """torch.onnx.export with a dynamic batch axis: the TorchScript exporter where this PyTorch has it, else the
    dynamo one (PyTorch 2.9 made dynamo the default)."""
    common = {"input_names": ["input"], "output_names": ["logits"], "opset_version": 17}
    try:
        torch.onnx.export(net, (example,), str(path), dynamo=False, dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, **common)
    except TypeError:  # a PyTorch without the dynamo switch: the TorchScript exporter is its only one
        torch.onnx.export(net, (example,), str(path), dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, **common)
    except Exception:
        batch = torch.export.Dim("batch", min=1, max=1024)
        torch.onnx.export(net, (example,), str(path), dynamo=True, dynamic_shapes=({0: batch},), **common)


def model_from_option(text: str) -> CheckModel:
    """--model NAME=PATH[:D1xD2...]: an ONNX model of one input; the shape (per query, no batch axis) defaults
    to what the model declares."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"--model wants NAME=PATH[:SHAPE], got {text!r}")
    path_text, _, shape_text = rest.partition(":")
    path = Path(path_text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"--model {name}: no file {path}")
    import onnxruntime as ort

    try:
        inputs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()
    except Exception as exc:
        raise argparse.ArgumentTypeError(f"--model {name}: onnxruntime cannot load {path}: {exc}") from None
    if len(inputs) != 1 or inputs[0].type != "tensor(float)":
        raise argparse.ArgumentTypeError(f"--model {name}: the check feeds one FP32 input; {path} has "
                                         + ", ".join(f"{i.name} {i.type}" for i in inputs))
    if shape_text:
        try:
            shape = tuple(int(d) for d in shape_text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--model {name}: shape {shape_text!r} is not like 3x224x224") from None
    else:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in inputs[0].shape[1:])
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"--model {name}: shape {shape} has no positive dimensions")
    return CheckModel(name, path.resolve(), inputs[0].name, shape)


# ----------------------------------------------------------------------------------------------- measuring

def measure_loop(run: Callable[[int], None], *, batches: Sequence[int], warmup: int = 3, min_iterations: int = 20,
                 min_time_s: float = 0.5, max_iterations: int = 2000, schedule: tuple[float, float, float] | None = None,
                 sync: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Time `run(batch)` by the profiler's rule (`workers.profiler.timed_runs`: warm-up runs, then timed runs
    until both `min_iterations` and `min_time_s`, at most `max_iterations`); or, with `schedule` = (start_at,
    window_s, gap_s), the co-run rule: batch k runs back to back over the wall-clock window that starts at
    start_at + k * (window_s + gap_s) and lasts window_s, its warm-up in the gap before it, so that processes
    measuring together, and the parent reading the GPU's activity, share each window. `sync` waits for the
    device (CUDA is asynchronous)."""
    from workers.profiler import timed_runs

    points = []
    for k, batch in enumerate(batches):
        if schedule is None:
            samples = timed_runs(lambda batch=batch: run(batch), warmup=warmup, min_iterations=min_iterations, min_time_s=min_time_s,
                                 max_iterations=max_iterations, sync=sync)
        else:
            for _ in range(warmup):
                run(batch)
            sync()
            start_at, window_s, gap_s = schedule
            time.sleep(max(0.0, start_at + k * (window_s + gap_s) - time.time()))
            samples = []
            started = time.perf_counter()
            while not samples or time.perf_counter() - started < window_s:
                t0 = time.perf_counter()
                run(batch)
                sync()
                samples.append((time.perf_counter() - t0) * 1000.0)
        total = sum(samples) / 1000.0
        points.append({"batch": batch, "latency_p50_ms": float(np.percentile(samples, 50)), "latency_p99_ms": float(np.percentile(samples, 99)),
                       "throughput_rps": batch * len(samples) / total if total > 0 else None, "iterations": len(samples)})
    return points


def _child_runner(runtime: str, model: Path, architecture: str | None, shape: tuple[int, ...]) -> tuple[Callable[[int], None], Callable[[], None], list[str]]:
    """`run(batch)`, `sync()` and the providers of one model in this (child) process."""
    if runtime in (TORCH_CUDA, REHEARSAL_TORCH):
        import torch
        import torchvision

        if architecture is None:
            raise SystemExit("the PyTorch path needs a torchvision architecture")
        device = "cuda" if runtime == TORCH_CUDA else "cpu"
        constructor = ARCHITECTURES[architecture][0]
        kwargs: dict[str, Any] = {"weights": None}
        if architecture == "inception_v3":
            kwargs.update(aux_logits=False, init_weights=False)
        net = getattr(torchvision.models, constructor)(**kwargs).eval().to(device)
        inputs: dict[int, Any] = {}

        def run_torch(batch: int) -> None:
            if batch not in inputs:
                inputs[batch] = torch.randn((batch, *shape), device=device)
            with torch.inference_mode():
                net(inputs[batch])

        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        return run_torch, sync, [f"torch {torch.__version__} {device}" + (f" cuda {torch.version.cuda}" if device == "cuda" else "")]
    from workers.runtime.session import OnnxSession

    device = os.environ.get("CUDA_VISIBLE_DEVICES") if runtime == ORT_CUDA else None
    session = OnnxSession(model, device_uuid=(device or "0") if runtime == ORT_CUDA else None)
    rng = np.random.default_rng(0)
    feeds: dict[int, dict[str, np.ndarray]] = {}
    name = session.input_names[0]

    def run_ort(batch: int) -> None:
        if batch not in feeds:
            feeds[batch] = {name: rng.standard_normal((batch, *shape)).astype(np.float32)}
        session.run(feeds[batch])

    return run_ort, lambda: None, list(session.providers)


def _torch_memory_reader() -> Callable[[], int]:
    """The GPU memory PyTorch's allocator has held at most so far, in MiB (weights, activations, workspace):
    what a model at the batch sizes measured up to now needs on the device."""
    import torch

    return lambda: round(torch.cuda.max_memory_allocated() / (1 << 20))


def child_measure(argv: Sequence[str]) -> int:
    """`gpu_check.py child-measure ...`: measure one model in this process, one JSON line per batch size."""
    parser = argparse.ArgumentParser(prog="gpu_check.py child-measure")
    parser.add_argument("--runtime", required=True, choices=RUNTIMES)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--architecture")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--window", type=float, help="with --ready-file: seconds each batch size is timed")
    parser.add_argument("--gap", type=float, default=0.5, help="with --ready-file: seconds between windows, for the warm-up")
    parser.add_argument("--ready-file", type=Path, help="touched once the model is loaded; the start time is then read from "
                                                        "the file of the same name ending .go")
    args = parser.parse_args(argv)
    shape = tuple(int(d) for d in args.shape.split("x"))
    batches = [int(b) for b in args.batches.split(",")]
    run, sync, providers = _child_runner(args.runtime, args.model, args.architecture, shape)
    for batch in batches:  # load and warm every batch size before the window
        run(batch)
    sync()
    schedule = None
    if args.ready_file is not None:
        args.ready_file.touch()
        go = args.ready_file.with_suffix(".go")  # the parent writes the first window's start time there
        while not go.exists() or not go.read_text().strip():
            time.sleep(0.005)
        schedule = (float(go.read_text().strip()), float(args.window or 1.0), float(args.gap))
    memory = _torch_memory_reader() if args.runtime == TORCH_CUDA else None
    for point in measure_loop(run, batches=batches, min_time_s=args.min_time, schedule=schedule, sync=sync):
        point["providers"] = providers
        if memory is not None:
            point["memory_mb"] = memory()
        sys.stdout.write(json.dumps(point) + "\n")
        sys.stdout.flush()
    return 0


def _child_command(model: CheckModel, runtime: str, batches: Sequence[int], *, min_time_s: float = 0.5,
                   window_s: float | None = None, gap_s: float = 0.5, ready_file: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "child-measure", "--runtime", runtime, "--model", str(model.path),
           "--shape", "x".join(str(d) for d in model.input_shape), "--batches", ",".join(str(b) for b in batches),
           "--min-time", str(min_time_s)]
    if model.architecture:
        cmd += ["--architecture", model.architecture]
    if window_s is not None:
        cmd += ["--window", str(window_s), "--gap", str(gap_s)]
    if ready_file is not None:
        cmd += ["--ready-file", str(ready_file)]
    return cmd


def _child_env(base: dict[str, str] | None, runtime: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(base or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if runtime in (REHEARSAL, REHEARSAL_TORCH):
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _child_output(process: subprocess.Popen, what: str, timeout_s: float) -> list[dict[str, Any]]:
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError(f"{what}: no answer within {timeout_s:.0f} s") from None
    if process.returncode != 0:
        last = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
        raise RuntimeError(f"{what}: exited with {process.returncode}: {' | '.join(last) or 'no output'}")
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,  # nosec B603 - this Python, this script
                            stdin=subprocess.DEVNULL)


# ----------------------------------------------------------------------------------------------- 3. profiles

def profile_runtime(probe: Probe, *, rehearsal: bool | str) -> tuple[str, str]:
    """Which runtime measures on this machine, and what summary.json says of the ONNX CUDA path. `rehearsal`:
    False, or the rehearsal runtime (REHEARSAL, REHEARSAL_TORCH)."""
    if rehearsal:
        return (rehearsal if isinstance(rehearsal, str) else REHEARSAL), "rehearsal on the CPU: no GPU path was exercised"
    if probe.gpu is None:
        raise StepSkipped(f"no GPU: {probe.gpu_reason}")
    if CUDA in probe.ort_providers:
        return ORT_CUDA, "verified: profiled through onnxruntime's CUDA execution provider"
    if probe.torch_cuda:
        return TORCH_CUDA, (f"unverified: this onnxruntime has no CUDA provider ({', '.join(probe.ort_providers)}); "
                            "the architectures were measured through PyTorch on the same GPU instead")
    raise StepSkipped(f"neither onnxruntime's CUDA provider ({', '.join(probe.ort_providers) or 'no onnxruntime'}) nor "
                      f"PyTorch with CUDA ({probe.torch_reason}) is here")


def profiles_run(out: Path, models: Sequence[CheckModel], probe: Probe, *, batches: Sequence[int] = DEFAULT_BATCHES,
                 min_time_s: float = 0.5, rehearsal: bool = False, deadline: float | None = None) -> StepResult:
    """Every model at every batch size on the whole GPU (see the module docstring); writes profiles.csv."""
    from workers.profiler import ProfilingError, profile_sweep_subprocess

    runtime, onnx_cuda = profile_runtime(probe, rehearsal=rehearsal)
    gpu = probe.gpu
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for model in models:
        if deadline is not None and time.monotonic() > deadline:
            errors.append(f"{model.name}: not measured, the time budget ran out")
            continue
        try:
            if runtime in (TORCH_CUDA, REHEARSAL_TORCH):
                if model.architecture is None:
                    errors.append(f"{model.name}: no torchvision architecture, so no PyTorch path")
                    continue
                env = _child_env({"CUDA_VISIBLE_DEVICES": gpu.uuid} if gpu is not None and not rehearsal else None, runtime)
                points = _child_output(_popen(_child_command(model, runtime, batches, min_time_s=min_time_s), env), model.name, 600)
            else:
                raw = profile_sweep_subprocess(model.path, batch_sizes=batches, device_uuid=None if rehearsal else gpu.uuid,
                                               min_time_s=min_time_s, timeout_s=600)
                points = [{"batch": p["batch_size"], "latency_p50_ms": p["latency_p50_ms"], "latency_p99_ms": p["latency_p99_ms"],
                           "throughput_rps": p["throughput_rps"], "iterations": p["iterations"], "memory_mb": p["memory_mb"],
                           "providers": p["providers"]} for p in raw]
        except (ProfilingError, RuntimeError) as exc:
            errors.append(f"{model.name}: {exc}")
            continue
        for p in points:
            memory_measure = ("GPU: PyTorch allocator peak" if runtime == TORCH_CUDA else "none" if runtime == REHEARSAL_TORCH
                              else "host RSS the session added (workers/profiler.py)")
            rows.append({"model": model.name, "architecture": model.architecture or "", "runtime": runtime, "memory_measure": memory_measure,
                         "device": "cpu" if rehearsal else probe.device_type, "gpu_uuid": "" if rehearsal else gpu.uuid,
                         "accuracy_top1": model.accuracy, **p, "providers": " ".join(p.get("providers") or [])})
    files = [_csv_write(out / "profiles.csv", rows, PROFILE_FIELDS)]
    details = {"runtime": runtime, "onnx_cuda_path": onnx_cuda, "rows": len(rows)}
    if not rows:
        return StepResult(FAILED, "; ".join(errors) or "no model to profile", files, details=details)
    reason = f"{len({r['model'] for r in rows})} models x {len(batches)} batch sizes through {runtime}"
    return StepResult(OK, reason + (f"; {'; '.join(errors)}" if errors else ""), files, details=details)


# ----------------------------------------------------------------------------------------------- 4. MPS

def mps_pairs(models: Sequence[CheckModel], count: int) -> list[tuple[CheckModel, CheckModel]]:
    """Up to `count` unordered pairs, light with heavy first (they differ most in what they use), then the rest,
    a model with itself last."""
    pairs = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]]
    pairs.sort(key=lambda p: abs(models.index(p[0]) - models.index(p[1])), reverse=True)
    pairs += [(m, m) for m in models]
    return pairs[:count]


def mps_run(out: Path, models: Sequence[CheckModel], probe: Probe, *, percents: Sequence[int] = MPS_PERCENTS,
            batches: Sequence[int] = MPS_BATCHES, pair_count: int = MPS_PAIRS, window_s: float = 1.0,
            rehearsal: bool = False, control: str | None = None, nvml: Any = None, state_dir: Path | None = None,
            deadline: float | None = None) -> StepResult:
    """Models alone on MPS partitions, then pairs co-running on complementary ones (module docstring)."""
    from workers.agent.backends.mps import MpsControl

    if not rehearsal and probe.gpu is not None and probe.gpu.mig_enabled:
        raise StepSkipped("MIG is enabled on the GPU, and MPS runs only where it is off (the check never changes the MIG mode)")
    runtime, _ = profile_runtime(probe, rehearsal=rehearsal)
    executable = control or probe.mps_control
    if executable is None:
        raise StepSkipped("the MPS control program (nvidia-cuda-mps-control) is not on the PATH")
    if runtime in (TORCH_CUDA, REHEARSAL_TORCH):
        models = [m for m in models if m.architecture]
    models = list(models)[:MPS_MODELS]
    if not models:
        raise StepSkipped("no model to run under MPS")
    uuid = "GPU-rehearsal" if rehearsal else probe.gpu.uuid
    # Short: the pipe folder holds UNIX sockets, whose paths are limited to about 100 bytes.
    root = Path(tempfile.mkdtemp(prefix="tgc-mps-", dir=state_dir))
    mps = MpsControl(root, executable, timeout_s=20.0)
    telemetry = _gpm_reader(nvml) if not rehearsal else None
    solo: dict[tuple[str, int, int], dict[str, Any]] = {}
    solo_rows: list[dict[str, Any]] = []
    corun_rows: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        mps.start(0, uuid)
        for model in models:
            for percent in percents:
                if deadline is not None and time.monotonic() > deadline:
                    errors.append("solo runs cut short: the time budget ran out")
                    break
                env = _child_env(mps.client_environment(0, percent, uuid), runtime)
                try:
                    points, activity = _measured_together([(model, batches, env)], runtime, window_s, telemetry)
                except RuntimeError as exc:
                    errors.append(f"{model.name} alone on {percent} %: {exc}")
                    continue
                for k, p in enumerate(points[0]):
                    row = {"model": model.name, "runtime": runtime, "percent": percent, **p, **(activity[k] if activity else {})}
                    solo[(model.name, p["batch"], percent)] = row
                    solo_rows.append(row)
        splits = [p for p in percents if p < 100 and 100 - p in percents]
        for a, b in mps_pairs(models, pair_count):
            for percent in splits:
                if deadline is not None and time.monotonic() > deadline:
                    errors.append("co-runs cut short: the time budget ran out")
                    break
                env_a = _child_env(mps.client_environment(0, percent, uuid), runtime)
                env_b = _child_env(mps.client_environment(0, 100 - percent, uuid), runtime)
                try:
                    (pa, pb), _ = _measured_together([(a, batches, env_a), (b, batches, env_b)], runtime, window_s, None)
                except RuntimeError as exc:
                    errors.append(f"{a.name}+{b.name} on {percent}/{100 - percent} %: {exc}")
                    continue
                for qa, qb in zip(pa, pb):
                    batch = qa["batch"]
                    sa, sb = solo.get((a.name, batch, percent)), solo.get((b.name, batch, 100 - percent))
                    corun_rows.append({
                        "model": a.name, "batch": batch, "percent": percent, "corunner": b.name, "corunner_batch": qb["batch"],
                        "runtime": runtime, "latency_p50_ms": qa["latency_p50_ms"], "latency_p99_ms": qa["latency_p99_ms"],
                        "iterations": qa["iterations"], "solo_p50_ms": sa and sa["latency_p50_ms"],
                        "factor": sa and qa["latency_p50_ms"] / sa["latency_p50_ms"], "corunner_p50_ms": qb["latency_p50_ms"],
                        "corunner_factor": sb and qb["latency_p50_ms"] / sb["latency_p50_ms"],
                    })
    finally:
        stop_error = ""
        try:
            mps.stop(0)
        except Exception as exc:  # reported, and the step fails: a daemon left running is not "ok"
            stop_error = f"the MPS daemon did not stop: {exc}"
        shutil.rmtree(root, ignore_errors=True)
    files = [_csv_write(out / "mps_solo.csv", solo_rows, SOLO_FIELDS), _csv_write(out / "mps_corun.csv", corun_rows, CORUN_FIELDS)]
    validation = interference_validate(solo_rows, corun_rows)
    files.append(_csv_write(out / "mps_interference.csv", validation, ["form", "status", "n", "p50", "p90", "p95", "max", "note"]))
    details = {"runtime": runtime, "solo_rows": len(solo_rows), "corun_rows": len(corun_rows), "daemon_stopped": not stop_error}
    if stop_error or not corun_rows:
        return StepResult(FAILED, "; ".join([stop_error] + errors if stop_error else errors) or "no co-run was measured", files, details=details)
    reason = f"{len(solo_rows)} solo points, {len(corun_rows)} co-runs through {runtime}; the daemon stopped"
    return StepResult(OK, reason + (f"; {'; '.join(errors)}" if errors else ""), files, details=details)


def _gpm_reader(nvml: Any = None) -> Callable[[], dict[str, float | None]] | None:
    """A function giving the whole GPU's SM and DRAM activity since its previous call (NVML's GPM, through the
    agent's own backend), or None where NVML cannot be read."""
    try:
        from workers.agent.backends.nvml import NvmlBackend

        backend = NvmlBackend(**({"nvml": nvml} if nvml is not None else {}), mps_dir=Path(tempfile.mkdtemp(prefix="tgc-gpm-")))
        backend.telemetry()
    except Exception:
        return None

    def read() -> dict[str, float | None]:
        sample = backend.telemetry()[0]
        return {"sm_active_pct": sample.sm_active_pct, "dram_active_pct": sample.dram_active_pct}

    return read


def _measured_together(runs: Sequence[tuple[CheckModel, Sequence[int], dict[str, str]]], runtime: str, window_s: float,
                       telemetry: Callable[[], dict[str, float | None]] | None, gap_s: float = 0.5
                       ) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Start one child per run (every run the same number of batch sizes), wait until each has loaded its model,
    then let them measure over the same windows (`measure_loop`'s schedule); where `telemetry` reads the GPU,
    its activity over each window. Each child's points, and the activity per window."""
    folder = Path(tempfile.mkdtemp(prefix="tgc-run-"))
    processes = []
    windows = max(len(batches) for _, batches, _ in runs)
    try:
        for n, (model, batches, env) in enumerate(runs):
            ready = folder / f"{n}.ready"
            cmd = _child_command(model, runtime, batches, window_s=window_s, gap_s=gap_s, ready_file=ready)
            processes.append((model, ready, _popen(cmd, env)))
        deadline = time.monotonic() + 300
        while not all(r.exists() for _, r, _ in processes):
            for model, _, process in processes:
                if process.poll() is not None:
                    _child_output(process, model.name, 5)  # raises with its error
                    raise RuntimeError(f"{model.name}: the measuring process ended before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError("the measuring processes did not get ready within 300 s")
            time.sleep(0.01)
        start_at = time.time() + gap_s
        for _, ready, _ in processes:  # written whole, then renamed: a child never reads half a number
            ready.with_suffix(".tmp").write_text(f"{start_at!r}\n")
            ready.with_suffix(".tmp").rename(ready.with_suffix(".go"))
        activity: list[dict[str, Any]] = []
        if telemetry is not None:
            for k in range(windows):
                begin = start_at + k * (window_s + gap_s)
                time.sleep(max(0.0, begin - time.time()))
                telemetry()  # GPM's baseline at the window's start
                time.sleep(max(0.0, begin + window_s - time.time()))
                activity.append(telemetry())
        span = windows * (window_s + gap_s)
        points = [_child_output(process, model.name, span + 120) for model, _, process in processes]
        return points, activity
    finally:
        for _, _, process in processes:
            if process.poll() is None:
                process.kill()
        shutil.rmtree(folder, ignore_errors=True)


def interference_validate(solo_rows: Sequence[dict[str, Any]], corun_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each interference form (engine/sharing/interference.py) validated on the co-runs by pair, where every
    feature it uses was measured; one row per form, with why where it was not validated."""
    import math

    from engine.sharing.interference import INTERFERENCE_FORMS, CorunFeatures, CorunSample, interference_validate_by_pair

    solo = {(r["model"], r["batch"], r["percent"]): r for r in solo_rows}
    samples = []
    for row in corun_rows:
        a, b = solo.get((row["model"], row["batch"], row["percent"])), solo.get((row["corunner"], row["corunner_batch"], 100 - row["percent"]))
        if a is None or b is None or not row.get("factor"):
            continue

        def util(r: dict[str, Any], key: str) -> float:
            return float(r[key]) if r.get(key) is not None else math.nan

        features = CorunFeatures(math.nan, math.nan, util(a, "dram_active_pct"), util(b, "dram_active_pct"), row["percent"], row["batch"],
                                 row["corunner_batch"], a["latency_p50_ms"])
        samples.append(CorunSample(row["model"], row["corunner"], features, max(float(row["factor"]), 1e-9)))
    pairs = {s.pair for s in samples}
    out = []
    dram_missing = any(math.isnan(s.features.mem_a) or math.isnan(s.features.mem_b) for s in samples)
    for name, form in INTERFERENCE_FORMS.items():
        if any("l2" in r for r in form.regressors):
            out.append({"form": name, "status": "not validated", "n": len(samples),
                        "note": "needs L2 utilisation, which NVML does not report (Nsight Compute could measure it)"})
            continue
        if dram_missing and any("mem" in r for r in form.regressors):
            out.append({"form": name, "status": "not validated", "n": len(samples), "note": "needs DRAM activity, not read on this machine"})
            continue
        if len(pairs) < 2:
            out.append({"form": name, "status": "not validated", "n": len(samples), "note": f"{len(pairs)} model pair(s): by-pair validation needs 2"})
            continue
        v = interference_validate_by_pair(samples, form=name).validation
        out.append({"form": name, "status": "validated by pair", "n": v.n, "p50": round(v.p50, 4), "p90": round(v.p90, 4),
                    "p95": round(v.p95, 4), "max": round(v.max, 4), "note": f"{len(pairs)} pairs, leave one pair out"})
    return out


# ----------------------------------------------------------------------------------------------- 5. end to end

E2E_PACKAGES = ("django", "rest_framework", "drf_spectacular", "django_filters", "celery", "django_celery_beat", "channels",
                "pulp", "highspy", "scipy", "typer", "httpx", "uvicorn", "environ")


def e2e_run(out: Path, model: CheckModel, probe: Probe, *, seconds: float = 60.0, rps: float = 20.0, slo_ms: float | None = None,
            rehearsal: bool = False, batches: Sequence[int] = (1, 2, 4, 8, 16, 32), timeout_s: float = 300.0) -> StepResult:
    """The product end to end on this host (module docstring); writes e2e.json and e2e_load.csv."""
    import importlib.util

    missing = [name for name in E2E_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise StepSkipped(f"the control plane's packages are not in this Python ({', '.join(missing)} missing): carry them as "
                          "wheels (docs/gpu-check.md)")
    if not rehearsal:
        if probe.gpu is None:
            raise StepSkipped(f"no GPU: {probe.gpu_reason}")
        if CUDA not in probe.ort_providers:
            raise StepSkipped("onnxruntime here has no CUDA provider, so Tessera's runtime cannot serve on the GPU "
                              f"({', '.join(probe.ort_providers)}); install onnxruntime-gpu (the gpu extra)")
        if probe.gpu.mig_enabled:
            raise StepSkipped("MIG is enabled: the end-to-end step uses the whole GPU and never changes the MIG mode")
    device_type = "cpu" if rehearsal else probe.device_type
    folder = out / "e2e"
    if folder.exists():  # a fresh control plane each run: the database and the agent's state start empty
        shutil.rmtree(folder)
    (out / "e2e_load.csv").unlink(missing_ok=True)
    folder.mkdir(parents=True)
    logs = folder / "logs"
    logs.mkdir()
    env = dict(os.environ)
    for name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    env.update({"TESSERA_VAR_DIR": str(folder / "var"), "DJANGO_SETTINGS_MODULE": "controlplane.settings.local", "DJANGO_DEBUG": "false",
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(32), "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if rehearsal:
        env["CUDA_VISIBLE_DEVICES"] = ""
    python = sys.executable
    started: list[subprocess.Popen] = []
    doc: dict[str, Any] = {"model": model.name, "device_type": device_type, "rps": rps, "seconds": seconds,
                           "runtime": REHEARSAL if rehearsal else ORT_CUDA}

    def spawn(name: str, cmd: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
        with open(logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(cmd, env={**env, **(extra or {})}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,  # nosec B603 - our own commands
                                       stdin=subprocess.DEVNULL)
        started.append(process)
        return process

    def call(what: str, cmd: list[str], limit: float = timeout_s) -> str:
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=limit)  # nosec B603 - our own commands
        (logs / f"{what}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"{what} exited with {done.returncode}: {' | '.join((done.stdout + done.stderr).strip().splitlines()[-4:])}")
        return done.stdout

    try:
        call("migrate", [python, "manage.py", "migrate", "--noinput", "-v", "0"])
        host = "gpu-check-host"
        setup = json.loads(call("setup", [python, str(Path(__file__).resolve()), "child-e2e-setup", "--host", host]).strip().splitlines()[-1])
        port, router_port = _free_port(), _free_port()
        url = f"http://127.0.0.1:{port}"
        spawn("server", [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"])
        _http_wait(f"{url}/api/v1/", 60, "the control plane")
        # --keep-mig-modes: whatever the plan says, the agent never switches the GPU's MIG mode.
        agent = [python, "-m", "controlplane.cli", "agent", "--state-dir", str(folder / "agent"), "--stop-runtimes-on-exit",
                 "--keep-mig-modes"]
        agent += ["--backend", "simulated", "--simulate", ""] if rehearsal else ["--backend", "nvml"]
        spawn("agent", agent, {"TESSERA_AGENT_TOKEN": setup["agent_token"], "TESSERA_CONTROL_PLANE": url})
        spawn("router", [python, "-m", "controlplane.cli", "router", "--listen", f"127.0.0.1:{router_port}", "--grpc-listen", "off",
                         "--name", host], {"TESSERA_ROUTER_TOKEN": setup["router_token"], "TESSERA_CONTROL_PLANE": url})
        api = _Api(url, setup["api_token"])
        api.host_online_wait(host, 90)
        profile_rows = _profile_rows_for(out, model.name)
        slo = slo_ms or _slo_from_profile(profile_rows)
        doc["slo_ms"] = slo
        deploy = [python, "-m", "controlplane.cli", "app", "deploy", model.name, "--model", str(model.path), "--slo-ms", f"{slo:g}",
                  "--expected-rps", f"{rps:g}", "--device-types", device_type, "--batch-sizes", ",".join(str(b) for b in batches),
                  "--apply", "--timeout", f"{timeout_s:g}", "--url", url, "--token", setup["api_token"]]
        if model.accuracy is not None:
            deploy += ["--accuracy", f"{model.accuracy}", "--accuracy-metric", "ImageNet top-1 (published, torchvision)"]
        if rehearsal:
            deploy += ["--cpu-threads", "1"]
        doc["deploy_output"] = call("deploy", deploy, limit=4 * timeout_s).strip().splitlines()
        router = f"http://127.0.0.1:{router_port}"
        _router_ready_wait(router, model, 120)
        doc["load"] = _load(out, router, model, seconds=seconds, rps=rps, slo_ms=slo)
        doc["prediction"] = api.prediction(model.name)
    except StepSkipped:
        raise
    except Exception as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for process in reversed(started):  # router, agent (drains and stops its runtimes), server
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(started):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    files = [_json_write(out / "e2e.json", doc)]
    if (out / "e2e_load.csv").exists():
        files.append("e2e_load.csv")
    if "error" in doc:
        return StepResult(FAILED, doc["error"] + f" (logs in {logs})", files)
    load = doc["load"]
    reason = (f"{model.name} on {device_type}: {load['in_time']} of {load['sent']} in time within {doc['slo_ms']:g} ms, p50 {load['p50_ms']} ms, "
              f"p99 {load['p99_ms']} ms, violations {load['violation_ratio']:.4f}; predicted p99 {doc['prediction'].get('latency_p99_ms')} ms, "
              f"violations {doc['prediction'].get('slo_violation_ratio')}")
    return StepResult(OK, reason, files, details={"load": load, "prediction": doc["prediction"], "slo_ms": doc["slo_ms"]})


def _http_wait(url: str, timeout_s: float, what: str) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


class _Api:
    """The control plane's REST API, as the e2e step reads it (an operator's token)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.headers = url.rstrip("/") + "/api/v1", {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **params: Any) -> Any:
        import httpx

        response = httpx.get(f"{self.url}{path}", params=params, headers=self.headers, timeout=10.0)
        response.raise_for_status()
        return response.json()

    def host_online_wait(self, host: str, timeout_s: float) -> None:
        """Until the agent has registered the host (its first report marks it online)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                found = self.get("/hosts/", name=host)
                rows = found.get("results", found) if isinstance(found, dict) else found
                if rows and rows[0].get("status") == "online":
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the agent did not report host {host} online within {timeout_s:.0f} s")

    def prediction(self, application: str) -> dict[str, Any]:
        """The active plan's prediction for `application` (the simulator's replay of the plan, made at plan time)."""
        found = self.get("/plans/", status="active")
        rows = found.get("results", found) if isinstance(found, dict) else found
        if not rows:
            return {"plan": None}
        plan = self.get(f"/plans/{rows[0]['id']}/")
        app = ((plan.get("prediction") or {}).get("applications") or {}).get(application) or {}
        return {"plan": plan["id"], "latency_p99_ms": app.get("latency_p99_ms"), "latency_p50_ms": app.get("latency_p50_ms"),
                "slo_violation_ratio": app.get("slo_violation_ratio"),
                "served_rps": ((plan.get("result") or {}).get("served_rps") or {}).get(application)}


def _profile_rows_for(out: Path, name: str) -> list[dict[str, str]]:
    path = out / "profiles.csv"
    if not path.exists():
        return []
    with path.open() as fh:
        return [r for r in csv.DictReader(fh) if r["model"] == name]


def _slo_from_profile(rows: Sequence[dict[str, str]]) -> float:
    """An SLO a batching server can meet with room: 4x the batch-8 p99 the profile step measured (or 4x the
    largest measured below it), at least 25 ms (the router, the runtime and the client's own share); 100 ms
    where nothing was measured."""
    points = sorted((int(r["batch"]), float(r["latency_p99_ms"])) for r in rows if r.get("latency_p99_ms"))
    under = [p for b, p in points if b <= 8]
    return max(25.0, round(4 * under[-1], 1)) if under else 100.0


def _binary_body(model: CheckModel, seed: int = 0) -> tuple[bytes, dict[str, str]]:
    """One query in the Open Inference Protocol's binary tensor extension (raw FP32 after a JSON header), and its
    headers: a 224x224 image as JSON numbers would cost the router and runtime more than the model."""
    data = np.random.default_rng(seed).standard_normal(model.input_size).astype("<f4").tobytes()
    header = json.dumps({"inputs": [{"name": model.input_name, "shape": [1, *model.input_shape], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return header + data, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


def _router_ready_wait(router: str, model: CheckModel, timeout_s: float) -> None:
    import httpx

    body, headers = _binary_body(model)
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.post(f"{router}/v2/models/{model.name}/infer", content=body, headers=headers, timeout=10.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"the router did not answer for {model.name} within {timeout_s:.0f} s (last: {last})")


def _load(out: Path, router: str, model: CheckModel, *, seconds: float, rps: float, slo_ms: float) -> dict[str, Any]:
    """`tessera load`'s traffic (workers.loadgen: Poisson arrivals, every request with the SLO as its budget, on
    loopback so no network share is taken), sent in the binary tensor extension; each request kept."""
    from workers.loadgen import LoadTarget, load_run_targets, load_schedule

    arrivals = load_schedule(rate_rps=rps, duration_s=seconds, seed=0)
    budgets = np.full(len(arrivals), float(slo_ms))
    body, headers = _binary_body(model)
    result = load_run_targets([LoadTarget(model.name, f"{router}/v2/models/{model.name}/infer", body, arrivals, budgets, headers)],
                              record=True)[model.name]
    queries = result.queries
    answered = [q for q in queries if q.status == 200]
    latencies = np.array([q.latency_ms for q in answered], dtype=float)
    in_time = sum(1 for q in answered if q.in_time)
    not_sent = sum(1 for q in queries if q.status == -1)  # no budget left when it was due
    sent = len(arrivals)
    _csv_write(out / "e2e_load.csv", [s.row() for s in result.seconds], ["second", "sent", "ok", "late", "errors", "p50_ms", "p99_ms"])
    return {"sent": sent, "answered": len(answered), "not_sent": not_sent, "in_time": in_time, "late": len(answered) - in_time + not_sent,
            "errors": sum(1 for q in queries if q.status not in (200, -1)), "served_rps": round(in_time / seconds, 2),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies.size else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies.size else None,
            "violation_ratio": round(1.0 - in_time / sent, 4) if sent else None, "wall_s": round(result.wall_s, 1)}


def child_e2e(command: str, argv: Sequence[str]) -> int:
    """The e2e step's set-up, in the control plane's database (Django set up in this child process only, so the
    steps before it need no Django): an operator and an API token, the host with its agent token, and the
    router's credential; the rest goes through the REST API."""
    parser = argparse.ArgumentParser(prog=f"gpu_check.py {command}")
    parser.add_argument("--host", required=True)
    args = parser.parse_args(argv)
    import django

    django.setup()
    from apps.core.context import change_context
    from apps.inventory.models import Host
    from apps.inventory.services import host_agent_token_rotate, router_credential_issue
    from apps.users.choices import RoleChoices
    from apps.users.services import token_create, user_create

    with change_context(source="command"):
        user = user_create(username="gpu-check", password=None, role=RoleChoices.OPERATOR)
        _, api_token = token_create(user=user, description="scripts/gpu_check.py")
        host = Host.objects.create(name=args.host, description="scripts/gpu_check.py: the GPU host under test")
        agent_token = host_agent_token_rotate(host=host)
        _, router_token = router_credential_issue(name=args.host, description="scripts/gpu_check.py")
    print(json.dumps({"api_token": api_token, "agent_token": agent_token, "router_token": router_token}))
    return 0


# ----------------------------------------------------------------------------------------------- main

STEPS = ("probe", "models", "profiles", "mps", "e2e")


def check_run(args: argparse.Namespace, *, nvml: Any = None) -> tuple[int, dict[str, Any]]:
    """Every step asked for, in order, within the time budget; summary.json. Returns (exit status, summary)."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget_s
    summary: dict[str, Any] = {"provenance": {"date": _now(), "host": socket.gethostname(), "command": " ".join(sys.argv),
                                              "git_commit": _git_commit(), "python": sys.version.split()[0],
                                              "rehearsal": bool(args.cpu_rehearsal)}, "steps": {}}
    steps = [s for s in STEPS if s in args.steps]
    models: list[CheckModel] = list(args.model or [])
    probe: Probe | None = None

    def record(name: str, fn: Callable[[], StepResult]) -> StepResult:
        t0 = time.monotonic()
        try:
            result = fn()
        except StepSkipped as exc:
            result = StepResult(SKIPPED, str(exc))
        except Exception as exc:
            result = StepResult(FAILED, f"{type(exc).__name__}: {exc}")
        result.seconds = round(time.monotonic() - t0, 1)
        summary["steps"][name] = asdict(result)
        print(f"{name:<9} {result.status:<8} {result.seconds:>6.1f} s  {result.reason}", flush=True)
        return result

    def probe_step() -> StepResult:
        nonlocal probe
        result, probe = probe_run(out, nvml=nvml, mps_control=args.mps_control)
        summary["provenance"]["driver"] = result.details.get("driver")
        return result

    record("probe", probe_step)
    assert probe is not None
    if args.require_gpu and probe.gpu is None:
        summary["exit"] = 2
        _json_write(out / "summary.json", summary)
        print(f"no GPU and --require-gpu: {probe.gpu_reason}", file=sys.stderr)
        return 2, summary
    rehearsal: bool | str = (REHEARSAL_TORCH if args.rehearse_torch else REHEARSAL) if args.cpu_rehearsal else False

    def models_step() -> StepResult:
        if not rehearsal and probe.gpu is None:
            raise StepSkipped(f"no GPU: {probe.gpu_reason}")
        if not args.architectures:
            raise StepSkipped("no architecture asked for (--architectures '')")
        result, exported = models_export(out, args.architectures)
        models.extend(exported)
        return result

    if "models" in steps:
        record("models", models_step)
    if "profiles" in steps:
        record("profiles", lambda: _runnable(probe, rehearsal, models) or profiles_run(out, models, probe, batches=args.batches, min_time_s=args.min_time,
                                                                 rehearsal=rehearsal, deadline=deadline - args.reserve_s))
    if "mps" in steps:
        record("mps", lambda: _runnable(probe, rehearsal, models) or mps_run(out, models, probe, rehearsal=rehearsal, control=args.mps_control, nvml=nvml,
                                                       window_s=args.mps_window, deadline=deadline - args.e2e_seconds - 60))
    if "e2e" in steps:
        def e2e_step() -> StepResult:
            _runnable(probe, rehearsal, models)
            chosen = next((m for m in models if m.name == args.e2e_model), models[0])
            return e2e_run(out, chosen, probe, seconds=args.e2e_seconds, rps=args.e2e_rps, slo_ms=args.e2e_slo_ms, rehearsal=rehearsal)

        record("e2e", e2e_step)
    summary["seconds"] = round(time.monotonic() - started, 1)
    failed = [name for name, step in summary["steps"].items() if step["status"] == FAILED]
    summary["exit"] = 1 if failed else 0
    _json_write(out / "summary.json", summary)
    print(f"{'total':<9} {'failed: ' + ', '.join(failed) if failed else 'ok':<8} {summary['seconds']:>6.1f} s  files in {out}")
    return summary["exit"], summary


def _runnable(probe: Probe, rehearsal: bool | str, models: Sequence[CheckModel]) -> None:
    """Raise StepSkipped, saying why, where a measuring step cannot run: no GPU (and no rehearsal), no runtime
    that reaches it, or no model."""
    profile_runtime(probe, rehearsal=rehearsal)
    if not models:
        raise StepSkipped("no model: the models step exported none and no --model was given")


def _numbers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"want whole numbers >= 1, got {text!r}")
    return values


def _names_of(known: Sequence[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of names out of `known`."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
        return names

    return parse


def parser_build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the result files (default gpu-check)")
    parser.add_argument("--steps", type=_names_of(STEPS, "steps"), default=list(STEPS), help=f"which steps, comma-separated (default all: {','.join(STEPS)})")
    parser.add_argument("--architectures", type=_names_of(list(ARCHITECTURES), "architectures"), default=list(DEFAULT_ARCHITECTURES),
                        help=f"torchvision architectures to export (default {','.join(DEFAULT_ARCHITECTURES)}; '' for none)")
    parser.add_argument("--model", type=model_from_option, action="append", help="also measure this ONNX model: NAME=PATH[:3x224x224]")
    parser.add_argument("--batches", type=_numbers, default=list(DEFAULT_BATCHES), help="profile batch sizes (default 1,2,4,...,64)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds each profile point is timed at least (default 0.5)")
    parser.add_argument("--mps-window", type=float, default=1.0, help="seconds each MPS solo or co-run point is timed (default 1.0)")
    parser.add_argument("--mps-control", help="the MPS control program (default nvidia-cuda-mps-control on the PATH)")
    parser.add_argument("--e2e-model", default=E2E_MODEL, help=f"the model deployed end to end (default {E2E_MODEL}, else the first)")
    parser.add_argument("--e2e-seconds", type=float, default=60.0, help="seconds of load end to end (default 60)")
    parser.add_argument("--e2e-rps", type=float, default=50.0, help="requests per second end to end (default 50)")
    parser.add_argument("--e2e-slo-ms", type=float, help="the SLO end to end (default 4x the profiled batch-8 p99, at least 25 ms)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the time budget; steps cut their loops short past it (default 480)")
    parser.add_argument("--reserve-s", type=float, default=240.0, help="of the budget, what the profiles step leaves to mps and e2e (default 240)")
    parser.add_argument("--require-gpu", action="store_true", help="exit 2 when no GPU answers, instead of skipping the GPU steps")
    parser.add_argument("--cpu-rehearsal", action="store_true", help="run the GPU steps on the CPU instead, labelled rehearsal-cpu")
    parser.add_argument("--rehearse-torch", action="store_true", help="with --cpu-rehearsal: measure through the PyTorch path (on the CPU)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "child-measure":
        return child_measure(argv[1:])
    if argv and argv[0] == "child-e2e-setup":
        return child_e2e(argv[0], argv[1:])
    args = parser_build().parse_args(argv)
    if args.rehearse_torch and not args.cpu_rehearsal:
        parser_build().error("--rehearse-torch is for --cpu-rehearsal")
    # SIGTERM (a timeout's) unwinds like an error, so the MPS daemon and the e2e processes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    status, _ = check_run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
