"""Page data for the dashboard, built from querysets restricted to the requesting user (the same role
permissions as the API). Views only render what these return."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from django.db.models import Count, OuterRef, Subquery

from apps.deployments.models import HostDesiredState, Runtime
from apps.inventory.choices import AcceleratorKindChoices
from apps.inventory.models import Accelerator, GpuInstance, Host, MpsPartition, RouterCredential
from apps.planning.diff import partition_duty_cycles
from apps.policies.models import SloPolicy
from apps.registry.models import Application, ModelVariant, Profile
from apps.telemetry.selectors import EnsembleFrequencies, application_ensemble_frequencies, application_latency_window, runtime_cores_history
from engine.geometry.catalogue import mig_catalogue_load
from engine.geometry.names import runtime_key_parse

from .profile_charts import variant_profile_series

# A GPU the MIG catalogue does not know is still drawn on this many memory slices (A100/H100 have 8).
DEFAULT_MEMORY_SLICES = 8
SVG_SLICE_WIDTH = 60  # SVG user units per memory slice; the drawing scales to its container
SVG_HEIGHT = 56
SVG_SUB_FONT = {True: 10, False: 12}  # the variant label's font size (svg.mig .sub, .narrow) on a narrow block or not
SVG_CHAR_WIDTH = 0.6  # an average glyph's advance, in font sizes (system sans-serif)
# An MPS GPU is drawn taller: under its partition's percent, a block lists the models time-sharing it.
MPS_SVG_HEIGHT = 92
MPS_BLOCK_HEIGHT = 78  # a partition block's height (from y=3); the GPU's utilisation bar is drawn under the blocks
MPS_MODEL_LINES = 3  # model lines a partition block has room for; more are "+N more"
MPS_LINE_FONT = 11  # svg.mig .model (px in SVG units)
MPS_LABEL_FONT = 15  # svg.mig .label
MPS_LINE_FIRST_Y, MPS_LINE_STEP = 40, 14
MPS_LINE_SQUEEZE = 0.75  # a model line may be squeezed to this share of its natural width before it is shortened
MIXED_COLOUR = "#52606d"  # a partition time-shared by models of several applications


GOLDEN_ANGLE = 137.508  # successive applications get hues as far apart as possible
_application_ordinals: dict[str, int] = {}


def application_colour(name: str | None) -> str:
    """A stable colour per application: its hue steps the golden angle by the application's primary key, so
    applications registered one after another never look alike (hashing names made near-twins). A name the
    registry does not know (telemetry keeps them) gets a hue from its hash."""
    if not name:
        return "#9aa5b1"
    ordinal = _application_ordinals.get(name)
    if ordinal is None:
        _application_ordinals.update(Application.objects.values_list("name", "pk"))
        ordinal = _application_ordinals.get(name)
    if ordinal is None:
        hue = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 360
    else:
        hue = (ordinal * GOLDEN_ANGLE) % 360
    return f"hsl({hue:.0f}, 58%, 42%)"


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
    change: str = ""  # on the plan page: "created" or "destroyed" by the plan ("" when kept, and on the fleet page)

    @property
    def application(self) -> str:
        return (self.runtime.application or "") if self.runtime else ""

    @property
    def variant_text_length(self) -> int | None:
        """The width to squeeze the variant label into when it would overflow its block (None: it fits)."""
        text = (self.runtime.variant or "") if self.runtime else ""
        room = self.width - 8
        return room if len(text) * SVG_CHAR_WIDTH * SVG_SUB_FONT[self.size == 1] > room else None


@dataclass
class ModelLineView:
    """One line of an MPS partition block: a model time-sharing it ("application: variant", shortened to
    fit), or "+N more" (no colour) when the block has no room for every model."""

    text: str
    colour: str | None
    y: int
    text_length: int | None = None  # squeeze the text into this width (None: it fits as it is)
    key: str | None = None  # the model's runtime key ("gpu0/mps60@0/1"); None for "+N more"


@dataclass
class PartitionView:
    """One MPS partition drawn as a share of its GPU's width (SVG coordinates precomputed), with the
    models time-sharing it (by slot) and its duty cycle (the round its models take turns in)."""

    slot: str  # "mps60@0"
    percent: int
    index: int
    state: str
    runtimes: list[RuntimeView]
    duty_cycle_ms: float | None
    x: int
    width: int
    text_x: int
    colour: str
    lines: list[ModelLineView]
    change: str = ""  # on the plan page: "created" or "destroyed" by the plan

    @property
    def label(self) -> str:
        """ "60 % · round 23.4 ms" where the block is wide enough, else "60 %" (the round is in its title)."""
        label = f"{self.percent} %"
        if self.duty_cycle_ms is None:
            return label
        longer = f"{label} · round {self.duty_cycle_ms:.3g} ms"
        return longer if len(longer) * SVG_CHAR_WIDTH * MPS_LABEL_FONT <= self.width - 8 else label

    @property
    def applications(self) -> str:
        """The applications served in it, space separated (for data-applications)."""
        return " ".join(sorted({r.application for r in self.runtimes if r.application}))

    @property
    def duty_cycle_text(self) -> str:
        """ "round 40 ms" ("" when the partition has no duty cycle)."""
        return f"round {self.duty_cycle_ms:g} ms" if self.duty_cycle_ms is not None else ""

    @property
    def line_x(self) -> int:
        return self.x + 16

    @property
    def swatch_x(self) -> int:
        return self.x + 6


@dataclass
class FreeShareView:
    """The share of an MPS GPU no partition holds, drawn as empty."""

    percent: int
    x: int
    width: int
    text_x: int

    @property
    def label(self) -> str:
        return f"{self.percent} % free" if self.width >= 60 else f"{self.percent} %"


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
    # A CPU's runtimes' cores over the last minutes: {instance id: [[epoch s, cores], ...]} (empty: none
    # reported cores); the fleet page draws it and the live feed extends it.
    cores_history: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    mps_enabled: bool = False
    partitions: list[PartitionView] = field(default_factory=list)  # an MPS GPU's partitions, by index
    mps_free: FreeShareView | None = None  # the share no partition holds (None: none free, or MPS off)
    # Where NVML disagrees with the MIG catalogue on this GPU (its agent's lines), and, for a GPU the
    # catalogue lacks, the label of the model planned from its NVML table.
    catalogue_disagreements: list[str] = field(default_factory=list)
    nvml_model_label: str = ""

    @property
    def svg_width(self) -> int:
        return self.memory_slices * SVG_SLICE_WIDTH

    @property
    def svg_height(self) -> int:
        return MPS_SVG_HEIGHT if self.mps_enabled else SVG_HEIGHT

    @property
    def mode_label(self) -> str:
        if self.mps_enabled:
            return "MPS on"
        return "MIG on" if self.mig_enabled else "MIG off"

    @property
    def mps_block_height(self) -> int:
        return MPS_BLOCK_HEIGHT

    @property
    def mps_bar_y(self) -> int:
        """Where the GPU's utilisation bar is drawn, under its partitions."""
        return 3 + MPS_BLOCK_HEIGHT + 4

    @property
    def mps_runtimes(self) -> list[RuntimeView]:
        """The models on its MPS partitions, by partition and slot."""
        return [r for p in self.partitions for r in p.runtimes]

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
    dropped_reports: int = 0
    # Catalogue disagreements the agent reported that name no GPU of the host (each GPU's are on its view).
    catalogue_disagreements: list[str] = field(default_factory=list)
    catalogue_disagreement_count: int = 0


