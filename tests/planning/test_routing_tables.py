"""One routing table per application and plan: what a plan run stores (and the rollout publishes, and the
routers draw from) is the table the simulator routed the plan's prediction with, entry for entry.

The live table is read back from what the run stored: each route's instance ("<host>/<runtime key>") is
mapped to the engine instance it runs by the runtime's host, device and placement in the plan's desired
states, independently of the translation's own bookkeeping. The simulated table is the one the simulator
built while it replayed the plan for the prediction (caught on its way in)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pytest

from apps.deployments.models import RoutingTable as PublishedTable
from apps.deployments.services import routing_tables_publish
from apps.jobs.services import job_execute
from apps.planning import services
from apps.planning.models import Plan
from apps.planning.services import plan_run_execute, plan_run_start
from apps.registry.models import Application
from engine.dataplane.routing import RoutingTable
from engine.plans.problem import RouteEntry, plan_from_dict
from engine.sharing.partitions import mps_slice_percent
from engine.simulation import simulator

from .conftest import DEMO_DEMAND

pytestmark = pytest.mark.django_db

# Three times the demo's demand: some applications need two instances, so their tables are real splits.
DEMAND = {name: 3 * rps for name, rps in DEMO_DEMAND.items()}


@pytest.fixture
def simulated_tables(monkeypatch) -> list[dict[str, RoutingTable]]:
    """Every set of routing tables the simulator builds from a plan, in order."""
    seen: list[dict[str, RoutingTable]] = []
    real = simulator.routing_tables_from_plan

    def spy(*args, **kwargs):
        tables = real(*args, **kwargs)
        seen.append(tables)
        return tables

    monkeypatch.setattr(simulator, "routing_tables_from_plan", spy)
    return seen


def _run(options: dict[str, Any]) -> Plan:
    job = plan_run_start(trigger="manual", options={"time_limit_s": 10, **options})
    job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    return Plan.objects.get(job=job)


def _engine_ids(plan: Plan) -> dict[str, str]:
    """Data-plane instance id ("<host>/<runtime key>") -> the engine instance id it runs, read from the
    desired states: the engine device is "<host>/<runtime device>", the instance the one on it at the
    runtime's placement (the only one on a whole GPU or a CPU)."""
    engine_plan = plan_from_dict(plan.result)
    # A CPU runs several instances (pipeline replicas), each at its index: the runtime key's last part. An MPS
    # partition runs several models in turn, each in a slot numbered in the plan's order (the key's last part).
    slots: dict[tuple[str, str], int] = defaultdict(int)
    by_place = {}
    for i in engine_plan.instances:
        if "/cpu" in i.device:
            where = f"#{i.start or 0}"
        elif i.start is None:
            where = None
        else:
            where = f"{i.slice}@{i.start}"
            if mps_slice_percent(i.slice) is not None:
                slot = slots[(i.device, where)]
                slots[(i.device, where)] += 1
                where = f"{where}/{slot}"
        by_place[(i.device, where)] = i.id
    assert len(by_place) == len(engine_plan.instances), [(i.device, i.slice, i.start, i.variant) for i in engine_plan.instances]

    def place(runtime: dict) -> str | None:
        if runtime["device"].startswith("cpu"):
            return f"#{runtime['key'].rsplit('/', 1)[1]}"
        placement = runtime.get("placement")
        if placement is not None and mps_slice_percent(placement.split("@")[0]) is not None:
            return f"{placement}/{runtime['key'].rsplit('/', 1)[1]}"
        return placement

    return {
        f"{host}/{runtime['key']}": by_place[(f"{host}/{runtime['device']}", place(runtime))]
        for host, spec in plan.desired_states.items() for runtime in spec["runtimes"]
    }


def _as_engine_tables(routing: dict[str, list[dict]], ids: dict[str, str]) -> dict[str, tuple[tuple[str, float], ...]]:
    """{application: ((engine instance id, weight), ...)} as a router holds it: the routes in a `RoutingTable`
    (workers/router/table.py builds its tables with it)."""
    return {
        application: RoutingTable(application, 0, tuple((ids[r["instance"]], r["weight"]) for r in routes)).entries
        for application, routes in routing.items()
    }


def _tables(tables: dict[str, RoutingTable]) -> dict[str, tuple[tuple[str, float], ...]]:
    return {application: table.entries for application, table in tables.items()}


