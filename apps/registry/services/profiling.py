"""Registry services for profiling: a profiling request's progress and results (the agent's reports),
profiling jobs (find the agents that can measure a variant, ask them, follow them), and automatic
profiling of new variants under the profiling policies."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterable, Sequence

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.core.context import change_context
from apps.core.transactions import transaction_retry
from apps.inventory.choices import AcceleratorKindChoices, GpuInstanceStateChoices, HostStatusChoices
from apps.inventory.models import Accelerator, Host
from apps.jobs.choices import JobKindChoices
from apps.jobs.models import Job
from apps.jobs.services import TransientJobError, job_checkpoint_set, job_create, job_enqueue, job_progress, job_targets
from engine.geometry.catalogue import gpu_model_canonical, mig_catalogue_load

from ..choices import (
    CPU_DEVICE_TYPE,
    FULL_SLICE,
    PROFILING_BATCH_SIZES_DEFAULT,
    PROFILING_FINISHED,
    ProfileSourceChoices,
    ProfilingStatusChoices,
)
from ..models import ModelVariant, Profile, ProfilingRequest
from .profiles import profile_upsert

logger = logging.getLogger(__name__)


PROFILING_LOG_MAX_CHARS = 100_000  # the log keeps its latest lines up to this size


def _log_append(log: str, line: str) -> str:
    if not line:
        return log
    log = f"{log}{line.rstrip(chr(10))}\n"
    return log[-PROFILING_LOG_MAX_CHARS:]


def _profiling_request_lock(profiling_request: ProfilingRequest) -> ProfilingRequest:
    # Only the request's row (of="self"): FOR UPDATE over the join would also lock its host, variant and
    # application, and an agent's report locking the host first deadlocked with a progress update (seen in CI).
    locked = (ProfilingRequest.objects.select_for_update(of=("self",)).select_related("host", "variant__application")
              .get(pk=profiling_request.pk))
    if locked.status in PROFILING_FINISHED:
        raise ValidationError({"status": f"Profiling request {locked.pk} has already {locked.status}."})
    return locked


@transaction_retry
@transaction.atomic
def profiling_request_progress(
    *, profiling_request: ProfilingRequest, status: str | None = None, progress: int | None = None, log_line: str = "", error: str = ""
) -> ProfilingRequest:
    """The agent's progress on a profiling request: `running` (any report on a pending request starts it),
    `failed` (finishes it, with `error`), a percentage, a log line appended. A finished request refuses."""
    pr = _profiling_request_progress_apply(profiling_request=profiling_request, status=status, progress=progress, log_line=log_line, error=error)
    _profiling_job_nudge(profiling_request=pr)
    return pr


def _profiling_request_progress_apply(
    *, profiling_request: ProfilingRequest, status: str | None, progress: int | None, log_line: str, error: str
) -> ProfilingRequest:
    pr = _profiling_request_lock(profiling_request)
    now = timezone.now()
    if status not in (None, ProfilingStatusChoices.RUNNING, ProfilingStatusChoices.FAILED):
        raise ValidationError({"status": "Progress sets running or failed; results set succeeded."})
    if progress is not None and not 0 <= progress <= 100:
        raise ValidationError({"progress": "Progress is a percentage, 0 to 100."})
    if pr.started is None:
        pr.started = now
    pr.status = status or ProfilingStatusChoices.RUNNING
    if progress is not None:
        pr.progress = progress
    if pr.status == ProfilingStatusChoices.FAILED:
        pr.finished = now
        pr.error = error or "The agent reported a failure."
    elif error:
        pr.error = error
    pr.log = _log_append(pr.log, log_line)
    pr.save()
    return pr


@transaction_retry
@transaction.atomic
def profiling_results_record(*, profiling_request: ProfilingRequest, points: list[dict[str, Any]], log_line: str = "") -> list[Profile]:
    """Store a profiling request's measurements as `measured` Profile rows (a point already profiled is
    updated in place) and mark the request succeeded. Each point must be one the request asked for: its
    device type and slice, one of its batch sizes (and, on a CPU, one of its thread counts as cpu_cores).
    All or nothing."""
    pr = _profiling_request_lock(profiling_request)
    if not points:
        raise ValidationError({"points": "Give at least one measured point."})
    now = timezone.now()
    device_type, slice_name = pr.profile_device_type, pr.profile_slice
    is_cpu = device_type == CPU_DEVICE_TYPE
    where = f"{pr.device}/{pr.placement}" if pr.placement else pr.device
    detail = f"Measured on {pr.host.name} {where} (profiling request {pr.pk})"[:200]
    errors, profiles, keys = [], [], set()
    for i, point in enumerate(points):
        profile = Profile(
            variant=pr.variant, device_type=point.get("device_type", ""), slice=point.get("slice") or "",
            cpu_cores=point.get("cpu_cores"), batch_size=point.get("batch_size"),
            latency_p50_ms=point.get("latency_p50_ms"), latency_p99_ms=point.get("latency_p99_ms"),
            throughput_rps=point.get("throughput_rps"), memory_mb=point.get("memory_mb"),
            source=ProfileSourceChoices.MEASURED, source_detail=detail, measured_at=now,
        )
        try:
            profile.full_clean(validate_unique=False, validate_constraints=False)  # normalises GPU and slice names
        except ValidationError as exc:
            errors.append(f"points[{i}]: {'; '.join(exc.messages)}")
            continue
        problems = []
        if profile.device_type != device_type:
            problems.append(f"device_type {profile.device_type!r} is not the request's ({device_type!r})")
        if profile.slice != slice_name:
            problems.append(f"slice {profile.slice!r} is not the request's ({slice_name!r})")
        if is_cpu and profile.cpu_cores not in pr.cpu_threads:
            problems.append(f"cpu_cores {profile.cpu_cores} is not one of the request's thread counts {pr.cpu_threads}")
        if profile.batch_size not in pr.batch_sizes:
            problems.append(f"batch_size {profile.batch_size} is not one of the request's {pr.batch_sizes}")
        key = (profile.device_type, profile.slice, profile.cpu_cores, profile.batch_size)
        if key in keys:
            problems.append("the same point is given twice")
        keys.add(key)
        if problems:
            errors.append(f"points[{i}]: {'; '.join(problems)}")
            continue
        profiles.append(profile)
    if errors:
        raise ValidationError({"points": errors})
    stored = []
    for profile in profiles:
        profile_upsert(profile=profile)
        stored.append(profile)
    pr.status = ProfilingStatusChoices.SUCCEEDED
    pr.progress = 100
    pr.started = pr.started or now
    pr.finished = now
    pr.log = _log_append(pr.log, log_line)
    pr.save()
    _profiling_job_nudge(profiling_request=pr)
    return stored


# --------------------------------------------------------------------------- profiling jobs
#
# `variant_profile` finds, for each device type and slice asked for, one online agent that can measure it
# and creates a ProfilingRequest there, all under one `profiling` Job. The job's task
# (`registry.profiling_job`, apps/registry/tasks.py) follows the requests: each attempt observes them
# every `poll` seconds for at most its time budget (well under the task's soft time limit), then, if some
# are still open, ends by raising `ProfilingJobWaiting` and the task re-schedules itself; the next
# attempt carries on from the job's checkpoint. The job's timeout (from its creation) marks requests
# still open as failed ("timed out") and fails the job. With embedded services (no broker), the task runs
# in a thread of this process (TESSERA_JOBS_IN_THREAD, see apps.jobs.services.job_enqueue) and follows
# the requests there until they finish or time out; run in its caller instead (tests), an attempt looks
# once and returns, and the agents' reports move the job on (`_profiling_job_nudge`). Either way no HTTP
# request waits on an agent.

PROFILING_JOB_TIMEOUT_S_DEFAULT = 1800
PROFILING_JOB_TIMEOUT_S_MAX = 7 * 24 * 3600
PROFILING_JOB_POLL_S_DEFAULT = 2.0
PROFILING_JOB_ATTEMPT_S_DEFAULT = 120.0
PROFILING_JOB_MAX_REQUESTS_DEFAULT = 32


def profiling_job_timeout_default() -> int:
    """TESSERA_PROFILING_JOB_TIMEOUT_S, else 30 minutes."""
    return int(getattr(settings, "TESSERA_PROFILING_JOB_TIMEOUT_S", PROFILING_JOB_TIMEOUT_S_DEFAULT))


def profiling_job_poll_s() -> float:
    """TESSERA_PROFILING_JOB_POLL_S: how often an attempt looks at its requests (and the delay before
    the next attempt)."""
    return float(getattr(settings, "TESSERA_PROFILING_JOB_POLL_S", PROFILING_JOB_POLL_S_DEFAULT))


def profiling_job_attempt_s() -> float:
    """TESSERA_PROFILING_JOB_ATTEMPT_S: how long one attempt follows its requests before handing over to
    the next (the task's soft time limit is well above it)."""
    return float(getattr(settings, "TESSERA_PROFILING_JOB_ATTEMPT_S", PROFILING_JOB_ATTEMPT_S_DEFAULT))


def profiling_job_max_requests() -> int:
    return int(getattr(settings, "TESSERA_PROFILING_JOB_MAX_REQUESTS", PROFILING_JOB_MAX_REQUESTS_DEFAULT))


def profiling_job_runner() -> str:
    """How a job's task runs: "worker" (a broker and Celery workers), "thread" (embedded services: in a
    thread of this process) or "caller" (embedded services, in the code that queued it: tests)."""
    if not getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        return "worker"
    return "thread" if getattr(settings, "TESSERA_JOBS_IN_THREAD", False) else "caller"


def profiling_job_remaining_s(*, job_id: int) -> float:
    """Seconds until the job's timeout (0 when past it, or when the job is gone)."""
    job = Job.objects.filter(pk=job_id).only("created", "params").first()
    if job is None:
        return 0.0
    timeout_s = int(job.params.get("timeout_s") or profiling_job_timeout_default())
    return max(0.0, (job.created + timedelta(seconds=timeout_s) - timezone.now()).total_seconds())


class ProfilingJobWaiting(TransientJobError):
    """An attempt's time budget ran out with requests still open: the task runs another attempt later."""


class ProfilingJobFailed(Exception):
    """Every request failed, or the job timed out: the job fails with this message."""


@dataclass(frozen=True)
class ProfilingTarget:
    """Where one (device type, slice) will be measured: an accelerator of an online host, and on a MIG GPU
    the placement of one of its ready instances."""

    device_type: str
    slice: str
    accelerator: Accelerator
    placement: str = ""

    @property
    def host(self) -> Host:
        return self.accelerator.host

    @property
    def device(self) -> str:
        return f"{self.accelerator.kind}{self.accelerator.index}"

    @property
    def is_cpu(self) -> bool:
        return self.accelerator.kind == AcceleratorKindChoices.CPU


@dataclass(frozen=True)
class ProfilingSkip:
    """A (device type, slice) asked for, or present on the fleet, that no agent can measure, and why."""

    device_type: str
    slice: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"device_type": self.device_type, "slice": self.slice, "reason": self.reason}

    def __str__(self) -> str:
        where = f"{self.device_type}/{self.slice}" if self.slice else (self.device_type or "fleet")
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class ProfilingJobStart:
    job: Job
    requests: list[ProfilingRequest]
    skipped: list[ProfilingSkip] = field(default_factory=list)


