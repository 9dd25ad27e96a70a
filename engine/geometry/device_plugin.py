"""What NVIDIA's Kubernetes device plugin advertises for a node's GPUs under each MIG strategy (pure).

The rules are those of NVIDIA/k8s-device-plugin (README, "Configuration Option Details", MIG_STRATEGY;
internal/rm/rm.go `AddDefaultResourcesToConfig` and internal/rm/device_map.go
`buildDeviceMapFromConfigResources`, `buildGPUDeviceMap`):

- `none`: every GPU is one `nvidia.com/gpu`, whether MIG is enabled on it or not; MIG devices are never
  advertised. What is advertised does not change when the MIG layout does.
- `single`: a GPU with MIG enabled is not advertised itself; each of its MIG devices is one
  `nvidia.com/gpu`. Every MIG device on the node must have the same profile, and every GPU the same MIG
  mode, or the plugin refuses the node's configuration.
- `mixed`: a GPU with MIG disabled is one `nvidia.com/gpu`; each MIG device is one
  `nvidia.com/mig-<profile>`, the profile's name with "+" written "." (`1g.5gb+me` -> `mig-1g.5gb.me`).

Tessera uses this to say which resource a pod would ask for to get one of a plan's instances (the Triton
export) and why its agent can share a node with the device plugin only under `none` (docs/deploy.md)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

__all__ = ["GPU_RESOURCE", "MIG_STRATEGIES", "DevicePluginRefusal", "GpuView", "device_plugin_resource", "device_plugin_resources"]

MIG_STRATEGIES = ("none", "single", "mixed")
GPU_RESOURCE = "nvidia.com/gpu"


class DevicePluginRefusal(ValueError):
    """The device plugin would refuse this node's configuration under the strategy (the message says why)."""


@dataclass(frozen=True)
class GpuView:
    """One GPU as the device plugin sees it: its MIG mode and the profiles of its MIG devices."""

    mig_enabled: bool
    profiles: tuple[str, ...] = ()


def _strategy_check(strategy: str) -> None:
    if strategy not in MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {strategy!r} (the device plugin's are {', '.join(MIG_STRATEGIES)})")


def device_plugin_resource(strategy: str, profile: str | None) -> str | None:
    """The resource one device is advertised as: `profile` None for a whole GPU with MIG disabled, else
    the MIG device's profile. None where the strategy never advertises such a device (a MIG device
    under `none`)."""
    _strategy_check(strategy)
    if profile is None:
        return GPU_RESOURCE
    if strategy == "none":
        return None
    if strategy == "single":
        return GPU_RESOURCE
    return "nvidia.com/mig-" + profile.replace("+", ".")


def device_plugin_resources(strategy: str, gpus: Sequence[GpuView]) -> dict[str, int]:
    """Every resource the plugin advertises on a node with these GPUs, with its count. Raises
    DevicePluginRefusal where the plugin would refuse the configuration (`single` with mixed MIG modes
    or mixed profiles)."""
    _strategy_check(strategy)
    if strategy == "none":
        return {GPU_RESOURCE: len(gpus)} if gpus else {}
    if strategy == "single":
        modes = {gpu.mig_enabled for gpu in gpus}
        if len(modes) > 1:
            raise DevicePluginRefusal("mig-strategy single: all devices on the node must be configured with the same migEnabled value")
        profiles = {p for gpu in gpus for p in gpu.profiles}
        if len(profiles) > 1:
            raise DevicePluginRefusal(f"mig-strategy single: all MIG devices must have the same profile, found {', '.join(sorted(profiles))}")
    counts: Counter[str] = Counter()
    for gpu in gpus:
        if not gpu.mig_enabled:
            counts[GPU_RESOURCE] += 1
            continue
        for profile in gpu.profiles:
            counts[device_plugin_resource(strategy, profile)] += 1
    return dict(sorted(counts.items()))