def _runtime_view(runtime: Runtime) -> RuntimeView:
    application = runtime.application.name if runtime.application_id else None
    return RuntimeView(
        key=runtime.key, application=application, variant=runtime.variant.name if runtime.variant_id else None,
        state=runtime.get_state_display(), simulated=runtime.simulated, colour=application_colour(application),
    )


def gpu_memory_slices(catalogue, model_name: str) -> int:
    """How many memory slices a GPU is drawn on: its MIG catalogue model's, else DEFAULT_MEMORY_SLICES."""
    spec = catalogue.gpu_model_find(model_name)
    return spec.memory_slices if spec is not None else DEFAULT_MEMORY_SLICES


def block_view(*, placement: str, profile: str, start: int, size: int, state: str, runtime: RuntimeView | None,
               change: str = "") -> BlockView:
    """A GPU instance on memory slices [start, start + size), in SVG coordinates: the one drawing geometry
    of the dashboard (the fleet page and the plan page's before/after drawings)."""
    x = start * SVG_SLICE_WIDTH
    width = max(size, 1) * SVG_SLICE_WIDTH
    return BlockView(
        placement=placement, profile=profile, start=start, size=size, state=state, runtime=runtime,
        x=x + 2, width=width - 4, text_x=x + width // 2,
        colour=application_colour(runtime.application if runtime else None), change=change,
    )


def _model_line_fit(candidates: list[str], room: int) -> tuple[str, int | None]:
    """The first of `candidates` that fits `room` SVG units (squeezed to MPS_LINE_SQUEEZE at most), else
    the last one shortened with an ellipsis: (text, textLength or None when it fits as it is)."""
    advance = SVG_CHAR_WIDTH * MPS_LINE_FONT
    for text in candidates:
        natural = len(text) * advance
        if natural <= room:
            return text, None
        if natural * MPS_LINE_SQUEEZE <= room:
            return text, max(room, 1)
    text = candidates[-1]
    keep = max(1, int(room / (advance * MPS_LINE_SQUEEZE)) - 1)
    short = text[:keep] + "…"
    return short, (max(room, 1) if len(short) * advance > room else None)


