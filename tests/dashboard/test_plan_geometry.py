"""The plan page's before/after geometry drawings: for a plan made on the demo fleet, "before" is what the
plan was made against (the hosts' desired states then), "after" the plan's desired states; GPUs whose layout
changes are flagged; the fleet page, which shares the drawing, still renders. Plus the page in a real
browser, with a screenshot (test-artifacts/screenshots/plan.png)."""
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.dashboard.plan_geometry import plan_geometry
from apps.deployments.models import HostDesiredState
from apps.inventory.models import GpuInstance, Host
from apps.jobs.services import job_execute
from apps.planning.models import Plan
from apps.planning.services import plan_run_execute, plan_run_start
from apps.registry.models import ModelVariant
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)

DEMO_DEMAND = {"classify-resnet": 300.0, "classify-densenet": 200.0, "classify-vgg": 150.0, "classify-mobile": 400.0, "tabular-cpu": 100.0}


def _demo_plan(solver: str = "garrison-demand") -> Plan:
    """A plan run on the demo fleet (hosts online, as after their agents' first reports). The garrison-demand
    planner reshapes the demo's MIG layouts (proteus keeps them), so the drawings have something to show."""
    Host.objects.update(status="online")
    job = plan_run_start(trigger="manual", options={"solver": solver, "demand": DEMO_DEMAND, "time_limit_s": 10})
    if not Plan.objects.filter(job=job).exists():  # outside a transactional test the on-commit task never ran
        job_execute(job_id=job.pk, work=lambda j: plan_run_execute(job=j))
    plan = Plan.objects.get(job=job)
    assert plan.status == "validated", plan.validation
    return plan


def _mig_layout(gpu: dict | None) -> list[str]:
    return sorted(gpu["layout"]) if gpu and gpu["mig_enabled"] else []


def _mps_layout(gpu: dict | None) -> list[str]:
    return sorted(gpu.get("mps_layout") or []) if gpu and gpu.get("mps_enabled") else []


def _layout(gpu: dict | None) -> list[str]:
    """What a GPU is drawn as: its MIG instances, or its MPS partitions ("mps60@0")."""
    return _mig_layout(gpu) or _mps_layout(gpu)


def _mode(gpu: dict) -> tuple[bool, bool]:
    return bool(gpu["mig_enabled"]), bool(gpu.get("mps_enabled"))


def _drawn(view) -> list[str]:
    if view.mps_enabled:
        return sorted(p.slot for p in view.partitions)
    return sorted(b.placement for b in view.blocks) if view.mig_enabled else []


def _figures(html: str, side: str) -> dict[str, list[str]]:
    """{"<host>/gpu<i>": sorted data-placement values} of the page's before or after drawings."""
    out = {}
    for gpu, body in re.findall(rf'<figure class="geo-side" data-side="{side}" data-gpu="([^"]+)">(.*?)</figure>', html, re.S):
        out[gpu] = sorted(re.findall(r'data-placement="([^"]+)"', body))
    return out


@pytest.fixture
def demo(db):
    seeded = demo_seed()
    # What the plan is made against: each host's desired state when the plan is made (the demo's v1).
    baseline = {s.host.name: s.spec for s in HostDesiredState.objects.select_related("host")}
    return {"seeded": seeded, "baseline": baseline, "plan": _demo_plan()}


