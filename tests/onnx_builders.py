"""Small ONNX models the tests build themselves with onnx.helper: a valid MLP, and files that fail each
stage of artifact validation (parse, checker, onnxruntime load)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def onnx_mlp_bytes(n_in: int = 4, hidden: int = 8, n_out: int = 3, seed: int = 0, probabilities: bool = False) -> bytes:
    """x [batch, n_in] -> logits [batch, n_out]; with `probabilities`, also their softmax as a second output."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.normal(size=(n_in, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(np.zeros(hidden, np.float32), "b1")
    w2 = numpy_helper.from_array(rng.normal(size=(hidden, n_out)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, f"mlp{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_out])], [w1, b1, w2],
    )
    if probabilities:
        graph.node.append(helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1))
        graph.output.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", n_out]))
    model = helper.make_model(graph, producer_name="tessera-tests", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_failing_checker_bytes() -> bytes:
    """Parses, but a node reads a tensor nothing produces."""
    node = helper.make_node("Relu", ["missing"], ["y"])
    graph = helper.make_graph(
        [node], "broken", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def onnx_unloadable_bytes() -> bytes:
    """Passes the checker (custom domains are opaque to it) but onnxruntime has no such operator."""
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node], "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model.SerializeToString()


TEXT_LABELS = {"cat": 1, "dog": 2, "bird": 3}  # onnx_text_bytes' vocabulary; anything else is 0
TEXT_KINDS = {1: "feline", 2: "canine", 3: "avian"}  # and each label's kind; 0 is "unknown"


def onnx_text_bytes() -> bytes:
    """A text model: text [batch, 1] (strings, the protocol's BYTES) -> label [batch, 1] (int64: its index in
    TEXT_LABELS, 0 when unknown) and kind [batch, 1] (a string output: TEXT_KINDS of the label, "unknown"),
    both by ai.onnx.ml's LabelEncoder (no locale needed, unlike StringNormalizer)."""
    nodes = [
        helper.make_node("LabelEncoder", ["text"], ["label"], domain="ai.onnx.ml", keys_strings=list(TEXT_LABELS),
                         values_int64s=list(TEXT_LABELS.values()), default_int64=0),
        helper.make_node("LabelEncoder", ["label"], ["kind"], domain="ai.onnx.ml", keys_int64s=list(TEXT_KINDS),
                         values_strings=list(TEXT_KINDS.values()), default_string="unknown"),
    ]
    graph = helper.make_graph(
        nodes, "text", [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("kind", TensorProto.STRING, ["batch", 1])],
    )
    model = helper.make_model(graph, producer_name="tessera-tests",
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_sequence_input_bytes() -> bytes:
    """A model whose input is a sequence of tensors: the protocol has no such thing, so no request can feed it."""
    node = helper.make_node("SequenceAt", ["xs", "zero"], ["y"])
    graph = helper.make_graph(
        [node], "sequence", [helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])], [numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()
