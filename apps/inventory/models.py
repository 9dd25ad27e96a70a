"""The fleet as it is: hosts, their accelerators (GPUs and CPU allotments), MIG GPU instances and MPS
partitions. MIG facts (profiles, sizes, legal starts) come from the engine's catalogue data, MPS rules
(allowed shares, at most 100 %, largest first) from engine.sharing.partitions, never from code here."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from apps.core.models import ChangeLoggedModel
from engine.geometry.catalogue import CatalogueError, GpuModelSpec, gpu_model_from_nvml, mig_catalogue_load
from engine.geometry.layout import Placement, mig_layout_validate
from engine.sharing.partitions import MPS_PARTITIONS_DEFAULT, mps_layout_format, mps_layout_validate

from .choices import (
    AcceleratorKindChoices,
    GpuInstanceStateChoices,
    HostBackendChoices,
    HostStatusChoices,
    MpsPartitionStateChoices,
)

name_validator = RegexValidator(
    r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$", "Use letters, digits, '.', '_' and '-', starting with a letter or digit."
)


class Host(ChangeLoggedModel):
    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    address = models.CharField(max_length=255, blank=True, help_text="Hostname or IP address of the agent")
    labels = models.JSONField(default=dict, blank=True, help_text='Free-form labels, e.g. {"zone": "eu-1"}')
    status = models.CharField(max_length=20, choices=HostStatusChoices.choices, default=HostStatusChoices.REGISTERED)
    backend = models.CharField(max_length=20, choices=HostBackendChoices.choices, default=HostBackendChoices.NVML)
    last_seen = models.DateTimeField(null=True, blank=True, editable=False)
    agent_version = models.CharField(max_length=50, blank=True, editable=False)
    agent_token_hash = models.CharField(max_length=64, blank=True, editable=False, db_index=True)
    agent_token_prefix = models.CharField(max_length=16, blank=True, editable=False)
    description = models.TextField(blank=True)
    converged_version = models.PositiveIntegerField(
        null=True, blank=True, editable=False,
        help_text="The desired-state version the agent last reported it has converged to; empty before the first",
    )
    settled_version = models.PositiveIntegerField(
        null=True, blank=True, editable=False,
        help_text="The desired-state version the agent reached but for runtimes that failed to start (reported as failed, "
        "retried): a rollout goes on without them",
    )
    catalogue_disagreements = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="Where the GPUs' MIG placements (as NVML reports them) differ from the catalogue, per the agent",
    )

    dropped_reports = models.PositiveBigIntegerField(
        default=0, editable=False,
        help_text="Metrics reports the agent had to drop (its outage buffer overflowed), as its later reports said",
    )

    audit_exclude_fields = ("agent_token_hash", "last_seen", "dropped_reports")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def simulated(self) -> bool:
        return self.backend == HostBackendChoices.SIMULATED

    def clean(self) -> None:
        if not isinstance(self.labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise ValidationError({"labels": "Labels must be an object of string keys to string values."})

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(pk=host.pk)


class Accelerator(ChangeLoggedModel):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="accelerators")
    index = models.PositiveSmallIntegerField(help_text="NVML device index, or the CPU allotment's index")
    kind = models.CharField(max_length=10, choices=AcceleratorKindChoices.choices)
    uuid = models.CharField(max_length=80, unique=True, null=True, blank=True, help_text="GPU UUID as NVML reports it")
    model_name = models.CharField(max_length=100, help_text='As NVML reports it, e.g. "NVIDIA A100-SXM4-40GB"; "cpu" for CPUs')
    memory_mb = models.PositiveIntegerField(default=0)
    mig_capable = models.BooleanField(default=False)
    mig_enabled = models.BooleanField(default=False)
    cpu_cores = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    mps_enabled = models.BooleanField(
        default=False,
        help_text="MPS partitioning (gpulets): the GPU is shared by partitions of a percent of its SMs. Never with MIG. "
        "As its agent reports it (the desired state's gpus entry turns it on or off)",
    )
    mps_partitions = models.JSONField(
        default=list, blank=True,
        help_text="The partition sizes (percent of the SMs) allowed on this GPU, e.g. [20, 40, 50, 60, 80, 100]; "
        "empty: the engine's default (" + ", ".join(map(str, MPS_PARTITIONS_DEFAULT)) + ")",
    )
    pci_device_id = models.CharField(
        max_length=10, blank=True, editable=False,
        help_text='The board\'s PCI device id as NVML reports it, in mig-parted\'s device-filter form ("0x20B010DE")',
    )
    nvml_profiles = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The GPU instance profiles NVML reports on this GPU while MIG is on (name, id, memory and compute "
        "slices, MiB, starts, instances), as its agent last said; a GPU the MIG catalogue lacks is planned from it",
    )

    class Meta:
        ordering = ["host__name", "kind", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "kind", "index"], name="accelerator_unique_host_kind_index"),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}/{self.kind}{self.index}" if self.host_id else f"{self.kind}{self.index}"

    @property
    def gpu_model(self) -> GpuModelSpec | None:
        """The catalogue entry for this GPU (by NVML's name, else by the board's PCI device id), or None for
        CPUs and GPUs the MIG catalogue does not know."""
        if self.kind != AcceleratorKindChoices.GPU:
            return None
        catalogue = mig_catalogue_load()
        return catalogue.gpu_model_find(self.model_name) or (
            catalogue.gpu_model_find_by_pci(self.pci_device_id) if self.pci_device_id else None
        )

    @property
    def gpu_model_planned(self) -> GpuModelSpec | None:
        """The model the planner and the geometry use: the catalogue's, else, for a GPU the catalogue lacks,
        one described from the NVML profile table its agent reported (labelled "from NVML, not in the
        catalogue"); None when there is neither (or the table is inconsistent)."""
        model = self.gpu_model
        if model is not None or self.kind != AcceleratorKindChoices.GPU or not self.nvml_profiles:
            return model
        try:
            # Named as profiles and problems name a GPU outside the catalogue: NVML's name without "NVIDIA ".
            return gpu_model_from_nvml(self.model_name.removeprefix("NVIDIA ").strip(), self.memory_mb, self.nvml_profiles,
                                       nvml_names=(self.model_name,))
        except CatalogueError:
            return None

    @property
    def mps_partitions_allowed(self) -> tuple[int, ...]:
        """The MPS partition sizes allowed on this GPU: its own list, else the engine's default."""
        return tuple(sorted(self.mps_partitions)) if self.mps_partitions else MPS_PARTITIONS_DEFAULT

    def _mps_clean(self, errors: dict[str, str]) -> None:
        allowed = self.mps_partitions
        if not isinstance(allowed, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in allowed):
            errors["mps_partitions"] = "Expected a list of whole percents, e.g. [20, 40, 50, 60, 80, 100]."
            return
        outside = [p for p in allowed if not 1 <= p <= 100]
        if outside:
            errors["mps_partitions"] = f"{', '.join(map(str, outside))}: an MPS partition is 1 to 100 % of the GPU."
            return
        if len(set(allowed)) != len(allowed):
            errors["mps_partitions"] = "A partition size is listed twice."
            return
        self.mps_partitions = sorted(allowed)
        if self.kind == AcceleratorKindChoices.CPU:
            if self.mps_enabled:
                errors["mps_enabled"] = "A CPU cannot use MPS."
            if self.mps_partitions:
                errors["mps_partitions"] = "A CPU has no MPS partitions."
            return
        if self.mig_enabled and self.mps_enabled:
            errors["mps_enabled"] = "MIG and MPS cannot both be enabled on a GPU: a GPU is partitioned with one or the other."
            return
        if self.pk is None:
            return
        partitions = list(MpsPartition.objects.filter(accelerator_id=self.pk).order_by("index"))
        if partitions and not self.mps_enabled:
            errors["mps_enabled"] = (f"{self} has MPS partitions ({mps_layout_format([p.percent for p in partitions])}); "
                                     "delete them before disabling MPS.")
        elif partitions:
            refused = sorted({p.percent for p in partitions} - set(self.mps_partitions_allowed))
            if refused:
                errors["mps_partitions"] = (f"{self} has partitions of {', '.join(map(str, refused))} %, which this list "
                                            "would not allow; delete them first.")

    def clean(self) -> None:
        errors: dict[str, str] = {}
        self._mps_clean(errors)
        if self.kind == AcceleratorKindChoices.CPU:
            if not self.cpu_cores:
                errors["cpu_cores"] = "A CPU accelerator needs its number of cores."
            if self.mig_capable or self.mig_enabled:
                errors["mig_capable"] = "A CPU cannot be MIG capable."
        elif self.kind == AcceleratorKindChoices.GPU:
            if self.cpu_cores:
                errors["cpu_cores"] = "Only CPU accelerators have cores."
            if not self.memory_mb:
                errors["memory_mb"] = "A GPU needs its memory size in MiB."
            if self.mig_enabled and not self.mig_capable:
                errors["mig_enabled"] = "MIG cannot be enabled on a GPU that is not MIG capable."
            if self.mig_enabled and self.gpu_model_planned is None:
                known = ", ".join(mig_catalogue_load().gpu_model_names)
                errors["model_name"] = (f"No MIG catalogue entry for {self.model_name!r} and no NVML profile table reported "
                                        f"for it; known MIG GPUs: {known}.")
        if errors:
            raise ValidationError(errors)

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(host=host)


class GpuInstance(ChangeLoggedModel):
    """A MIG GPU instance (with its one full-size compute instance), placed at an explicit start."""

    accelerator = models.ForeignKey(Accelerator, on_delete=models.CASCADE, related_name="gpu_instances")
    profile = models.CharField(max_length=30, help_text='MIG profile name, e.g. "3g.20gb"')
    placement_start = models.PositiveSmallIntegerField(help_text="First memory slice, as nvidia-smi mig -lgipp counts them")
    placement_size = models.PositiveSmallIntegerField(editable=False, help_text="Memory slices occupied, from the catalogue")
    uuid = models.CharField(max_length=80, blank=True, help_text="MIG device UUID, once created")
    state = models.CharField(max_length=20, choices=GpuInstanceStateChoices.choices, default=GpuInstanceStateChoices.PENDING)

    class Meta:
        ordering = ["accelerator__host__name", "accelerator__index", "placement_start"]
        constraints = [
            models.UniqueConstraint(fields=["accelerator", "placement_start"], name="gpuinstance_unique_start"),
        ]

    def __str__(self) -> str:
        return f"{self.accelerator}:{self.profile}@{self.placement_start}" if self.accelerator_id else self.placement

    @property
    def placement(self) -> str:
        return f"{self.profile}@{self.placement_start}"

    def clean(self) -> None:
        """Refuse an instance that would make its GPU's MIG layout invalid, with NVIDIA's reason."""
        if not self.accelerator_id:
            return
        accelerator = self.accelerator
        if accelerator.kind != AcceleratorKindChoices.GPU:
            raise ValidationError({"accelerator": "GPU instances live on GPUs, not CPUs."})
        if not accelerator.mig_enabled:
            raise ValidationError({"accelerator": f"MIG is not enabled on {accelerator}."})
        spec = accelerator.gpu_model_planned
        if spec is None:
            raise ValidationError({"accelerator": f"{accelerator}: neither the MIG catalogue nor NVML describes its profiles."})
        if spec.profile_find(self.profile) is None:
            known = ", ".join(spec.profile_names)
            raise ValidationError({"profile": f"{self.profile!r} is not a MIG profile of {spec.name} (known: {known})."})
        others = accelerator.gpu_instances.exclude(pk=self.pk) if self.pk else accelerator.gpu_instances.all()
        layout = [Placement(o.profile, o.placement_start) for o in others]
        layout.append(Placement(self.profile, self.placement_start))
        verdict = mig_layout_validate(spec, layout)
        if not verdict.valid:
            raise ValidationError({"placement_start": verdict.reason})

    def save(self, *args, **kwargs):
        spec = self.accelerator.gpu_model_planned
        profile = spec.profile_find(self.profile) if spec is not None else None
        if profile is not None:
            self.profile = profile.name  # canonical spelling ("MIG 3G.20GB" -> "3g.20gb")
            self.placement_size = profile.memory_slices
        super().save(*args, **kwargs)

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(accelerator__host=host)


class MpsPartition(ChangeLoggedModel):
    """An MPS partition of a GPU (gpulets): `percent` of its SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
    `index` its place in the GPU's layout, largest first. Several models may time-share one partition
    (their runtimes are `gpu<i>/mps<NN>@<index>/<slot>`). The partitions of a GPU are 0..n-1, add up to at
    most 100 % and each is a size the GPU allows (`Accelerator.mps_partitions_allowed`)."""

    accelerator = models.ForeignKey(Accelerator, on_delete=models.CASCADE, related_name="mps_partitions_set")
    percent = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(100)], help_text="Share of the GPU's SMs, in percent",
    )
    index = models.PositiveSmallIntegerField(help_text="Place in the GPU's layout, largest first (0..n-1)")
    state = models.CharField(max_length=20, choices=MpsPartitionStateChoices.choices, default=MpsPartitionStateChoices.PENDING)

    class Meta:
        ordering = ["accelerator__host__name", "accelerator__index", "index"]
        constraints = [
            models.UniqueConstraint(fields=["accelerator", "index"], name="mpspartition_unique_index"),
        ]

    def __str__(self) -> str:
        return f"{self.accelerator}:{self.slot}" if self.accelerator_id else self.slot

    @property
    def slot(self) -> str:
        """The partition's name in plans and runtime keys, e.g. "mps60@0"."""
        return f"mps{self.percent}@{self.index}"

    def clean(self) -> None:
        """Refuse a partition that would make its GPU's MPS layout invalid, naming every problem."""
        if not self.accelerator_id or self.percent is None or self.index is None:
            return
        accelerator = self.accelerator
        if accelerator.kind != AcceleratorKindChoices.GPU:
            raise ValidationError({"accelerator": "MPS partitions live on GPUs, not CPUs."})
        if not accelerator.mps_enabled:
            raise ValidationError({"accelerator": f"MPS is not enabled on {accelerator}."})
        allowed = accelerator.mps_partitions_allowed
        if self.percent not in allowed:
            raise ValidationError({"percent": f"{self.percent} % is not a partition size {accelerator} allows "
                                              f"(allowed: {', '.join(map(str, allowed))} %)."})
        others = accelerator.mps_partitions_set.exclude(pk=self.pk) if self.pk else accelerator.mps_partitions_set.all()
        layout = {p.index: p.percent for p in others}
        if self.index in layout:
            raise ValidationError({"index": f"{accelerator} already has partition {self.index}."})
        layout[self.index] = self.percent
        problem = mps_partitions_problem(layout, allowed)
        if problem:
            raise ValidationError({"index": f"{accelerator}: {problem}"})

    @staticmethod
    def agent_scope(queryset, host):
        return queryset.filter(accelerator__host=host)


