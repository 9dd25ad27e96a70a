"""compose.yaml: validated against the Compose Specification's JSON schema (tests/deploy/data, vendored from
compose-spec), read by Docker Compose itself (`config`) where it is installed, and held to the Dockerfile and
deploy/kubernetes: one image, the same commands (parsed by the real CLIs), ports, health checks on the same
paths, the secrets required from the environment, and its bootstrap and credential wrappers run for real.
Nothing is started here (no Docker daemon): docs/deploy.md says what was not run."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import resolve

from apps.core.views import healthz
from apps.inventory.models import Host, RouterCredential
from apps.inventory.services import host_by_agent_token, router_credential_by_secret
from apps.users.roles import user_role
from tests.deploy.commands import REPO, command_check, production_settings_load
from tests.deploy.images import COMPOSE, compose_load, dockerfile_stages, interpolate
from tests.deploy.kustomize import render
from tests.deploy.test_kubernetes import _command_line, _container_env, _find, _ports
from workers.agent.backends.simulated import simulated_gpus_parse

SCHEMA = json.loads((Path(__file__).parent / "data" / "compose-spec.json").read_text())
COMPOSE_FILE = compose_load()
SERVICES = COMPOSE_FILE["services"]
STAGES = dockerfile_stages()
BASE = render(REPO / "deploy" / "kubernetes" / "base")
# What the user writes in .env (docs/deploy.md): the secrets compose refuses to start without.
DOTENV = {"DJANGO_SECRET_KEY": "k" * 50, "POSTGRES_PASSWORD": "pg-password", "TESSERA_ADMIN_PASSWORD": "admin-password"}
TESSERA = {name for name, service in SERVICES.items() if service.get("image", "").startswith("tessera:")}
# Which Kubernetes workload runs each control-plane process (kind, name, container or None for the main one).
K8S = {
    "web": ("Deployment", "tessera-web"), "ingest": ("Deployment", "tessera-ingest"),
    "worker": ("Deployment", "tessera-worker"), "beat": ("Deployment", "tessera-beat"),
    "migrate": ("Job", "tessera-migrate"), "router": ("StatefulSet", "tessera-router"),
    "agent": ("DaemonSet", "tessera-agent"),
}


def _k8s(service: str) -> dict:
    kind, name = K8S[service]
    return _find(BASE, kind, name)["spec"]["template"]["spec"]["containers"][0]


def _environment(service: str) -> dict[str, str]:
    """The service's environment as compose gives it (interpolated with the example .env) over the image's ENV."""
    env = STAGES["tessera"].pairs("ENV") if service in TESSERA else {}
    env = {k: v for k, v in env.items() if "$" not in v}  # PATH=...:$PATH
    declared = SERVICES[service].get("environment", {})
    env.update({k: interpolate(str(v), DOTENV) for k, v in declared.items()})
    return env


def _commands(service: str) -> list[list[str]]:
    """The command lines a service runs: its command, or the lines of its `/bin/sh -c` script that run a
    program of the image (python, tessera, celery; $$ read as $)."""
    command = [interpolate(str(a), DOTENV) for a in SERVICES[service]["command"]]
    if command[:2] != ["/bin/sh", "-c"]:
        return [command]
    lines = []
    for line in command[2].splitlines():
        argv = shlex.split(line.strip().removeprefix("exec "))
        if argv and argv[0] in ("python", "tessera", "celery"):
            lines.append(argv)
    return lines


# --------------------------------------------------------------------------- the specification and Compose itself


def test_compose_yaml_is_valid_under_the_compose_specification():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(COMPOSE_FILE)


def test_the_schema_check_refuses_what_compose_would_refuse():
    """What the test above relies on: a misspelt key and a wrong type each fail."""
    validator = jsonschema.Draft7Validator(SCHEMA)
    typo = copy.deepcopy(COMPOSE_FILE)
    typo["services"]["web"]["healthcheck"]["intervall"] = "5s"
    assert any("intervall" in e.message for e in validator.iter_errors(typo))
    wrong = copy.deepcopy(COMPOSE_FILE)
    wrong["services"]["web"]["depends_on"]["bootstrap"]["condition"] = "service_done"
    assert list(validator.iter_errors(wrong))


def _docker_compose() -> list[str] | None:
    """Docker Compose v2 (`docker compose`, or a standalone `docker-compose` v2), or None."""
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]):
            shown = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True, timeout=60)
            if shown.returncode == 0 and shown.stdout.strip().lstrip("v").startswith("2."):
                return argv
    return None


@pytest.mark.skipif(_docker_compose() is None, reason="Docker Compose v2 is not installed (`config` needs no daemon)")
def test_docker_compose_reads_it_and_refuses_to_start_without_the_secrets(tmp_path):
    """Compose's own loader: interpolation, merge keys, every key and reference; `config` needs no daemon."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    checked = subprocess.run([*_docker_compose(), "-f", str(COMPOSE), "config", "--quiet"], cwd=tmp_path,
                             env={**env, **DOTENV}, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    for name in DOTENV:
        without = subprocess.run([*_docker_compose(), "-f", str(COMPOSE), "config", "--quiet"], cwd=tmp_path,
                                 env={**env, **{k: v for k, v in DOTENV.items() if k != name}}, capture_output=True, text=True, timeout=120)
        assert without.returncode != 0 and f"required variable {name} is missing a value" in without.stderr


