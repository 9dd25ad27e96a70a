"""The Applications pages' data: a list an operator can scan (one row per application: its SLO, demand,
what was served and how fast, at what accuracy, its variants and its state) and one page per application
(variants and their profiles, the pipelines and ensemble it belongs to, recent plans), as NetBox lists
objects and shows one. Built from querysets restricted to the requesting user."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count
from django.shortcuts import get_object_or_404

from apps.deployments.choices import RuntimeStateChoices
from apps.deployments.models import RoutingTable, Runtime
from apps.policies.models import SloPolicy
from apps.registry.models import Application, ModelVariant
from apps.telemetry.selectors import applications_traffic_window
from engine.geometry.names import instance_id_parse

from .selectors import ApplicationView, application_colour, application_queryset_for, applications_overview, pipelines_declared

# The list's traffic columns are over this many recent seconds.
APPLICATIONS_WINDOW_S = 60
# An application's page lists this many of its latest plans.
APPLICATION_PLANS = 8

STATE_SERVING, STATE_NO_READY, STATE_NO_CAPACITY = "serving", "no ready instance", "no capacity"
STATE_NOT_PLANNED, STATE_RELEASED, STATE_NO_SLO = "not planned yet", "released", "no SLO"


@dataclass(frozen=True)
class ApplicationRow:
    pk: int
    name: str
    task: str
    colour: str
    slo_ms: float | None
    demand_rps: float | None  # queries that arrived per second over the window (routers' reports); None: none reported
    declared_rps: float | None  # the SLO policy's expected demand
    served_rps: float | None  # answered per second over the window
    p99_ms: float | None  # the worst router interval's p99 in the window
    violation_ratio: float | None  # late, dropped or unrouted over arrivals in the window
    accuracy: float | None  # of the variants the active routing table routes to, weighted by their routes' weights
    variants: int
    state: str  # STATE_*
    state_detail: str
    window_s: int = APPLICATIONS_WINDOW_S


def routes_weighted(routes) -> list[dict]:
    """The routes that carry traffic (weight > 0) of a stored table or a plan's routing for one application."""
    return [r for r in routes or [] if float(r.get("weight") or 0) > 0]


def plan_serving_find(application: Application, statuses: tuple[str, ...] | None = None):
    """The latest plan in `statuses` (default PLAN_SERVING_STATUSES) that routes traffic to `application`, or None."""
    from apps.planning.models import Plan

    plans = Plan.objects.filter(status__in=statuses or PLAN_SERVING_STATUSES, routing__has_key=application.name).order_by("-created", "-id")[:5]
    return next((p for p in plans if routes_weighted(p.routing.get(application.name))), None)


def _route_state(table: RoutingTable | None, runtimes: dict[tuple[str, str], Runtime]) -> tuple[str, str]:
    if table is None:
        return STATE_NOT_PLANNED, "no plan has given it a routing table"
    routed = routes_weighted(table.routes)
    if not routed:
        return STATE_NO_CAPACITY, f"routing table v{table.version} gives it no instance"
    ready = 0
    for route in routed:
        try:
            host, key = instance_id_parse(route["instance"])
        except ValueError:
            continue
        runtime = runtimes.get((host, key.key))
        if runtime is not None and runtime.state == RuntimeStateChoices.READY and runtime.variant_id == route.get("variant"):
            ready += 1
    if not ready:
        return STATE_NO_READY, f"none of its {len(routed)} routed instances reports ready"
    return STATE_SERVING, f"{ready} of {len(routed)} routed instance{'s' if len(routed) != 1 else ''} ready"


def _routed_accuracy(table: RoutingTable | None, accuracy: dict[int, float]) -> float | None:
    if table is None:
        return None
    weighted = [(float(r.get("weight") or 0), accuracy.get(r.get("variant"))) for r in table.routes]
    total = sum(w for w, a in weighted if a is not None)
    return sum(w * a for w, a in weighted if a is not None) / total if total > 0 else None


