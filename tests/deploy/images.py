"""The Dockerfile read as stages (dockerfile-parse's instructions, ARGs substituted in FROM), and compose.yaml
as Compose loads it, for tests/deploy/test_images.py and test_compose.py."""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

from tests.deploy.commands import REPO

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "compose.yaml"


@dataclass
class Stage:
    name: str
    base: str                                   # FROM's image (ARGs substituted) or an earlier stage's name
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def pairs(self, instruction: str) -> dict[str, str]:
        """LABEL or ENV as {key: value} (the key=value form; shell quoting as Docker reads it)."""
        out = {}
        for value in self.values(instruction):
            for word in shlex.split(value):
                key, _, val = word.partition("=")
                out[key] = val
        return out

    def exec_form(self, instruction: str) -> list[str] | None:
        """The last CMD or ENTRYPOINT in exec (JSON) form, or None."""
        found = self.values(instruction)
        return json.loads(found[-1]) if found else None

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        """HEALTHCHECK's options and its CMD (exec form)."""
        (value,) = self.values("HEALTHCHECK")
        options, _, command = value.partition("CMD")
        flags = dict(re.findall(r"--([\w-]+)=(\S+)", options))
        return flags, json.loads(command)


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    parser = DockerfileParser(path=str(path))
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "ARG" and current is None:
            name, _, default = value.partition("=")
            args[name] = default
            continue
        if instruction == "FROM":
            words = value.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: FROM {value}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            current = stages[words[2]] = Stage(words[2], base)
            continue
        assert current is not None, f"{instruction} before the first FROM"
        current.instructions.append((instruction, value))
    return stages


def compose_load(path: Path = COMPOSE) -> dict:
    """compose.yaml as YAML loads it (anchors and merge keys resolved; ${...} left as written)."""
    return yaml.safe_load(path.read_text())


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one string: ${NAME}, ${NAME:-default}, ${NAME:?error} and $$ (a literal $)."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, rest = match.group(1), match.group(2), match.group(3)
        if op == ":?":
            if not env.get(name):
                raise KeyError(f"{name}: {rest}")
            return env[name]
        if op == ":-":
            return env.get(name) or rest
        return env.get(name, "")

    return re.sub(r"\$\$|\$\{(\w+)(?:(:[?-])([^}]*))?\}", one, value)
