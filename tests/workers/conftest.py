"""Fixtures the router's protocol tests share (tests/workers/oip_helpers.py)."""
from __future__ import annotations

import pytest

from tests.workers.dataplane_helpers import runtime_spec, runtime_start
from tests.workers.oip_helpers import NUMBERS, oip_models


@pytest.fixture(scope="module")
def models() -> dict[str, bytes]:
    return oip_models()


@pytest.fixture(scope="module")
def runtimes(models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("oip-runtimes")
    started = {}
    try:
        for k, name in enumerate(models):
            path = workdir / f"{name}.onnx"
            path.write_bytes(models[name])
            application = "calibrate" if name == "calibrate" else "tabular"
            spec = runtime_spec(key=f"cpu0/{k}", application=application, variant=name, instance=f"host/cpu0/{k}", artifact_path=str(path),
                                variant_id=NUMBERS[name])
            started[name] = runtime_start(spec, workdir, name)
        yield started
    finally:
        for rt in started.values():
            rt.stop()


