"""The data plane's names (docs/dataplane.md, "Names"), one implementation for the control plane and the
agents: devices (`gpu0`, `cpu0`), runtime keys (`gpu0/3g.20gb@4`, `gpu1`, `cpu0/0`) and fleet-wide
instance ids (`<host>/<runtime key>`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

DEVICE_RE = re.compile(r"^(?P<kind>gpu|cpu)(?P<index>[0-9]{1,4})$")
RUNTIME_KEY_RE = re.compile(
    r"^(?:(?P<gpu>gpu[0-9]{1,4})(?:/(?P<placement>[^/@\s]+@[0-9]{1,2}))?|(?P<cpu>cpu[0-9]{1,4})/(?P<slot>[0-9]{1,4}))$"
)
RUNTIME_KEY_MAX_LENGTH = 100


@dataclass(frozen=True)
class RuntimeKey:
    key: str
    device: str  # "gpu0", "cpu0"
    kind: str  # "gpu" | "cpu"
    index: int
    placement: str | None  # "3g.20gb@4" for a MIG instance; None for a whole GPU and for CPU runtimes
    slot: int | None  # the CPU runtime's number on its device; None on GPUs


def device_parse(text: str) -> tuple[str, int]:
    """`gpu0` -> ("gpu", 0). ValueError when malformed."""
    match = DEVICE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a device name such as 'gpu0' or 'cpu0'")
    return match["kind"], int(match["index"])


def runtime_key_parse(text: str) -> RuntimeKey:
    """`gpu0/3g.20gb@4`, `gpu1` or `cpu0/2`. ValueError when malformed."""
    match = RUNTIME_KEY_RE.match(text) if isinstance(text, str) and len(text) <= RUNTIME_KEY_MAX_LENGTH else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a runtime key: 'gpu<i>/<profile>@<start>' (a MIG instance), 'gpu<i>' (a whole GPU) "
            "or 'cpu<i>/<n>' (a CPU runtime)"
        )
    device = match["gpu"] or match["cpu"]
    kind, index = device_parse(device)
    slot = int(match["slot"]) if match["slot"] is not None else None
    return RuntimeKey(key=text, device=device, kind=kind, index=index, placement=match["placement"], slot=slot)


def instance_id_parse(text: str) -> tuple[str, RuntimeKey]:
    """`sim-cpu-01/cpu0/0` -> ("sim-cpu-01", RuntimeKey(cpu0/0)). ValueError when malformed."""
    if not isinstance(text, str) or "/" not in text:
        raise ValueError(f"{text!r} is not an instance id '<host>/<runtime key>'")
    host, _, key = text.partition("/")
    if not host:
        raise ValueError(f"{text!r} is not an instance id '<host>/<runtime key>'")
    return host, runtime_key_parse(key)


def instance_id(host_name: str, key: str) -> str:
    return f"{host_name}/{key}"
