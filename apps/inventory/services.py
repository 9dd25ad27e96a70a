"""Inventory services: agent tokens, router credentials, and applying a host's actual-state report. (The MIG layout check
every GPU instance passes is the model's own: GpuInstance.clean.)"""
from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.users.tokens import AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX, token_display, token_generate, token_hash
from engine.geometry.layout import Placement, mig_layout_validate

from .choices import AcceleratorKindChoices, GpuInstanceStateChoices, HostStatusChoices
from .models import Accelerator, GpuInstance, Host, RouterCredential

ACCELERATOR_REPORT_FIELDS = ("uuid", "model_name", "memory_mb", "mig_capable", "mig_enabled", "cpu_cores")


@transaction.atomic
def host_agent_token_rotate(*, host: Host) -> str:
    """Issue a new agent token for a host (the previous one stops working) and return its secret once."""
    secret = token_generate(AGENT_TOKEN_PREFIX)
    host.agent_token_hash = token_hash(secret)
    host.agent_token_prefix = token_display(secret)
    host.save(update_fields=["agent_token_hash", "agent_token_prefix", "last_updated"])
    return secret


@transaction.atomic
def router_credential_issue(*, name: str, description: str | None = None) -> tuple[RouterCredential, str]:
    """Issue a credential for router `name` (created on first issue; re-issuing replaces the secret, so the
    previous one stops working, and lifts a revocation). Returns it with its secret, shown once. Raises
    ValidationError for a name that is not a valid router name."""
    credential = RouterCredential.objects.select_for_update().filter(name=name).first() or RouterCredential(name=name)
    secret = token_generate(ROUTER_TOKEN_PREFIX)
    credential.token_hash = token_hash(secret)
    credential.token_prefix = token_display(secret)
    credential.revoked = None
    if description is not None:
        credential.description = description
    credential.full_clean(validate_unique=False)
    credential.save()
    return credential, secret


@transaction.atomic
def router_credential_revoke(*, credential: RouterCredential) -> RouterCredential:
    """Revoke a router credential: its secret stops working at once (401). The record stays, marked revoked,
    for the fleet page and the audit log; issuing again gives the router a new secret."""
    credential = RouterCredential.objects.select_for_update().get(pk=credential.pk)
    if credential.revoked is None:
        credential.revoked = timezone.now()
        credential.token_hash = ""
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
    spec = accelerator.gpu_model
    layout = [Placement(i["profile"], i["start"]) for i in reported]
    if reported:
        if not accelerator.mig_enabled or spec is None:
            raise ValidationError({"accelerators": f"{accelerator}: MIG instances reported on a GPU without MIG enabled."})
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


@transaction.atomic
def host_actual_state_apply(*, host: Host, report: dict[str, Any]) -> Host:
    """Make the inventory match what the host's agent reports: its backend, devices and MIG instances, the
    desired-state version it has converged to and its catalogue disagreements. The report is all or
    nothing: an invalid part (an impossible MIG layout, say) changes nothing. The data-plane parts of the
    report (runtimes, operations) are applied by apps.deployments.services.host_report_apply, which calls
    this in the same transaction. Accelerators' `placements` are not stored: the agent sums up what differs
    from the catalogue in `catalogue_disagreements`."""
    host = Host.objects.select_for_update().get(pk=host.pk)
    host_values = {"backend": report["backend"]}
    # Optional parts (older agents leave them out): a key that is absent leaves the stored value alone.
    if "desired_version" in report:
        host_values["converged_version"] = report["desired_version"]
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
        try:
            _save_if_changed(accelerator, {f: item.get(f, getattr(accelerator, f)) for f in ACCELERATOR_REPORT_FIELDS})
        except ValidationError as exc:
            raise ValidationError({"accelerators": f"{accelerator}: {'; '.join(exc.messages)}"}) from exc
        if item["kind"] == AcceleratorKindChoices.GPU:
            _instances_apply(accelerator, item.get("instances", []))
    for key, accelerator in current.items():
        if key not in seen:
            accelerator.delete()
    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now(), agent_version=report.get("agent_version", ""))
    host.refresh_from_db()
    return host