def applications_list(user, *, window_s: int = APPLICATIONS_WINDOW_S, only: int | None = None) -> list[ApplicationRow]:
    """One row per application the user may see (or only the one with pk `only`), in name order; a fixed
    number of queries whatever the number of applications."""
    applications = application_queryset_for(user).annotate(variant_count=Count("variants"))
    applications = list(applications.filter(pk=only) if only is not None else applications)
    names = [a.name for a in applications]
    slos = {s.application_id: s for s in SloPolicy.objects.restrict(user, "view").filter(application__in=applications)}
    stages = set(Application.objects.filter(pk__in=[a.pk for a in applications], pipeline_stage__isnull=False).values_list("pk", flat=True))
    tables = {t.application_id: t for t in RoutingTable.objects.filter(application__in=applications, active=True)}
    accuracy = dict(ModelVariant.objects.filter(application__in=applications).values_list("pk", "accuracy"))
    hosts = {str(r["instance"]).split("/", 1)[0] for t in tables.values() for r in t.routes if "/" in str(r.get("instance", ""))}
    runtimes = {(r.host.name, r.key): r for r in Runtime.objects.filter(host__name__in=hosts).select_related("host").only(
        "key", "state", "variant_id", "host__name")}
    traffic = applications_traffic_window(names=names, seconds=window_s)
    rows = []
    for a in applications:
        slo = slos.get(a.pk)
        table = tables.get(a.pk)
        if a.released:
            state, detail = STATE_RELEASED, "unloaded: plans give it no capacity until it is loaded again"
        elif slo is None and a.pk not in stages:
            state, detail = STATE_NO_SLO, "plans leave it out until it has an SLO policy"
        else:
            state, detail = _route_state(table, runtimes)
        seen = traffic.get(a.name)
        rows.append(ApplicationRow(
            pk=a.pk, name=a.name, task=a.get_task_display(), colour=application_colour(a.name),
            slo_ms=slo.latency_p99_ms if slo else None, declared_rps=slo.expected_rps if slo else None,
            demand_rps=seen["arrivals"] / window_s if seen else None, served_rps=seen["served"] / window_s if seen else None,
            p99_ms=seen["p99_ms"] if seen else None, violation_ratio=seen["violation_ratio"] if seen else None,
            accuracy=_routed_accuracy(table, accuracy), variants=a.variant_count, state=state, state_detail=detail, window_s=window_s,
        ))
    return rows


@dataclass
class ApplicationDetail:
    application: Application
    row: ApplicationRow
    view: ApplicationView  # its SLO, variants and their profile charts
    pipelines: list[dict] = field(default_factory=list)  # the pipelines it is a stage of, as drawn
    ensemble: object = None  # its EnsemblePolicy (members prefetched), or None
    plans: list = field(default_factory=list)  # its latest plans (those that route it), newest first: {"plan", "instances"}


def application_detail(user, pk: int) -> ApplicationDetail:
    """One application the user may see (404 otherwise) with everything its page shows."""
    from apps.planning.models import Plan
    from apps.policies.models import EnsemblePolicy

    application = get_object_or_404(application_queryset_for(user), pk=pk)
    (row,) = applications_list(user, only=application.pk)
    (view,) = applications_overview(user, applications=[application])
    pipelines = [g for g in pipelines_declared(user) if application.name in {node["name"] for node in g["nodes"]}]
    ensemble = (EnsemblePolicy.objects.restrict(user, "view").filter(application=application)
                .prefetch_related("members__variant").first())
    plans = [{"plan": plan, "instances": len(routes_weighted(plan.routing.get(application.name)))}
             for plan in Plan.objects.restrict(user, "view").filter(routing__has_key=application.name).order_by("-created", "-id")[:APPLICATION_PLANS]]
    return ApplicationDetail(application=application, row=row, view=view, pipelines=pipelines, ensemble=ensemble, plans=plans)


# --------------------------------------------------------------------------- the guided deploy flow

