"""Time series the data plane reports every second: per runtime (from the agents' metrics), per GPU and
MIG instance (ditto), per application and per pipeline path as each router sees it; and the CPU runtimes'
in-place resizes, each one as it happened. Samples are measurements, not
configuration: they are bulk-inserted without model validation or change logging, read-only everywhere,
and pruned by age (telemetry_prune)."""
from __future__ import annotations

from django.db import models

from apps.core.querysets import RestrictedQuerySet
from apps.inventory.models import Host
from apps.registry.models import Application, Pipeline


class IntervalCounts(models.Model):
    """What happened to queries over one reporting interval, ending at `at`."""

    at = models.DateTimeField(help_text="End of the interval")
    interval_s = models.FloatField()
    arrivals = models.PositiveIntegerField(default=0)
    served = models.PositiveIntegerField(default=0, help_text="Answered, on time or late")
    late = models.PositiveIntegerField(default=0)
    dropped = models.PositiveIntegerField(default=0)
    latency_p50_ms = models.FloatField(null=True, blank=True)
    latency_p99_ms = models.FloatField(null=True, blank=True)

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["-at", "-id"]


class RuntimeSample(IntervalCounts):
    """One runtime's counts over one interval. `application_name` is what the agent reported; the foreign
    key is set when an application of that name exists."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="runtime_samples")
    runtime_key = models.CharField(max_length=100)
    application = models.ForeignKey(Application, null=True, blank=True, on_delete=models.SET_NULL, related_name="runtime_samples")
    application_name = models.CharField(max_length=100, blank=True)
    variant_name = models.CharField(max_length=100, blank=True)
    queue_length = models.PositiveIntegerField(default=0)
    batches = models.PositiveIntegerField(default=0)
    batch_size_mean = models.FloatField(default=0.0)
    # A CPU runtime's cores and batch cap at the end of the interval (they change in place under vertical
    # scaling); null where the agent does not say (GPU runtimes).
    cores = models.PositiveSmallIntegerField(null=True, blank=True)
    batch_cap = models.PositiveIntegerField(null=True, blank=True)
    # The CPU ids it runs on then (a list; null where it is not pinned, or not a CPU runtime).
    cpus = models.JSONField(null=True, blank=True)

    class Meta(IntervalCounts.Meta):
        indexes = [
            models.Index(fields=["host", "at"], name="runtimesample_host_at"),
            models.Index(fields=["application", "at"], name="runtimesample_application_at"),
            models.Index(fields=["at"], name="runtimesample_at"),
        ]

    def __str__(self) -> str:
        return f"{self.runtime_key} @ {self.at:%Y-%m-%d %H:%M:%S}"


class RuntimeResize(models.Model):
    """One in-place resize of a CPU runtime (vertical scaling), as its agent reported it with the next
    metrics report: when, who asked (`by`: "vertical", the agent's fast loop, or "desired", a desired-state
    change) and why, from which cores and batch cap to which, on which CPUs, and whether the runtime took
    them (`outcome`). A measurement, like the samples: bulk-inserted, read-only, pruned by age."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="runtime_resizes")
    runtime_key = models.CharField(max_length=100)
    application = models.ForeignKey(Application, null=True, blank=True, on_delete=models.SET_NULL, related_name="runtime_resizes")
    application_name = models.CharField(max_length=100, blank=True)
    variant_name = models.CharField(max_length=100, blank=True)
    at = models.DateTimeField(help_text="When it was resized (the agent's clock)")
    reported_at = models.DateTimeField(help_text="The end of the interval whose report carried it")
    by = models.CharField(max_length=20, help_text='"vertical" (the agent\'s fast loop) or "desired" (a desired-state change)')
    outcome = models.CharField(max_length=20, help_text='"ok", or "failed" (the runtime kept the sizes it had)')
    reason = models.CharField(max_length=500, blank=True)
    from_cores = models.PositiveSmallIntegerField(null=True, blank=True)
    from_batch_cap = models.PositiveIntegerField(null=True, blank=True)
    cores = models.PositiveSmallIntegerField()
    batch_cap = models.PositiveIntegerField(null=True, blank=True)
    cpus = models.JSONField(null=True, blank=True, help_text="The CPU ids after the resize (null: not pinned)")
    resize_ms = models.FloatField(null=True, blank=True)
    prepared = models.BooleanField(null=True, blank=True, help_text="A session for those cores was ready (a warm resize)")

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["host", "runtime_key", "at"], name="runtimeresize_host_key_at"),
            models.Index(fields=["application", "at"], name="runtimeresize_application_at"),
            models.Index(fields=["at"], name="runtimeresize_at"),
        ]

    def __str__(self) -> str:
        return f"{self.runtime_key} {self.from_cores}->{self.cores} cores @ {self.at:%Y-%m-%d %H:%M:%S}"