@pytest.mark.django_db
def test_before_and_after_are_the_stored_states(demo):
    plan, baseline = demo["plan"], demo["baseline"]
    geometry = plan_geometry(plan)
    # Every planned host with GPUs, every GPU of the plan's desired state; the CPU host has nothing to draw.
    assert [h.name for h in geometry.hosts] == sorted(n for n, s in plan.desired_states.items() if s["gpus"])
    assert "sim-cpu-01" not in {h.name for h in geometry.hosts}
    variant_names = dict(ModelVariant.objects.values_list("pk", "name"))
    layout_changes = 0
    for host in geometry.hosts:
        after_spec = plan.desired_states[host.name]
        before_spec = baseline[host.name]
        assert host.baseline.startswith("desired state v")
        assert [g.name for g in host.gpus] == [f"gpu{g['index']}" for g in after_spec["gpus"]]
        before_gpus = {g["index"]: g for g in before_spec["gpus"]}
        for gpu, after in zip(host.gpus, after_spec["gpus"]):
            before = before_gpus[after["index"]]
            assert _drawn(gpu.after) == _layout(after), gpu.accelerator
            assert gpu.before is not None and _drawn(gpu.before) == _layout(before), gpu.accelerator
            assert (gpu.before.mig_enabled, gpu.after.mig_enabled) == (before["mig_enabled"], after["mig_enabled"])
            assert (gpu.before.mps_enabled, gpu.after.mps_enabled) == (_mode(before)[1], _mode(after)[1])
            changed = _layout(before) != _layout(after) or _mode(before) != _mode(after)
            assert gpu.layout_changed == changed, gpu.accelerator
            layout_changes += changed
            by_start = lambda p: int(p.split("@")[1])  # noqa: E731
            assert gpu.created == sorted(set(_mig_layout(after)) - set(_mig_layout(before)), key=by_start)
            assert gpu.destroyed == sorted(set(_mig_layout(before)) - set(_mig_layout(after)), key=by_start)
            assert gpu.partitions_created == sorted(set(_mps_layout(after)) - set(_mps_layout(before)), key=by_start)
            assert gpu.partitions_destroyed == sorted(set(_mps_layout(before)) - set(_mps_layout(after)), key=by_start)
            # Each block carries the runtime its side runs there (application and variant), and the marks.
            for view, spec, mark, other in ((gpu.before, before_spec, "destroyed", after), (gpu.after, after_spec, "created", before)):
                runtimes = {r["key"]: r for r in spec["runtimes"]}
                for block in view.blocks:
                    runtime = runtimes.get(f"{gpu.name}/{block.placement}")
                    assert block.application == (runtime["application"] if runtime else "")
                    if runtime:
                        variant = runtime["variant"]["id"] if isinstance(runtime["variant"], dict) else runtime["variant"]
                        assert block.runtime.variant == variant_names[variant]
                    assert block.change == (mark if block.placement not in _layout(other) else "")
                for partition in view.partitions:  # an MPS GPU: the models of each partition, by slot
                    models = sorted((r for r in spec["runtimes"] if r["key"].startswith(f"{gpu.name}/{partition.slot}/")),
                                    key=lambda r: int(r["key"].rsplit("/", 1)[1]))
                    assert [r.key for r in partition.runtimes] == [r["key"] for r in models]
                    duty = models[0].get("duty_cycle_ms") if models else None
                    assert partition.duty_cycle_ms == (pytest.approx(duty, abs=1e-6) if duty is not None else None)
                    assert partition.change == (mark if partition.slot not in _layout(other) else "")
                if not view.mig_enabled:
                    whole = runtimes.get(gpu.name)
                    assert (view.whole_runtime.application if view.whole_runtime else None) == (whole["application"] if whole else None)
    assert layout_changes == sum(h.layout_changes for h in geometry.hosts) == geometry.layout_changes > 0
    # At this load the composition with gpulets on the 2080 Tis first serves everything at a higher
    # accuracy than garrison-demand on the MIG GPUs (engine/solvers/mixed.py): it repartitions the 2080 Tis and
    # empties the H100's MIG instances.
    # (The demo pipeline is planned first, by FA2 on the CPU host.)
    assert plan.result["solver"] == "fa2+gpulets+garrison-demand" and any("kept MPS first" in n for n in plan.result["notes"])
    h100 = {g.name: g for g in next(h for h in geometry.hosts if h.name == "sim-h100-01").gpus}
    assert set(h100["gpu0"].destroyed) == {"4g.40gb@0", "3g.40gb@4"} and h100["gpu0"].layout_changed
    rtx = {g.name: g for g in next(h for h in geometry.hosts if h.name == "sim-2080ti-01").gpus}
    assert rtx["gpu0"].partitions_destroyed == ["mps60@0", "mps40@1"] and rtx["gpu0"].partitions_created
    assert all(p.runtimes and p.duty_cycle_ms for p in rtx["gpu0"].after.partitions)
    # The legend names every application drawn, each in its fleet-page colour.
    drawn = {b.application for h in geometry.hosts for g in h.gpus for v in (g.before, g.after) for b in v.blocks if b.application}
    assert {e.name for e in geometry.legend} >= drawn and drawn