def _gpu_device_type(accelerator: Accelerator) -> str:
    """As ProfilingRequest.profile_device_type: the catalogue name (MIG or not), else the NVML name."""
    return gpu_model_canonical(accelerator.model_name) or accelerator.model_name


def _device_type_normalise(name: str) -> str:
    text = str(name).strip()
    if text.lower() == CPU_DEVICE_TYPE:
        return CPU_DEVICE_TYPE
    return gpu_model_canonical(text) or text


def _hosts_text(hosts: Iterable[Host], *, status: bool = False, limit: int = 5) -> str:
    seen: dict[int, Host] = {}
    for host in hosts:
        seen.setdefault(host.pk, host)
    names = [f"{h.name} {h.status}" if status else h.name for h in sorted(seen.values(), key=lambda h: h.name)]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _online(host: Host) -> bool:
    return host.status == HostStatusChoices.ONLINE


def _slice_normalise(device_type: str, slice_name: str) -> tuple[str | None, str]:
    """(canonical slice, "") or (None, why not)."""
    text = str(slice_name).strip()
    if text.lower() == FULL_SLICE:
        return FULL_SLICE, ""
    spec = mig_catalogue_load().gpu_model_find(device_type)
    if spec is None:
        return None, f"{device_type} is not in the MIG catalogue: only {FULL_SLICE!r} can be profiled on it"
    profile = spec.profile_find(text)
    if profile is None:
        return None, f"{text!r} is not a MIG profile of {spec.name} (known: {', '.join(spec.profile_names)})"
    return profile.name, ""


