"""deploy/systemd: the units for hosts without Kubernetes. `systemd-analyze verify` (where installed) reads
them as systemd would, with their ExecStart pointed at this checkout; every ExecStart is parsed by the
real CLIs in the environment its EnvironmentFile example gives; the example environments are what the
programs read."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.main import get_command

from controlplane.cli import app
from tests.deploy.commands import REPO, VENV_BIN, command_check, production_settings_load

SYSTEMD = REPO / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
CONTROL_PLANE = ("tessera-migrate", "tessera-web", "tessera-ingest", "tessera-worker", "tessera-beat")


def unit_parse(path: Path) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values, in order]}} (a key may repeat, as ExecStart= does in a oneshot)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def env_file(path: str) -> dict[str, str]:
    """The example of an EnvironmentFile (/etc/tessera/NAME.env -> deploy/systemd/NAME.env.example)."""
    example = SYSTEMD / (Path(path).name + ".example")
    assert example.exists(), f"no example for {path}"
    pairs = [line.split("=", 1) for line in example.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {k: v for k, v in pairs}


def _exec_lines(unit: dict) -> tuple[dict[str, str], list[list[str]]]:
    env = {}
    for path in unit["Service"].get("EnvironmentFile", []):
        env.update(env_file(path))
    lines = []
    for line in unit["Service"]["ExecStart"]:
        # systemd replaces ${NAME} with the variable's value, as one word.
        argv = shlex.split(line)
        lines.append([env[a[2:-1]] if a.startswith("${") and a.endswith("}") else a for a in argv])
    return env, lines


def test_the_units_cover_the_control_plane_the_router_and_the_agent():
    assert {u.stem for u in UNITS} == {*CONTROL_PLANE, "tessera-router", "tessera-agent"}


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.stem)
def test_every_exec_start_is_a_command_the_real_cli_accepts(path):
    env, lines = _exec_lines(unit_parse(path))
    for argv in lines:
        assert argv[0].startswith("/opt/tessera/.venv/bin/"), argv
        command_check(argv, env)


def test_what_each_unit_runs():
    runs = {}
    for path in UNITS:
        _env, lines = _exec_lines(unit_parse(path))
        runs[path.stem] = [" ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:4])) for argv in lines]
    assert runs["tessera-migrate"] == ["python -m django migrate", "python -m django collectstatic"]
    assert runs["tessera-web"] == ["tessera serve --bind 127.0.0.1"] and runs["tessera-ingest"] == ["tessera ingest --bind 127.0.0.1"]
    assert runs["tessera-worker"] == ["tessera worker --concurrency 2"] and runs["tessera-beat"] == ["celery -A controlplane beat"]
    assert runs["tessera-router"] == ["tessera router --listen 0.0.0.0:8100"]
    assert runs["tessera-agent"] == ["tessera agent --backend nvml"]


def test_the_control_plane_environment_is_what_production_settings_need():
    env = env_file("/etc/tessera/tessera.env")
    loaded = production_settings_load(env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == str(Path(env["TESSERA_VAR_DIR"]) / "media")
    for required in ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"):
        without = production_settings_load({k: v for k, v in env.items() if k != required})
        assert without.returncode != 0 and required in without.stderr


def _envvars(command: str) -> set[str]:
    """The environment variables the `tessera COMMAND` options read, from the CLI itself."""
    group = get_command(app)
    return {param.envvar for param in group.commands[command].params if getattr(param, "envvar", None)}


@pytest.mark.parametrize(("command", "file"), [("agent", "agent.env"), ("router", "router.env")])
def test_the_data_plane_environments_set_what_the_cli_reads(command, file):
    assert {"TESSERA_CONTROL_PLANE"} < _envvars(command) <= set(env_file(f"/etc/tessera/{file}"))


def test_hardening_and_restart_policy():
    for path in UNITS:
        service = unit_parse(path)["Service"]
        assert service["NoNewPrivileges"] == ["yes"] and service["ProtectHome"] == ["yes"] and service["PrivateTmp"] == ["yes"]
        if path.stem != "tessera-migrate":
            assert service["Restart"] == ["on-failure"], path.name
        if path.stem in CONTROL_PLANE:
            assert service["User"] == ["tessera"] and service["ProtectSystem"] == ["strict"]
            assert service["CapabilityBoundingSet"] == [""] and service["EnvironmentFile"] == ["/etc/tessera/tessera.env"]
    router = unit_parse(SYSTEMD / "tessera-router.service")["Service"]
    assert router["DynamicUser"] == ["yes"] and router["CapabilityBoundingSet"] == [""]
    # The agent creates MIG instances (root) and its runtimes outlive its restarts (their own sessions:
    # workers/agent/supervisor.py), which the default KillMode=control-group would prevent.
    agent = unit_parse(SYSTEMD / "tessera-agent.service")["Service"]
    assert "User" not in agent and agent["KillMode"] == ["process"] and "CapabilityBoundingSet" not in agent
    for name in CONTROL_PLANE[1:]:
        unit = unit_parse(SYSTEMD / f"{name}.service")["Unit"]
        assert unit["Requires"] == ["tessera-migrate.service"] and "tessera-migrate.service" in unit["After"][0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    """systemd's own reading: unknown keys, unparsable values, missing executables and dependencies are
    all reported (it exits 0 on most of them, so any output at all fails this test). The units are copied
    with /opt/tessera pointed at this checkout and the EnvironmentFiles at their examples."""
    for path in UNITS:
        text = path.read_text().replace("/opt/tessera/.venv/bin", str(VENV_BIN)).replace("/opt/tessera", str(REPO))
        for env in ("tessera.env", "agent.env", "router.env"):
            text = text.replace(f"/etc/tessera/{env}", str(SYSTEMD / f"{env}.example"))
        (tmp_path / path.name).write_text(text)
    verified = subprocess.run(["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stdout == verified.stderr == "", verified.stdout + verified.stderr
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nRestart=sometimes\n")
    noticed = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=120)
    assert "sometimes" in noticed.stderr  # the check above would see such a mistake
