"""`tessera plan export --format triton-repository`: a stored plan as Triton model repositories, each
config.pbtxt read back by protobuf's text format into Triton's own ModelConfig message
(tritonclient.grpc.model_config_pb2), the model files checked byte for byte, the launch lines run
through a shell."""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from typer.testing import CliRunner

from apps.planning.export import plan_triton_repository_export
from apps.planning.models import Plan
from apps.policies.models import SloPolicy
from apps.registry.services.artifacts import artifact_create
from controlplane.cli import app
from engine.dataplane.triton import TritonExportError
from tests.onnx_builders import onnx_mlp_bytes

pytestmark = pytest.mark.django_db


def _real_artifacts(fleet) -> dict[str, bytes]:
    """Give the fleet's served variants real ONNX files (x [batch, n] -> logits [batch, 3]); their bytes by variant name."""
    files = {}
    for seed, (variant, n_in) in enumerate(((fleet.small, 6), (fleet.big, 6), (fleet.mlp, 8))):
        data = onnx_mlp_bytes(n_in=n_in, seed=seed + 11)
        variant.artifact = artifact_create(upload=io.BytesIO(data), original_name=f"{variant.name}.onnx")
        variant.save()
        files[variant.name] = data
    return files


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_each_instance_is_a_triton_repository_with_its_batching(validated_plan, small_fleet, tmp_path):
    files = _real_artifacts(small_fleet)
    plan = validated_plan({"classify": 2000, "tabular": 100})
    out = tmp_path / "triton"
    export = plan_triton_repository_export(plan=plan, out=out)

    index = json.loads((out / "index.json").read_text())
    assert index == export.index and index["plan"] == plan.pk
    runtimes = {(host, r["key"]): r for host, spec in plan.desired_states.items() for r in spec["runtimes"]}
    assert {(s["host"], m["runtime_key"]) for s in index["servers"] for m in s["models"]} == set(runtimes)
    slo = {"classify": 100.0, "tabular": 40.0}
    for server in index["servers"]:
        (model,) = server["models"]  # no MPS here: one runtime, so one model, per server
        directory = out / server["repository"] / model["name"]
        config = _config(directory / "config.pbtxt")
        runtime = runtimes[(server["host"], model["runtime_key"])]
        app = runtime["application"]
        assert config.name == model["name"] == app and config.platform == "onnxruntime_onnx"
        assert config.max_batch_size == runtime["max_batch"]
        batching = config.dynamic_batching
        assert list(batching.preferred_batch_size) == [runtime["max_batch"]]
        # The profiles of the fleet: classify small/big at 4/8 ms x (1 + (b - 1) / 2) (halved on a whole
        # GPU), tabular mlp 2 ms x b / cores. The delay is the SLO less the batch's latency.
        variant = model["variant"]
        if app == "classify":
            base = {"small": 4.0, "big": 8.0}[variant] * (0.5 if runtime["placement"] is None else 1.0)
            latency = base * (1 + 0.5 * (runtime["max_batch"] - 1))
            latency_1 = base
        else:
            latency = latency_1 = None
        if latency is not None:
            assert batching.max_queue_delay_microseconds == int((slo[app] - latency) * 1000)
            # classify's SLO policy drops on the deadline: what waited past the SLO less a batch of one's latency.
            assert batching.default_queue_policy.default_timeout_microseconds == int((slo[app] - latency_1) * 1000)
        else:
            # tabular drops at twice its SLO (slo-2x).
            assert batching.default_queue_policy.default_timeout_microseconds == 80_000
        assert batching.default_queue_policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
        (group,) = config.instance_group
        assert group.count == 1
        if runtime["cpu_threads"]:
            assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and not group.gpus
            assert config.parameters["intra_op_thread_count"].string_value == str(runtime["cpu_threads"])
            assert server["environment"] == {"CUDA_VISIBLE_DEVICES": ""}
        else:
            assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0]
        # Tensors: the artifact's, the batch dimension left to max_batch_size.
        n_in = 8 if app == "tabular" else 6
        assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", model_config_pb2.TYPE_FP32, [n_in])]
        assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("logits", model_config_pb2.TYPE_FP32, [3])]
        assert (directory / "1" / "model.onnx").read_bytes() == files[variant]
        weights = {r["instance"]: r["weight"] for r in plan.routing[app]}
        assert model["weight"] == weights[f"{server['host']}/{model['runtime_key']}"]