def profiling_targets_find(
    *, device_types: Sequence[str] | None = None, slices: Sequence[str] | None = None, cpu_threads: Sequence[int] | None = None
) -> tuple[list[ProfilingTarget], list[ProfilingSkip]]:
    """One target per (device type, slice) that an online agent can measure, and the reasons for the
    others. `device_types` defaults to every type on the online fleet; `slices` (GPUs only; MIG profiles or
    "full") to every slice the online GPUs of a type have (a whole GPU where MIG is off, each profile of a
    ready MIG instance). CPUs: an online host's CPU with enough cores for `cpu_threads` (a CPU on a
    simulated host computes for real). GPUs: never on a simulated host (its GPUs compute nothing). Among
    several candidates, the host with the fewest open profiling requests, then by name."""
    accelerators = list(Accelerator.objects.select_related("host").prefetch_related("gpu_instances").order_by("host__name", "kind", "index"))
    load = Counter(
        ProfilingRequest.objects.filter(status__in=[ProfilingStatusChoices.PENDING, ProfilingStatusChoices.RUNNING]).values_list("host_id", flat=True)
    )
    cpus = [a for a in accelerators if a.kind == AcceleratorKindChoices.CPU]
    gpus: dict[str, list[Accelerator]] = {}
    for accelerator in accelerators:
        if accelerator.kind == AcceleratorKindChoices.GPU:
            gpus.setdefault(_gpu_device_type(accelerator), []).append(accelerator)

    if device_types:
        wanted = list(dict.fromkeys(_device_type_normalise(t) for t in device_types))
    else:
        wanted = ([CPU_DEVICE_TYPE] if any(_online(c.host) for c in cpus) else []) + sorted(
            t for t, accs in gpus.items() if any(_online(a.host) for a in accs)
        )
        if not wanted:
            return [], [ProfilingSkip("", "", "no host with a CPU or GPU is online")]

    targets: list[ProfilingTarget] = []
    skipped: list[ProfilingSkip] = []

    def pick(candidates: list[tuple[Accelerator, str]], device_type: str, slice_name: str) -> None:
        accelerator, placement = min(candidates, key=lambda c: (load[c[0].host_id], -(c[0].cpu_cores or 0), c[0].host.name, c[0].index, c[1]))
        load[accelerator.host_id] += 1  # spread one call's requests over the hosts
        targets.append(ProfilingTarget(device_type, slice_name, accelerator, placement))

    for device_type in wanted:
        if device_type == CPU_DEVICE_TYPE:
            if not cpus:
                skipped.append(ProfilingSkip(CPU_DEVICE_TYPE, "", "no host has a CPU in the inventory"))
                continue
            online = [c for c in cpus if _online(c.host)]
            if not online:
                statuses = _hosts_text((c.host for c in cpus), status=True)
                skipped.append(ProfilingSkip(CPU_DEVICE_TYPE, "", f"no host with a CPU is online ({statuses})"))
                continue
            need = max(cpu_threads) if cpu_threads else 1
            fit = [c for c in online if (c.cpu_cores or 1) >= need]
            if not fit:
                most = max(c.cpu_cores or 1 for c in online)
                skipped.append(ProfilingSkip(CPU_DEVICE_TYPE, "", f"no online CPU has the {need} cores cpu_threads asks for (the most is {most})"))
                continue
            pick([(c, "") for c in fit], CPU_DEVICE_TYPE, "")
            continue

        accs = gpus.get(device_type, [])
        if not accs:
            skipped.append(ProfilingSkip(device_type, "", f"no {device_type} GPU in the inventory"))
            continue
        online = [a for a in accs if _online(a.host)]
        if not online:
            statuses = _hosts_text((a.host for a in accs), status=True)
            skipped.append(ProfilingSkip(device_type, "", f"no host with a {device_type} is online ({statuses})"))
            continue
        ready = {a.pk: [i for i in a.gpu_instances.all() if i.state == GpuInstanceStateChoices.READY] for a in online}
        if slices:
            wanted_slices = []
            for raw in dict.fromkeys(slices):
                name, why = _slice_normalise(device_type, raw)
                if name is None:
                    skipped.append(ProfilingSkip(device_type, str(raw), why))
                elif name not in wanted_slices:
                    wanted_slices.append(name)
        else:
            present = {FULL_SLICE for a in online if not a.mig_enabled} | {i.profile for a in online if a.mig_enabled for i in ready[a.pk]}
            wanted_slices = sorted(present, key=lambda s: (s != FULL_SLICE, s))
            if not wanted_slices:
                skipped.append(ProfilingSkip(
                    device_type, "",
                    f"MIG is enabled on every online {device_type} and none has a ready MIG instance: "
                    "create one through its host's desired state, or disable MIG on one",
                ))
        for slice_name in wanted_slices:
            if slice_name == FULL_SLICE:
                candidates = [(a, "") for a in online if not a.mig_enabled]
            else:
                candidates = [(a, i.placement) for a in online if a.mig_enabled for i in ready[a.pk] if i.profile == slice_name]
            real = [c for c in candidates if not c[0].host.simulated]
            if real:
                pick(real, device_type, slice_name)
            elif candidates:
                skipped.append(ProfilingSkip(
                    device_type, slice_name,
                    f"only on simulated hosts ({_hosts_text(c[0].host for c in candidates)}): simulated GPUs compute nothing, so they "
                    "cannot be profiled; import profiles for it instead (POST /api/v1/profiles/import/)",
                ))
            elif slice_name == FULL_SLICE:
                skipped.append(ProfilingSkip(
                    device_type, slice_name, f"MIG is enabled on every online {device_type}: profile one of its MIG slices, or disable MIG on one",
                ))
            else:
                skipped.append(ProfilingSkip(
                    device_type, slice_name,
                    f"no online {device_type} has a ready {slice_name} MIG instance: create one through its host's desired state first",
                ))
    return targets, skipped


