"""A plan as Triton model repositories, for teams that serve with Triton and use Tessera as their planner
(`tessera plan export <plan id> --format triton-repository --out DIR`).

What `plan_triton_repository_export` writes under `out` (created whole, or not at all):

    index.json                      the plan, and per server: host, device, placement, what CUDA sees,
                                    ports, the resource a Kubernetes pod would request under each of the
                                    device plugin's MIG strategies, its models and their routing weights;
                                    per host, what the device plugin would advertise under each strategy
    <host>/launch.sh                one `tritonserver` line per server of the host
    <host>/<server>/<model>/config.pbtxt
    <host>/<server>/<model>/1/model.onnx   the variant's artifact, its sha256 checked on the way

One server per MIG instance, whole GPU, MPS partition or CPU allotment, as Tessera runs one runtime
process per instance: `CUDA_VISIBLE_DEVICES` names the MIG device (`MIG-…` UUID, as NVML and the
inventory report it) or the GPU, so each server sees exactly its slice as device 0. An instance the plan
creates has no UUID yet: its line reads it from a shell variable that stops the script with a message
until it is set. Each server of a host gets its own ports (HTTP 8000 + 10 i, gRPC + 1, metrics + 2).

The runtimes are resolved as applying the plan would resolve them (`host_desired_state_validate`): the
batching SLO and drop rule from the application's SLO policy, the profile from the registry. The
translation into Triton's configuration is the engine's (engine/dataplane/triton.py)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError

from apps.deployments.services import host_desired_state_validate
from apps.inventory.models import Host
from apps.registry.models import ModelVariant
from engine.dataplane.triton import TritonExportError, triton_config_pbtxt, triton_model_config
from engine.geometry.device_plugin import MIG_STRATEGIES, DevicePluginRefusal, GpuView, device_plugin_resource, device_plugin_resources
from engine.geometry.layout import placement_parse
from engine.geometry.names import instance_id, runtime_key_parse

from .models import Plan

__all__ = ["TRITON_BASE_PORT", "TritonRepositoryExport", "plan_triton_repository_export"]

TRITON_BASE_PORT = 8000  # Triton's own default HTTP port; server i of a host uses 8000 + 10 i, +1 gRPC, +2 metrics
_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class TritonRepositoryExport:
    """What was written: the index (as in index.json) and the number of servers and models."""

    out: Path
    index: dict[str, Any] = field(default_factory=dict)

    @property
    def servers(self) -> list[dict[str, Any]]:
        return self.index["servers"]


def _fail(plan: Plan, message: str) -> TritonExportError:
    return TritonExportError(f"plan {plan.pk}: {message}")


def _server_key(runtime: dict[str, Any]) -> str:
    """The server a runtime belongs to: its own key, but the partition for a model in an MPS partition."""
    rk = runtime_key_parse(runtime["key"])
    return f"{rk.device}/{rk.placement}" if rk.mps_percent is not None else rk.key


def _shell_variable(host: str, server: str) -> str:
    return "TESSERA_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{host}_{server}").upper().strip("_")


def _visible_devices(host: Host, server: str, runtime: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The environment of the server's process ({} for none) and, where a device's UUID is not known yet,
    the shell variable its line reads it from."""
    rk = runtime_key_parse(runtime["key"])
    if rk.kind == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}, None  # no GPU: the ONNX Runtime backend runs on the CPU
    gpu = host.accelerators.filter(kind="gpu", index=rk.index).prefetch_related("gpu_instances").first()
    pending = _shell_variable(host.name, server)
    if rk.mps_percent is not None:
        env = {"CUDA_VISIBLE_DEVICES": gpu.uuid if gpu is not None and gpu.uuid else f"${{{pending}}}",
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(rk.mps_percent)}
        return env, None if gpu is not None and gpu.uuid else pending
    if rk.placement is None:
        if gpu is not None and gpu.uuid:
            return {"CUDA_VISIBLE_DEVICES": gpu.uuid}, None
        return {"CUDA_VISIBLE_DEVICES": f"${{{pending}}}"}, pending
    placement = placement_parse(runtime["placement"])
    existing = None
    if gpu is not None and gpu.mig_enabled:
        existing = next((gi for gi in gpu.gpu_instances.all()
                         if gi.placement_start == placement.start and gi.profile == placement.profile and gi.uuid), None)
    if existing is not None:
        return {"CUDA_VISIBLE_DEVICES": existing.uuid}, None
    return {"CUDA_VISIBLE_DEVICES": f"${{{pending}}}"}, pending


