"""What should run where (a host's desired state, an application's routing table) and what runs (the
runtimes and operations the agents report). The documents' shapes are in docs/dataplane.md; they are
validated and filled in by the services, never written directly."""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from apps.core.querysets import RestrictedQuerySet
from apps.inventory.models import Host
from apps.registry.models import Application, ModelVariant
from engine.geometry.names import RUNTIME_KEY_MAX_LENGTH

from .choices import OperationOutcomeChoices, RuntimeStateChoices


class HostDesiredState(ChangeLoggedModel):
    """One version of what a host should run: the geometry of the GPUs it lists and its runtimes. `spec` is
    the whole document the agent reads (docs/dataplane.md), with the host, version, variants, artifacts
    and profiles filled in by `host_desired_state_set`. Versions only ever grow; the latest one counts."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="desired_states")
    version = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    spec = models.JSONField(help_text="The desired-state document, as the agent reads it")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False, related_name="+"
    )

    class Meta:
        ordering = ["host__name", "-version"]
        verbose_name = "host desired state"
        constraints = [
            models.UniqueConstraint(fields=["host", "version"], name="hostdesiredstate_unique_version_per_host"),
        ]

    def __str__(self) -> str:
        return f"{self.host.name} v{self.version}" if self.host_id else f"v{self.version}"

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(host=host)


class RoutingTable(ChangeLoggedModel):
    """One version of an application's traffic split over instances (`<host>/<runtime key>`). At most one
    version per application is active; publishing a new one deactivates the previous in the same
    transaction. `routes` is [{"instance", "variant" (id), "weight"}], weights normalised to sum to 1."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="routing_tables")
    version = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    active = models.BooleanField(default=False)
    routes = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False, related_name="+"
    )

    class Meta:
        ordering = ["application__name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["application", "version"], name="routingtable_unique_version_per_application"),
            models.UniqueConstraint(
                fields=["application"], condition=models.Q(active=True), name="routingtable_one_active_per_application"
            ),
        ]

    def __str__(self) -> str:
        name = self.application.name if self.application_id else "?"
        return f"{name} v{self.version}{' (active)' if self.active else ''}"

    @staticmethod
    def agent_scope(queryset, host):
        # An agent may read every application's table (the runtimes it supervises serve any application).
        # Routers read them with their own credential: RestrictedQuerySet gives them every table.
        return queryset


class Runtime(models.Model):
    """A runtime as its host's agent last reported it. Not a ChangeLoggedModel on purpose: this is
    reported state, replaced wholesale by every report, and the agent's operations (HostOperation) are the
    record of what happened; auditing each report would only repeat them."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="runtimes")
    key = models.CharField(max_length=RUNTIME_KEY_MAX_LENGTH, help_text='Runtime key, e.g. "gpu0/3g.20gb@4", "gpu1", "cpu0/0"')
    application = models.ForeignKey(Application, null=True, blank=True, on_delete=models.SET_NULL, related_name="runtimes")
    variant = models.ForeignKey(ModelVariant, null=True, blank=True, on_delete=models.SET_NULL, related_name="runtimes")
    state = models.CharField(max_length=20, choices=RuntimeStateChoices.choices)
    endpoint = models.CharField(max_length=255, blank=True, help_text='Where routers reach it, e.g. "tcp://10.0.0.5:41001"')
    simulated = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    last_updated = models.DateTimeField(auto_now=True)

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["host__name", "key"]
        constraints = [models.UniqueConstraint(fields=["host", "key"], name="runtime_unique_key_per_host")]

    def __str__(self) -> str:
        return f"{self.host.name}/{self.key}" if self.host_id else self.key

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(host=host)


class HostOperation(models.Model):
    """One operation an agent performed (a MIG instance created, a runtime started), appended from its
    reports. Append-only: the log itself is the record, so it is not change-logged."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="operations")
    at = models.DateTimeField()
    action = models.CharField(max_length=50, help_text='e.g. "mig.create", "runtime.start"')
    target = models.CharField(max_length=200, blank=True)
    outcome = models.CharField(max_length=10, choices=OperationOutcomeChoices.choices)
    detail = models.TextField(blank=True)

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["host", "at"], name="hostoperation_host_at")]

    def __str__(self) -> str:
        host = self.host.name if self.host_id else "?"
        return f"{host} {self.action} {self.target} ({self.outcome})"

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(host=host)


class SlotChange(models.Model):
    """A change of what a host's slots serve, announced before their routes are withdrawn and gone once the
    host's new desired state is stored (`routes_withdraw`, `host_desired_state_set`). `serving` is what the
    host's slots will serve ({runtime key: variant id or null}; a key not in it: nothing). While it stands, a
    routing table may not add a route to one of the host's slots for another variant than that one, so an
    operator's publish cannot slip a route in between the withdrawal and the write. `expires_at` ends one
    whose writer died between the two."""

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="slot_change")
    serving = models.JSONField(default=dict)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["host"]

    def __str__(self) -> str:
        return f"{self.host.name}: {len(self.serving)} slots changing until {self.expires_at:%H:%M:%S}"