def _pr_where(pr: ProfilingRequest) -> str:
    device = f"{pr.device} {pr.placement}" if pr.placement else pr.device
    return f"request {pr.pk} on {pr.host.name}/{device}"


def _user(actor: Any) -> Any:
    return actor if getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None) else None


@transaction.atomic
def variant_profile(
    *,
    variant: ModelVariant,
    device_types: Sequence[str] | None = None,
    slices: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    cpu_threads: Sequence[int] | None = None,
    timeout_s: int | None = None,
    string_length: int | None = None,
    actor: Any = None,
    actor_name: str = "",
) -> ProfilingJobStart:
    """Profile a variant on the fleet: one ProfilingRequest per (device type, slice) an online agent can
    measure (see `profiling_targets_find`), and a `profiling` job that follows them, queued on commit.
    Refuses (ValidationError) a variant without an artifact, and a call no agent can serve at all (saying
    why for each device type); what cannot be measured beside what can is left out and listed in
    `skipped` and the job's log."""
    if variant.artifact_id is None:
        raise ValidationError({"variant": (
            f"{variant} has no artifact to profile: upload its ONNX file (POST /api/v1/artifacts/) and set it as the variant's artifact first."
        )})
    if variant.artifact.verify_error:
        raise ValidationError({"variant": f"{variant}'s artifact {variant.artifact_id} failed verification: {variant.artifact.verify_error}"})
    timeout_s = int(timeout_s or profiling_job_timeout_default())
    if not 1 <= timeout_s <= PROFILING_JOB_TIMEOUT_S_MAX:
        raise ValidationError({"timeout_s": f"Give a timeout between 1 and {PROFILING_JOB_TIMEOUT_S_MAX} seconds."})
    targets, skipped = profiling_targets_find(device_types=device_types, slices=slices, cpu_threads=cpu_threads)
    if not targets:
        raise ValidationError({"device_types": f"No agent can profile {variant}: " + "; ".join(str(s) for s in skipped) + "."})
    limit = profiling_job_max_requests()
    if len(targets) > limit:
        raise ValidationError({"device_types": (
            f"That makes {len(targets)} profiling requests, more than the limit of {limit}: name fewer device_types or slices."
        )})
    user = _user(actor)
    requests = []
    for target in targets:
        pr = ProfilingRequest(
            variant=variant, host=target.host, device=target.device, placement=target.placement,
            batch_sizes=list(batch_sizes) if batch_sizes else list(PROFILING_BATCH_SIZES_DEFAULT),
            cpu_threads=list(cpu_threads or []) if target.is_cpu else [], created_by=user,
            **({"string_length": int(string_length)} if string_length else {}),
        )
        try:
            pr.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as exc:
            where = f"{target.device_type}/{target.slice}" if target.slice else target.device_type
            raise ValidationError({k: [f"{where} on {target.host.name}: {m}" for m in v] for k, v in exc.message_dict.items()}) from exc
        requests.append(pr)
    params = {
        "device_types": list(device_types or []), "slices": list(slices or []), "batch_sizes": list(batch_sizes or []),
        "cpu_threads": list(cpu_threads or []), "timeout_s": timeout_s, **({"string_length": int(string_length)} if string_length else {}),
    }
    job = job_create(kind=JobKindChoices.PROFILING, actor=actor, actor_name=actor_name, targets=[variant], params=params)
    for pr in requests:
        pr.job = job
        pr.save()
    params = {**params, "profiling_requests": [pr.pk for pr in requests], "skipped": [s.as_dict() for s in skipped]}
    # Created a moment ago in this transaction and not yet queued: its targets and params are completed here.
    Job.objects.filter(pk=job.pk).update(targets=job_targets([variant, *requests]), params=params)
    job.targets, job.params = job_targets([variant, *requests]), params
    job_progress(job_id=job.pk, log_line=f"profiling {variant}: {len(requests)} request(s), timeout {timeout_s} s")
    for pr in requests:
        job_progress(job_id=job.pk, log_line=f"{_pr_where(pr)} for {pr.profile_device_type}" + (f"/{pr.profile_slice}" if pr.profile_slice else ""))
    for skip in skipped:
        job_progress(job_id=job.pk, log_line=f"left out {skip}")
    from ..tasks import profiling_job_task  # the task module imports this one

    job_enqueue(job=job, task=profiling_job_task)
    return ProfilingJobStart(job=job, requests=requests, skipped=skipped)


