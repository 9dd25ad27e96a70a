"""workers/profiler.py on its own: a sweep feeds every input type a request can carry, string (BYTES)
inputs as words of the declared length, and a failing profiler process is reported by its reason, whole."""
from __future__ import annotations

import numpy as np
import pytest

from tests.onnx_builders import onnx_mlp_bytes, onnx_text_bytes
from workers.profiler import ProfilingError, _failure_reason, _feed, profile_sweep, profile_sweep_subprocess


def test_a_text_model_is_profiled_on_words_of_the_declared_length(tmp_path) -> None:
    """Issue 38: the profiler fed floats to a string input and stored a traceback cut mid-line."""
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_text_bytes(), providers=["CPUExecutionProvider"])
    feed = _feed(session, 3, np.random.default_rng(0), string_length=40)
    assert feed["text"].shape == (3, 1) and feed["text"].dtype == object
    assert all(isinstance(w, str) and len(w) == 40 for w in feed["text"].reshape(-1))
    points = profile_sweep(onnx_text_bytes(), batch_sizes=[1, 4], min_iterations=5, min_time_s=0.05, string_length=8)
    assert [p["batch_size"] for p in points] == [1, 4] and all(p["latency_p50_ms"] > 0 for p in points)
    model = tmp_path / "text.onnx"
    model.write_bytes(onnx_text_bytes())
    points = profile_sweep_subprocess(model, batch_sizes=[2], min_time_s=0.05, string_length=4)
    assert [p["batch_size"] for p in points] == [2]
    with pytest.raises(ProfilingError, match="string_length must be 1..65536"):
        profile_sweep(onnx_text_bytes(), batch_sizes=[1], string_length=0)


def test_a_failed_profiler_process_says_why_in_one_whole_line(tmp_path) -> None:
    model = tmp_path / "mlp.onnx"
    model.write_bytes(onnx_mlp_bytes())
    with pytest.raises(ProfilingError) as caught:
        profile_sweep_subprocess(model, batch_sizes=[1], min_time_s=0.05, string_length=0)
    assert str(caught.value) == "profiler process failed: string_length must be 1..65536, got 0"
    assert _failure_reason("Traceback (most recent call last):\n  File x\nValueError: bad shape\n") == "ValueError: bad shape"
    assert _failure_reason("") == "it exited without saying why"