def mps_model_lines(*, runtimes: list[RuntimeView], width: int) -> list[ModelLineView]:
    """A partition block's model lines: "application: variant" each (the variant alone, or shortened, where
    the block is too narrow; the block's <title> has them in full), or "+N more" on the last line when
    there are more than MPS_MODEL_LINES models."""
    room = width - 22  # 16 for the swatch before the text, 6 after it
    shown = runtimes if len(runtimes) <= MPS_MODEL_LINES else runtimes[:MPS_MODEL_LINES - 1]
    lines = []
    for i, runtime in enumerate(shown):
        variant = runtime.variant or runtime.key
        candidates = [f"{runtime.application}: {variant}", variant] if runtime.application else [variant]
        text, length = _model_line_fit(candidates, room)
        lines.append(ModelLineView(text=text, colour=runtime.colour, y=MPS_LINE_FIRST_Y + i * MPS_LINE_STEP, text_length=length,
                                   key=runtime.key))
    if len(shown) < len(runtimes):
        text, length = _model_line_fit([f"+{len(runtimes) - len(shown)} more"], room)
        lines.append(ModelLineView(text=text, colour=None, y=MPS_LINE_FIRST_Y + len(shown) * MPS_LINE_STEP, text_length=length))
    return lines


def _share_edges(start_percent: int, percent: int, gpu_width: int) -> tuple[int, int]:
    """The SVG x of a share's left and right edges, rounded so that adjacent shares meet exactly."""
    return round(start_percent * gpu_width / 100), round(min(100, start_percent + percent) * gpu_width / 100)


def partition_view(*, slot: str, percent: int, index: int, start_percent: int, gpu_width: int, state: str,
                   runtimes: list[RuntimeView], duty_cycle_ms: float | None, change: str = "") -> PartitionView:
    """An MPS partition of `percent` % drawn from `start_percent` % of a GPU drawing `gpu_width` wide: the
    one drawing geometry of MPS partitions (the fleet page and the plan page's before/after drawings).
    Coloured by its application, or MIXED_COLOUR when it time-shares models of several."""
    left, right = _share_edges(start_percent, percent, gpu_width)
    width = right - left
    applications = {r.application for r in runtimes if r.application}
    if len(applications) > 1:
        colour = MIXED_COLOUR
    else:
        colour = application_colour(next(iter(applications), None))
    return PartitionView(
        slot=slot, percent=percent, index=index, state=state, runtimes=runtimes, duty_cycle_ms=duty_cycle_ms,
        x=left + 2, width=width - 4, text_x=left + width // 2, colour=colour,
        lines=mps_model_lines(runtimes=runtimes, width=width - 4), change=change,
    )