@dataclass(frozen=True)
class ProfilingJobState:
    """What one observation of a profiling job found."""

    active: bool
    total: int
    open: int
    succeeded: list[int]
    failed: list[str]  # "request 3 on host/cpu0: why"
    progress: int
    timed_out: bool
    timeout_s: int

    @property
    def finished(self) -> bool:
        return self.open == 0


def _pr_state(pr: ProfilingRequest | None) -> str:
    return "withdrawn" if pr is None else f"{pr.status}:{pr.progress}"


def profiling_job_observe(*, job_id: int) -> ProfilingJobState | None:
    """Look at a profiling job's requests once: log what changed since the last look (kept in the job's
    checkpoint, so a later attempt does not log it again), set the job's progress (the mean of its
    requests', a finished one counting 100), and past the job's timeout mark the requests still open as
    failed ("timed out"). Safe to call at any time and from several places; None when the job is gone."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, kind=JobKindChoices.PROFILING).first()
        if job is None:
            return None
        ids = [int(pk) for pk in job.params.get("profiling_requests", [])]
        timeout_s = int(job.params.get("timeout_s") or profiling_job_timeout_default())
        found = ProfilingRequest.objects.select_related("host", "variant__application").filter(pk__in=ids)
        requests: dict[int, ProfilingRequest | None] = {pk: None for pk in ids}
        requests.update({pr.pk: pr for pr in found})
        timed_out = bool(job.checkpoint.get("timed_out"))
        if job.active and timezone.now() >= job.created + timedelta(seconds=timeout_s):
            still_open = [pr for pr in requests.values() if pr is not None and pr.status not in PROFILING_FINISHED]
            if still_open:
                timed_out = True
                message = f"timed out: not finished within the profiling job's {timeout_s} s"
                with change_context(source="profiling-job", principal=_user(job.actor)):
                    for pr in still_open:
                        try:
                            requests[pr.pk] = _profiling_request_progress_apply(
                                profiling_request=pr, status=ProfilingStatusChoices.FAILED, progress=None, log_line=message, error=message,
                            )
                        except ValidationError:  # it finished meanwhile
                            pr.refresh_from_db()
                job_checkpoint_set(job_id=job.pk, name="timed_out", value=True)
        seen = dict(job.checkpoint.get("seen", {}))
        lines = []
        for pk, pr in requests.items():
            state = _pr_state(pr)
            if seen.get(str(pk), "pending:0") == state:
                continue
            seen[str(pk)] = state
            if pr is None:
                lines.append(f"request {pk}: withdrawn (deleted)")
            elif pr.status == ProfilingStatusChoices.FAILED:
                lines.append(f"{_pr_where(pr)}: failed: {pr.error}")
            elif pr.status == ProfilingStatusChoices.SUCCEEDED:
                lines.append(f"{_pr_where(pr)}: succeeded")
            else:
                lines.append(f"{_pr_where(pr)}: {pr.status} {pr.progress}%")
        done = [pr for pr in requests.values() if pr is None or pr.status in PROFILING_FINISHED]
        progress = round(sum(100 if (pr is None or pr.status in PROFILING_FINISHED) else pr.progress for pr in requests.values()) / max(1, len(ids)))
        if job.active:
            if lines:
                job_checkpoint_set(job_id=job.pk, name="seen", value=seen)
            for line in lines:
                job_progress(job_id=job.pk, log_line=line)
            if min(progress, 99) != job.progress:
                job_progress(job_id=job.pk, progress=min(progress, 99))  # 100 once the job has succeeded
        return ProfilingJobState(
            active=job.active, total=len(ids), open=len(ids) - len(done),
            succeeded=[pk for pk, pr in requests.items() if pr is not None and pr.status == ProfilingStatusChoices.SUCCEEDED],
            failed=[(f"request {pk}: withdrawn (deleted)" if pr is None else f"{_pr_where(pr)}: {pr.error or 'failed'}")
                    for pk, pr in requests.items() if pr is None or pr.status == ProfilingStatusChoices.FAILED],
            progress=progress, timed_out=timed_out, timeout_s=timeout_s,
        )


def profiling_job_follow(*, job: Job, budget_s: float, poll_s: float) -> dict[str, Any]:
    """A profiling job's work for one attempt (run by `job_execute`): observe the requests every `poll_s`
    seconds until all have finished, for at most `budget_s` seconds (0: look once). Returns the job's
    result when all finished with at least one success; raises `ProfilingJobFailed` when all failed or
    the job timed out, and `ProfilingJobWaiting` when the budget runs out first."""
    until = time.monotonic() + max(0.0, budget_s)
    while True:
        state = profiling_job_observe(job_id=job.pk)
        if state is None:
            raise ProfilingJobFailed("the job's record is gone")
        if state.finished:
            break
        if time.monotonic() + poll_s > until:
            raise ProfilingJobWaiting(f"waiting for {state.open} of {state.total} profiling request(s), {state.progress}% done")
        time.sleep(poll_s)
    if state.timed_out:
        raise ProfilingJobFailed(
            f"timed out after {state.timeout_s} s: {len(state.succeeded)} of {state.total} request(s) succeeded; "
            + "; ".join(state.failed)
        )
    if not state.succeeded:
        raise ProfilingJobFailed("every profiling request failed: " + "; ".join(state.failed))
    if state.failed:
        job_progress(job_id=job.pk, log_line=f"{len(state.succeeded)} of {state.total} request(s) succeeded; failed: " + "; ".join(state.failed))
    return {"profiling_requests": state.total, "succeeded": state.succeeded, "failed": state.failed}


def profiling_job_attempt_final(*, job_id: int, grace_s: float = 600.0) -> bool:
    """Whether a retry of the job's task after a transient error (the database away) is to be its last:
    once the job is past its timeout by `grace_s`, the job gives up instead of retrying for ever."""
    job = Job.objects.filter(pk=job_id).only("created", "params").first()
    if job is None:
        return True
    timeout_s = int(job.params.get("timeout_s") or profiling_job_timeout_default())
    return timezone.now() > job.created + timedelta(seconds=timeout_s + grace_s)


def _profiling_job_nudge(*, profiling_request: ProfilingRequest) -> None:
    """When a job's task runs in its caller (nothing polls), an agent's report on one of the job's requests
    moves the job on once the report commits: a look at the requests, and the job's task when all have
    finished. With a worker, or the in-process thread, the job's task polls and this does nothing."""
    job_id = profiling_request.job_id
    if not job_id or profiling_job_runner() != "caller":
        return
    transaction.on_commit(lambda: _profiling_job_nudged(job_id))


