"""Page data for the dashboard, built from querysets restricted to the requesting user (the same role
permissions as the API). Views only render what these return."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from apps.deployments.models import Runtime
from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, GpuInstance, Host
from apps.planning.engine.mig import mig_catalogue_load

# A GPU the MIG catalogue does not know is still drawn on this many memory slices (A100/H100 have 8).
DEFAULT_MEMORY_SLICES = 8
SVG_SLICE_WIDTH = 60  # SVG user units per memory slice; the drawing scales to its container
SVG_HEIGHT = 56


def application_colour(name: str | None) -> str:
    """A stable colour per application (same name, same colour on every page and every run)."""
    if not name:
        return "#9aa5b1"
    hue = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 360
    return f"hsl({hue}, 55%, 42%)"


@dataclass
class RuntimeView:
    key: str
    application: str | None
    variant: str | None
    state: str
    simulated: bool
    colour: str


@dataclass
class BlockView:
    """One GPU instance drawn on its memory slices (SVG coordinates precomputed)."""

    placement: str
    profile: str
    start: int
    size: int
    state: str
    runtime: RuntimeView | None
    x: int
    width: int
    text_x: int
    colour: str

    @property
    def application(self) -> str:
        return (self.runtime.application or "") if self.runtime else ""


@dataclass
class AcceleratorView:
    name: str
    kind: str
    model_name: str
    memory_mb: int
    mig_enabled: bool
    memory_slices: int = 0
    blocks: list[BlockView] = field(default_factory=list)
    whole_runtime: RuntimeView | None = None  # a runtime on the whole GPU (MIG off)
    cpu_cores: int | None = None
    cpu_runtimes: list[RuntimeView] = field(default_factory=list)

    @property
    def svg_width(self) -> int:
        return self.memory_slices * SVG_SLICE_WIDTH

    @property
    def svg_height(self) -> int:
        return SVG_HEIGHT

    @property
    def slice_ticks(self) -> list[dict]:
        return [{"index": i, "x": i * SVG_SLICE_WIDTH} for i in range(self.memory_slices)]

    @property
    def whole_colour(self) -> str:
        return application_colour(self.whole_runtime.application if self.whole_runtime else None)


@dataclass
class HostView:
    name: str
    status: str
    status_label: str
    backend: str
    backend_label: str
    simulated: bool
    last_seen: object
    accelerators: list[AcceleratorView]


def _runtime_view(runtime: Runtime) -> RuntimeView:
    application = runtime.application.name if runtime.application_id else None
    return RuntimeView(
        key=runtime.key, application=application, variant=runtime.variant.name if runtime.variant_id else None,
        state=runtime.get_state_display(), simulated=runtime.simulated, colour=application_colour(application),
    )


def _block_view(instance: GpuInstance, runtime: RuntimeView | None) -> BlockView:
    x = instance.placement_start * SVG_SLICE_WIDTH
    width = max(instance.placement_size, 1) * SVG_SLICE_WIDTH
    return BlockView(
        placement=instance.placement, profile=instance.profile, start=instance.placement_start,
        size=instance.placement_size, state=instance.get_state_display(), runtime=runtime,
        x=x + 2, width=width - 4, text_x=x + width // 2,
        colour=application_colour(runtime.application if runtime else None),
    )


def fleet_overview(user) -> list[HostView]:
    """Every host the user may see, with its GPUs (MIG layouts on memory slices) and CPU devices, and the
    runtimes its agent last reported on each."""
    catalogue = mig_catalogue_load()
    hosts = list(Host.objects.restrict(user, "view").order_by("name"))
    accelerators = Accelerator.objects.restrict(user, "view").filter(host__in=hosts).order_by("kind", "index")
    instances = GpuInstance.objects.restrict(user, "view").filter(accelerator__host__in=hosts).order_by("placement_start")
    runtimes = (
        Runtime.objects.restrict(user, "view").filter(host__in=hosts).select_related("application", "variant")
    )
    runtime_by_key = {(r.host_id, r.key): _runtime_view(r) for r in runtimes}
    instances_by_accelerator: dict[int, list[GpuInstance]] = {}
    for instance in instances:
        instances_by_accelerator.setdefault(instance.accelerator_id, []).append(instance)
    accelerators_by_host: dict[int, list[AcceleratorView]] = {}
    for acc in accelerators:
        view = AcceleratorView(
            name=f"{acc.kind}{acc.index}", kind=acc.kind, model_name=acc.model_name, memory_mb=acc.memory_mb,
            mig_enabled=acc.mig_enabled,
        )
        if acc.kind == AcceleratorKindChoices.GPU:
            spec = catalogue.gpu_model_find(acc.model_name)
            view.memory_slices = spec.memory_slices if spec is not None else DEFAULT_MEMORY_SLICES
            if acc.mig_enabled:
                view.blocks = [
                    _block_view(gi, runtime_by_key.get((acc.host_id, f"gpu{acc.index}/{gi.placement}")))
                    for gi in instances_by_accelerator.get(acc.pk, [])
                ]
            else:
                view.whole_runtime = runtime_by_key.get((acc.host_id, f"gpu{acc.index}"))
        else:
            view.cpu_cores = acc.cpu_cores
            prefix = f"cpu{acc.index}"
            view.cpu_runtimes = sorted(
                (rv for (host_id, key), rv in runtime_by_key.items()
                 if host_id == acc.host_id and (key == prefix or key.startswith(prefix + "/"))),
                key=lambda rv: rv.key,
            )
        accelerators_by_host.setdefault(acc.host_id, []).append(view)
    return [
        HostView(
            name=h.name, status=h.status, status_label=h.get_status_display(), backend=h.backend,
            backend_label=h.get_backend_display(), simulated=h.simulated, last_seen=h.last_seen,
            accelerators=accelerators_by_host.get(h.pk, []),
        )
        for h in hosts
    ]
