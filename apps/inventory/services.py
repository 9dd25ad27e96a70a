"""Inventory services: agent tokens, router credentials, and applying a host's actual-state report. (The MIG layout check
every GPU instance passes is the model's own: GpuInstance.clean; the MPS layout check every partition passes is
MpsPartition.clean.)"""
from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.users.tokens import AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX, token_display, token_generate, token_hash
from engine.geometry.layout import Placement, mig_layout_validate
from engine.geometry.names import mps_placement_parse

from .choices import AcceleratorKindChoices, GpuInstanceStateChoices, HostStatusChoices, MpsPartitionStateChoices
from .models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential, mps_partitions_problem

# mps_enabled is optional in a report (older agents leave it out): absent, the stored value stays.
ACCELERATOR_REPORT_FIELDS = ("uuid", "model_name", "memory_mb", "mig_capable", "mig_enabled", "mps_enabled", "cpu_cores",
                             "pci_device_id", "nvml_profiles")


@transaction.atomic
def host_agent_token_rotate(*, host: Host) -> str:
    """Issue a new agent token for a host (the previous one stops working) and return its secret once."""
    secret = token_generate(AGENT_TOKEN_PREFIX)
    host.agent_token_hash = token_hash(secret)
    host.agent_token_prefix = token_display(secret)
    host.save(update_fields=["agent_token_hash", "agent_token_prefix", "last_updated"])
    return secret


@transaction.atomic
def router_credential_issue(*, name: str, description: str | None = None, may_load_models: bool | None = None) -> tuple[RouterCredential, str]:
    """Issue a credential for router `name` (created on first issue; re-issuing replaces the secret, so the
    previous one stops working, and lifts a revocation). Returns it with its secret, shown once. Raises
    ValidationError for a name that is not a valid router name. `may_load_models` (None: as it was; off
    for a new one): whether the router may relay the model repository's load and unload."""
    credential = RouterCredential.objects.select_for_update().filter(name=name).first() or RouterCredential(name=name)
    secret = token_generate(ROUTER_TOKEN_PREFIX)
    credential.token_hash = token_hash(secret)
    credential.token_prefix = token_display(secret)
    credential.revoked = None
    if description is not None:
        credential.description = description
    if may_load_models is not None:
        credential.may_load_models = may_load_models
    credential.full_clean(validate_unique=False)
    credential.save()
    return credential, secret


@transaction.atomic
def router_credential_update(*, credential: RouterCredential, description: str | None = None,
                             may_load_models: bool | None = None) -> RouterCredential:
    """Change what a router credential says and may do (None: as it was) without touching its secret, so the
    running router keeps working; audited like every change (issue, revoke, update)."""
    credential = RouterCredential.objects.select_for_update().get(pk=credential.pk)
    changed = []
    if description is not None and description != credential.description:
        credential.description, changed = description, [*changed, "description"]
    if may_load_models is not None and may_load_models != credential.may_load_models:
        credential.may_load_models, changed = may_load_models, [*changed, "may_load_models"]
    if changed:
        credential.full_clean(validate_unique=False)
        credential.save(update_fields=[*changed, "last_updated"])
    return credential


@transaction.atomic
def router_credential_revoke(*, credential: RouterCredential) -> RouterCredential:
    """Revoke a router credential: its secret stops working at once (401). The record stays, marked revoked,
    for the fleet page and the audit log; issuing again gives the router a new secret."""
    credential = RouterCredential.objects.select_for_update().get(pk=credential.pk)
    if credential.revoked is None:
        credential.revoked = timezone.now()
        credential.token_hash = ""  # nosec B105 - revoked: no hash matches any secret
        credential.save(update_fields=["revoked", "token_hash", "last_updated"])
    return credential


def router_credential_by_secret(*, secret: str) -> RouterCredential | None:
    """The valid (not revoked) credential with this secret, or None."""
    if not secret.startswith(ROUTER_TOKEN_PREFIX):
        return None
    return RouterCredential.objects.filter(token_hash=token_hash(secret), revoked__isnull=True).first()


def host_visible_find(*, principal, pk) -> Host | None:
    """The host with this id if the principal may see it (an agent: only its own host), else None."""
    return Host.objects.restrict(principal, "view").filter(pk=pk).first()


def host_by_agent_token(*, secret: str) -> Host | None:
    if not secret.startswith(AGENT_TOKEN_PREFIX):
        return None
    return Host.objects.filter(agent_token_hash=token_hash(secret)).first()


