"""Triton Inference Server's core through PyTriton (`nvidia-pytriton` ships the server binary) serving the
bench's ONNX model: the Python inference function runs onnxruntime; Triton's HTTP front end speaks the Open
Inference Protocol, its binary tensor extension included. Dynamic batching is off (PyTriton's default
batcher would merge concurrent requests, which Tessera's rows with batching off do not do).
Run with PyTriton's venv: python benches/peers/pytriton_onnx.py --model M --port P --threads T --ready-file F."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from _peer import arguments, free_port, onnx_session


def main() -> int:
    args = arguments()
    session = onnx_session(args.model, args.threads)
    width = session.get_inputs()[0].shape[1]
    classes = session.get_outputs()[0].shape[1]

    @batch
    def infer(x: np.ndarray) -> dict:
        return {"y": session.run(None, {"x": x})[0]}

    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, grpc_address="127.0.0.1", grpc_port=free_port(),
                          metrics_port=free_port(), allow_metrics=False, log_verbose=0)
    with Triton(config=config) as triton:
        triton.bind(model_name="mlp", infer_func=infer, inputs=[Tensor(name="x", dtype=np.float32, shape=(width,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(classes,))],
                    config=ModelConfig(max_batch_size=256, batcher=None), strict=False)
        Path(args.ready_file).write_text(f"http://127.0.0.1:{args.port}")
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
