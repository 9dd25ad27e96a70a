"""Who is acting. Users act through sessions or API tokens; a host's agent acts through its agent token
and is represented by `AgentPrincipal`, which is deliberately not a Django user: it has no role and no
model permissions beyond reading its own host's records. A router acts through its router credential,
scoped to one router name (`RouterPrincipal`): it reads the routing tables and its own credential, and
reports under its own name only."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

# The only model permissions an agent holds, all of them to read. What it may see is further narrowed by
# each model's `agent_scope` (see RestrictedQuerySet.restrict): its own host's records; every routing
# table (its host's router serves every application); only the artifacts its host's latest desired state
# or open profiling requests use. It writes nothing through these: its reports, metrics, router reports
# and profiling progress and results go through agent-only actions that check for an agent themselves.
# Variants, applications and profiles are not readable: the desired state and the profiling request carry
# what the agent needs of them.
AGENT_PERMISSIONS = frozenset(
    {
        "inventory.view_host",
        "inventory.view_accelerator",
        "inventory.view_gpuinstance",
        "deployments.view_hostdesiredstate",
        "deployments.view_routingtable",
        "deployments.view_runtime",
        "deployments.view_hostoperation",
        "registry.view_profilingrequest",
        "registry.view_artifact",
    }
)


class _DataPlanePrincipal(ABC):
    """What an agent and a router share: authenticated, no role, never staff, and the fixed read
    permissions of `permissions` (narrowed further by each model's scope, see RestrictedQuerySet)."""

    permissions: frozenset[str] = frozenset()
    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    @property
    @abstractmethod
    def username(self) -> str:
        """How logs and audit records name the principal, e.g. "agent:node1"."""

    def __str__(self) -> str:
        return self.username

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return perm in self.permissions

    def has_perms(self, perms, obj: Any = None) -> bool:
        return all(self.has_perm(p, obj) for p in perms)

    def get_all_permissions(self, obj: Any = None) -> set[str]:
        return set(self.permissions)


@dataclass(frozen=True)
class AgentPrincipal(_DataPlanePrincipal):
    host: Any  # apps.inventory.models.Host; typed loosely so core does not import inventory

    permissions = AGENT_PERMISSIONS

    @property
    def username(self) -> str:
        return f"agent:{self.host.name}"


def principal_is_agent(principal: Any) -> bool:
    return isinstance(principal, AgentPrincipal)


# What a router reads: every routing table (it serves every application) and its own credential (its name).
# Its reports go through a router-only view that checks the name itself.
ROUTER_PERMISSIONS = frozenset({"deployments.view_routingtable", "inventory.view_routercredential"})


@dataclass(frozen=True)
class RouterPrincipal(_DataPlanePrincipal):
    credential: Any  # apps.inventory.models.RouterCredential; typed loosely so core does not import inventory

    permissions = ROUTER_PERMISSIONS

    @property
    def username(self) -> str:
        return f"router:{self.credential.name}"


def principal_is_router(principal: Any) -> bool:
    return isinstance(principal, RouterPrincipal)
