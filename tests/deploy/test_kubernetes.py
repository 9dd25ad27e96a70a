"""deploy/kubernetes: every resource as it will be applied (the base alone, with each component, the
production overlay, and the example Secrets) validated by kubernetes-validate against the Kubernetes API
schemas in strict mode (unknown fields refused), and what a schema cannot see checked against the code:
probes against the paths the processes serve, commands against the real CLIs, Secret and ConfigMap keys
against what the settings require, the agent's GPU resources against the device plugin's naming."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.test import Client, override_settings
from django.urls import resolve

from apps.core.views import healthz
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.device_plugin import GPU_RESOURCE, GpuView, device_plugin_resources
from engine.geometry.layout import mig_layouts_enumerate
from tests.deploy.commands import REPO, command_check, production_settings_load
from tests.deploy.kustomize import json_patch, render, yaml_documents
from workers.agent.exporter import AgentExporter
from workers.router.app import Router

K8S = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes release still maintained when this was written, and the newest schemas the
# installed kubernetes-validate has.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
BUILDS = {
    "base": K8S / "base",
    "production": K8S / "overlays" / "production",
}
COMPONENTS = ("device-plugin-none", "device-plugin-off")


def _with_component(component: str) -> list[dict]:
    """The base with one component, as an overlay naming it would build."""
    return render(K8S / "base", components=(K8S / "components" / component,))


def _builds() -> dict[str, list[dict]]:
    out = {name: render(path) for name, path in BUILDS.items()}
    for component in COMPONENTS:
        out[f"base+{component}"] = _with_component(component)
    out["secrets.example"] = yaml_documents(K8S / "secrets.example.yaml")
    return out


BUILT = _builds()


def _find(resources: list[dict], kind: str, name: str) -> dict:
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def _pod_specs(resources: list[dict]):
    for r in resources:
        if r["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield r, r["spec"]["template"]["spec"]


def _containers(resources: list[dict]):
    for r, pod in _pod_specs(resources):
        for c in pod.get("initContainers", []) + pod["containers"]:
            yield r, pod, c


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("build", sorted(BUILT))
def test_every_resource_passes_the_strict_api_schema(build, version):
    resources = BUILT[build]
    assert resources
    for resource in resources:
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_validator_is_strict_about_unknown_fields():
    """What the test above relies on: a misspelt field fails validation (not just a wrong type)."""
    web = _find(BUILT["base"], "Deployment", "tessera-web")
    typo = json_patch(web, [{"op": "add", "path": "/spec/template/spec/containers/0/readinessProbe/httpget", "value": {}}])
    with pytest.raises(kubernetes_validate.ValidationError, match="httpget"):
        kubernetes_validate.validate(typo, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its kustomize) is not installed")
@pytest.mark.parametrize("build", ["base", "production", *COMPONENTS])
def test_the_renderer_agrees_with_kubectl_kustomize(build, tmp_path):
    """The tests' renderer against the real kustomize (kubectl's), resource for resource."""
    if build in COMPONENTS:
        overlay = tmp_path / "overlay"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(K8S / "base", overlay)], "components": [os.path.relpath(K8S / "components" / build, overlay)]}))
        ours, folder = BUILT[f"base+{build}"], overlay
    else:
        ours, folder = BUILT[build], BUILDS[build]
    built = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    theirs = [d for d in yaml.safe_load_all(built.stdout) if d]

    def keyed(docs):
        return {(d["kind"], d["metadata"]["name"]): d for d in docs}

    assert keyed(theirs) == keyed(ours)


# --------------------------------------------------------------------------- commands


def _command_line(container: dict) -> list[list[str]]:
    """The command lines a container runs: its command + args, or for `/bin/sh -c SCRIPT` the line it execs."""
    argv = container.get("command", []) + container.get("args", [])
    if argv[:2] != ["/bin/sh", "-c"]:
        return [argv]
    execs = [line.strip()[len("exec "):] for line in argv[2].splitlines() if line.strip().startswith("exec ")]
    assert len(execs) == 1, argv
    return [shlex.split(execs[0])]


def _expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Shell variables in an exec line ($POD_IP) replaced by `env`'s values, as the pod's shell would."""
    return [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], a) for a in argv]


