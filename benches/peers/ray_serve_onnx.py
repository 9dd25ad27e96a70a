"""Ray Serve serving the bench's ONNX model: one replica whose deployment decodes an Open Inference Protocol
JSON request, runs onnxruntime and answers OIP JSON (Ray Serve has no OIP front end of its own).
Run with Ray's venv: python benches/peers/ray_serve_onnx.py --model M --port P --threads T --ready-file F."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import ray
from ray import serve
from starlette.requests import Request

from _peer import arguments, onnx_session


@serve.deployment(num_replicas=1, max_ongoing_requests=64, ray_actor_options={"num_cpus": 0})
class Mlp:
    def __init__(self, model: str, threads: int) -> None:
        self.session = onnx_session(model, threads)

    async def __call__(self, request: Request) -> dict:
        tensor = (await request.json())["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        y = self.session.run(None, {"x": x})[0]
        return {"model_name": "mlp", "outputs": [{"name": "y", "shape": list(y.shape), "datatype": "FP32", "data": y.ravel().tolist()}]}


def main() -> int:
    args = arguments()
    # The replica's worker process imports _peer (onnx_session) from this folder.
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}})
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config={"enable_access_log": False})
    serve.run(Mlp.bind(args.model, args.threads), route_prefix="/v2/models/mlp/infer", name="mlp")
    Path(args.ready_file).write_text(f"http://127.0.0.1:{args.port}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