# --------------------------------------------------------------------------- services and the image


def test_the_stack_runs_the_production_processes_from_the_tessera_image():
    assert set(SERVICES) == {"postgres", "redis", "migrate", "bootstrap", "web", "ingest", "worker", "beat", "router", "agent"}
    assert TESSERA == set(SERVICES) - {"postgres", "redis"}
    labels = STAGES["tessera"].pairs("LABEL")
    for name in TESSERA:
        service = SERVICES[name]
        assert service["image"] == f"{labels['org.opencontainers.image.title']}:{labels['org.opencontainers.image.version']}"
        assert service["build"] == {"context": ".", "target": "tessera"}
    assert {_k8s(s)["image"] for s in K8S if s != "agent"} == {SERVICES["web"]["image"]}
    # The one simulated agent needs no GPU: the control plane's image, not tessera-agent's CUDA one.
    (agent_argv,) = _commands("agent")
    assert agent_argv[agent_argv.index("--backend") + 1] == "simulated"
    assert len(simulated_gpus_parse(agent_argv[agent_argv.index("--simulate") + 1])) == 1  # GPUs of the catalogue


def test_every_command_is_one_the_real_clis_accept_in_its_environment():
    seen = set()
    for name in sorted(TESSERA):
        env = _environment(name)
        for argv in _commands(name):
            if argv[:2] == ["python", "deploy/docker/bootstrap.py"]:
                continue  # run for real below
            program, parsed = command_check(argv, {**env, "TESSERA_AGENT_TOKEN": "tsa_x", "TESSERA_ROUTER_TOKEN": "tsr_x"})
            seen.add((name, program, tuple(parsed[0]) if program == "tessera" else parsed[0] if program == "django" else argv[3]))
    assert seen == {
        ("migrate", "django", "migrate"), ("bootstrap", "django", "collectstatic"), ("web", "tessera", ("serve",)),
        ("ingest", "tessera", ("ingest",)), ("worker", "tessera", ("worker",)), ("beat", "celery", "beat"),
        ("router", "tessera", ("router",)), ("agent", "tessera", ("agent",)),
    }


def test_commands_are_the_kubernetes_ones():
    """Each process runs as its Kubernetes workload runs it. The differences, on purpose: one ingest process
    (the machine is one), and the agent's simulated backend, advertised under its service name."""
    for name in ("web", "worker", "beat", "migrate", "router"):
        assert _commands(name) == _command_line(_k8s(name)), name
    (ingest,) = _commands("ingest")
    (k8s_ingest,) = _command_line(_k8s("ingest"))
    at = ingest.index("--processes")
    assert ingest[:at] == k8s_ingest[:at] and ingest[at + 1] == "1"
    (agent,) = _commands("agent")
    (k8s_agent,) = _command_line(_k8s("agent"))
    drop = {"--backend", "--simulate", "--advertise"}

    def options(argv):
        out, skip = [], False
        for a in argv:
            if skip:
                skip = False
            elif a in drop:
                skip = True
            else:
                out.append(a)
        return out

    assert options(agent) == options(k8s_agent)
    assert agent[agent.index("--advertise") + 1] == "agent"


