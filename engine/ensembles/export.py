"""The learned scheduler's policy as an ONNX file that onnxruntime runs (serving never imports torch):
a multilayer perceptron, features -> logits (one per member), written from its weights with the `onnx`
package's helpers (Gemm and an activation per hidden layer), beside a JSON file with the state's shape
(`SchedulerSpec`) and how the policy was made.

Written from the weights rather than by `torch.onnx.export`: the network is three matrix products, the
file is the same on every machine and torch version, and a policy can be written (and tested) without
torch at all.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.ensembles.scheduler import POLICY_INPUT, POLICY_OUTPUT, SchedulerSpec

__all__ = ["ACTIVATIONS", "policy_mlp_write"]

ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu"}


def policy_mlp_write(path: str | Path, layers: Sequence[tuple[np.ndarray, np.ndarray]], spec: SchedulerSpec, *,
                     activation: str = "tanh", meta: dict[str, Any] | None = None) -> Path:
    """Write `path` (.onnx) and its .json: `layers` are (weight (out, in), bias (out,)) in order, the
    activation after every layer but the last. Checks the shapes against the spec and the model with
    `onnx.checker`."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    path = Path(path).with_suffix(".onnx")
    width = spec.feature_count
    nodes, initializers = [], []
    current = POLICY_INPUT
    for n, (weight, bias) in enumerate(layers):
        weight = np.asarray(weight, dtype=np.float32)
        bias = np.asarray(bias, dtype=np.float32)
        if weight.ndim != 2 or weight.shape[1] != width or bias.shape != (weight.shape[0],):
            raise ValueError(f"layer {n}: weight {weight.shape} and bias {bias.shape} do not follow a width of {width}")
        width = weight.shape[0]
        initializers += [numpy_helper.from_array(weight, f"w{n}"), numpy_helper.from_array(bias, f"b{n}")]
        last = n == len(layers) - 1
        out = POLICY_OUTPUT if last else f"h{n}"
        nodes.append(helper.make_node("Gemm", [current, f"w{n}", f"b{n}"], [out if last else f"z{n}"], transB=1))
        if not last:
            nodes.append(helper.make_node(ACTIVATIONS[activation], [f"z{n}"], [out]))
        current = out
    if width != len(spec.members):
        raise ValueError(f"the last layer gives {width} logits, the scheduler has {len(spec.members)} members")
    graph = helper.make_graph(
        nodes, "tessera-ensemble-scheduler",
        [helper.make_tensor_value_info(POLICY_INPUT, TensorProto.FLOAT, ["batch", spec.feature_count])],
        [helper.make_tensor_value_info(POLICY_OUTPUT, TensorProto.FLOAT, ["batch", len(spec.members)])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tessera")
    model.ir_version = 8  # readable by every onnxruntime Tessera supports (>= 1.18)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    path.with_suffix(".json").write_text(json.dumps({"spec": spec.to_dict(), "activation": activation, **(meta or {})}, indent=2) + "\n")
    return path
