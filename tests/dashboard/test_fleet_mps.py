"""The fleet page draws MPS GPUs (issue 17) as it draws MIG ones: each partition a block as wide as its
share of the GPU, with its percent, the models time-sharing it (as the agent reports them) and its duty
cycle (from the host's latest desired state); the share no partition holds is drawn empty. In a real
browser too, with a screenshot (test-artifacts/screenshots/fleet-mps.png)."""
from __future__ import annotations

import re

import pytest

from apps.deployments.models import HostDesiredState, Runtime
from apps.inventory.models import Host, MpsPartition
from apps.registry.models import Application
from controlplane.demo import demo_seed
from tests.dashboard.test_fleet_browser import SCREENSHOTS, browser_page  # noqa: F401 (fixture)

MPS_HOST = "sim-2080ti-01"


def _report_mps_runtimes() -> dict[str, dict]:
    """What sim-2080ti-01's agent reports once it serves its desired state: a ready runtime per model on
    each partition, the partitions ready. Returns the desired runtimes by key."""
    host = Host.objects.get(name=MPS_HOST)
    spec = HostDesiredState.objects.filter(host=host).latest("version").spec
    applications = {a.name: a for a in Application.objects.all()}
    for runtime in spec["runtimes"]:
        variant = runtime["variant"]["id"] if isinstance(runtime["variant"], dict) else runtime["variant"]  # stored: {"id", ...}
        Runtime.objects.create(host=host, key=runtime["key"], application=applications[runtime["application"]],
                               variant_id=variant, state="ready", simulated=True)
    MpsPartition.objects.filter(accelerator__host=host).update(state="ready")
    return {r["key"]: r for r in spec["runtimes"]}


def _partition_blocks(html: str, gpu: str) -> dict[str, str]:
    """{slot: its drawing, up to the next block} of one GPU's figure on the page."""
    figure = re.search(rf'<figure class="device gpu" data-accelerator="{MPS_HOST}/{gpu}">(.*?)</figure>', html, re.S)
    assert figure, gpu
    svg = figure.group(1).split("</svg>")[0]
    parts = re.split(r'(?=<g class="block)', svg)[1:]
    return {re.search(r'data-placement="([^"]+)"', part)[1]: part for part in parts if 'class="block partition' in part}


@pytest.mark.django_db
def test_the_fleet_page_draws_each_partition_with_its_models_and_round(client):
    seeded = demo_seed()
    desired = _report_mps_runtimes()
    assert client.login(username="viewer", password=seeded.logins["viewer"])
    html = client.get("/fleet/").content.decode()
    assert f'data-host="{MPS_HOST}"' in html and html.count("MPS on") >= 2 and "2 partitions" in html
    for accelerator in Host.objects.get(name=MPS_HOST).accelerators.order_by("index"):
        partitions = list(accelerator.mps_partitions_set.order_by("index"))
        blocks = _partition_blocks(html, f"gpu{accelerator.index}")
        assert list(blocks) == [p.slot for p in partitions]
        widths = {}
        for partition in partitions:
            block = blocks[partition.slot]
            assert f'data-percent="{partition.percent}"' in block and f"{partition.percent} %" in block
            models = sorted((k for k in desired if k.startswith(f"gpu{accelerator.index}/{partition.slot}/")), key=lambda k: int(k.rsplit("/", 1)[1]))
            assert models and re.findall(r'data-runtime="([^"]+)"', block) == models
            duty = desired[models[0]]["duty_cycle_ms"]
            if duty is not None:
                assert float(re.search(r'data-duty-cycle-ms="([^"]+)"', block)[1]) == pytest.approx(duty, abs=1e-6)
                assert f"round {round(duty, 6):g} ms" in block
            for key in models:  # each model's application and variant, in the block's title
                runtime = desired[key]
                assert runtime["application"] in block
            widths[partition.slot] = int(re.search(r'<rect x="\d+" y="3" width="(\d+)"', block)[1])
        # Drawn as shares of the GPU: widths in the partitions' proportions (4 px of margin each).
        total = sum(p.percent for p in partitions)
        for partition in partitions:
            assert (widths[partition.slot] + 4) / sum(w + 4 for w in widths.values()) == pytest.approx(partition.percent / total, abs=0.01)
        # Each model is listed under its GPU with its live load.
        for key in [k for k in desired if k.startswith(f"gpu{accelerator.index}/")]:
            assert f'data-instance="{MPS_HOST}/{key}"' in html


@pytest.mark.django_db
def test_a_partition_without_models_and_the_free_share_are_drawn(client):
    seeded = demo_seed()
    gpu1 = Host.objects.get(name=MPS_HOST).accelerators.get(index=1)
    MpsPartition.objects.filter(accelerator=gpu1, index=1).delete()  # gpu1 keeps mps50@0: half of it is free
    assert client.login(username="viewer", password=seeded.logins["viewer"])
    html = client.get("/fleet/").content.decode()
    blocks = _partition_blocks(html, "gpu1")
    assert list(blocks) == ["mps50@0"] and "no models" in blocks["mps50@0"]  # no agent has reported a runtime
    assert 'data-mps-free="50"' in html and "50 % free" in html


@pytest.fixture
def mps_fleet(transactional_db):
    """The demo fleet with the MPS host serving, read before the browser opens (see test_fleet_browser)."""
    seeded = demo_seed()
    _report_mps_runtimes()
    gpu0 = Host.objects.get(name=MPS_HOST).accelerators.get(index=0)
    return {"viewer_password": seeded.logins["viewer"], "percents": [p.percent for p in gpu0.mps_partitions_set.order_by("index")]}


@pytest.mark.django_db(transaction=True)
def test_the_mps_partitions_in_a_browser(asgi_live_server, mps_fleet, browser_page):
    page, url = browser_page, asgi_live_server.url
    page.goto(f"{url}/fleet/")  # to the login page, and back here once logged in
    page.fill("#id_username", "viewer")
    page.fill("#id_password", mps_fleet["viewer_password"])
    page.click("form button[type=submit]")
    page.wait_for_url(f"{url}/fleet/")
    gpu0 = page.locator(f'[data-accelerator="{MPS_HOST}/gpu0"]')
    gpu0.locator("g.partition").first.wait_for()
    blocks = gpu0.locator("g.partition")
    assert blocks.count() == len(mps_fleet["percents"]) == 2
    boxes = [blocks.nth(i).locator("rect").first.bounding_box() for i in range(blocks.count())]
    # Side by side, left to right by index, as wide as their shares (60 % and 40 %).
    assert boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"] + 1
    first, second = mps_fleet["percents"]
    assert boxes[0]["width"] / boxes[1]["width"] == pytest.approx(first / second, rel=0.06)
    # Every model line is visible inside its partition.
    lines = gpu0.locator("g.model-line")
    assert lines.count() >= 2 and all(lines.nth(i).is_visible() for i in range(lines.count()))
    gpu0.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator(f'[data-host="{MPS_HOST}"]').screenshot(path=str(SCREENSHOTS / "fleet-mps.png"))
    assert (SCREENSHOTS / "fleet-mps.png").stat().st_size > 0
