"""The device plugin's resources per MIG strategy (engine/geometry/device_plugin.py) and a runtime as a
Triton configuration (engine/dataplane/triton.py), the latter read back into Triton's own ModelConfig."""
from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine.dataplane.triton import (
    TritonExportError,
    triton_config_pbtxt,
    triton_model_config,
    triton_queue_delay_us,
    triton_queue_timeout_us,
)
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.device_plugin import DevicePluginRefusal, GpuView, device_plugin_resource, device_plugin_resources
from engine.geometry.layout import mig_layouts_enumerate

A100 = mig_catalogue_load().gpu_model_find("A100-SXM4-40GB")


def _views(layouts):
    return [GpuView(True, tuple(p.profile for p in layout)) for layout in layouts]


def test_under_none_the_advertised_resources_do_not_depend_on_the_mig_layout():
    """Why Tessera's agent can hold all of a node's GPUs under `none` and nowhere else: whatever layouts
    the agent applies, the plugin advertises the same `nvidia.com/gpu` count."""
    layouts = mig_layouts_enumerate(A100, maximal=True)
    assert len(layouts) > 10
    seen_none = {tuple(device_plugin_resources("none", _views([a, b])).items()) for a in layouts[:6] for b in layouts[-6:]}
    assert seen_none == {(("nvidia.com/gpu", 2),)}
    seen_mixed = {tuple(device_plugin_resources("mixed", _views([layout])).items()) for layout in layouts}
    assert len(seen_mixed) > 10  # every layout change renames or recounts what `mixed` advertises


def test_mixed_names_mig_devices_by_profile_with_plus_as_dot():
    views = [GpuView(True, ("3g.20gb", "2g.10gb", "1g.5gb+me")), GpuView(False)]
    assert device_plugin_resources("mixed", views) == {
        "nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb.me": 1, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}
    assert device_plugin_resource("mixed", "1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert device_plugin_resource("none", "3g.20gb") is None
    assert device_plugin_resource("single", "3g.20gb") == device_plugin_resource("none", None) == "nvidia.com/gpu"


def test_single_accepts_uniform_mig_devices_and_refuses_the_rest():
    assert device_plugin_resources("single", [GpuView(True, ("1g.5gb",) * 7)] * 2) == {"nvidia.com/gpu": 14}
    assert device_plugin_resources("single", [GpuView(False)] * 4) == {"nvidia.com/gpu": 4}
    with pytest.raises(DevicePluginRefusal, match="same profile, found 1g.5gb, 3g.20gb"):
        device_plugin_resources("single", [GpuView(True, ("3g.20gb", "1g.5gb"))])
    with pytest.raises(DevicePluginRefusal, match="same migEnabled value"):
        device_plugin_resources("single", [GpuView(True, ("3g.20gb",)), GpuView(False)])
    with pytest.raises(ValueError, match="unknown MIG strategy 'auto'"):
        device_plugin_resources("auto", [])


RUNTIME = {
    "max_batch": 8, "cpu_threads": None,
    "batching": {"slo_ms": 50.0, "drop_rule": "deadline"},
    "profile": [{"batch": 1, "latency_ms": 5.0}, {"batch": 4, "latency_ms": 8.0}, {"batch": 16, "latency_ms": 20.0}],
}
IMAGES = [{"name": "images", "dtype": "tensor(float16)", "shape": ["batch", 3, None, "width"]},
          {"name": "scale", "dtype": "tensor(int64)", "shape": [None, 1]}]
LABELS = [{"name": "labels", "dtype": "tensor(string)", "shape": ["batch"]}]


def _parsed(config) -> model_config_pb2.ModelConfig:
    return text_format.Parse(triton_config_pbtxt(config), model_config_pb2.ModelConfig())


def test_a_gpu_runtime_reads_back_as_triton_model_config():
    parsed = _parsed(triton_model_config(name='odd "name"\\x', runtime=RUNTIME, inputs=IMAGES, outputs=LABELS))
    assert parsed.name == 'odd "name"\\x' and parsed.platform == "onnxruntime_onnx" and parsed.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in parsed.input] == [
        ("images", model_config_pb2.TYPE_FP16, [3, -1, -1]), ("scale", model_config_pb2.TYPE_INT64, [1])]
    assert [(t.name, t.data_type, list(t.dims)) for t in parsed.output] == [("labels", model_config_pb2.TYPE_STRING, [])]
    # Batch 8 lies between the profiled 4 (8 ms) and 16 (20 ms): 12 ms; the SLO leaves 38 ms of waiting.
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 38_000
    assert list(parsed.dynamic_batching.preferred_batch_size) == [8]
    # deadline: rejected once a batch of one (5 ms) could no longer finish within the 50 ms SLO.
    assert parsed.dynamic_batching.default_queue_policy.default_timeout_microseconds == 45_000
    (group,) = parsed.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (1, model_config_pb2.ModelInstanceGroup.KIND_GPU, [0])
    assert not parsed.parameters


