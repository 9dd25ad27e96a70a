"""CPU hosts shared by the parts of a composed plan: the cores each part has taken (`CpuHostUse`) and the
placement of replicas onto the cores left (`replicas_place`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from engine.plans.problem import DeviceSpec

__all__ = ["CpuHostUse", "replicas_place"]


@dataclass
class CpuHostUse:
    """The CPU hosts' cores already given by earlier parts of a composition, and the next free instance
    number on each, so that every part's instances on one host have distinct numbers."""

    used: dict[str, int] = field(default_factory=dict)
    next_start: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def free_cores(self, device: DeviceSpec) -> int:
        return max(0, (device.cores or 0) - self.used.get(device.name, 0))

    def take(self, host: str, cores: int) -> None:
        self.used[host] = self.used.get(host, 0) + cores

    def number(self, host: str) -> int:
        start = self.next_start[host]
        self.next_start[host] += 1
        return start


def replicas_place(hosts: Sequence[DeviceSpec], replicas: Sequence[tuple[str, int]], used: dict[str, int] | None = None,
                   prefer: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, list[str]], list[str]]:
    """Place replicas (key, cores) on CPU hosts, largest first (first-fit decreasing), each on the first host
    with room in this order: those in `prefer` (hosts that run the pipeline's stages now: its traffic stays
    where it is), then the largest hosts. A host is filled before the next is opened, so a pipeline's
    replicas stay on few hosts (stage to stage stays local), whole hosts stay free for the other
    applications, and a small CPU beside GPUs is the last resort. Returns host -> keys placed there, and
    the keys that fit nowhere. `used`: cores already taken per host, updated in place."""
    free = {h.name: (h.cores or 0) - (used or {}).get(h.name, 0) for h in hosts}
    size = dict(free)  # "largest" by the cores free when the call begins: an earlier part's host counts as what it has left
    placed: dict[str, list[str]] = defaultdict(list)
    left: list[str] = []
    for key, cores in sorted(replicas, key=lambda r: (-r[1], r[0])):
        fits = [name for name, f in free.items() if f >= cores]
        if not fits:
            left.append(key)
            continue
        host = min(fits, key=lambda name: (name not in prefer, -size[name], name))
        free[host] -= cores
        placed[host].append(key)
        if used is not None:
            used[host] = used.get(host, 0) + cores
    return dict(placed), left
