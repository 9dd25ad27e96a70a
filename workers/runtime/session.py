"""An ONNX Runtime session that serves batches of queries.

`OnnxSession(model, sha256=..., intra_op_threads=1, providers=None, device_uuid=None)`:

- `model` is the serialized ONNX model (bytes) or a path to it. With `sha256`, the bytes are checked
  first and a mismatch raises `ArtifactChecksumError` (nothing is loaded).
- Execution providers: CUDA only when it is asked for (named in `providers`, or `device_uuid` given with
  `providers=None`) and this onnxruntime build has it; it is pinned to the GPU `device_uuid` names (an
  index, or a "GPU-..." UUID resolved through CUDA_VISIBLE_DEVICES or nvidia-smi). CPU is the fallback
  for what CUDA does not run, with `intra_op_threads` intra-op threads. A runtime on a GPU (`device_uuid`
  given, `providers=None`) never falls back whole: where this onnxruntime has no CUDA provider (the CPU
  build of onnxruntime, not onnxruntime-gpu), or the provider does not load (onnxruntime then runs the
  session on the CPU and only logs it), `CudaUnavailableError` is raised, so that a GPU slice is never
  served, or profiled, at the CPU's speed under the GPU's name. The one exception is declared, for tests
  of the agent against a fake NVML on machines without a GPU: with ``TESSERA_CPU_STANDS_IN_FOR_GPU=1`` in
  the environment the CPU serves, with a warning (the session's providers say CPU).
- `run_batch(inputs)`: one dict name -> array per query; each input is stacked along axis 0 (a query's
  array may carry its own leading batch axis, or not), the model runs once, and each output is split back
  per query (without the batch axis for queries that came without one).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["CPU_STANDS_IN_ENV", "ArtifactChecksumError", "CudaUnavailableError", "OnnxSession", "cuda_active_check"]

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

_ONNX_DTYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


class ArtifactChecksumError(ValueError):
    """The model's bytes do not have the SHA-256 the registry recorded."""

    def __init__(self, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"model artifact checksum mismatch: expected sha256 {expected}, got {actual}")


# Tests of the agent against a fake NVML (no GPU on the machine) run real runtimes on the CPU: they say so.
CPU_STANDS_IN_ENV = "TESSERA_CPU_STANDS_IN_FOR_GPU"


class CudaUnavailableError(RuntimeError):
    """CUDA was required (a runtime or a profile on a GPU) and the session does not run on it."""


def cuda_active_check(providers: Sequence[str], *, available: Sequence[str], where: str) -> None:
    """Raise `CudaUnavailableError` unless CUDA is the session's first provider (or the CPU is declared to stand
    in: `CPU_STANDS_IN_ENV`). `providers`: what the session runs on (``InferenceSession.get_providers()``);
    `available`: what this onnxruntime build offers."""
    if providers and providers[0] == CUDA:
        return
    if os.environ.get(CPU_STANDS_IN_ENV) == "1":
        logging.getLogger("tessera.runtime").warning("%s: %s=1, so the CPU stands in for the GPU (a test on a machine without one)",
                                                     where, CPU_STANDS_IN_ENV)
        return
    if CUDA not in available:
        import onnxruntime as ort

        raise CudaUnavailableError(
            f"{where}: this onnxruntime ({ort.__version__}) has no CUDA execution provider (it offers "
            f"{', '.join(available) or 'none'}): install onnxruntime-gpu, the `gpu` extra, on GPU hosts; "
            "nothing runs on the CPU under a GPU's name")
    raise CudaUnavailableError(
        f"{where}: the CUDA execution provider did not load (the session runs on {', '.join(providers) or 'nothing'}); "
        "onnxruntime logs why above, most often a CUDA or cuDNN library its build needs that is missing or of "
        "another major version")


def _cuda_device_id(device_uuid: str) -> int:
    """The CUDA device index of `device_uuid` (an index already, or a GPU UUID) in this process."""
    if device_uuid.isdigit():
        return int(device_uuid)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [e.strip() for e in visible.split(",")]
        if device_uuid in entries:
            return entries.index(device_uuid)
        raise ValueError(f"GPU {device_uuid} is not in CUDA_VISIBLE_DEVICES={visible}")
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"],  # nosec B603 - nvidia-smi, fixed arguments
                             capture_output=True, text=True, timeout=10)
        for line in out.stdout.splitlines():
            index, _, uuid = (part.strip() for part in line.partition(","))
            if uuid == device_uuid:
                return int(index)
    raise ValueError(f"cannot find GPU {device_uuid}")