def _device_plugin(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per MIG strategy, what NVIDIA's device plugin would advertise on the host once its GPUs are as the
    desired state has them: {"resources": {name: count}} or {"refused": why}."""
    gpus = [GpuView(bool(g.get("mig_enabled")), tuple(placement_parse(p).profile for p in g.get("layout") or []))
            for g in doc["gpus"]]
    out: dict[str, dict[str, Any]] = {}
    for strategy in MIG_STRATEGIES:
        try:
            out[strategy] = {"resources": device_plugin_resources(strategy, gpus)}
        except DevicePluginRefusal as exc:
            out[strategy] = {"refused": str(exc)}
    return out


def _kubernetes_resources(runtime: dict[str, Any], plugin: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Per device-plugin MIG strategy, the resource a pod requests to get this server's device. None where
    the strategy offers no such device (a MIG instance under `none`; MPS partitions and CPU allotments are
    not device-plugin devices) or the plugin would refuse the host's GPUs as planned (`single` with mixed
    profiles or MIG modes)."""
    rk = runtime_key_parse(runtime["key"])
    if rk.kind == "cpu" or rk.mps_percent is not None:
        return {strategy: None for strategy in MIG_STRATEGIES}
    profile = placement_parse(runtime["placement"]).profile if runtime.get("placement") else None
    return {strategy: None if "refused" in plugin[strategy] else device_plugin_resource(strategy, profile) for strategy in MIG_STRATEGIES}


def _model_names(runtimes: list[dict[str, Any]]) -> list[str]:
    """Each runtime's model name in its server: the application's (what a client asks for), qualified by
    the variant where two runtimes of one server serve the same application."""
    counts: dict[str, int] = {}
    for r in runtimes:
        counts[r["application"]] = counts.get(r["application"], 0) + 1
    return [r["application"] if counts[r["application"]] == 1 else f"{r['application']}.{r['variant']['name']}" for r in runtimes]


def _specs(variant: ModelVariant, field_name: str) -> list[dict[str, Any]]:
    """The variant's tensor specs, or its artifact's where it declares none (as ModelVariant.clean fills them)."""
    return getattr(variant, field_name) or (getattr(variant.artifact, field_name) if variant.artifact is not None else [])


def _artifact_copy(plan: Plan, variant: ModelVariant, target: Path) -> None:
    """Copy the variant's artifact to `target`, checking its sha256 against the registry's."""
    artifact = variant.artifact
    digest = hashlib.sha256()
    try:
        with artifact.file.open("rb") as source, target.open("wb") as sink:
            while chunk := source.read(_COPY_CHUNK):
                digest.update(chunk)
                sink.write(chunk)
    except OSError as exc:
        raise _fail(plan, f"cannot read artifact {artifact.pk} of {variant}: {exc.strerror or exc}") from exc
    if digest.hexdigest() != artifact.sha256:
        raise _fail(plan, f"artifact {artifact.pk} of {variant} no longer matches its sha256 (the stored file changed)")


def _routing_weights(plan: Plan) -> dict[str, float]:
    """{"<host>/<runtime key>": weight} from the plan's routing tables."""
    return {route["instance"]: float(route["weight"]) for routes in (plan.routing or {}).values() for route in routes}


def _launch_line(env: dict[str, str], repository: str, ports: dict[str, int]) -> str:
    assignments = " ".join(f"{name}={value}" if value else f"{name}=" for name, value in env.items())
    return (f"{assignments} tritonserver --model-repository=\"$EXPORT_DIR/{repository}\" --http-port={ports['http']} "
            f"--grpc-port={ports['grpc']} --metrics-port={ports['metrics']} &")


def plan_triton_repository_export(*, plan: Plan, out: Path) -> TritonRepositoryExport:
    """Write the plan's runtimes as Triton model repositories under `out` (see the module docstring).
    `out` must not exist yet (or be an empty folder); nothing is left there when the export fails.
    Raises TritonExportError with the reason."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _fail(plan, f"{out} exists and is not an empty folder; give a new one")
    if not plan.desired_states:
        raise _fail(plan, f"it has no desired states (status {plan.status}): nothing to export")
    weights = _routing_weights(plan)
    hosts = {h.name: h for h in Host.objects.filter(name__in=list(plan.desired_states))}
    resolved: dict[str, dict[str, Any]] = {}
    for host_name, spec in sorted(plan.desired_states.items()):
        host = hosts.get(host_name)
        if host is None:
            raise _fail(plan, f"host {host_name} is no longer in the inventory")
        try:
            resolved[host_name] = host_desired_state_validate(host=host, spec=spec)
        except ValidationError as exc:
            raise _fail(plan, f"the desired state of {host_name} no longer applies: {'; '.join(exc.messages)}") from exc
    variant_ids = {r["variant"]["id"] for doc in resolved.values() for r in doc["runtimes"]}
    variants = ModelVariant.objects.select_related("application", "artifact").in_bulk(list(variant_ids))

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        servers: list[dict[str, Any]] = []
        device_plugin: dict[str, dict[str, Any]] = {}
        for host_name, doc in resolved.items():
            plugin = device_plugin[host_name] = _device_plugin(doc)
            grouped: dict[str, list[dict[str, Any]]] = {}
            for runtime in doc["runtimes"]:
                grouped.setdefault(_server_key(runtime), []).append(runtime)
            lines = []
            for i, (server, runtimes) in enumerate(sorted(grouped.items())):
                directory = server.replace("/", "-")
                repository = f"{host_name}/{directory}"
                ports = {"http": TRITON_BASE_PORT + 10 * i, "grpc": TRITON_BASE_PORT + 10 * i + 1, "metrics": TRITON_BASE_PORT + 10 * i + 2}
                env, pending = _visible_devices(hosts[host_name], server, runtimes[0])
                models = []
                for name, runtime in zip(_model_names(runtimes), runtimes):
                    variant = variants[runtime["variant"]["id"]]
                    if variant.artifact is None:
                        raise _fail(plan, f"variant {variant} has no artifact; a Triton model repository needs the model file")
                    try:
                        config = triton_model_config(name=name, runtime=runtime, inputs=_specs(variant, "inputs"),
                                                     outputs=_specs(variant, "outputs"))
                    except TritonExportError as exc:
                        raise _fail(plan, f"{instance_id(host_name, runtime['key'])} ({variant}): {exc}") from exc
                    model_dir = staging / repository / name
                    (model_dir / "1").mkdir(parents=True)
                    (model_dir / "config.pbtxt").write_text(triton_config_pbtxt(config))
                    _artifact_copy(plan, variant, model_dir / "1" / "model.onnx")
                    models.append({
                        "name": name, "application": runtime["application"], "variant": variant.name,
                        "runtime_key": runtime["key"], "max_batch_size": config.max_batch_size,
                        "max_queue_delay_microseconds": config.queue_delay_us,
                        "weight": weights.get(instance_id(host_name, runtime["key"]), 0.0),
                    })
                launch = _launch_line(env, repository, ports)
                lines.append(launch)
                servers.append({
                    "host": host_name, "server": server, "repository": repository, "device": runtimes[0]["device"],
                    "placement": runtimes[0].get("placement"), "environment": env, "pending_device_variable": pending,
                    "ports": ports, "kubernetes_resource": _kubernetes_resources(runtimes[0], plugin), "models": models,
                    "launch": launch,
                })
            script = staging / host_name / "launch.sh"
            script.parent.mkdir(parents=True, exist_ok=True)
            pending_checks = [f": \"${{{s['pending_device_variable']}:?set it to the UUID of {s['device']} {s['placement'] or ''} "
                              "once the instance exists (nvidia-smi -L)}\"" for s in servers
                              if s["host"] == host_name and s["pending_device_variable"]]
            script.write_text("#!/bin/sh\n# Tessera plan {pk}: the Triton servers of host {host}, one per instance.\n"
                              "set -eu\nEXPORT_DIR=\"$(cd \"$(dirname \"$0\")/..\" && pwd)\"\n{checks}{lines}\nwait\n".format(
                                  pk=plan.pk, host=host_name, checks="".join(c + "\n" for c in pending_checks), lines="\n".join(lines)))
            script.chmod(0o755)
        index = {"plan": plan.pk, "status": plan.status, "format": "triton-repository", "servers": servers,
                 "device_plugin": device_plugin}
        (staging / "index.json").write_text(json.dumps(index, indent=1) + "\n")
        staging.chmod(0o755)  # mkdtemp's folder is private; the export is not
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return TritonRepositoryExport(out=out, index=index)