@dataclass(frozen=True)
class DeployStep:
    """One step of putting an application into service, as its page shows it: done or what is missing, and
    the action that does it next (a POST to the page, operators only) or where to do it."""

    key: str
    title: str
    done: bool
    detail: str
    action: str | None = None  # DEPLOY_ACTIONS key, offered while the step is not done and the steps before it are
    action_label: str = ""
    link: str | None = None  # where to do it instead, when the page has no action for it
    link_label: str = ""


DEPLOY_ACTIONS = ("profile", "plan", "apply")
PLAN_SERVING_STATUSES = ("validated", "approved", "rolling_out", "active")
PLAN_APPLICABLE_STATUSES = ("validated", "approved")  # what the deploy flow's apply step approves (if need be) and applies


def application_deploy_steps(application: Application, row: ApplicationRow) -> list[DeployStep]:
    """The same steps as `tessera app deploy` (controlplane/cli/app.py), read from what is stored: a variant
    with its ONNX file, an SLO policy (with its expected demand), profiles on the fleet, a plan that serves
    it, and in service. A step is offered only once the steps before it are done."""
    from django.urls import reverse

    from apps.registry.models import Profile

    variants = list(application.variants.select_related("artifact").order_by("name"))
    with_file = [v for v in variants if v.artifact_id]
    profiled = set(Profile.objects.filter(variant__in=variants).values_list("variant_id", flat=True).distinct())
    # A variant can be planned with an ONNX file (its runtimes load it) or with imported profiles alone (a
    # simulated GPU computes nothing, so the demo's GPU variants have no file).
    usable = [v for v in variants if v.artifact_id or v.pk in profiled]
    steps = [DeployStep(
        "variant", "A variant", bool(usable),
        (f"{len(usable)} variant{'s' if len(usable) != 1 else ''}, {len(with_file)} with an ONNX file") if usable else "no variant with an ONNX file yet",
        link=None if usable else reverse("dashboard:applications") + f"?application={application.pk}#upload", link_label="Upload one")]
    slo = getattr(application, "slo_policy", None)  # a missing one-to-one raises an AttributeError subclass
    steps.append(DeployStep(
        "slo", "An SLO policy", slo is not None,
        (f"p99 ≤ {slo.latency_p99_ms:g} ms" + (f", planned for at least {slo.expected_rps:g} queries/s" if slo.expected_rps else
                                                ", sized from what it is sent (declare an expected demand to serve it before traffic comes)"))
        if slo is not None else "none: plans leave the application out",
        action=None if slo is not None else "slo", action_label="Set it"))
    missing = [v for v in usable if v.pk not in profiled]
    steps.append(DeployStep(
        "profiles", "Profiles on the fleet", bool(usable) and not missing,
        "every variant is profiled" if usable and not missing else
        (f"not profiled: {', '.join(v.name for v in missing)}" if missing else "nothing to profile yet"),
        action="profile" if any(v.artifact_id for v in missing) else None, action_label="Profile on the fleet's agents"))
    plan = plan_serving_find(application)
    steps.append(DeployStep(
        "plan", "A plan that serves it", plan is not None,
        f"plan #{plan.pk} ({plan.get_status_display().lower()}) routes it" if plan is not None else "no plan gives it capacity yet",
        action=None if plan is not None else "plan", action_label="Plan the fleet"))
    serving = row.state == STATE_SERVING
    offer_apply = plan is not None and plan.status in PLAN_APPLICABLE_STATUSES and not serving
    steps.append(DeployStep(
        "serve", "In service", serving, row.state_detail if serving or plan is None else
        (f"plan #{plan.pk} waits for approval" if offer_apply else f"{row.state}: {row.state_detail}"),
        action="apply" if offer_apply else None, action_label=f"Approve and apply plan #{plan.pk}" if plan is not None else ""))
    # An action is offered only when the steps before it are done.
    out, ready = [], True
    for step in steps:
        out.append(step if ready or step.action is None else DeployStep(step.key, step.title, step.done, step.detail, link=step.link,
                                                                             link_label=step.link_label))
        ready = ready and step.done
    return out
