"""Rollout of an approved plan on the demo fleet with stand-in agents (a thread that reports each host
converged to its latest desired state, as a real agent does after reconciling): make before break with
the routing switch in between, a host that never converges fails the rollout and everything touched is
restored, an operator's rollback, and a re-delivered task that does nothing twice."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from apps.deployments.models import HostDesiredState, RoutingTable, Runtime
from apps.deployments.services import host_desired_state_latest
from apps.inventory.models import Host
from apps.jobs.models import Job
from apps.jobs.services import job_execute
from apps.planning.choices import PlanStatusChoices
from apps.planning.models import Plan
from apps.planning.rollout import plan_apply, plan_approve, plan_rollback, rollout_execute
from apps.registry.models import Application, ModelVariant
from controlplane.demo import demo_seed

pytestmark = pytest.mark.django_db(transaction=True)


class StandInAgents:
    """Reports every host in `alive` converged to its latest desired-state version `delay_s` after that
    version was written (as an agent would after reconciling), checking every 50 ms."""

    def __init__(self, alive: set[str], delay_s: float = 0.0, broken: dict[str, str] | None = None) -> None:
        self.alive = alive
        self.delay_s = delay_s
        # host name -> a runtime key that fails to start there: the host settles (reached but for it), as a
        # real agent reports when a runtime's artifact does not load.
        self.broken = broken or {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                for host in Host.objects.filter(name__in=self.alive):
                    latest = HostDesiredState.objects.filter(host=host).order_by("-version").values_list("version", "created", "spec").first()
                    if not latest or time.time() - latest[1].timestamp() < self.delay_s:
                        continue
                    key = self.broken.get(host.name)
                    if key is not None and any(r["key"] == key for r in latest[2]["runtimes"]):
                        if host.settled_version != latest[0]:
                            Runtime.objects.update_or_create(host=host, key=key, defaults={
                                "state": "failed", "error": "cannot load the model: INVALID_PROTOBUF", "endpoint": ""})
                            Host.objects.filter(pk=host.pk).update(settled_version=latest[0])
                    elif host.converged_version != latest[0]:
                        Host.objects.filter(pk=host.pk).update(converged_version=latest[0], settled_version=latest[0])
        finally:
            connection.close()

    def __enter__(self) -> "StandInAgents":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def fleet():
    demo_seed(admin_password="Admin-demo-pass-1")
    Host.objects.update(status="online", converged_version=1)  # the demo's version 1 is what runs
    return {h.name: h for h in Host.objects.all()}


def cpu_plan() -> Plan:
    """sim-cpu-01 keeps cpu0/0 (and cpu0/2, the demo pipeline's calibrator, cpu0/3, the heavy classifier,
    unrouted, and from cpu0/4 the ensemble's members), drops cpu0/1 and starts cpu0/8 with the random-feature
    variant; the rest unchanged."""
    tabular = Application.objects.get(name="tabular-cpu")
    linear, other = ModelVariant.objects.get(application=tabular, name="linear"), ModelVariant.objects.get(application=tabular, name="random-features-256")
    desired = {}
    for host in Host.objects.all():
        latest = host_desired_state_latest(host=host)
        desired[host.name] = {"gpus": latest.spec["gpus"], "runtimes": latest.spec["runtimes"]}
    runtimes = [r for r in desired["sim-cpu-01"]["runtimes"] if r["key"] != "cpu0/1"]
    runtimes.append({"key": "cpu0/8", "cpu_threads": 1, "application": "tabular-cpu", "variant": other.pk, "max_batch": 8, "batching": {"policy": "proteus"}})
    desired["sim-cpu-01"] = {"gpus": [], "runtimes": runtimes}
    routing = {"tabular-cpu": [{"instance": "sim-cpu-01/cpu0/0", "variant": linear.pk, "weight": 3.0},
                               {"instance": "sim-cpu-01/cpu0/8", "variant": other.pk, "weight": 1.0}]}
    for table in RoutingTable.objects.filter(active=True).exclude(application=tabular):
        routing[table.application.name] = [{"instance": r["instance"], "variant": r["variant"], "weight": r["weight"]} for r in table.routes]
    return Plan.objects.create(status=PlanStatusChoices.VALIDATED, desired_states=desired, routing=routing)


def test_rollout_makes_before_it_breaks_and_switches_routing_in_between(fleet) -> None:
    plan = cpu_plan()
    with pytest.raises(ValidationError):
        plan_apply(plan=plan, actor=None)  # not approved yet
    plan_approve(plan=plan, actor=None)
    with StandInAgents(set(fleet)):
        job = plan_apply(plan=plan, actor=None, deadline_s=20)  # eager: runs to its end here
    job.refresh_from_db()
    plan.refresh_from_db()
    assert job.status == "succeeded", job.log + job.error
    assert plan.status == "active" and plan.activated_at
    cpu = fleet["sim-cpu-01"]
    versions = list(HostDesiredState.objects.filter(host=cpu).order_by("version"))
    assert [v.version for v in versions] == [1, 2, 3]
    before, make, final = versions[0].spec, versions[1].spec, versions[2].spec
    # What the demo runs on the CPU host (cpu0/0-3 and the ensemble's members from cpu0/4 on: which of them
    # the demo deploys depends on the CPU profiles it measured on this machine).
    keys = [r["key"] for r in before["runtimes"]]
    assert keys[:2] == ["cpu0/0", "cpu0/1"] and "cpu0/8" not in keys
    kept = [key for key in keys if key != "cpu0/1"]
    assert [r["key"] for r in make["runtimes"]] == ["cpu0/0", "cpu0/1", *kept[1:], "cpu0/8"]  # old and new together
    assert [r["key"] for r in final["runtimes"]] == [*kept, "cpu0/8"]
    # Unchanged hosts were not written at all.
    assert HostDesiredState.objects.filter(host=fleet["sim-h100-01"]).count() == 1
    table = RoutingTable.objects.get(application__name="tabular-cpu", active=True)
    assert table.version == 2 and {r["instance"] for r in table.routes} == {"sim-cpu-01/cpu0/0", "sim-cpu-01/cpu0/8"}
    # The switch came after the make wave and before the break wave.
    assert versions[1].created <= table.created <= versions[2].created
    assert "make:" in job.log and "switched" in job.log and "break:" in job.log

    # A re-delivered task finds the job finished and does nothing; rollout_execute itself is idempotent too.
    assert job_execute(job_id=job.pk, work=lambda j: rollout_execute(job=j)) is None
    assert rollout_execute(job=job) == {"plan": plan.pk, "status": "active"}
    assert HostDesiredState.objects.filter(host=cpu).count() == 3

    # The operator takes it back: the host returns to version 1's state, the tables to theirs.
    with StandInAgents(set(fleet)):
        back = plan_rollback(plan=plan, actor=None, deadline_s=20)
    back.refresh_from_db()
    plan.refresh_from_db()
    assert back.status == "succeeded", back.log + back.error
    assert plan.status == "rolled_back"
    latest = host_desired_state_latest(host=cpu)
    assert latest.version == 4 and latest.spec["runtimes"] == versions[0].spec["runtimes"]
    # The route to cpu0/8, which goes, was withdrawn before the host was written back (version 3); the tables
    # before the rollout came back once the host had converged (version 4): never a route to a changing slot.
    withdrawn = RoutingTable.objects.get(application__name="tabular-cpu", version=3)
    assert {r["instance"] for r in withdrawn.routes} == {"sim-cpu-01/cpu0/0"} and withdrawn.created <= latest.created
    restored = RoutingTable.objects.get(application__name="tabular-cpu", active=True)
    # The routes of version 1, whatever they were: which CPU slots the demo routes to depends on the CPU profiles
    # it measured on this machine (a loaded CI run once left the heavy classifier's cpu0/3 out).
    first = RoutingTable.objects.get(application__name="tabular-cpu", version=1)
    assert restored.version == 4 and restored.routes == first.routes and {"sim-cpu-01/cpu0/0", "sim-cpu-01/cpu0/1"} <= {r["instance"] for r in restored.routes}
    assert restored.created >= latest.created
    assert "rollback: routes to the slots that change withdrawn (tabular-cpu v3)" in back.log


def test_a_host_that_never_converges_fails_the_rollout_and_everything_is_restored(fleet) -> None:
    plan = cpu_plan()
    plan_approve(plan=plan, actor=None)
    started = time.monotonic()
    with StandInAgents(set(fleet) - {"sim-cpu-01"}):
        job = plan_apply(plan=plan, actor=None, deadline_s=1.5)
    job.refresh_from_db()
    plan.refresh_from_db()
    assert job.status == "failed" and "sim-cpu-01 did not converge within 1.5 s" in job.error and "rolled back" in job.error
    assert plan.status == "failed"
    assert time.monotonic() - started < 15
    cpu = fleet["sim-cpu-01"]
    latest = host_desired_state_latest(host=cpu)
    first = HostDesiredState.objects.get(host=cpu, version=1)
    assert latest.version == 3 and latest.spec["runtimes"] == first.spec["runtimes"]  # the state before, as a new version
    # The routers never left the old tables (the switch comes after the make wave).
    assert RoutingTable.objects.get(application__name="tabular-cpu", active=True).version == 1
    assert Job.objects.get(pk=job.pk).result == {}


def test_a_runtime_that_cannot_start_is_reported_and_the_rest_of_the_plan_goes_on(fleet) -> None:
    """Issue 38: a runtime that could not start kept its host from converging, the rollout timed out and
    every other change of the plan was rolled back. Now its host settles without it: the rollout goes on,
    the plan is active, the runtime is reported (job log, rollout record, notes) and routers skip it."""
    plan = cpu_plan()
    plan_approve(plan=plan, actor=None)
    with StandInAgents(set(fleet), broken={"sim-cpu-01": "cpu0/8"}):
        job = plan_apply(plan=plan, actor=None, deadline_s=20)
    job.refresh_from_db()
    plan.refresh_from_db()
    assert job.status == "succeeded", job.log + job.error
    assert plan.status == "active"
    failed = [{"key": "cpu0/8", "application": "", "error": "cannot load the model: INVALID_PROTOBUF"}]
    assert plan.rollout["failed_runtimes"] == {"sim-cpu-01": failed} and job.result["failed_runtimes"] == {"sim-cpu-01": failed}
    assert any("sim-cpu-01/cpu0/8" in note and "did not start" in note for note in plan.notes)
    assert "sim-cpu-01/cpu0/8" in job.log and "its routes stay withdrawn" in job.log
    # The other changes of the plan are in place: cpu0/1 is gone, the routing switched.
    final = host_desired_state_latest(host=fleet["sim-cpu-01"])
    assert "cpu0/1" not in {r["key"] for r in final.spec["runtimes"]}
    table = RoutingTable.objects.get(application__name="tabular-cpu", active=True)
    assert table.version == 2
    # ...and no router sends a query to the runtime that did not start: the table lists it without endpoint.
    from apps.deployments.api.serializers import RoutingTableSerializer

    routes = {r["instance"]: r for r in RoutingTableSerializer(table).data["routes"]}
    assert routes["sim-cpu-01/cpu0/8"]["state"] == "failed" and routes["sim-cpu-01/cpu0/8"]["endpoint"] is None


def key_reuse_plan() -> tuple[Plan, str]:
    """A plan that gives a sim-a100-01 slot serving classify-resnet to classify-mobile (the same runtime key,
    another application); every other host and table unchanged."""
    host = Host.objects.get(name="sim-a100-01")
    latest = host_desired_state_latest(host=host)
    slot = next(r["key"] for r in latest.spec["runtimes"] if r["application"] == "classify-resnet")
    mobilenet = ModelVariant.objects.get(application__name="classify-mobile", name="mobilenet")
    runtimes = [r if r["key"] != slot else {**r, "application": "classify-mobile", "variant": mobilenet.pk} for r in latest.spec["runtimes"]]
    instance = f"{host.name}/{slot}"
    routing = {}
    for table in RoutingTable.objects.filter(active=True):
        routing[table.application.name] = [{"instance": r["instance"], "variant": r["variant"], "weight": r["weight"]}
                                           for r in table.routes if r["instance"] != instance]
    routing.setdefault("classify-mobile", []).append({"instance": instance, "variant": mobilenet.pk, "weight": 1.0})
    plan = Plan.objects.create(status=PlanStatusChoices.VALIDATED, routing=routing,
                               desired_states={host.name: {"gpus": latest.spec["gpus"], "runtimes": runtimes}})
    return plan, instance


def test_a_plan_that_reuses_a_slot_for_another_application_withdraws_its_route_first(fleet) -> None:
    plan, instance = key_reuse_plan()
    plan_approve(plan=plan, actor=None)
    resnet = Application.objects.get(name="classify-resnet")
    before = RoutingTable.objects.get(application=resnet, active=True)
    assert instance in {r["instance"] for r in before.routes}
    with StandInAgents(set(fleet), delay_s=0.3):
        job = plan_apply(plan=plan, actor=None, deadline_s=20)
    job.refresh_from_db()
    assert job.status == "succeeded", job.log + job.error
    host = fleet["sim-a100-01"]
    moved = HostDesiredState.objects.filter(host=host, version__gt=1).order_by("version").first()
    assert next(r["application"] for r in moved.spec["runtimes"] if f"{host.name}/{r['key']}" == instance) == "classify-mobile"
    # classify-resnet's route to the slot was withdrawn before the slot was given to classify-mobile ...
    withdrawn = RoutingTable.objects.get(application=resnet, version=before.version + 1)
    assert instance not in {r["instance"] for r in withdrawn.routes} and withdrawn.created < moved.created
    assert "make: routes to the slots that change withdrawn (classify-resnet" in job.log
    # ... and classify-mobile got a route to it only at the switch, once the host had converged.
    mobile_tables = RoutingTable.objects.filter(application__name="classify-mobile").order_by("version")
    first_routed = next(t for t in mobile_tables if instance in {r["instance"] for r in t.routes})
    assert first_routed.created > moved.created + timedelta(seconds=0.3)


def test_routers_that_do_not_take_the_withdrawal_fail_the_rollout_before_the_slot_changes(fleet, monkeypatch) -> None:
    from apps.deployments import services
    from tests.api.test_desired_state_ordering import StandInRouter

    monkeypatch.setattr(services, "ROUTERS_CONFIRM_DEADLINE_S", 1.0)
    plan, instance = key_reuse_plan()
    plan_approve(plan=plan, actor=None)
    with StandInRouter("classify-resnet", stuck=True), StandInAgents(set(fleet)):
        job = plan_apply(plan=plan, actor=None, deadline_s=20)
    job.refresh_from_db()
    plan.refresh_from_db()
    assert job.status == "failed" and "stand-in did not take the routing tables" in job.error and "rolled back" in job.error
    assert plan.status == "failed"
    # The slot never changed, and classify-resnet routes to it again.
    assert HostDesiredState.objects.filter(host=fleet["sim-a100-01"]).count() == 1
    assert instance in {r["instance"] for r in RoutingTable.objects.get(application__name="classify-resnet", active=True).routes}


def test_rolling_back_a_plan_that_gave_an_application_its_first_table_leaves_no_stale_route(fleet) -> None:
    """classify-mobile had no table before the rollout (so none to restore); the plan routes it to a slot
    taken from classify-resnet. Rolled back, the slot serves classify-resnet again: the rollback's own
    withdrawal takes classify-mobile's route to it away before the slot changes back, so no table is left
    routing to it for the wrong model."""
    RoutingTable.objects.filter(application__name="classify-mobile").delete()
    plan, instance = key_reuse_plan()
    plan_approve(plan=plan, actor=None)
    with StandInAgents(set(fleet)):
        job = plan_apply(plan=plan, actor=None, deadline_s=20)
    job.refresh_from_db()
    assert job.status == "succeeded", job.log + job.error
    mobile = RoutingTable.objects.get(application__name="classify-mobile", active=True)
    assert instance in {r["instance"] for r in mobile.routes}
    with StandInAgents(set(fleet)):
        back = plan_rollback(plan=plan, actor=None, deadline_s=20)
    back.refresh_from_db()
    assert back.status == "succeeded", back.log + back.error
    assert RoutingTable.objects.get(application__name="classify-mobile", active=True).routes == []
    resnet = RoutingTable.objects.get(application__name="classify-resnet", active=True)
    assert instance in {r["instance"] for r in resnet.routes}