class OnnxSession:
    """See the module docstring."""

    def __init__(
        self,
        model: bytes | Path | str,
        *,
        sha256: str | None = None,
        intra_op_threads: int = 1,
        providers: Sequence[str] | None = None,
        device_uuid: str | None = None,
    ) -> None:
        import onnxruntime as ort

        data = model if isinstance(model, (bytes, bytearray)) else Path(model).read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        if sha256 is not None and self.sha256 != sha256.strip().lower():
            raise ArtifactChecksumError(sha256, self.sha256)
        if intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1, not {intra_op_threads!r}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(intra_op_threads)
        options.inter_op_num_threads = 1
        available = set(ort.get_available_providers())
        wanted = list(providers) if providers is not None else ([CUDA] if device_uuid is not None else [])
        chosen: list = []
        for name in wanted:
            if name not in available or name in (p if isinstance(p, str) else p[0] for p in chosen):
                continue
            if name == CUDA and device_uuid is not None:
                chosen.append((CUDA, {"device_id": _cuda_device_id(device_uuid)}))
            else:
                chosen.append(name)
        if CPU not in chosen:
            chosen.append(CPU)
        self.device_uuid = device_uuid
        self._session = ort.InferenceSession(bytes(data), sess_options=options, providers=chosen)
        self.providers: list[str] = list(self._session.get_providers())
        if device_uuid is not None and providers is None:
            cuda_active_check(self.providers, available=sorted(available), where=f"GPU {device_uuid}")
        self._inputs = self._session.get_inputs()
        self.input_names: list[str] = [i.name for i in self._inputs]
        self.output_names: list[str] = [o.name for o in self._session.get_outputs()]
        self._rank = {i.name: len(i.shape) for i in self._inputs}
        # String inputs (tensor(string), the protocol's BYTES): onnxruntime takes text, the wire gives bytes.
        self._strings = frozenset(i.name for i in self._inputs if i.type == "tensor(string)")

    def warmup(self, batch_sizes: Sequence[int] = (1,)) -> None:
        """Run the model once per batch size on zeros (symbolic dims other than the batch set to 1)."""
        for b in batch_sizes:
            feed = {}
            for i in self._inputs:
                shape = [b] + [d if isinstance(d, int) and d > 0 else 1 for d in i.shape[1:]]
                if i.name in self._strings:
                    feed[i.name] = np.full(shape, "", dtype=object)
                else:
                    feed[i.name] = np.zeros(shape, dtype=_ONNX_DTYPES.get(i.type, np.float32))
            self._session.run(self.output_names, feed)

    def _text(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The string inputs as text (UTF-8), as onnxruntime takes them."""
        if not self._strings:
            return feed
        out = dict(feed)
        for name in self._strings & feed.keys():
            array = np.asarray(feed[name])
            flat = array.reshape(-1).tolist()
            try:
                text = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
            except UnicodeDecodeError as exc:
                raise ValueError(f"input {name!r}: a string element is not UTF-8 ({exc.reason} at byte {exc.start})") from None
            converted = np.empty(len(text), dtype=object)
            converted[:] = text
            out[name] = converted.reshape(array.shape)
        return out

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on already batched inputs."""
        return dict(zip(self.output_names, self._session.run(self.output_names, self._text(feed))))

    def run_batch(self, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Stack the queries' inputs along axis 0, run once, split the outputs back per query."""
        if not inputs:
            return []
        sizes: list[int] = []
        squeeze: list[bool] = []
        for q, query in enumerate(inputs):
            missing = [n for n in self.input_names if n not in query]
            if missing:
                raise ValueError(f"query {q} lacks inputs {missing}")
            first = np.asarray(query[self.input_names[0]])
            unbatched = first.ndim == self._rank[self.input_names[0]] - 1
            squeeze.append(unbatched)
            sizes.append(1 if unbatched else first.shape[0])
        feed = {}
        for name in self.input_names:
            parts = [np.asarray(query[name])[None] if unbatched else np.asarray(query[name]) for query, unbatched in zip(inputs, squeeze)]
            feed[name] = np.concatenate(parts, axis=0)
        outputs = self._session.run(self.output_names, self._text(feed))
        bounds = np.cumsum(sizes)[:-1]
        per_query: list[dict[str, np.ndarray]] = [{} for _ in inputs]
        for name, out in zip(self.output_names, outputs):
            for q, piece in enumerate(np.split(out, bounds, axis=0)):
                per_query[q][name] = piece[0] if squeeze[q] else piece
        return per_query