def test_mig_instances_name_their_device_and_the_device_plugin_resource(validated_plan, small_fleet, tmp_path):
    _real_artifacts(small_fleet)
    # A plan that keeps node-a's MIG geometry (proteus keeps layouts; the fleet model may run gpu0 whole).
    plan = validated_plan({"classify": 2000, "tabular": 100}, solver="proteus")
    index = plan_triton_repository_export(plan=plan, out=tmp_path / "t").index
    by_server = {(s["host"], s["server"]): s for s in index["servers"]}
    gpu1 = by_server[("node-a", "gpu1")]  # the whole GPU (MIG off): its GPU UUID, nvidia.com/gpu where the node is accepted
    assert gpu1["environment"]["CUDA_VISIBLE_DEVICES"] == small_fleet.host.accelerators.get(index=1, kind="gpu").uuid
    assert gpu1["kubernetes_resource"] == {"none": "nvidia.com/gpu", "single": None, "mixed": "nvidia.com/gpu"}
    migs = [s for s in index["servers"] if s["placement"]]
    assert migs, "the plan uses a MIG instance"
    for server in migs:
        # The factory's instances have no MIG UUID yet: the line waits for it in a shell variable.
        assert server["pending_device_variable"] and server["environment"]["CUDA_VISIBLE_DEVICES"] == f"${{{server['pending_device_variable']}}}"
        # `single` would refuse node-a (gpu0 in MIG mode, gpu1 not); `none` never hands out a MIG device.
        assert server["kubernetes_resource"] == {"none": None, "single": None, "mixed": "nvidia.com/mig-3g.20gb"}
    plugin = index["device_plugin"]["node-a"]
    assert plugin["none"] == {"resources": {"nvidia.com/gpu": 2}}
    assert plugin["mixed"] == {"resources": {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.20gb": 2}}
    assert "same migEnabled value" in plugin["single"]["refused"]
    assert index["device_plugin"]["node-cpu"] == {"none": {"resources": {}}, "single": {"resources": {}}, "mixed": {"resources": {}}}
    gi = small_fleet.host.accelerators.get(index=0, kind="gpu").gpu_instances.get(placement_start=int(migs[0]["placement"].split("@")[1]))
    gi.uuid = "MIG-0b6c2b65-3a6a-5a7f-9e9e-0123456789ab"
    gi.save()
    again = plan_triton_repository_export(plan=plan, out=tmp_path / "t2").index
    server = next(s for s in again["servers"] if s["server"] == migs[0]["server"])
    assert server["environment"]["CUDA_VISIBLE_DEVICES"] == gi.uuid and server["pending_device_variable"] is None
    assert server["launch"].startswith(f"CUDA_VISIBLE_DEVICES={gi.uuid} tritonserver --model-repository=")


def test_launch_script_runs_one_server_per_instance_and_waits_for_uncreated_devices(validated_plan, small_fleet, tmp_path):
    _real_artifacts(small_fleet)
    plan = validated_plan({"classify": 2000, "tabular": 100}, solver="proteus")  # MIG instances to wait for
    out = tmp_path / "t"
    index = plan_triton_repository_export(plan=plan, out=out).index
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "launched"
    # A stand-in tritonserver that records what it was started with: the script's own shell does the rest.
    fake = bin_dir / "tritonserver"
    fake.write_text(f"#!/bin/sh\necho \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES $*\" >> {record}\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    script = out / "node-a" / "launch.sh"
    refused = subprocess.run([str(script)], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "nvidia-smi -L" in refused.stderr and not record.exists()
    pending = {s["pending_device_variable"]: f"MIG-fake-{i}" for i, s in enumerate(index["servers"]) if s["pending_device_variable"]}
    done = subprocess.run([str(script)], env={**env, **pending}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    launched = sorted(record.read_text().splitlines())
    expected = sorted(
        f"CUDA_VISIBLE_DEVICES={pending.get(s['pending_device_variable'], s['environment']['CUDA_VISIBLE_DEVICES'])} "
        f"--model-repository={out.resolve() / s['repository']} --http-port={s['ports']['http']} --grpc-port={s['ports']['grpc']} "
        f"--metrics-port={s['ports']['metrics']}"
        for s in index["servers"] if s["host"] == "node-a")
    assert launched == expected
    ports = [p for s in index["servers"] if s["host"] == "node-a" for p in s["ports"].values()]
    assert len(ports) == len(set(ports))


def test_a_variant_without_artifact_or_tensors_fails_and_writes_nothing(validated_plan, small_fleet, tmp_path):
    plan = validated_plan({"classify": 2000, "tabular": 100})  # the fleet's classify variants have no artifact
    exports = tmp_path / "exports"  # (the test's media folder is in tmp_path too)
    out = exports / "t"
    with pytest.raises(TritonExportError, match="has no artifact; a Triton model repository needs the model file"):
        plan_triton_repository_export(plan=plan, out=out)
    assert not out.exists() and list(exports.iterdir()) == []
    _real_artifacts(small_fleet)
    small_fleet.mlp.artifact.inputs = [{"name": "x", "dtype": "tensor(float)", "shape": [1, 8]}]  # no batch dimension
    small_fleet.mlp.artifact.save()
    with pytest.raises(TritonExportError, match=r"node-cpu/cpu0/0 .*'x' has shape \[1, 8\]; Triton batches along a first dimension"):
        plan_triton_repository_export(plan=plan, out=out)
    assert list(exports.iterdir()) == []


def test_a_changed_artifact_file_is_refused(validated_plan, small_fleet, tmp_path):
    _real_artifacts(small_fleet)
    plan = validated_plan({"tabular": 100})
    artifact = small_fleet.mlp.artifact
    with open(artifact.file.path, "ab") as fh:
        fh.write(b"tampered")
    with pytest.raises(TritonExportError, match="no longer matches its sha256"):
        plan_triton_repository_export(plan=plan, out=tmp_path / "exports" / "t")
    assert list((tmp_path / "exports").iterdir()) == []


def test_an_existing_folder_and_a_plan_without_desired_states_are_refused(validated_plan, small_fleet, tmp_path):
    _real_artifacts(small_fleet)
    plan = validated_plan({"tabular": 100})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(TritonExportError, match="exists and is not an empty folder"):
        plan_triton_repository_export(plan=plan, out=tmp_path / "busy")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]
    empty = Plan.objects.create(status="failed")
    with pytest.raises(TritonExportError, match="no desired states"):
        plan_triton_repository_export(plan=empty, out=tmp_path / "t")
    # The SLO policy is where the batching SLO comes from: without one, the plan no longer applies.
    SloPolicy.objects.filter(application=small_fleet.tabular).delete()
    with pytest.raises(TritonExportError, match="the desired state of node-cpu no longer applies: .*no SLO policy"):
        plan_triton_repository_export(plan=plan, out=tmp_path / "t")


def test_the_cli_exports_and_says_why_it_cannot(validated_plan, small_fleet, tmp_path):
    _real_artifacts(small_fleet)
    SloPolicy.objects.exclude(application=small_fleet.tabular).update(scale_to_zero=True)  # tabular alone is planned
    plan = validated_plan({"tabular": 100})
    runner = CliRunner()
    out = tmp_path / "t"
    result = runner.invoke(app, ["plan", "export", str(plan.pk), "--format", "triton-repository", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"plan {plan.pk} (validated): 1 Triton server(s), 1 model(s)" in result.output
    config = _config(out / "node-cpu" / "cpu0-0" / "tabular" / "config.pbtxt")
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    digest = hashlib.sha256((out / "node-cpu" / "cpu0-0" / "tabular" / "1" / "model.onnx").read_bytes()).hexdigest()
    assert digest == small_fleet.mlp.artifact.sha256
    for args, message in (
        (["plan", "export", str(plan.pk), "--format", "savedmodel", "--out", str(tmp_path / "x")], "--format must be one of triton-repository"),
        (["plan", "export", "999999", "--format", "triton-repository", "--out", str(tmp_path / "x")], "no plan 999999"),
        (["plan", "export", str(plan.pk), "--format", "triton-repository", "--out", str(out)], "exists and is not an empty folder"),
    ):
        refused = runner.invoke(app, args)
        assert refused.exit_code == 2 and message in refused.output, refused.output
    assert not (tmp_path / "x").exists()
