"""The data plane's names (docs/dataplane.md, "Names"), one implementation for the control plane and the
agents: devices (`gpu0`, `cpu0`), runtime keys (`gpu0/3g.20gb@4`, `gpu1`, `cpu0/0`, and on MPS GPUs
`gpu0/mps60@0` for a partition and `gpu0/mps60@0/1` for one model in it) and fleet-wide instance ids
(`<host>/<runtime key>`).

An MPS partition placement is `mps<NN>@<k>`: NN the percent of the GPU's SMs (1..100, written without
leading zeros so that a key has one spelling), k the partition's index in its GPU's layout (largest first).
Several models may share a partition in turn; each has its own runtime key with a slot, its position in
the partition. A slot is allowed only after an MPS placement (`gpu0/3g.20gb@4/1` is not a key)."""
from __future__ import annotations

import re
from dataclasses import dataclass

DEVICE_RE = re.compile(r"^(?P<kind>gpu|cpu)(?P<index>[0-9]{1,4})$")
RUNTIME_KEY_RE = re.compile(
    r"^(?:(?P<gpu>gpu[0-9]{1,4})(?:/(?P<placement>[^/@\s]+@[0-9]{1,2})(?:/(?P<model_slot>[0-9]{1,4}))?)?"
    r"|(?P<cpu>cpu[0-9]{1,4})/(?P<slot>[0-9]{1,4}))$"
)
RUNTIME_KEY_MAX_LENGTH = 100
# An MPS partition placement, as written in keys and layouts: "mps60@0" (no leading zeros, 1..100 %).
MPS_PLACEMENT_RE = re.compile(r"^mps(?P<percent>[1-9][0-9]{0,2})@(?P<index>[0-9]{1,2})$")


@dataclass(frozen=True)
class RuntimeKey:
    key: str
    device: str  # "gpu0", "cpu0"
    kind: str  # "gpu" | "cpu"
    index: int
    placement: str | None  # "3g.20gb@4" (MIG) or "mps60@0" (MPS); None for a whole GPU and for CPU runtimes
    slot: int | None  # the CPU runtime's number on its device, or the model's position in its MPS partition
    mps_percent: int | None = None  # 60 for gpu0/mps60@0 and gpu0/mps60@0/1; None elsewhere
    mps_index: int | None = None  # the partition's index on its GPU (the k of mps<NN>@<k>)

    @property
    def is_mps(self) -> bool:
        """On an MPS partition: the partition's own key or a model's key in it."""
        return self.mps_percent is not None

    @property
    def partition_key(self) -> str | None:
        """`gpu0/mps60@0` for `gpu0/mps60@0/1` and for itself; None when not on an MPS partition."""
        return f"{self.device}/{self.placement}" if self.is_mps else None


def device_parse(text: str) -> tuple[str, int]:
    """`gpu0` -> ("gpu", 0). ValueError when malformed."""
    match = DEVICE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a device name such as 'gpu0' or 'cpu0'")
    return match["kind"], int(match["index"])


def is_mps_placement(text: object) -> bool:
    """Whether `text` is written as an MPS placement (`mps...@k`), well-formed or not: such a placement is
    never a MIG one."""
    return isinstance(text, str) and text[:3].lower() == "mps"


def mps_placement_parse(text: str) -> tuple[int, int]:
    """`mps60@0` -> (60, 0): (percent of the SMs, partition index). ValueError when malformed."""
    match = MPS_PLACEMENT_RE.match(text) if isinstance(text, str) else None
    if match is None or not 1 <= int(match["percent"]) <= 100:
        raise ValueError(
            f"{text!r} is not an MPS partition placement 'mps<NN>@<k>' (NN a whole percent 1..100 without "
            "leading zeros, k the partition's index), such as 'mps60@0'"
        )
    return int(match["percent"]), int(match["index"])


def mps_placement(percent: int, index: int) -> str:
    """(60, 0) -> `mps60@0`, checked."""
    text = f"mps{percent}@{index}"
    mps_placement_parse(text)
    return text


def runtime_key_parse(text: str) -> RuntimeKey:
    """`gpu0/3g.20gb@4`, `gpu1`, `cpu0/2`, `gpu0/mps60@0` or `gpu0/mps60@0/1`. ValueError when malformed."""
    match = RUNTIME_KEY_RE.match(text) if isinstance(text, str) and len(text) <= RUNTIME_KEY_MAX_LENGTH else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a runtime key: 'gpu<i>/<profile>@<start>' (a MIG instance), 'gpu<i>' (a whole GPU), "
            "'cpu<i>/<n>' (a CPU runtime), 'gpu<i>/mps<NN>@<k>' (an MPS partition) or 'gpu<i>/mps<NN>@<k>/<slot>' "
            "(a model in an MPS partition)"
        )
    device = match["gpu"] or match["cpu"]
    kind, index = device_parse(device)
    placement = match["placement"]
    percent = mps_index = None
    if is_mps_placement(placement):
        try:
            percent, mps_index = mps_placement_parse(placement)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a runtime key: {exc}") from None
    elif match["model_slot"] is not None:
        raise ValueError(
            f"{text!r} is not a runtime key: a slot ('/<n>' after the placement) is only for models in an MPS "
            "partition, such as 'gpu0/mps60@0/1'"
        )
    raw_slot = match["slot"] if match["slot"] is not None else match["model_slot"]
    slot = int(raw_slot) if raw_slot is not None else None
    return RuntimeKey(
        key=text, device=device, kind=kind, index=index, placement=placement, slot=slot,
        mps_percent=percent, mps_index=mps_index,
    )


def partition_key(key: str) -> str:
    """The MPS partition key of a model key (`gpu0/mps60@0/1` -> `gpu0/mps60@0`; a partition's own key is
    returned as it is). ValueError when `key` is not on an MPS partition."""
    parsed = runtime_key_parse(key)
    if parsed.partition_key is None:
        raise ValueError(f"{key!r} is not on an MPS partition (expected 'gpu<i>/mps<NN>@<k>[/<slot>]')")
    return parsed.partition_key


def mps_percent(key: str) -> int:
    """The percent of the SMs of the partition a key is on (`gpu0/mps60@0/1` -> 60). ValueError when
    `key` is not on an MPS partition."""
    parsed = runtime_key_parse(key)
    if parsed.mps_percent is None:
        raise ValueError(f"{key!r} is not on an MPS partition (expected 'gpu<i>/mps<NN>@<k>[/<slot>]')")
    return parsed.mps_percent


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