@pytest.mark.django_db
def test_plan_page_draws_before_and_after_and_flags_changes(client, demo):
    plan, baseline = demo["plan"], demo["baseline"]
    assert client.login(username="viewer", password=demo["seeded"].logins["viewer"])
    html = client.get(f"/plans/{plan.pk}/").content.decode()
    assert 'id="geometry"' in html and "<h2>Geometry</h2>" in html
    before, after = _figures(html, "before"), _figures(html, "after")
    expected_after = {f"{h}/gpu{g['index']}": _layout(g) for h, s in plan.desired_states.items() for g in s["gpus"]}
    expected_before = {f"{h}/gpu{g['index']}": _layout(g) for h, s in baseline.items() if h in plan.desired_states for g in s["gpus"]}
    assert after == expected_after and before == expected_before
    modes = {f"{h}/gpu{g['index']}": _mode(g) for h, s in baseline.items() if h in plan.desired_states for g in s["gpus"]}
    flags = dict(re.findall(r'data-geometry-gpu="([^"]+)" data-layout-changed="(true|false)"', html))
    assert flags == {
        gpu: "true" if expected_before[gpu] != layout or modes[gpu] != _mode(g) else "false"
        for h, s in plan.desired_states.items() for g in s["gpus"] for gpu, layout in [(f"{h}/gpu{g['index']}", _layout(g))]
    }
    assert flags["sim-2080ti-01/gpu0"] == "true" and "false" in flags.values()
    # Changed GPUs are open and highlighted; created and destroyed blocks and partitions are marked.
    assert re.search(r'<details class="geo-gpu layout-changed" data-geometry-gpu="sim-h100-01/gpu0"[^>]* open>', html)
    assert '<g class="block destroyed" data-placement="4g.40gb@0"' in html
    assert '<g class="block partition destroyed" data-placement="mps60@0"' in html
    created = plan_geometry(plan).hosts[0].gpus[0].partitions_created  # sim-2080ti-01/gpu0, first by name
    assert created and all(f'<g class="block partition created" data-placement="{p}"' in html for p in created)
    # The Diff lists the partition changes too.
    assert 'data-partition-destroyed="mps60@0"' in html and f'data-partition-created="{created[0]}"' in html
    summary = plan.diff["summary"]
    assert f"+{summary['mps_created']}/−{summary['mps_destroyed']} MPS" in html and summary["mps_destroyed"] == 4
    assert 'class="geo-legend"' in html and "data-legend=" in html


@pytest.mark.django_db
def test_geometry_queries_are_bounded(demo):
    plan = demo["plan"]
    with CaptureQueriesContext(connection) as queries:
        geometry = plan_geometry(plan)
    assert len(queries) == 2, [q["sql"] for q in queries.captured_queries]  # the hosts' GPUs; the variants' names
    assert sum(len(h.gpus) for h in geometry.hosts) == 8  # 6 MIG-capable GPUs, 2 RTX 2080 Ti in MPS mode


@pytest.mark.django_db
def test_fleet_page_still_draws_every_instance(client, demo):
    assert client.login(username="viewer", password=demo["seeded"].logins["viewer"])
    html = client.get("/fleet/").content.decode()
    placements = [p for p in re.findall(r'data-placement="([^"]+)"', html) if not p.startswith("mps")]
    assert sorted(placements) == sorted(gi.placement for gi in GpuInstance.objects.all())
    assert 'data-accelerator="sim-a100-01/gpu0"' in html and '<g class="block" data-placement="4g.20gb@0"' in html
    assert "geo-side" not in html