def _save_if_changed(obj, values: dict[str, Any]) -> bool:
    changed = [name for name, value in values.items() if getattr(obj, name) != value]
    if not changed and obj.pk:
        return False
    for name in changed:
        setattr(obj, name, values[name])
    obj.full_clean(validate_unique=False, validate_constraints=False)
    obj.save()
    return True


def _instances_apply(accelerator: Accelerator, reported: list[dict[str, Any]]) -> None:
    spec = accelerator.gpu_model_planned  # the catalogue's model, else NVML's table for the GPU
    layout = [Placement(i["profile"], i["start"]) for i in reported]
    if reported:
        if not accelerator.mig_enabled:
            raise ValidationError({"accelerators": f"{accelerator}: MIG instances reported on a GPU without MIG enabled."})
        if spec is None:
            raise ValidationError({"accelerators": f"{accelerator}: MIG instances reported on a GPU that neither the MIG "
                                                   "catalogue nor a reported NVML profile table describes."})
        verdict = mig_layout_validate(spec, layout)
        if not verdict.valid:
            raise ValidationError({"accelerators": f"{accelerator}: reported MIG layout is invalid: {verdict.reason}"})
    wanted = {i["start"]: i for i in reported}
    # Remove what is gone first, so no intermediate layout overlaps the one being reported.
    existing = {}
    for gi in accelerator.gpu_instances.all():
        if gi.placement_start in wanted and wanted[gi.placement_start]["profile"] == gi.profile:
            existing[gi.placement_start] = gi
        else:
            gi.delete()
    for start, item in sorted(wanted.items()):
        gi = existing.get(start) or GpuInstance(accelerator=accelerator, profile=item["profile"], placement_start=start)
        _save_if_changed(gi, {"uuid": item.get("uuid", ""), "state": item.get("state", GpuInstanceStateChoices.READY)})


def _mps_layout_desired(accelerator: Accelerator) -> list[tuple[int, int]] | None:
    """The MPS layout [(percent, index), ...] the host's latest desired state gives this GPU, or None."""
    # By name, not by import: deployments builds on the inventory, not the other way round.
    desired_state = apps.get_model("deployments", "HostDesiredState")
    spec = desired_state.objects.filter(host_id=accelerator.host_id).order_by("-version").values_list("spec", flat=True).first()
    for gpu in (spec or {}).get("gpus", []):
        if isinstance(gpu, dict) and gpu.get("index") == accelerator.index and gpu.get("mps_enabled"):
            try:
                return [mps_placement_parse(text) for text in gpu.get("mps_layout", [])]
            except (TypeError, ValueError):
                return None
    return None