class GpuSample(models.Model):
    """One GPU (placement blank) or one MIG instance on it (placement "3g.20gb@4") at one moment."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpu_samples")
    accelerator_index = models.PositiveSmallIntegerField()
    placement = models.CharField(max_length=40, blank=True, help_text="MIG placement; blank for the whole GPU")
    at = models.DateTimeField()
    utilization_pct = models.FloatField(null=True, blank=True)
    gr_engine_active_pct = models.FloatField(null=True, blank=True)
    memory_used_mb = models.PositiveIntegerField(default=0)
    power_w = models.FloatField(null=True, blank=True)
    simulated = models.BooleanField(default=False)

    objects = RestrictedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["host", "at"], name="gpusample_host_at"),
            models.Index(fields=["at"], name="gpusample_at"),
        ]

    def __str__(self) -> str:
        where = f"gpu{self.accelerator_index}" + (f"/{self.placement}" if self.placement else "")
        return f"{where} @ {self.at:%Y-%m-%d %H:%M:%S}"


class ApplicationSample(IntervalCounts):
    """One application's traffic over one interval as one router saw it (`router`: the name its router
    credential is scoped to; `host`: the host whose agent token posted it, from before routers had
    credentials of their own, so empty on new samples)."""

    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="application_samples")
    router = models.CharField(max_length=100)
    application = models.ForeignKey(Application, null=True, blank=True, on_delete=models.SET_NULL, related_name="application_samples")
    application_name = models.CharField(max_length=100)
    routing_version = models.PositiveIntegerField(null=True, blank=True)
    no_route = models.PositiveIntegerField(default=0)
    # Requests per size over the interval, {"<rows per request>": count} (Garrison's D[b]); null where the
    # router does not count them.
    query_sizes = models.JSONField(null=True, blank=True)
    # The interval's random ensembles (Garrison's frequency table), one block per scheduler that drew them (a
    # policy changed within the interval gives two): [{"scheduler": text, "queries": n, "chosen": {variant: n},
    # "voted": {variant: n}, "sizes": {"<ensemble size>": n}}, ...]; null without an ensemble.
    ensembles = models.JSONField(null=True, blank=True)

    class Meta(IntervalCounts.Meta):
        indexes = [
            models.Index(fields=["application", "at"], name="applicationsample_app_at"),
            models.Index(fields=["host", "at"], name="applicationsample_host_at"),
            models.Index(fields=["at"], name="applicationsample_at"),
        ]

    def __str__(self) -> str:
        return f"{self.application_name} via {self.router} @ {self.at:%Y-%m-%d %H:%M:%S}"


class PipelinePathSample(IntervalCounts):
    """One pipeline path's end-to-end traffic over one interval as one router saw it: queries that arrived
    at its entry, answered by its last stage (on time or late), dropped at a stage past the deadline, failed
    at a stage, or with no route for a stage. Each stage is also reported as its own application."""

    router = models.CharField(max_length=100)
    pipeline = models.ForeignKey(Pipeline, null=True, blank=True, on_delete=models.SET_NULL, related_name="path_samples")
    pipeline_name = models.CharField(max_length=100)
    path = models.CharField(max_length=100)
    failed = models.PositiveIntegerField(default=0)
    no_route = models.PositiveIntegerField(default=0)

    class Meta(IntervalCounts.Meta):
        indexes = [models.Index(fields=["pipeline_name", "path", "at"], name="pathsample_pipeline_path_at")]

    def __str__(self) -> str:
        return f"{self.pipeline_name}/{self.path} via {self.router} @ {self.at:%Y-%m-%d %H:%M:%S}"