@pytest.mark.django_db
def test_what_the_diff_does_not_record_is_not_guessed(client, users):
    """A host the diff does not cover, and a GPU whose stored layout the catalogue refused, have no "before";
    a runtime whose variant changes is drawn with its variant on each side."""
    from tests.factories import GpuFactory, HostFactory, ModelVariantFactory

    host = HostFactory(name="node-a")
    GpuFactory(host=host, index=0)
    GpuFactory(host=host, index=1)
    other = HostFactory(name="node-b")
    GpuFactory(host=other, index=0)
    small, big = ModelVariantFactory(name="small"), ModelVariantFactory(name="big")
    app = small.application.name
    runtime = {"key": "gpu0/3g.20gb@0", "application": app, "variant": big.pk, "max_batch": 8}
    plan = Plan.objects.create(status="validated", desired_states={
        "node-a": {"gpus": [{"index": 0, "mig_enabled": True, "layout": ["3g.20gb@0", "3g.20gb@4"]},
                            {"index": 1, "mig_enabled": True, "layout": ["7g.40gb@0"]}], "runtimes": [runtime]},
        "node-b": {"gpus": [{"index": 0, "mig_enabled": False, "layout": []}], "runtimes": []},
    }, diff={"hosts": {"node-a": {"baseline": "plan 1", "changed": True, "gpus": {
        "gpu1": {"mig_enabled": {"before": True, "after": True}, "keep": [], "destroy": [], "create": [], "error": "refused"}},
        "runtimes": {"added": [], "removed": [], "kept": 0,
                     "changed": [{"key": "gpu0/3g.20gb@0", "before": {**runtime, "variant": small.pk}, "after": runtime}]}}}})
    geometry = plan_geometry(plan)
    a, b = geometry.hosts
    gpu0, gpu1 = a.gpus
    assert _drawn(gpu0.before) == _drawn(gpu0.after) == ["3g.20gb@0", "3g.20gb@4"] and not gpu0.layout_changed
    assert gpu0.runtimes_changed and gpu0.changed
    assert gpu0.before.blocks[0].runtime.variant == "small" and gpu0.after.blocks[0].runtime.variant == "big"
    assert gpu1.before is None and gpu1.layout_changed
    assert b.baseline == "not recorded" and b.gpus[0].before is None
    client.force_login(users["viewer"])
    html = client.get(f"/plans/{plan.pk}/").content.decode()
    assert html.count("Not recorded by the plan's diff.") == 2
    assert 'data-geometry-gpu="node-a/gpu0" data-layout-changed="false" data-runtimes-changed="true"' in html


# --------------------------------------------------------------------------- in a real browser


@pytest.fixture
def geometry_plan(transactional_db):
    """The demo fleet and a plan that reshapes it, made before the browser opens (see test_fleet_browser)."""
    seeded = demo_seed()
    plan = _demo_plan()
    changed = sorted(f"{h}/gpu{g['index']}" for h, d in plan.diff["hosts"].items() for g in plan.desired_states[h]["gpus"]
                     if f"gpu{g['index']}" in d["gpus"])
    return {"plan": plan.pk, "viewer_password": seeded.logins["viewer"], "changed": changed}


@pytest.mark.django_db(transaction=True)
def test_plan_page_shows_the_geometry_in_a_browser(live_server, geometry_plan, browser_page):
    page, url = browser_page, live_server.url
    page.goto(f"{url}/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", geometry_plan["viewer_password"])
    page.click("form button[type=submit]")
    page.wait_for_load_state()
    page.goto(f"{url}/plans/{geometry_plan['plan']}/")
    page.wait_for_selector("#geometry [data-placement]")
    changed = page.locator('[data-layout-changed="true"]')
    assert sorted(changed.nth(i).get_attribute("data-geometry-gpu") for i in range(changed.count())) == geometry_plan["changed"]
    # Before and after of a changed GPU are side by side, at the same scale.
    gpu = page.locator('[data-geometry-gpu="sim-h100-01/gpu0"]')
    before, after = gpu.locator('[data-side="before"] svg'), gpu.locator('[data-side="after"] svg')
    assert before.is_visible() and after.is_visible()
    b, a = before.bounding_box(), after.bounding_box()
    assert b["x"] + b["width"] < a["x"] and abs(b["y"] - a["y"]) < 2 and abs(b["width"] - a["width"]) < 2
    # Unchanged GPUs are folded.
    unchanged = page.locator("details.geo-gpu.unchanged")
    for i in range(unchanged.count()):
        assert not unchanged.nth(i).locator("svg").first.is_visible()
    page.locator("#geometry").scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "plan.png"), full_page=True)
    page.locator("#geometry").screenshot(path=str(SCREENSHOTS / "plan-geometry.png"))
    assert (SCREENSHOTS / "plan.png").stat().st_size > 0 and (SCREENSHOTS / "plan-geometry.png").stat().st_size > 0