def test_ports_are_the_commands_ports_published_on_loopback_only():
    published: dict[str, set[int]] = {}
    for name in TESSERA:
        for port in SERVICES[name].get("ports", []):
            host_ip, host_port, target = port.split(":")
            assert host_ip == "127.0.0.1" and host_port == target
            published.setdefault(name, set()).add(int(target))
    assert published == {"web": {8000}, "router": {8100, 8101}}
    (web,) = _commands("web")
    assert int(web[web.index("--port") + 1]) == 8000 == _ports(_k8s("web"))["http"]
    (router,) = _commands("router")
    assert router[router.index("--listen") + 1] == "0.0.0.0:8100" and router[router.index("--grpc-listen") + 1] == "0.0.0.0:8101"
    assert _ports(_k8s("router")) == {"http": 8100, "grpc": 8101}
    assert {int(p) for v in STAGES["tessera"].values("EXPOSE") for p in v.split()} >= set().union(*published.values())
    # The data plane calls ingest at the port ingest listens on.
    (ingest,) = _commands("ingest")
    for name in ("router", "agent"):
        assert SERVICES[name]["environment"]["TESSERA_CONTROL_PLANE"] == f"http://ingest:{ingest[ingest.index('--port') + 1]}"


# --------------------------------------------------------------------------- health checks and start order


def _check_url(name: str) -> str:
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "deploy/docker/healthcheck.py"] and len(test) == 4, test
    return test[3]