def _published(plan: Plan) -> dict[str, list[dict]]:
    """Publish the plan's routing as the rollout's switch does (as it is) and read back the active tables
    the routers fetch. The hosts' desired states are not rolled out here (the switch comes after them), so the
    check of routes against their slots is off."""
    routing_tables_publish(tables={Application.objects.get(name=a): routes for a, routes in plan.routing.items()}, check_slots=False)
    return {t.application.name: t.routes for t in PublishedTable.objects.filter(active=True).select_related("application")}


def test_the_live_and_the_simulated_tables_of_a_solved_plan_are_the_same(demo_fleet, simulated_tables):
    """Before, the stored weights were the instances' assigned_rps; normalised, as a router normalises
    them, classify-resnet's split (0.49244216689942255, 0.5075578331005773) still differed from the
    simulator's (..., 0.5075578331005774) in the last bit."""
    plan = _run({"demand": DEMAND})
    assert plan.status == "validated", plan.validation
    assert len(simulated_tables) == 1  # the prediction: one plan, applied once
    simulated = _tables(simulated_tables[0])
    ids = _engine_ids(plan)
    # The demo pipeline's second stage too, and the ensemble application (no demand: an empty table).
    assert set(simulated) == set(plan.routing) == set(DEMO_DEMAND) | {"tabular-calibrate", "tabular-ensemble"}
    # Stored: the weights are the engine table's, bit for bit (no re-derivation on the way).
    stored = {application: tuple((ids[r["instance"]], r["weight"]) for r in routes) for application, routes in plan.routing.items()}
    assert stored == simulated
    assert _as_engine_tables(plan.routing, ids) == simulated
    assert any(len(entries) > 1 for entries in simulated.values())  # a real split, not only single routes
    # Published: the active tables the routers fetch hold the same entries.
    assert _as_engine_tables(_published(plan), ids) == simulated


def _uniform(plan):
    """Proteus without query assignment (§6.5): every instance of an application gets the same share,
    whatever the solver assigned it (benches/end_to_end.py's `uniform_weights`)."""
    return {app: [RouteEntry(e.instance, 1.0 / len(entries)) for e in entries] for app, entries in plan.routing.items()}


def _nudged(plan):
    """The solver's shares moved by 4e-7 between the two largest routes of each split application: within
    the validator's tolerance, so the plan still validates, but no longer proportional to assigned_rps."""
    routing = {}
    for app, entries in plan.routing.items():
        entries = list(entries)
        if len(entries) > 1:
            order = sorted(range(len(entries)), key=lambda k: -entries[k].weight)
            a, b = order[0], order[1]
            entries[a] = RouteEntry(entries[a].instance, entries[a].weight - 4e-7)
            entries[b] = RouteEntry(entries[b].instance, entries[b].weight + 4e-7)
        routing[app] = entries
    return routing


@pytest.mark.parametrize(("reweigh", "status"), [(_uniform, "failed"), (_nudged, "validated")], ids=["uniform", "nudged"])
def test_route_weights_not_proportional_to_assigned_rps_reach_the_fleet_as_the_simulator_routes_them(
    demo_fleet, simulated_tables, monkeypatch, reweigh, status,
):
    """The case where the two used to differ: the live translation weighted each route by its instance's
    assigned_rps, the simulator (and so the prediction) by the plan's route weight."""
    real_solve = services.plan_solve

    def solve(*args, **kwargs):
        plan = real_solve(*args, **kwargs)
        return dataclasses.replace(plan, routing=reweigh(plan))

    monkeypatch.setattr(services, "plan_solve", solve)
    plan = _run({"demand": DEMAND})
    assert plan.status == status, plan.validation
    engine_plan = plan_from_dict(plan.result)
    shares = {i.id: i.assigned_rps / engine_plan.served_rps[a] for a, entries in engine_plan.routing.items()
              for i in engine_plan.instances if i.id in {e.instance for e in entries}}
    assert any(e.weight != shares[e.instance] for entries in engine_plan.routing.values() for e in entries)
    simulated = _tables(simulated_tables[0])
    ids = _engine_ids(plan)
    stored = {application: tuple((ids[r["instance"]], r["weight"]) for r in routes) for application, routes in plan.routing.items()}
    assert stored == simulated
    assert _as_engine_tables(plan.routing, ids) == simulated
    if status == "validated":  # applicable: what the routers would get is the same too
        assert _as_engine_tables(_published(plan), ids) == simulated