def _container_env(resources: list[dict], container: dict) -> dict[str, str]:
    """The environment the container's process gets: its ConfigMap and Secret values (the example
    Secrets'), the downward API's fields as stand-ins, and what its wrapper exports."""
    configs = {r["metadata"]["name"]: r["data"] for r in resources if r["kind"] == "ConfigMap"}
    secrets = _secrets()
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configs[source["configMapRef"]["name"]])
        if "secretRef" in source:
            env.update(secrets[source["secretRef"]["name"]])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in ref:
            env[var["name"]] = configs[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        elif "fieldRef" in ref:
            env[var["name"]] = {"spec.nodeName": "gpu-node-1", "metadata.name": "tessera-router-0", "status.podIP": "10.0.0.7"}[ref["fieldRef"]["fieldPath"]]
    script = (container.get("args") or [""])[0] if container.get("command") == ["/bin/sh", "-c"] else ""
    for exported in re.findall(r"^\s*export (\w+)=", script, flags=re.M):
        env[exported] = f"value of {exported}"
    return env


@pytest.mark.parametrize("build", ["base", "production", "base+device-plugin-none"])
def test_every_command_is_one_the_real_clis_accept(build):
    seen = set()
    for resource, _pod, container in _containers(BUILT[build]):
        env = _container_env(BUILT[build], container)
        for argv in _command_line(container):
            program, parsed = command_check(_expand(argv, env), env)
            seen.add((program, tuple(parsed[0]) if program == "tessera" else parsed[0] if program == "django" else argv[3]))
    assert seen == {
        ("tessera", ("serve",)), ("tessera", ("ingest",)), ("tessera", ("worker",)), ("tessera", ("router",)),
        ("tessera", ("agent",)), ("django", "migrate"), ("django", "collectstatic"), ("celery", "beat"),
    }


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_ports_services_and_the_control_plane_url_agree():
    base = BUILT["base"]
    web = _find(base, "Deployment", "tessera-web")["spec"]["template"]["spec"]["containers"][0]
    ingest = _find(base, "Deployment", "tessera-ingest")["spec"]["template"]["spec"]["containers"][0]
    router = _find(base, "StatefulSet", "tessera-router")["spec"]["template"]["spec"]["containers"][0]
    agent = _find(base, "DaemonSet", "tessera-agent")["spec"]["template"]["spec"]["containers"][0]
    assert _ports(web)["http"] == int(web["command"][web["command"].index("--port") + 1]) == 8000
    assert _ports(ingest)["http"] == int(ingest["command"][ingest["command"].index("--port") + 1]) == 8001
    (router_argv,) = _command_line(router)
    assert _ports(router)["http"] == int(router_argv[router_argv.index("--listen") + 1].rpartition(":")[2])
    (agent_argv,) = _command_line(agent)
    assert _ports(agent)["metrics"] == int(agent_argv[agent_argv.index("--metrics-port") + 1])
    # Each Service selects pods that exist and targets a port they name.
    for service in (r for r in base if r["kind"] == "Service"):
        pods = [(r, pod) for r, pod in _pod_specs(base)
                if all(r["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())]
        assert pods, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert all(port["targetPort"] in _ports(pod["containers"][0]) for _r, pod in pods), service["metadata"]["name"]
    # Agents and routers are pointed at tessera ingest's Service, in the namespace the base puts it.
    config = _find(base, "ConfigMap", "tessera-config")["data"]
    ingest_service = _find(base, "Service", "tessera-ingest")
    assert config["TESSERA_CONTROL_PLANE"] == (
        f"http://{ingest_service['metadata']['name']}.{ingest_service['metadata']['namespace']}.svc:{ingest_service['spec']['ports'][0]['port']}")
    statefulset = _find(base, "StatefulSet", "tessera-router")
    assert _find(base, "Service", statefulset["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def _fake_tessera(bin_dir: Path, record: Path) -> None:
    bin_dir.mkdir()
    fake = bin_dir / "tessera"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$TESSERA_AGENT_TOKEN$TESSERA_ROUTER_TOKEN\" \"$@\" > {record}\n")
    fake.chmod(0o755)


@pytest.mark.parametrize(("kind", "name", "identity", "secret_dir"), [
    ("DaemonSet", "tessera-agent", "NODE_NAME", "/etc/tessera/agent-tokens"),
    ("StatefulSet", "tessera-router", "POD_NAME", "/etc/tessera/router-credentials"),
])
def test_the_credential_wrappers_pick_this_pods_key_or_say_what_is_missing(kind, name, identity, secret_dir, tmp_path):
    """The shell wrappers, run for real: each pod reads the key named after its node (agent) or itself
    (router) from the mounted Secret, and exports it as the token the CLI reads."""
    container = _find(BUILT["base"], kind, name)["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == secret_dir)
    assert mount["readOnly"]
    script = container["args"][0].replace(secret_dir, str(tmp_path / "secret"))
    (tmp_path / "secret").mkdir()
    record = tmp_path / "argv"
    _fake_tessera(tmp_path / "bin", record)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", identity: "gpu-node-7", "POD_IP": "10.0.0.7"}
    missing = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "gpu-node-7" in missing.stderr and not record.exists()
    (tmp_path / "secret" / "gpu-node-7").write_text("tsx_secret_of_gpu-node-7")
    ran = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    token, *argv = record.read_text().splitlines()
    assert token == "tsx_secret_of_gpu-node-7"
    assert argv == _expand(_command_line(container)[0], env)[1:] and ("10.0.0.7" in argv) == (identity == "NODE_NAME")


# --------------------------------------------------------------------------- secrets and settings


def _secret_refs(resources: list[dict]) -> dict[str, set[str]]:
    """{Secret name: keys the manifests read from it} (envFrom reads the whole Secret: key set empty)."""
    refs: dict[str, set[str]] = {}
    for _r, pod, container in _containers(resources):
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                refs.setdefault(source["secretRef"]["name"], set())
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.setdefault(ref["name"], set()).add(ref["key"])
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                refs.setdefault(volume["secret"]["secretName"], set())
    return refs


def _secrets() -> dict[str, dict[str, str]]:
    return {s["metadata"]["name"]: s["stringData"] for s in BUILT["secrets.example"]}


def test_every_secret_the_manifests_read_is_in_the_example_with_its_keys():
    secrets = _secrets()
    for build in ("base", "production"):
        for name, keys in _secret_refs(BUILT[build]).items():
            assert name in secrets, f"{build} reads Secret {name}, which secrets.example.yaml does not show"
            assert keys <= set(secrets[name])
    # ConfigMap keys read one by one exist too.
    config = _find(BUILT["base"], "ConfigMap", "tessera-config")["data"]
    for _r, _pod, container in _containers(BUILT["base"]):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["name"] == "tessera-config" and ref["key"] in config


def test_the_secret_and_config_are_exactly_what_production_settings_need():
    """The control plane's environment (ConfigMap + tessera-secrets) loads the production settings, and
    each secret is required: without it start-up stops with ImproperlyConfigured."""
    config = _find(BUILT["base"], "ConfigMap", "tessera-config")["data"]
    secrets = _secrets()["tessera-secrets"]
    assert config["DJANGO_SETTINGS_MODULE"] == "controlplane.settings.production"
    loaded = production_settings_load({**config, **secrets})
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == config["TESSERA_MEDIA_ROOT"]
    for key in secrets:
        without = production_settings_load({**config, **{k: v for k, v in secrets.items() if k != key}})
        assert without.returncode != 0 and "ImproperlyConfigured" in without.stderr and key in without.stderr


# --------------------------------------------------------------------------- probes


def _probes(container: dict) -> list[dict]:
    return [container[p] for p in ("readinessProbe", "livenessProbe", "startupProbe") if p in container]


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["tessera-web", "tessera-ingest"])
def test_control_plane_probes_reach_healthz_as_the_kubelet_sends_them(name):
    """The readiness probe's path is the health view, and a GET the way the kubelet sends it (plain HTTP,
    the probe's Host header) passes the production settings' host check and HTTPS redirect: 200. Without
    the header the kubelet would send the pod's IP, which Django refuses."""
    base = BUILT["base"]
    container = _find(base, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    config = _find(base, "ConfigMap", "tessera-config")["data"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    redirect = env.get("DJANGO_SECURE_SSL_REDIRECT", "true") == "true"
    readiness = container["readinessProbe"]["httpGet"]
    assert resolve(readiness["path"]).func is healthz
    assert "tcpSocket" in container["livenessProbe"]  # a database outage takes it out of rotation, not down
    host = next(h["value"] for h in readiness["httpHeaders"] if h["name"] == "Host")
    with override_settings(ALLOWED_HOSTS=config["DJANGO_ALLOWED_HOSTS"].split(","), SECURE_SSL_REDIRECT=redirect,
                           SECURE_REDIRECT_EXEMPT=[r"^healthz$"]):
        client = Client()
        answered = client.get(readiness["path"], HTTP_HOST=f"{host}:{container['ports'][0]['containerPort']}")
        assert answered.status_code == 200, answered.content
        assert answered.json()["status"] in ("ok", "degraded")
        assert client.get(readiness["path"], HTTP_HOST="10.1.2.3:8000").status_code == 400
        if redirect:  # what the probe's exemption is for: every other plain-HTTP request is sent to HTTPS
            assert client.get("/api/v1/", HTTP_HOST=host).status_code == 301


def test_router_probes_reach_its_healthz():
    container = _find(BUILT["base"], "StatefulSet", "tessera-router")["spec"]["template"]["spec"]["containers"][0]
    paths = {p["httpGet"]["path"] for p in _probes(container)}
    assert paths == {"/healthz"}
    router = Router(lambda: [], None, name="tessera-router-0")
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(router({"type": "http", "method": "GET", "path": "/healthz", "headers": [], "query_string": b""}, receive, send))
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["status"] == "ok"


def test_agent_probes_reach_its_exporter():
    container = _find(BUILT["base"], "DaemonSet", "tessera-agent")["spec"]["template"]["spec"]["containers"][0]
    probes = _probes(container)
    assert {p["httpGet"]["path"] for p in probes} == {"/metrics"} and {p["httpGet"]["port"] for p in probes} == {"metrics"}
    exporter = AgentExporter(hostname="gpu-node-7")
    port = exporter.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        exporter.close()


# --------------------------------------------------------------------------- the agent and the GPUs


def _agent(build: str) -> dict:
    return _find(BUILT[build], "DaemonSet", "tessera-agent")["spec"]["template"]["spec"]


def _nvidia_resources(container: dict) -> dict[str, str]:
    resources = container.get("resources", {})
    return {k: v for part in ("requests", "limits") for k, v in resources.get(part, {}).items() if k.startswith("nvidia.com/")}


def test_the_agent_owns_its_nodes_gpus_as_mig_manager_does():
    pod = _agent("base")
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["securityContext"] == {"privileged": True}
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["NVIDIA_MIG_CONFIG_DEVICES"] == env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert pod["nodeSelector"] == {"nvidia.com/mig.capable": "true", "nvidia.com/gpu.deploy.mig-manager": "false"}
    assert pod["runtimeClassName"] == "nvidia"
    assert _nvidia_resources(container) == {}
    (argv,) = _command_line(container)
    assert argv[argv.index("--backend") + 1] == "nvml" and "--stop-runtimes-on-exit" in argv
    # Nothing here asks mig-manager for a layout: the nvidia.com/mig.config label is never set.
    for path in K8S.rglob("*.yaml"):
        assert "nvidia.com/mig.config" not in "".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#"))


A100 = mig_catalogue_load().gpu_model_find("A100-SXM4-40GB")


def test_under_strategy_none_the_agent_takes_exactly_what_the_plugin_advertises_whatever_the_layout():
    pod = _agent("base+device-plugin-none")
    (container,) = pod["containers"]
    count = int(pod["nodeSelector"]["nvidia.com/gpu.count"])
    assert _nvidia_resources(container) == {GPU_RESOURCE: str(count)}
    layouts = mig_layouts_enumerate(A100, maximal=True)
    for layout in (layouts[0], layouts[len(layouts) // 2], layouts[-1], ()):
        views = [GpuView(bool(layout), tuple(p.profile for p in layout))] * count
        assert device_plugin_resources("none", views) == {GPU_RESOURCE: count}


def test_under_single_or_mixed_the_agent_goes_only_where_the_plugin_is_off():
    pod = _agent("base+device-plugin-off")
    (container,) = pod["containers"]
    assert _nvidia_resources(container) == {}
    assert pod["nodeSelector"]["nvidia.com/gpu.deploy.device-plugin"] == "false"
    # Why: under these strategies what the node offers changes with every layout the agent applies.
    two = [mig_layouts_enumerate(A100, maximal=True)[i] for i in (0, -1)]
    mixed = [device_plugin_resources("mixed", [GpuView(True, tuple(p.profile for p in layout))]) for layout in two]
    assert mixed[0] != mixed[1] and all(name.startswith("nvidia.com/mig-") for m in mixed for name in m)


def test_the_production_overlay_uses_its_registry_and_the_none_component():
    images = {c["image"] for _r, _pod, c in _containers(BUILT["production"])}
    assert images == {"registry.example.org/tessera/tessera:0.1.0", "registry.example.org/tessera/tessera-agent:0.1.0"}
    production, none = _agent("production"), _agent("base+device-plugin-none")
    assert production["nodeSelector"] == none["nodeSelector"]
    assert _nvidia_resources(production["containers"][0]) == _nvidia_resources(none["containers"][0]) == {GPU_RESOURCE: "8"}