def test_a_cpu_runtime_sets_its_threads_and_drop_rules_map_to_queue_policies():
    cpu = {**RUNTIME, "cpu_threads": 6, "batching": {"slo_ms": 50.0, "drop_rule": "never"}}
    parsed = _parsed(triton_model_config(name="m", runtime=cpu, inputs=IMAGES, outputs=LABELS))
    assert parsed.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and not parsed.instance_group[0].gpus
    assert parsed.parameters["intra_op_thread_count"].string_value == "6"
    assert not parsed.dynamic_batching.HasField("default_queue_policy")
    assert triton_queue_timeout_us(drop_rule="slo-1x", slo_ms=50, latency_at_1_ms=5) == 50_000
    assert triton_queue_timeout_us(drop_rule="slo-2x", slo_ms=50, latency_at_1_ms=5) == 100_000
    assert triton_queue_delay_us(slo_ms=10, batch_latency_ms=12) == 0  # the batch alone takes the SLO: no waiting
    with pytest.raises(TritonExportError, match="unknown drop rule 'sometimes'"):
        triton_queue_timeout_us(drop_rule="sometimes", slo_ms=50, latency_at_1_ms=5)


@pytest.mark.parametrize(("inputs", "message"), [
    ([], "declares no input"),
    ([{"name": "x", "dtype": "tensor(float)", "shape": [4, 8]}], r"'x' has shape \[4, 8\]; Triton batches along a first dimension that varies"),
    ([{"name": "x", "dtype": "tensor(complex64)", "shape": ["batch"]}], r"input 'x': tensor type 'tensor\(complex64\)' has no Open Inference Protocol datatype"),
])
def test_tensors_triton_cannot_batch_are_refused(inputs, message):
    with pytest.raises(TritonExportError, match=message):
        triton_model_config(name="m", runtime=RUNTIME, inputs=inputs, outputs=LABELS)


def test_a_loads_configuration_maps_what_it_can_and_names_what_it_cannot() -> None:
    from engine.dataplane.triton import TritonLoadConfigError, TritonLoadSettings, triton_load_config_parse

    parse = lambda config: triton_load_config_parse(config, model="m", inputs=["x"], outputs=["y"])  # noqa: E731
    assert parse("{}") == TritonLoadSettings()  # nothing given: nothing changes
    assert parse({"max_batch_size": 8}) == TritonLoadSettings(max_batch_size=8)
    assert parse('{"max_batch_size": 0}').max_batch_size == 1  # Triton's "no batching": one query per batch
    assert parse({"dynamic_batching": {}}).batching_delay_ms == 0.0  # Triton's default delay
    assert parse({"dynamic_batching": {"max_queue_delay_microseconds": "2500"}}).batching_delay_ms == 2.5  # protobuf JSON's int64
    assert parse({"name": "m", "platform": "onnxruntime_onnx", "backend": "onnxruntime", "input": [{"name": "x", "dims": [4]}],
                  "output": [{"name": "y"}]}) == TritonLoadSettings()
    for config, field in [({"instance_group": []}, "instance_group"), ({"max_batch_size": True}, "max_batch_size"),
                          ({"max_batch_size": 1.5}, "max_batch_size"), ({"output": [{"name": "z"}]}, "output[0].name"),
                          ({"output": {"name": "y"}}, "output"), ({"dynamic_batching": []}, "dynamic_batching"),
                          ({"backend": "python"}, "backend"), ("not json", "config"), (7, "config")]:
        with pytest.raises(TritonLoadConfigError) as caught:
            parse(config)
        assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")
