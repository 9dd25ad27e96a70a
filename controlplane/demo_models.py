"""Two small, really trained classifiers exported to ONNX, for the demo's CPU application: a linear
model and a random-feature network (a hidden ReLU layer with a least-squares readout). Both are fitted
in closed form with NumPy on a fixed synthetic data set and scored on a held-out split, so their
accuracies are measured, not invented."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N_FEATURES = 8
N_CLASSES = 3


@dataclass(frozen=True)
class DemoModel:
    name: str
    onnx_bytes: bytes
    accuracy: float  # on the held-out split
    description: str


def _dataset(seed: int = 7, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    # Three interleaved noisy rings in the first two features, distractor noise in the rest: a linear
    # model cannot separate them well, a non-linear one can.
    rng = np.random.default_rng(seed)
    y = rng.integers(0, N_CLASSES, n)
    radius = 1.0 + y + rng.normal(0, 0.35, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    x = rng.normal(0, 1.0, (n, N_FEATURES))
    x[:, 0] = radius * np.cos(angle)
    x[:, 1] = radius * np.sin(angle)
    return x.astype(np.float32), y


def _fit_readout(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    targets = np.eye(N_CLASSES)[y]
    design = np.hstack([features, np.ones((features.shape[0], 1))])
    weights, *_ = np.linalg.lstsq(design, targets, rcond=None)
    return weights.astype(np.float32)


def _graph(name: str, layers: list[tuple[np.ndarray, np.ndarray, bool]]) -> bytes:
    nodes, inits, current = [], [], "input"
    for i, (w, b, relu) in enumerate(layers):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]), helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"])]
        current = f"z{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [current], [f"h{i}"]))
            current = f"h{i}"
    nodes.append(helper.make_node("Softmax", [current], ["probabilities"], axis=-1))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", N_FEATURES])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", N_CLASSES])], inits,
    )
    model = helper.make_model(graph, producer_name="tessera-demo", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def demo_models_build() -> list[DemoModel]:
    x, y = _dataset()
    split = int(0.7 * len(y))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    linear = _fit_readout(x_train, y_train)
    linear_acc = float(((np.hstack([x_test, np.ones((len(x_test), 1))]) @ linear).argmax(1) == y_test).mean())

    rng = np.random.default_rng(11)
    hidden = 256
    w_in = rng.normal(0, 1.0, (N_FEATURES, hidden)).astype(np.float32)
    b_in = rng.normal(0, 1.0, hidden).astype(np.float32)
    relu = lambda a: np.maximum(a @ w_in + b_in, 0)  # noqa: E731
    readout = _fit_readout(relu(x_train), y_train)
    rf_acc = float(((np.hstack([relu(x_test), np.ones((len(x_test), 1))]) @ readout).argmax(1) == y_test).mean())

    return [
        DemoModel(
            "linear", _graph("demo-linear", [(linear[:-1], linear[-1], False)]), linear_acc,
            "Linear classifier, least squares on one-hot targets",
        ),
        DemoModel(
            "random-features-256", _graph("demo-rf", [(w_in, b_in, True), (readout[:-1], readout[-1], False)]), rf_acc,
            "256 random ReLU features with a least-squares readout",
        ),
    ]