def _mps_partitions_reorganising(accelerator: Accelerator, reported: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """While an agent reorganises a GPU's partitions (gpulets §4.6) it reports the old and the new ones
    together (indices repeat, or the shares add up to more than 100 %), and a partition that failed to start
    leaves a gap. Then the partitions to store are those of the desired state's layout once all of them
    run, else the stored ones stay (None)."""
    pairs = {(p["percent"], p["index"]): p for p in reported}
    desired = _mps_layout_desired(accelerator)
    if not desired or not set(desired) <= set(pairs):
        return None
    if mps_partitions_problem({i: p for p, i in desired}, accelerator.mps_partitions_allowed):
        return None
    return [pairs[pair] for pair in sorted(desired, key=lambda pair: pair[1])]


def _mps_partitions_wanted(accelerator: Accelerator, values: dict[str, Any], item: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The partitions the GPU is to have after this report (None: the report says nothing of them, leave
    the stored ones alone), checked as a whole layout. MPS off means no partition."""
    reported = item.get("mps_partitions")
    if not values["mps_enabled"]:
        if reported:
            raise ValidationError({"accelerators": f"{accelerator}: MPS partitions reported on a GPU without MPS enabled."})
        return []
    if reported is None:
        return None
    allowed = accelerator.mps_partitions_allowed
    refused = sorted({p["percent"] for p in reported} - set(allowed))
    if refused:
        raise ValidationError({"accelerators": f"{accelerator}: reported MPS partitions of {', '.join(map(str, refused))} %, "
                                               f"which it does not allow (allowed: {', '.join(map(str, allowed))} %)."})
    layout = {p["index"]: p["percent"] for p in reported}
    if len(layout) != len(reported) or mps_partitions_problem(layout, allowed):
        # Not a layout by itself: the agent reports the partitions whose processes run, so old and new ones
        # overlap while it reorganises and one that failed to start leaves a gap. Not the host's fault, and
        # refusing the report would block every other fact in it: keep what is stored until it settles.
        return _mps_partitions_reorganising(accelerator, reported)
    return sorted(reported, key=lambda p: p["index"])


def _mps_partitions_prune(accelerator: Accelerator, wanted: list[dict[str, Any]]) -> dict[int, MpsPartition]:
    """Delete the stored partitions that are not the first ones of `wanted` unchanged, so every layout on
    the way (kept prefix, then the new ones in index order) is valid. Returns the kept ones by index."""
    kept: dict[int, MpsPartition] = {}
    stored = sorted(accelerator.mps_partitions_set.all(), key=lambda p: p.index) if accelerator.pk else []
    prefix = True
    for partition in stored:
        item = wanted[partition.index] if partition.index < len(wanted) else None
        prefix = prefix and item is not None and item["percent"] == partition.percent and partition.index == len(kept)
        if prefix:
            kept[partition.index] = partition
    for partition in reversed(stored):  # the last first: what stays is always a valid layout
        if partition.index not in kept:
            partition.delete()
    return kept


def _mps_partitions_create(accelerator: Accelerator, wanted: list[dict[str, Any]], kept: dict[int, MpsPartition]) -> None:
    for item in wanted:
        partition = kept.get(item["index"]) or MpsPartition(accelerator=accelerator, percent=item["percent"], index=item["index"])
        _save_if_changed(partition, {"state": item.get("state", MpsPartitionStateChoices.READY)})


@transaction.atomic
def host_actual_state_apply(*, host: Host, report: dict[str, Any]) -> Host:
    """Make the inventory match what the host's agent reports: its backend, devices, MIG instances and MPS
    partitions (`mps_partitions`, when reported; MPS reported off removes them), the desired-state version
    it has converged to and its catalogue disagreements. The report is all or
    nothing: an invalid part (an impossible MIG layout, say) changes nothing. The data-plane parts of the
    report (runtimes, operations) are applied by apps.deployments.services.host_report_apply, which calls
    this in the same transaction. Accelerators' `placements` are not stored: the agent sums up what differs
    from the catalogue in `catalogue_disagreements`; their NVML profile tables (`nvml_profiles`) are, so
    that a GPU the catalogue lacks can be planned from what NVML reports."""
    host = Host.objects.select_for_update().get(pk=host.pk)
    host_values = {"backend": report["backend"]}
    # Optional parts (older agents leave them out): a key that is absent leaves the stored value alone.
    if "desired_version" in report:
        host_values["converged_version"] = report["desired_version"]
    if "settled_version" in report:
        host_values["settled_version"] = report["settled_version"]
    if "catalogue_disagreements" in report:
        host_values["catalogue_disagreements"] = list(report["catalogue_disagreements"])
    if host.status != HostStatusChoices.MAINTENANCE:
        host_values["status"] = HostStatusChoices.ONLINE
    _save_if_changed(host, host_values)
    current = {(a.kind, a.index): a for a in host.accelerators.all()}
    seen = set()
    for item in report["accelerators"]:
        key = (item["kind"], item["index"])
        seen.add(key)
        accelerator = current.get(key) or Accelerator(host=host, kind=item["kind"], index=item["index"])
        values = {f: item.get(f, getattr(accelerator, f)) for f in ACCELERATOR_REPORT_FIELDS}
        if "mps_enabled" not in item and values["mig_enabled"]:
            values["mps_enabled"] = False  # an agent that reports MIG on says MPS is off, if it says nothing of MPS
        wanted, kept = None, {}
        if item["kind"] == AcceleratorKindChoices.GPU:
            wanted = _mps_partitions_wanted(accelerator, values, item)
            if wanted is not None:
                kept = _mps_partitions_prune(accelerator, wanted)  # before MPS may be switched off below
        try:
            _save_if_changed(accelerator, values)
        except ValidationError as exc:
            raise ValidationError({"accelerators": f"{accelerator}: {'; '.join(exc.messages)}"}) from exc
        if item["kind"] == AcceleratorKindChoices.GPU:
            _instances_apply(accelerator, item.get("instances", []))
            if wanted is not None:
                _mps_partitions_create(accelerator, wanted, kept)
    for key, accelerator in current.items():
        if key not in seen:
            accelerator.delete()
    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now(), agent_version=report.get("agent_version", ""))
    host.refresh_from_db()
    return host
