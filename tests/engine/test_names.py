"""The data plane's names (engine/geometry/names.py): devices, runtime keys (MIG instances, whole GPUs, CPU
runtimes, and MPS partitions with their models' slots) and fleet instance ids."""
from __future__ import annotations

import pytest

from engine.geometry import names
from engine.geometry.names import RuntimeKey, instance_id, instance_id_parse, runtime_key_parse


@pytest.mark.parametrize("key, expected", [
    ("gpu0/3g.20gb@4", RuntimeKey("gpu0/3g.20gb@4", "gpu0", "gpu", 0, "3g.20gb@4", None)),
    ("gpu12", RuntimeKey("gpu12", "gpu12", "gpu", 12, None, None)),
    ("cpu0/2", RuntimeKey("cpu0/2", "cpu0", "cpu", 0, None, 2)),
    ("gpu0/mps60@0", RuntimeKey("gpu0/mps60@0", "gpu0", "gpu", 0, "mps60@0", None, 60, 0)),
    ("gpu1/mps40@1/3", RuntimeKey("gpu1/mps40@1/3", "gpu1", "gpu", 1, "mps40@1", 3, 40, 1)),
    ("gpu0/mps100@0/0", RuntimeKey("gpu0/mps100@0/0", "gpu0", "gpu", 0, "mps100@0", 0, 100, 0)),
])
def test_runtime_keys(key, expected) -> None:
    assert runtime_key_parse(key) == expected


@pytest.mark.parametrize("key, message", [
    ("gpu0/3g.20gb@4/1", "only for models in an MPS partition"),  # a slot after a MIG placement
    ("gpu0/mps0@0/0", "1..100"),
    ("gpu0/mps101@0/0", "1..100"),
    ("gpu0/mps060@0/0", "without leading zeros"),  # one spelling per key
    ("gpu0/MPS60@0", "not an MPS partition placement"),
    ("gpu0/mps60/0", "is not a runtime key"),
    ("gpu0/mps60@0/1/2", "is not a runtime key"),
    ("gpu0/1", "is not a runtime key"),
    ("cpu0", "is not a runtime key"),
    ("gpu0/" + "x" * 100, "is not a runtime key"),
    (None, "is not a runtime key"),
])
def test_malformed_runtime_keys(key, message) -> None:
    with pytest.raises(ValueError, match=message):
        runtime_key_parse(key)


def test_mps_helpers() -> None:
    assert names.mps_placement_parse("mps60@0") == (60, 0)
    assert names.mps_placement(40, 1) == "mps40@1"
    with pytest.raises(ValueError):
        names.mps_placement(0, 1)
    assert names.is_mps_placement("mps60@0") and names.is_mps_placement("MPS7@1") and not names.is_mps_placement("3g.20gb@4")
    assert names.partition_key("gpu0/mps60@0/1") == "gpu0/mps60@0" == names.partition_key("gpu0/mps60@0")
    assert names.mps_percent("gpu2/mps25@3/0") == 25
    for not_mps in ("gpu0/3g.20gb@4", "gpu0", "cpu0/0"):
        assert runtime_key_parse(not_mps).partition_key is None and not runtime_key_parse(not_mps).is_mps
        with pytest.raises(ValueError, match="not on an MPS partition"):
            names.partition_key(not_mps)
        with pytest.raises(ValueError, match="not on an MPS partition"):
            names.mps_percent(not_mps)


def test_instance_ids() -> None:
    host, key = instance_id_parse("sim-mps-01/gpu0/mps60@0/1")
    assert host == "sim-mps-01" and key.partition_key == "gpu0/mps60@0" and key.slot == 1
    assert instance_id("sim-mps-01", "gpu0/mps60@0/1") == "sim-mps-01/gpu0/mps60@0/1"
    assert instance_id_parse("sim-cpu-01/cpu0/0")[1].slot == 0
    for bad in ("gpu0", "/gpu0", "h/gpu0/3g.20gb@4/1"):
        with pytest.raises(ValueError):
            instance_id_parse(bad)