def test_health_checks_ask_the_paths_and_ports_kubernetes_probes():
    """Every serving process is checked on its own port at the path its Kubernetes probe asks; worker and
    beat, which Kubernetes does not probe (no endpoint), and the one-shot jobs are not; the web check is the
    image's own HEALTHCHECK."""
    checked = {n for n in SERVICES if not SERVICES[n].get("healthcheck", {}).get("disable")}
    assert checked == {"postgres", "redis", "web", "ingest", "router", "agent"}
    assert {n for n in K8S if "readinessProbe" not in _k8s(n)} == {"worker", "beat", "migrate"}
    for name in checked & TESSERA:
        container = _k8s(name)
        probe = container["readinessProbe"]["httpGet"]
        (argv,) = _commands(name)
        if name == "agent":
            port = int(argv[argv.index("--metrics-port") + 1])
        elif name == "router":
            port = int(argv[argv.index("--listen") + 1].rpartition(":")[2])
        else:
            port = int(argv[argv.index("--port") + 1])
        assert port == _ports(container)[probe["port"]], name
        assert _check_url(name) == f"http://127.0.0.1:{port}{probe['path']}", name
    assert ["CMD", *STAGES["tessera"].healthcheck()[1]] == SERVICES["web"]["healthcheck"]["test"]
    assert SERVICES["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert SERVICES["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_start_order():
    """Nothing waits on a service without a health check; the migrations run once the database answers,
    the bootstrap after them, everything else after the bootstrap; the data plane once ingest is healthy."""
    for name, service in SERVICES.items():
        for dependency, how in service.get("depends_on", {}).items():
            assert dependency in SERVICES, (name, dependency)
            if how["condition"] == "service_healthy":
                assert not SERVICES[dependency].get("healthcheck", {}).get("disable"), (name, dependency)
                assert "healthcheck" in SERVICES[dependency] or SERVICES[dependency].get("image", "").startswith("tessera:")
            if how["condition"] == "service_completed_successfully":
                assert SERVICES[dependency]["restart"] == "no", dependency
    assert SERVICES["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert SERVICES["bootstrap"]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    for name in ("web", "ingest", "worker", "beat", "router", "agent"):
        assert SERVICES[name]["depends_on"]["bootstrap"] == {"condition": "service_completed_successfully"}
        assert SERVICES[name]["restart"] == "unless-stopped"
    for name in ("router", "agent"):
        assert SERVICES[name]["depends_on"]["ingest"] == {"condition": "service_healthy"}
    assert SERVICES["worker"]["stop_grace_period"] == f"{_find(BASE, 'Deployment', 'tessera-worker')['spec']['template']['spec']['terminationGracePeriodSeconds']}s"


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["web", "ingest"])
def test_the_control_plane_checks_get_200_under_the_stacks_settings(name):
    """The request the check sends (plain HTTP, Host: the first allowed name) passes the production settings'
    host check with the stack's DJANGO_ALLOWED_HOSTS and no HTTPS redirect; so do the agent's and router's
    requests to http://ingest:8001."""
    spec = importlib.util.spec_from_file_location("healthcheck", REPO / "deploy" / "docker" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = _environment(name)
    url = _check_url(name)
    path = "/" + url.split("/", 3)[3]
    assert resolve(path).func is healthz
    assert env["DJANGO_SECURE_SSL_REDIRECT"] == "false"
    with override_settings(ALLOWED_HOSTS=env["DJANGO_ALLOWED_HOSTS"].split(","), SECURE_SSL_REDIRECT=False):
        client = Client()
        host = module.allowed_host(env["DJANGO_ALLOWED_HOSTS"])
        assert host == "localhost"
        answered = client.get(path, HTTP_HOST=f"{host}:{url.split(':')[2].split('/')[0]}")
        assert answered.status_code == 200 and answered.json()["status"] in ("ok", "degraded")
        assert client.get(path, HTTP_HOST="ingest:8001").status_code == 200
        assert client.get(path, HTTP_HOST="evil.example.org").status_code == 400


# --------------------------------------------------------------------------- secrets, settings and volumes


def test_secrets_come_from_the_environment_and_nothing_else():
    """Every secret is `${NAME:?…}`: compose refuses to start without it, and the file holds no value."""
    text = COMPOSE.read_text()
    for name in DOTENV:
        assert f"${{{name}:?" in text and f"${{{name}:-" not in text, name
    env = SERVICES["web"]["environment"]
    assert env["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")
    assert "${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]
    assert SERVICES["bootstrap"]["environment"]["TESSERA_ADMIN_PASSWORD"].startswith("${TESSERA_ADMIN_PASSWORD:?")
    assert not (REPO / ".env").exists() or ".env" in (REPO / ".dockerignore").read_text()
    for name in DOTENV:
        with pytest.raises(KeyError, match=name):
            interpolate(text, {k: v for k, v in DOTENV.items() if k != name})


def test_the_stacks_environment_loads_the_production_settings():
    env = _environment("web")
    assert env["DJANGO_SETTINGS_MODULE"] == "controlplane.settings.production"
    assert env["DATABASE_URL"] == f"postgres://tessera:{DOTENV['POSTGRES_PASSWORD']}@postgres:5432/tessera"
    postgres = SERVICES["postgres"]["environment"]
    assert (postgres["POSTGRES_USER"], postgres["POSTGRES_DB"]) == ("tessera", "tessera")
    loaded = production_settings_load(env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == env["TESSERA_MEDIA_ROOT"]
    for name in TESSERA - {"router", "agent"}:
        assert {k: v for k, v in _environment(name).items() if k in env} == env, name


def test_named_volumes_hold_what_outlives_a_container():
    volumes = COMPOSE_FILE["volumes"]
    mounts: dict[str, dict[str, str]] = {}
    for name, service in SERVICES.items():
        for mount in service.get("volumes", []):
            source, target, *mode = mount.split(":")
            assert source in volumes, f"{name}: {source} is not a named volume"
            mounts.setdefault(source, {})[name] = target + (":" + mode[0] if mode else "")
    assert set(mounts) == set(volumes)
    assert mounts["postgres-data"] == {"postgres": "/var/lib/postgresql/data"}
    assert mounts["media"] == {n: "/var/lib/tessera/media" for n in ("web", "ingest", "worker")}
    assert mounts["static"] == {n: "/var/lib/tessera/static" for n in ("bootstrap", "web")}
    assert mounts["credentials"] == {"bootstrap": "/var/lib/tessera/credentials", "router": "/var/lib/tessera/credentials:ro",
                                     "agent": "/var/lib/tessera/credentials:ro"}
    (agent,) = _commands("agent")
    assert mounts["agent-state"] == {"agent": agent[agent.index("--state-dir") + 1]}
    # The image creates each mount point, owned by its user, so a new named volume starts writable by it.
    (create,) = STAGES["tessera"].values("RUN")
    for target in ("/var/lib/tessera/media", "/var/lib/tessera/static", "/var/lib/tessera/credentials", "/var/lib/tessera-agent"):
        assert target in create.split()


# --------------------------------------------------------------------------- bootstrap and credential wrappers


def _bootstrap_module():
    spec = importlib.util.spec_from_file_location("compose_bootstrap", REPO / "deploy" / "docker" / "bootstrap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bootstrap_args() -> dict[str, str]:
    (line,) = [argv for argv in _commands("bootstrap") if argv[:2] == ["python", "deploy/docker/bootstrap.py"]]
    rest = line[2:]
    return {rest[i].lstrip("-").replace("-", "_"): rest[i + 1] for i in range(0, len(rest), 2)}


@pytest.mark.django_db(transaction=True)
def test_bootstrap_sets_up_the_admin_the_agent_token_and_the_router_credential_once(tmp_path, monkeypatch):
    """bootstrap.py as the bootstrap service runs it (its arguments from compose.yaml), against the test
    database: the admin (a superuser: Tessera's admin role), the simulated Host with a token and the
    router's credential in files only their owner reads; run again, it keeps what still verifies; a
    database that no longer knows them (a new one) gets new ones."""
    args = _bootstrap_args()
    assert args["credentials"] == "/var/lib/tessera/credentials"
    credentials = tmp_path / "credentials"
    module = _bootstrap_module()
    monkeypatch.delenv("TESSERA_ADMIN_PASSWORD", raising=False)
    with pytest.raises(SystemExit, match="TESSERA_ADMIN_PASSWORD"):
        module.bootstrap(credentials=credentials, agent_host=args["agent_host"], router=args["router"])
    monkeypatch.setenv("TESSERA_ADMIN_PASSWORD", DOTENV["TESSERA_ADMIN_PASSWORD"])
    first = module.bootstrap(credentials=credentials, agent_host=args["agent_host"], router=args["router"])
    assert [line.split("' ", 1)[1] for line in first] == ["created", "issued (new host)", "issued"]
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password(DOTENV["TESSERA_ADMIN_PASSWORD"]) and user_role(admin) == "admin"
    token, credential = (credentials / "agent-token").read_text().strip(), (credentials / "router-credential").read_text().strip()
    assert {oct(p.stat().st_mode & 0o777) for p in credentials.iterdir()} == {"0o600"}
    host = host_by_agent_token(secret=token)
    assert host.name == args["agent_host"] and host.backend == "simulated"
    assert router_credential_by_secret(secret=credential).name == args["router"]
    again = module.bootstrap(credentials=credentials, agent_host=args["agent_host"], router=args["router"])
    assert [line.split("' ", 1)[1] for line in again] == ["password set", "kept", "kept"]
    assert (credentials / "agent-token").read_text().strip() == token
    # A new database: the files no longer verify, so both are issued again.
    Host.objects.all().delete()
    RouterCredential.objects.all().delete()
    module.bootstrap(credentials=credentials, agent_host=args["agent_host"], router=args["router"])
    assert (credentials / "agent-token").read_text().strip() != token
    assert host_by_agent_token(secret=(credentials / "agent-token").read_text().strip()).name == args["agent_host"]


def _fake_tessera(bin_dir: Path, record: Path) -> None:
    bin_dir.mkdir()
    fake = bin_dir / "tessera"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$TESSERA_AGENT_TOKEN$TESSERA_ROUTER_TOKEN\" \"$@\" > {record}\n")
    fake.chmod(0o755)


@pytest.mark.parametrize(("service", "file"), [("agent", "agent-token"), ("router", "router-credential")])
def test_the_credential_wrappers_export_what_bootstrap_wrote(service, file, tmp_path):
    """The agent's and router's scripts, run for real ($$ read as $, as compose does) with a stand-in
    `tessera`: each exports its file's secret as the variable the CLI reads; a missing file stops it."""
    script = interpolate(SERVICES[service]["command"][2], DOTENV).replace("/var/lib/tessera/credentials", str(tmp_path / "credentials"))
    (tmp_path / "credentials").mkdir()
    record = tmp_path / "argv"
    _fake_tessera(tmp_path / "bin", record)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    missing = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and not record.exists()
    (tmp_path / "credentials" / file).write_text("tsx_secret\n")
    ran = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    token, *argv = record.read_text().splitlines()
    assert token == "tsx_secret" and argv == _commands(service)[0][1:]
    assert _container_env(BASE, _k8s(service)).keys() >= {"TESSERA_CONTROL_PLANE"}
