"""A stored plan's MIG geometry as NVIDIA mig-parted configs: one config per host, for the MIG manager of a
Kubernetes node (or nvidia-mig-parted under systemd) to apply, and the node label that selects it
(``nvidia.com/mig.config=<config>``, which NVIDIA's MIG manager watches).

What is exported: every GPU of a host's desired state in the plan that the inventory knows as MIG-capable:
its planned layout (MIG on, the placements as counts, the exact placements as a comment), or MIG off
where the plan runs it whole or in MPS mode. A GPU whose model the catalogue lacks is exported from the
profile table its agent reported from NVML, labelled so; one without such a table, and GPUs without MIG,
are left out with a note."""
from __future__ import annotations

from dataclasses import dataclass, field

from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, Host
from engine.geometry.migparted import NODE_LABEL, mig_parted_export, mig_parted_node_configs

from .models import Plan

__all__ = ["PlanMigPartedExport", "plan_mig_parted_export"]


@dataclass(frozen=True)
class PlanMigPartedExport:
    """`text`: the mig-parted config.yaml (version v1), its first lines saying which label to set on which
    node; `labels`: {host: config name}; `notes`: GPUs left out, and why."""

    text: str
    labels: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def label_lines(self) -> list[str]:
        return [f"{host}: {NODE_LABEL}={name}" for host, name in sorted(self.labels.items())]


def plan_mig_parted_export(*, plan: Plan) -> PlanMigPartedExport:
    """The plan's per-host MIG geometry as mig-parted configs (see the module docstring). ValueError when
    no host of the plan has a MIG-capable GPU to configure."""
    notes: list[str] = []
    hosts = {h.name: h for h in Host.objects.filter(name__in=list(plan.desired_states))}
    accelerators = {
        (a.host.name, a.index): a
        for a in Accelerator.objects.filter(host__in=hosts.values(), kind=AcceleratorKindChoices.GPU).select_related("host")
    }
    gpus_by_host: dict[str, list] = {}
    for host_name, spec in sorted(plan.desired_states.items()):
        if host_name not in hosts:
            notes.append(f"{host_name}: no longer in the inventory")
            continue
        for gpu in spec.get("gpus", []):
            where = f"{host_name}/gpu{gpu['index']}"
            accelerator = accelerators.get((host_name, gpu["index"]))
            if accelerator is None:
                notes.append(f"{where}: no longer in the inventory")
                continue
            if not accelerator.mig_capable:
                continue  # nothing for mig-parted to do on a GPU without MIG
            model = accelerator.gpu_model_planned
            if model is None:
                notes.append(f"{where} ({accelerator.model_name}): not in the MIG catalogue and its agent reported no "
                             "NVML profile table; left out")
                continue
            layout = gpu.get("layout") if gpu.get("mig_enabled") and not gpu.get("mps_enabled") else None
            gpus_by_host.setdefault(host_name, []).append((gpu["index"], model, layout))
    configs, labels = mig_parted_node_configs(f"tessera-plan-{plan.pk}", gpus_by_host)
    header = [f"# Tessera plan {plan.pk} ({plan.status}): one config per node; set each node's {NODE_LABEL} label:"]
    header += [f"#   {host}: {NODE_LABEL}={name}" for host, name in sorted(labels.items())]
    header += [f"# note: {note}" for note in notes]
    return PlanMigPartedExport(text="\n".join(header) + "\n" + mig_parted_export(configs), labels=labels, notes=notes)