def mps_free_share(*, partitions: list[PartitionView], gpu_width: int) -> FreeShareView | None:
    """The share of the GPU its partitions leave free, after them (None when they hold it all)."""
    used = sum(p.percent for p in partitions)
    if used >= 100:
        return None
    left, right = _share_edges(used, 100 - used, gpu_width)
    return FreeShareView(percent=100 - used, x=left + 2, width=right - left - 4, text_x=left + (right - left) // 2)


def mps_partitions_draw(view: AcceleratorView, partitions: list[dict]) -> None:
    """Draw an MPS GPU's partitions on `view`: each of `partitions` {slot, percent, index, state, runtimes,
    duty_cycle_ms, change} by index, side by side from the left, then the free share."""
    view.mps_enabled = True
    start = 0
    view.partitions = []
    for p in sorted(partitions, key=lambda p: p["index"]):
        view.partitions.append(partition_view(start_percent=start, gpu_width=view.svg_width, **p))
        start += p["percent"]
    view.mps_free = mps_free_share(partitions=view.partitions, gpu_width=view.svg_width)


def _block_view(instance: GpuInstance, runtime: RuntimeView | None) -> BlockView:
    return block_view(placement=instance.placement, profile=instance.profile, start=instance.placement_start,
                      size=instance.placement_size, state=instance.get_state_display(), runtime=runtime)


def _mps_partitions_of(acc: Accelerator, partitions: list[MpsPartition], runtime_by_key: dict,
                       duty_cycles: dict[tuple[int, str], float]) -> list[dict]:
    """An MPS GPU's partitions as `mps_partitions_draw` takes them: the models its agent reports in each
    (keys gpu<i>/<slot>/<n>, by n) and the duty cycle its host's latest desired state gives it."""
    models: dict[str, list[tuple[int, RuntimeView]]] = {}
    for (host_id, key), view in runtime_by_key.items():
        if host_id != acc.host_id or not key.startswith(f"gpu{acc.index}/mps"):
            continue
        try:
            parsed = runtime_key_parse(key)
        except ValueError:
            continue
        if parsed.is_mps and parsed.index == acc.index and parsed.slot is not None:
            models.setdefault(parsed.placement, []).append((parsed.slot, view))
    return [
        {"slot": partition.slot, "percent": partition.percent, "index": partition.index, "state": partition.get_state_display(),
         "runtimes": [view for _, view in sorted(models.get(partition.slot, []), key=lambda sv: sv[0])],
         "duty_cycle_ms": duty_cycles.get((acc.index, partition.slot))}
        for partition in partitions
    ]


def fleet_overview(user) -> list[HostView]:
    """Every host the user may see, with its GPUs (MIG layouts on memory slices, MPS partitions as shares
    of the GPU with the models time-sharing each) and CPU devices, and the runtimes its agent last reported
    on each."""
    catalogue = mig_catalogue_load()
    hosts = list(Host.objects.restrict(user, "view").order_by("name"))
    accelerators = list(Accelerator.objects.restrict(user, "view").filter(host__in=hosts).order_by("kind", "index"))
    instances = GpuInstance.objects.restrict(user, "view").filter(accelerator__host__in=hosts).order_by("placement_start")
    runtimes = (
        Runtime.objects.restrict(user, "view").filter(host__in=hosts).select_related("application", "variant")
    )
    runtime_by_key = {(r.host_id, r.key): _runtime_view(r) for r in runtimes}
    cpu_hosts = sorted({a.host_id for a in accelerators if a.kind == AcceleratorKindChoices.CPU})
    cores_history = runtime_cores_history(host_ids=cpu_hosts) if cpu_hosts else {}
    host_names = {h.pk: h.name for h in hosts}
    disagreements_by_host = {h.pk: [str(line) for line in h.catalogue_disagreements or []] for h in hosts}
    instances_by_accelerator: dict[int, list[GpuInstance]] = {}
    for instance in instances:
        instances_by_accelerator.setdefault(instance.accelerator_id, []).append(instance)
    # MPS GPUs: their partitions, and their duty cycles from each such host's latest desired state (two
    # queries, only where there is an MPS GPU).
    mps = [a for a in accelerators if a.kind == AcceleratorKindChoices.GPU and a.mps_enabled]
    partitions_by_accelerator: dict[int, list[MpsPartition]] = {}
    duty_cycles_by_host: dict[int, dict[tuple[int, str], float]] = {}
    if mps:
        for partition in MpsPartition.objects.restrict(user, "view").filter(accelerator__in=mps).order_by("index"):
            partitions_by_accelerator.setdefault(partition.accelerator_id, []).append(partition)
        latest = HostDesiredState.objects.filter(host=OuterRef("host")).order_by("-version").values("version")[:1]
        states = HostDesiredState.objects.restrict(user, "view").filter(
            host_id__in={a.host_id for a in mps}, version=Subquery(latest),
        )
        duty_cycles_by_host = {state.host_id: partition_duty_cycles((state.spec or {}).get("runtimes") or []) for state in states}
    accelerators_by_host: dict[int, list[AcceleratorView]] = {}
    for acc in accelerators:
        view = AcceleratorView(
            name=f"{acc.kind}{acc.index}", kind=acc.kind, model_name=acc.model_name, memory_mb=acc.memory_mb,
            mig_enabled=acc.mig_enabled,
        )
        if acc.kind == AcceleratorKindChoices.GPU:
            view.memory_slices = gpu_memory_slices(catalogue, acc.model_name)
            planned = acc.gpu_model_planned
            if planned is not None:
                view.memory_slices = planned.memory_slices
                view.nvml_model_label = planned.label if planned.from_nvml else ""
            view.catalogue_disagreements = [
                line for line in disagreements_by_host.get(acc.host_id, []) if line.startswith(f"gpu{acc.index} ")
            ]
            if acc.mps_enabled:
                mps_partitions_draw(view, _mps_partitions_of(
                    acc, partitions_by_accelerator.get(acc.pk, []), runtime_by_key, duty_cycles_by_host.get(acc.host_id, {}),
                ))
            elif acc.mig_enabled:
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
            view.cores_history = {f"{host_names[acc.host_id]}/{rv.key}": cores_history[(acc.host_id, rv.key)]
                                  for rv in view.cpu_runtimes if (acc.host_id, rv.key) in cores_history}
        accelerators_by_host.setdefault(acc.host_id, []).append(view)
    return [
        HostView(
            name=h.name, status=h.status, status_label=h.get_status_display(), backend=h.backend,
            backend_label=h.get_backend_display(), simulated=h.simulated, last_seen=h.last_seen,
            accelerators=accelerators_by_host.get(h.pk, []), dropped_reports=h.dropped_reports,
            catalogue_disagreements=_host_level_disagreements(disagreements_by_host[h.pk], accelerators_by_host.get(h.pk, [])),
            catalogue_disagreement_count=len(disagreements_by_host[h.pk]),
        )
        for h in hosts
    ]


def _host_level_disagreements(lines: list[str], views: list[AcceleratorView]) -> list[str]:
    """The lines no GPU view of the host shows (a GPU no longer in the inventory, say)."""
    shown = {line for view in views for line in view.catalogue_disagreements}
    return [line for line in lines if line not in shown]


def router_credentials_for(user) -> list[RouterCredential]:
    """The routers' credentials the user may see (viewer and up), by name: never a secret, only its prefix."""
    return list(RouterCredential.objects.restrict(user, "view").order_by("name"))


# --------------------------------------------------------------------------- plans and jobs

PLAN_ACTIONS = {"validated": "approve", "approved": "apply", "active": "rollback"}  # which button a state allows


def _pct(value) -> str:
    return "—" if value is None else f"{float(value):.1%}"


def plan_queryset_for(user):
    from apps.planning.models import Plan

    return Plan.objects.restrict(user, "view").select_related("job", "previous", "created_by", "approved_by")


def shortfall_summary(shortfall: dict) -> str:
    items = [(name, rps) for name, rps in (shortfall or {}).items() if isinstance(rps, (int, float)) and rps > 0]
    if not items:
        return "none"
    return ", ".join(f"{name} {rps:g} rps" for name, rps in sorted(items))


def diff_summary(diff: dict) -> str:
    s = (diff or {}).get("summary") or {}
    if not s:
        return "—"
    if not s.get("changes"):
        return "no change"
    parts = [f"+{s.get('mig_created', 0)}/−{s.get('mig_destroyed', 0)} MIG"]
    if s.get("mps_created") or s.get("mps_destroyed") or s.get("mps_mode_changes"):
        parts.append(f"+{s.get('mps_created', 0)}/−{s.get('mps_destroyed', 0)} MPS")
    parts += [f"+{s.get('runtimes_added', 0)}/−{s.get('runtimes_removed', 0)}/~{s.get('runtimes_changed', 0)} runtimes",
              f"{s.get('applications_rerouted', 0)} rerouted"]
    return ", ".join(parts)


def _ms_text(value) -> str:
    return f"{float(value):g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "none"


def _timing_change_text(before: dict, after: dict) -> str:
    """ " (round 40 → 25 ms, turn 12 → 9 ms)" for a model on an MPS partition whose duty cycle or turn
    changes ("" otherwise, and for every other runtime)."""
    parts = [f"{label} {_ms_text(before.get(k))} → {_ms_text(after.get(k))} ms"
             for k, label in (("duty_cycle_ms", "round"), ("turn_ms", "turn"))
             if (k in before or k in after) and before.get(k) != after.get(k)]
    return f" ({', '.join(parts)})" if parts else ""


def _gpu_diff_rows(gpus: dict) -> list[dict]:
    """A host's GPU changes as the plan page's Diff lists them: MIG mode and instances; MPS mode, partitions
    created and destroyed, and the duty cycles of kept partitions that change (absent from diffs made
    before MPS: then nothing)."""
    rows = []
    for gpu, c in sorted(gpus.items()):
        partitions = c.get("partitions") or {}
        rows.append({
            "name": gpu, "create": c.get("create", []), "destroy": c.get("destroy", []), "mode": c.get("mig_enabled", {}),
            "mps_mode": c.get("mps_enabled") or {}, "partitions_create": partitions.get("create", []),
            "partitions_destroy": partitions.get("destroy", []),
            "duty_cycles": [{"partition": d.get("partition"), "text": f"round {_ms_text(d.get('before'))} → {_ms_text(d.get('after'))} ms"}
                            for d in c.get("duty_cycles") or []],
        })
    return rows


@dataclass
class PlanRow:
    pk: int
    status: str
    status_label: str
    trigger: str
    created: object
    solver_status: str
    gap: str
    effective_accuracy: str
    shortfall: str
    diff: str


def planner_rows() -> list[dict]:
    """The planners a plan run may use (engine/solvers/registry.py), as the plans page lists them."""
    from apps.planning.services import PLAN_RUN_SOLVERS
    from engine.solvers.registry import PLANNERS

    return [PLANNERS[name].as_dict() for name in PLAN_RUN_SOLVERS]


def plan_list(user) -> list[PlanRow]:
    return [
        PlanRow(pk=p.pk, status=p.status, status_label=p.get_status_display(), trigger=p.trigger, created=p.created,
                solver_status=p.solver_status or "—", gap=_pct(p.gap), effective_accuracy=_pct(p.effective_accuracy),
                shortfall=shortfall_summary(p.shortfall), diff=diff_summary(p.diff))
        for p in plan_queryset_for(user)
    ]


def _variant_names(ids) -> dict[int, str]:
    from apps.registry.models import ModelVariant

    ids = {i for i in ids if isinstance(i, int)}
    return {v.pk: f"{v.application.name}/{v.name}" if v.application_id else v.name
            for v in ModelVariant.objects.filter(pk__in=ids).select_related("application")} if ids else {}


def plan_detail(plan) -> dict:
    """What the plan page shows, from the plan's stored JSON (prediction, routing, diff)."""
    prediction = plan.prediction or {}
    applications = [
        {"name": name, "queries": app.get("queries"), "on_time": app.get("on_time"), "late": app.get("late"),
         "dropped": app.get("dropped"), "violation": _pct(app.get("slo_violation_ratio")),
         "accuracy": _pct(app.get("effective_accuracy")), "p99": app.get("latency_p99_ms")}
        for name, app in sorted((prediction.get("applications") or {}).items())
    ]
    variant_ids = [r.get("variant") for routes in (plan.routing or {}).values() for r in routes]
    diff = plan.diff or {}
    for host in (diff.get("hosts") or {}).values():
        rts = host.get("runtimes") or {}
        variant_ids += [r.get("variant") for r in rts.get("added", []) + rts.get("removed", [])]
        variant_ids += [c.get(side, {}).get("variant") for c in rts.get("changed", []) for side in ("before", "after")]
    names = _variant_names(variant_ids)
    routing = []
    for application, routes in sorted((plan.routing or {}).items()):
        total = sum(max(0.0, float(r.get("weight") or 0)) for r in routes)
        routing.append({"application": application, "routes": [
            {"instance": r.get("instance"), "variant": names.get(r.get("variant"), r.get("variant")),
             "weight": f"{(max(0.0, float(r.get('weight') or 0)) / total if total > 0 else 0):.1%}"}
            for r in routes
        ]})
    hosts = []
    for name, host in sorted((diff.get("hosts") or {}).items()):
        rts = host.get("runtimes") or {}
        label = lambda r: f"{r.get('key')} {r.get('application') or ''} {names.get(r.get('variant'), r.get('variant') or '')}".strip()  # noqa: E731
        hosts.append({
            "name": name, "baseline": host.get("baseline", ""), "changed": host.get("changed", False),
            "gpus": _gpu_diff_rows(host.get("gpus") or {}),
            "added": [label(r) for r in rts.get("added", [])],
            "removed": [label(r) for r in rts.get("removed", [])],
            "changed_runtimes": [f"{c.get('key')}: {names.get(c['before'].get('variant'), c['before'].get('variant'))} → "
                                 f"{names.get(c['after'].get('variant'), c['after'].get('variant'))}"
                                 f"{_timing_change_text(c['before'], c['after'])}" for c in rts.get("changed", [])],
            "kept": rts.get("kept", 0),
        })
    return {
        "plan": plan, "action": PLAN_ACTIONS.get(plan.status), "gap": _pct(plan.gap), "effective_accuracy": _pct(plan.effective_accuracy),
        "shortfall": shortfall_summary(plan.shortfall), "diff_summary": diff_summary(diff), "diff_against": (diff.get("against") or {}).get("description", ""),
        "prediction": prediction, "violation": _pct(prediction.get("slo_violation_ratio")),
        "predicted_accuracy": _pct(prediction.get("effective_accuracy")), "applications": applications,
        "routing": routing, "hosts": hosts, "notes": [str(n) for n in (plan.notes or [])],
        "pipelines": plan_pipeline_graphs(plan), **plan_prediction_checks(plan),
    }


def plan_prediction_checks(plan) -> dict:
    """The plan's prediction against what was measured while it was active (apps.planning.prediction), as the
    plan page shows it; or when that comparison will come."""
    from django.conf import settings

    def _num(value, fmt: str) -> str:
        return "—" if value is None else format(value, fmt)

    rows = [{
        "target": c.target, "kind": c.get_kind_display(), "window_s": round((c.window_end - c.window_start).total_seconds()),
        "predicted_rps": _num(c.predicted_rps, ".1f"), "measured_rps": _num(c.measured_rps, ".1f"),
        "predicted_violation": _pct(c.predicted_violation_ratio), "measured_violation": _pct(c.measured_violation_ratio),
        "violation_error": "—" if c.violation_error is None else f"{c.violation_error * 100:+.1f} pt",
        "predicted_p99": _num(c.predicted_p99_ms, ".1f"), "measured_p99": _num(c.measured_p99_ms, ".1f"),
        "p99_error": "—" if c.p99_error is None else f"{c.p99_error:+.0%}", "note": c.note,
    } for c in plan.prediction_checks.all()]
    pending = None
    if plan.prediction_checked_at is None and plan.activated_at is not None and plan.status in ("active", "superseded"):
        pending = f"compared with what is measured once it has been active {settings.TESSERA_PREDICTION_CHECK_WINDOW_S:g} s, or when the next plan replaces it"
    return {"prediction_checks": rows, "prediction_checked_at": plan.prediction_checked_at, "prediction_check_pending": pending}


def plan_pipeline_graphs(plan) -> list[dict]:
    """Each pipeline the plan planned as one: its DAG with the chosen variant, batch, replicas and budget
    per stage, and each path's planned and predicted latency against its SLO."""
    from .pipeline_graph import pipeline_graph

    predicted = (plan.prediction or {}).get("pipelines") or {}
    graphs = []
    for name, summary in sorted(((plan.result or {}).get("pipelines") or {}).items()):
        paths = [{"name": path, **{k: q[k] for k in ("stages", "slo_ms", "demand_rps")}} for path, q in summary.get("paths", {}).items()]
        stages = list(summary.get("stages", {})) or list(dict.fromkeys(s for q in paths for s in q["stages"]))
        graph = pipeline_graph(name=name, stages=stages, paths=paths, summary=summary, prediction=predicted.get(name))
        graph.update(status=summary.get("status"), solver=summary.get("solver"), cores=summary.get("cores"), pas=summary.get("pas"))
        graphs.append(graph)
    return graphs


def pipelines_declared(user) -> list[dict]:
    """Every pipeline the user may see, as declared: its DAG with pinned variants, its paths' SLO and demand,
    and each path's live end-to-end traffic over the last minute (router reports)."""
    from apps.registry.models import Pipeline
    from apps.telemetry.selectors import pipeline_paths_live

    from .pipeline_graph import pipeline_graph

    live = pipeline_paths_live(seconds=60)
    return [
        pipeline_graph(name=p.name, stages=[s["application"] for s in p.stages], paths=p.paths,
                       pinned={s["application"]: s["variant"] for s in p.stages if s.get("variant")},
                       live={q["name"]: live.get((p.name, q["name"])) for q in p.paths})
        for p in Pipeline.objects.restrict(user, "view").order_by("name")
    ]


def job_queryset_for(user):
    from apps.jobs.models import Job

    return Job.objects.restrict(user, "view").select_related("actor")


# --------------------------------------------------------------------------- applications

@dataclass
class VariantView:
    name: str
    accuracy_pct: str
    accuracy_metric: str
    artifact_name: str | None
    artifact_sha: str | None
    profile_points: list[tuple[str, int]]  # (device type, number of points), sorted by device type
    pk: int = 0
    chart: dict | None = None  # profile_charts.variant_profile_series data plus "slo_ms"; None when not profiled

    @property
    def chart_id(self) -> str:
        return f"profile-data-{self.pk}"


@dataclass
class ApplicationView:
    pk: int
    name: str
    task: str
    description: str
    slo: object  # apps.policies SloPolicy or None
    variants: list[VariantView]
    colour: str


def application_queryset_for(user):
    return Application.objects.restrict(user, "view").order_by("name")


def _chart_with_slo(chart: dict | None, slo) -> dict | None:
    return None if chart is None else {**chart, "slo_ms": slo.latency_p99_ms if slo is not None else None}


def applications_overview(user, *, applications: list[Application] | None = None) -> list[ApplicationView]:
    """Every application the user may see (or those of `applications`), with its SLO and its variants
    (accuracy, artifact, profile points per device type, and latency-vs-batch chart data with the SLO)."""
    applications = list(application_queryset_for(user)) if applications is None else list(applications)
    slos = {s.application_id: s for s in SloPolicy.objects.restrict(user, "view").filter(application__in=applications)}
    variants = list(
        ModelVariant.objects.restrict(user, "view").filter(application__in=applications).select_related("artifact")
        .order_by("application__name", "-accuracy", "name")
    )
    points: dict[int, list[tuple[str, int]]] = {}
    counts = (
        Profile.objects.restrict(user, "view").filter(variant__in=variants).values("variant_id", "device_type")
        .annotate(n=Count("pk")).order_by("variant_id", "device_type")
    )
    for row in counts:
        points.setdefault(row["variant_id"], []).append((row["device_type"], row["n"]))
    charts = variant_profile_series(variants, profiles=Profile.objects.restrict(user, "view"))
    by_application: dict[int, list[VariantView]] = {}
    for v in variants:
        artifact = v.artifact if v.artifact_id else None
        by_application.setdefault(v.application_id, []).append(VariantView(
            name=v.name, accuracy_pct=f"{v.accuracy * 100:.1f}%", accuracy_metric=v.accuracy_metric,
            artifact_name=artifact.original_name if artifact else None,
            artifact_sha=artifact.sha256[:12] if artifact else None,
            profile_points=points.get(v.pk, []), pk=v.pk,
            chart=_chart_with_slo(charts.get(v.pk), slos.get(v.application_id)),
        ))
    return [
        ApplicationView(pk=a.pk, name=a.name, task=a.get_task_display(), description=a.description, slo=slos.get(a.pk),
                        variants=by_application.get(a.pk, []), colour=application_colour(a.name))
        for a in applications
    ]


# --------------------------------------------------------------------------- policies

POLICY_KINDS = ("slo", "replan", "profiling")  # the Policies page's sections, in order


def policy_model(kind: str):
    """The policy model for one of POLICY_KINDS, or None."""
    from apps.policies.models import ProfilingPolicy, ReplanPolicy

    return {"slo": SloPolicy, "replan": ReplanPolicy, "profiling": ProfilingPolicy}.get(kind)


def policy_queryset_for(user, kind: str, action: str = "view"):
    """The policies of one kind the user may see (or change, with action="change"), in page order."""
    qs = policy_model(kind).objects.restrict(user, action)
    return qs.select_related("application").order_by("application__name") if kind == "slo" else qs.order_by("name")


@dataclass
class PoliciesOverview:
    slo: list  # SloPolicy rows, by application name
    applications_without_slo: list[str]
    replan: list  # ReplanPolicy rows, by name
    replan_governing_pk: int | None  # the enabled policy that governs the re-planning triggers (first by name)
    profiling: list  # ProfilingPolicy rows, by name


def policies_overview(user) -> PoliciesOverview:
    """Every policy the user may see: each application's SLO, the re-planning and the profiling policies."""
    from apps.planning.demand import replan_policy_current

    slo = list(policy_queryset_for(user, "slo"))
    with_slo = {p.application_id for p in slo}
    without = [a.name for a in application_queryset_for(user) if a.pk not in with_slo] if user.has_perm("policies.view_slopolicy") else []
    replan = list(policy_queryset_for(user, "replan"))
    governing = replan_policy_current()
    return PoliciesOverview(
        slo=slo, applications_without_slo=without, replan=replan, profiling=list(policy_queryset_for(user, "profiling")),
        replan_governing_pk=governing.pk if governing is not None and any(p.pk == governing.pk for p in replan) else None,
    )


# --------------------------------------------------------------------------- ensemble policies

# The Policies page shows what the routers counted of each ensemble over this many recent seconds.
ENSEMBLE_WINDOW_S = 300


@dataclass
class EnsembleOverview:
    policies: list  # EnsemblePolicy rows the user may see, by application name, members prefetched
    frequencies: dict[int, EnsembleFrequencies]  # by policy pk, where routers reported its ensembles in the window
    applications_without: list  # Application rows (with a variant) the user may see that have no ensemble policy
    window_s: int
    latency: dict[int, dict] = field(default_factory=dict)  # by policy pk: its application's p99 and violations in the window


def ensembles_overview(user, *, window_s: int = ENSEMBLE_WINDOW_S) -> EnsembleOverview:
    """Every application's ensemble policy the user may see (`policies.view_ensemblepolicy`), with the
    sampling frequencies the routers counted over the last `window_s` seconds, and the applications with
    a variant but no policy (to which an operator may give one)."""
    from apps.policies.models import EnsemblePolicy

    policies = list(EnsemblePolicy.objects.restrict(user, "view").select_related("application", "application__slo_policy")
                    .prefetch_related("members__variant").order_by("application__name"))
    frequencies = {}
    latency = {}
    for policy in policies:
        # The latest scheduler's draws: after a policy change, the new policy's table, not a mixture.
        seen = application_ensemble_frequencies(application=policy.application, window_s=window_s, latest=True)
        if seen is not None:
            frequencies[policy.pk] = seen
        served = application_latency_window(application_name=policy.application.name, seconds=window_s)
        if served is not None:
            latency[policy.pk] = served
    with_policy = {p.application_id for p in policies}
    without = [a for a in application_queryset_for(user).annotate(n=Count("variants")).filter(n__gt=0) if a.pk not in with_policy]
    return EnsembleOverview(policies=policies, frequencies=frequencies, applications_without=without, window_s=window_s, latency=latency)
