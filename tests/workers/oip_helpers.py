"""What the router's protocol tests over HTTP (test_router_oip.py) and gRPC (test_router_grpc.py) share: two
variants of a tabular model and a calibration stage, run by real onnxruntime runtime processes (the
`models` and `runtimes` fixtures, tests/workers/conftest.py), and the routing tables the control plane
would list for them."""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.dataplane.tensors import oip_tensor_metadata
from tests.onnx_builders import onnx_mlp_bytes, onnx_text_bytes
from tests.workers.dataplane_helpers import runtime_spec, runtime_start
from workers.router.oip import RepositoryActionError
from workers.runtime.session import OnnxSession

VARIANTS = ("small", "big")
# The variants' numbers (the registry's ids, as oip_tables gives them): the protocol's versions.
NUMBERS = {"small": 11, "big": 12, "calibrate": 21}
SPEC_IN = [{"name": "x", "dtype": "tensor(float)", "shape": ["batch", 4]}]
SPEC_OUT = [{"name": "logits", "dtype": "tensor(float)", "shape": ["batch", 3]},
            {"name": "probabilities", "dtype": "tensor(float)", "shape": ["batch", 3]}]
PIPELINE = {"name": "chain", "stages": [{"application": "tabular", "max_batch": 4},
                                        {"application": "calibrate", "max_batch": 4, "inputs": {"x": "logits"}}],
            "paths": [{"name": "main", "stages": ["tabular", "calibrate"], "slo_ms": 5000.0, "demand_rps": 1.0}]}


def oip_models() -> dict[str, bytes]:
    return {"small": onnx_mlp_bytes(seed=1, probabilities=True), "big": onnx_mlp_bytes(hidden=32, seed=2, probabilities=True),
            "calibrate": onnx_mlp_bytes(n_in=3, hidden=4, n_out=3, seed=3)}


def oip_tables(runtimes, *, tabular_routes=VARIANTS, pipeline=None, batches=None) -> list[dict]:
    """The tables as the control plane lists them, `model` block included (RoutingTableSerializer.get_model);
    `batches`: {variant: its instance's planned batch} for the tabular routes (a plan's tables give them)."""
    versions = {v: {"id": NUMBERS[v], "inputs": oip_tensor_metadata(SPEC_IN), "outputs": oip_tensor_metadata(SPEC_OUT)} for v in VARIANTS}
    calibrate_io = {"inputs": oip_tensor_metadata([{"name": "x", "dtype": "tensor(float)", "shape": ["batch", 3]}]),
                    "outputs": oip_tensor_metadata([{"name": "logits", "dtype": "tensor(float)", "shape": ["batch", 3]}]),
                    "id": NUMBERS["calibrate"]}
    return [
        {"id": 1, "application": "tabular", "version": 1, "active": True, "slo_ms": 5000.0, "drop_rule": "deadline",
         "routes": [{"instance": f"host/cpu0/{VARIANTS.index(v)}", "variant": v, "weight": 1.0, "endpoint": runtimes[v].endpoint,
                     "state": "ready", **({"batch": batches[v]} if batches else {})} for v in tabular_routes],
         "pipeline": copy.deepcopy(pipeline),
         "model": {"platform": "onnxruntime_onnx", **versions["small"], "versions": versions}},
        {"id": 2, "application": "calibrate", "version": 1, "active": True, "slo_ms": 5000.0, "drop_rule": "deadline",
         "routes": [{"instance": "host/cpu0/2", "variant": "calibrate", "weight": 1.0, "endpoint": runtimes["calibrate"].endpoint,
                     "state": "ready"}],
         "pipeline": copy.deepcopy(pipeline), "model": {"platform": "onnxruntime_onnx", **calibrate_io, "versions": {"calibrate": calibrate_io}}},
    ]


def oip_expected(models, variant: str, x: np.ndarray) -> dict[str, np.ndarray]:
    return OnnxSession(models[variant]).run({"x": x})


PERF_ANALYZER = Path(__file__).resolve().parents[2] / "var" / "bench-peers" / "perf-analyzer" / "bin" / "perf_analyzer"


TEXT_NUMBER = 31  # the text model's variant number


@contextlib.contextmanager
def text_model_served(workdir: Path) -> Iterator[dict]:
    """A real onnxruntime runtime of the text model (tests/onnx_builders.py `onnx_text_bytes`: string input
    `text`, outputs `label` INT64 and `kind` BYTES) as application `tags`, variant `labels`; yields its
    routing table."""
    model = workdir / "text.onnx"
    model.write_bytes(onnx_text_bytes())
    runtime = runtime_start(runtime_spec(key="cpu0/5", application="tags", variant="labels", instance="host/cpu0/5",
                                         artifact_path=str(model), variant_id=TEXT_NUMBER), workdir, "text")
    try:
        text_io = {"inputs": oip_tensor_metadata([{"name": "text", "dtype": "tensor(string)", "shape": ["batch", 1]}]),
                   "outputs": oip_tensor_metadata([{"name": "label", "dtype": "tensor(int64)", "shape": ["batch", 1]},
                                                   {"name": "kind", "dtype": "tensor(string)", "shape": ["batch", 1]}])}
        yield {"id": 3, "application": "tags", "version": 1, "active": True, "slo_ms": 5000.0, "drop_rule": "deadline",
               "routes": [{"instance": "host/cpu0/5", "variant": "labels", "weight": 1.0, "endpoint": runtime.endpoint, "state": "ready"}],
               "pipeline": None, "model": {"platform": "onnxruntime_onnx", **text_io, "versions": {"labels": {**text_io, "id": TEXT_NUMBER}}}}
    finally:
        runtime.stop()


def repository_recording(calls: list):
    """A router's `repository` callable that records each load and unload in `calls` and refuses the model
    named "forbidden" as a control plane refuses a router whose credential may not load models (403)."""

    def repository(action: str, name: str, *, config=None) -> None:
        calls.append((action, name, config))
        if name == "forbidden":
            raise RepositoryActionError(403, "this router's credential may not load or unload models")

    return repository