def mps_partitions_problem(layout: dict[int, int], allowed) -> str | None:
    """What is wrong with a GPU's partitions {index: percent} (None: nothing): the engine's rules (allowed
    sizes, at most 100 %, indices 0..n-1), and largest first, in words."""
    percents = [layout[i] for i in sorted(layout)]
    problems = mps_layout_validate(percents, allowed=allowed)
    if sorted(layout) != list(range(len(layout))):
        problems.append(f"partition indices must be 0..{len(layout) - 1}, got {sorted(layout)}")
    if percents != sorted(percents, reverse=True):
        problems.append(f"partitions must be largest first by index, got {', '.join(f'mps{p}@{i}' for i, p in sorted(layout.items()))}")
    if problems:
        return f"invalid MPS layout {mps_layout_format(percents)!r}: {'; '.join(problems)}"
    return None


class RouterCredential(ChangeLoggedModel):
    """A router's own credential (`tsr_…`), scoped to one router name: it reads the routing tables and posts
    router reports under `name` only, so one host cannot feed planning demand in another router's name.
    Issued (or re-issued: the previous secret stops working) and revoked by an admin, like agent tokens;
    every issue and revocation is in the audit log (`token_prefix` and `revoked` change, the hash never shows)."""

    name = models.CharField(max_length=100, unique=True, validators=[name_validator], help_text="The router name its reports carry")
    description = models.CharField(max_length=200, blank=True)
    token_hash = models.CharField(max_length=64, blank=True, editable=False, db_index=True)
    token_prefix = models.CharField(max_length=16, blank=True, editable=False)
    revoked = models.DateTimeField(null=True, blank=True, editable=False, help_text="When it was revoked; empty while valid")
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    dropped_reports = models.PositiveBigIntegerField(
        default=0, editable=False,
        help_text="Reports the router had to drop (its outage buffer overflowed), as its later reports said",
    )
    may_load_models = models.BooleanField(
        default=False,
        help_text="Whether the router may pin and release applications for the Open Inference Protocol's model "
        "repository extension (POST /v2/repository/models/{name}/load|unload): off unless an admin allows it",
    )

    audit_exclude_fields = ("token_hash", "last_used", "dropped_reports")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.revoked is None and bool(self.token_hash)

    @staticmethod
    def router_scope(queryset, credential):
        return queryset.filter(pk=credential.pk)
