"""MLServer serving the bench's ONNX model through a custom runtime (MLServer ships no ONNX runtime):
`OnnxModel` decodes the OIP request with MLServer's NumpyCodec, runs onnxruntime, encodes the output.
Run with MLServer's venv: python benches/peers/mlserver_onnx.py --model M --port P --threads T --ready-file F."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # inside MLServer's worker: the runtime class it loads by name
    import numpy as np
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest, InferenceResponse

    class OnnxModel(MLModel):
        async def load(self) -> bool:
            from _peer import onnx_session

            self.session = onnx_session(self.settings.parameters.uri, int(self.settings.parameters.extra["threads"]))
            return True

        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
            y = self.session.run(None, {"x": x})[0]
            return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(name="y", payload=y)])
except ImportError:  # imported elsewhere (a linter): nothing to define
    pass


def main() -> int:
    from _peer import arguments, free_port

    args = arguments()
    folder = Path(tempfile.mkdtemp(prefix="mlserver-bench-"))
    for name in ("mlserver_onnx.py", "_peer.py"):  # MLServer imports the runtime from the model's folder
        shutil.copy(Path(__file__).with_name(name), folder / name)
    # One process: no parallel inference workers (they would add a hop and take the bench's other core).
    (folder / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": args.port, "grpc_port": free_port(), "metrics_port": free_port(),
        "parallel_workers": 0, "debug": False, "metrics_endpoint": None}))
    (folder / "model-settings.json").write_text(json.dumps({
        "name": "mlp", "implementation": "mlserver_onnx.OnnxModel",
        "parameters": {"uri": args.model, "extra": {"threads": args.threads}}}))
    server = subprocess.Popen([str(Path(sys.executable).with_name("mlserver")), "start", str(folder)], cwd=folder)
    url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", args.port), timeout=1) as s:
                s.sendall(b"GET /v2/models/mlp/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    Path(args.ready_file).write_text(url)
                    break
        except OSError:
            pass
        time.sleep(0.3)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