def _profiling_job_nudged(job_id: int) -> None:
    try:
        state = profiling_job_observe(job_id=job_id)
        if state is not None and state.active and state.finished:
            from ..tasks import profiling_job_task

            profiling_job_task.delay(job_id)
    except Exception:  # the agent's report is stored; the job's own task will see it
        logger.exception("profiling job %s: following an agent's report failed", job_id)


# --------------------------------------------------------------------------- automatic profiling


def profiling_auto_schedule(*, variant: ModelVariant, previous_artifact_id: int | None, actor: Any = None) -> None:
    """Call when a variant is created or changed: when it has just got an artifact, the enabled profiling
    policies that profile new variants run (`profiling_auto_run`) once the transaction commits."""
    if not variant.artifact_id or variant.artifact_id == previous_artifact_id:
        return
    variant_id = variant.pk
    transaction.on_commit(lambda: profiling_auto_run(variant_id=variant_id, actor=actor))


def profiling_auto_run(*, variant_id: int, actor: Any = None) -> list[Job]:
    """Profile a variant under each enabled ProfilingPolicy with `auto_profile_new_variants`; a policy no
    agent can serve is skipped with a log line. Never raises: the variant is already stored."""
    from apps.policies.models import ProfilingPolicy  # policies builds on the registry, not the other way round

    jobs: list[Job] = []
    try:
        variant = ModelVariant.objects.select_related("application").filter(pk=variant_id).first()
        if variant is None or variant.artifact_id is None:
            return jobs
        for policy in ProfilingPolicy.objects.filter(enabled=True, auto_profile_new_variants=True).order_by("name"):
            try:
                start = variant_profile(
                    variant=variant, device_types=policy.device_types or None, slices=policy.slices or None,
                    batch_sizes=policy.batch_sizes or None, cpu_threads=policy.cpu_threads or None, timeout_s=policy.timeout_s,
                    actor=actor, actor_name=f"profiling policy {policy.name}",
                )
            except ValidationError as exc:
                logger.info("profiling policy %s: not profiling %s: %s", policy.name, variant, "; ".join(exc.messages))
                continue
            logger.info("profiling policy %s: profiling %s in job %s", policy.name, variant, start.job.pk)
            jobs.append(start.job)
    except Exception:
        logger.exception("automatic profiling of variant %s failed", variant_id)
    return jobs
