"""What every peer server script shares (they run in the peers' venvs, without Tessera): the command line,
a free port for the ports a peer opens beside its HTTP one, and the onnxruntime session the bench's other
rows use (CPU provider, T intra-op threads, one inter-op thread)."""
from __future__ import annotations

import argparse
import socket
from pathlib import Path


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=lambda p: str(Path(p).resolve()))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ready-file", required=True)
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def onnx_session(model: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
