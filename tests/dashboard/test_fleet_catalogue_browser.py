"""The fleet page in a real browser (Chromium through Playwright, as tests/dashboard/test_fleet_browser.py):
where NVML disagrees with the MIG catalogue, each host says how often and each GPU lists the lines its agent
reported; a GPU the catalogue lacks is drawn on the memory slices of its NVML table and labelled "from NVML,
not in the catalogue"; an RTX PRO 6000 is drawn on its twelve placement units."""
import pytest

from apps.inventory.choices import HostBackendChoices
from apps.inventory.models import GpuInstance
from controlplane.demo import demo_seed
from engine.geometry.catalogue import mig_catalogue_load
from tests.dashboard.test_fleet_browser import browser_page  # noqa: F401 - the fixture
from tests.factories import GpuFactory, HostFactory

A100_TABLE = [
    {"name": p.name, "profile_id": p.profile_id, "memory_slices": p.memory_slices, "compute_slices": p.compute_slices,
     "memory_mb": p.memory_gb * 1000, "starts": list(p.starts), "max_count": p.max_count}
    for p in mig_catalogue_load().gpu_model_get("A100-SXM4-40GB").profiles
]
DISAGREEMENTS = [
    "gpu0 NVIDIA A800 40GB PCIe (PCI device id 0x20F610DE): NVML reports MIG profiles [...], but the catalogue does "
    "not know this model; it is planned from NVML's profile table (from NVML, not in the catalogue)",
    "gpu1 1g.24gb: NVML gives it profile id 15, the catalogue 14",
    "gpu7 3g.20gb: NVML reports starts [4], the catalogue [0, 4]",
]


@pytest.fixture
def fleet_with_disagreements(transactional_db):
    seeded = demo_seed()
    host = HostFactory(name="nvml-odd", status="online", backend=HostBackendChoices.NVML, catalogue_disagreements=DISAGREEMENTS)
    a800 = GpuFactory(host=host, index=0, model_name="NVIDIA A800 40GB PCIe", pci_device_id="0x20F610DE", nvml_profiles=A100_TABLE)
    GpuInstance.objects.create(accelerator=a800, profile="3g.20gb", placement_start=4)
    rtx = GpuFactory(host=host, index=1, model_name="NVIDIA RTX PRO 6000 Blackwell Server Edition", memory_mb=97887)
    GpuInstance.objects.create(accelerator=rtx, profile="2g.48gb", placement_start=6)
    return {"viewer_password": seeded.logins["viewer"]}


@pytest.mark.django_db(transaction=True)
def test_the_fleet_page_flags_catalogue_disagreements(asgi_live_server, fleet_with_disagreements, browser_page):  # noqa: F811
    page = browser_page
    page.goto(f"{asgi_live_server.url}/fleet/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", fleet_with_disagreements["viewer_password"])
    page.click("form button[type=submit]")
    page.wait_for_url(f"{asgi_live_server.url}/fleet/")
    host = page.locator('[data-host="nvml-odd"]')
    host.wait_for()
    assert host.locator(".badge.catalogue-disagreements").inner_text() == "3 catalogue disagreements"
    # Per GPU, the lines about it; the line about a GPU the host no longer has, under the host.
    a800 = host.locator('[data-accelerator="nvml-odd/gpu0"]')
    rtx = host.locator('[data-accelerator="nvml-odd/gpu1"]')
    assert a800.locator('[data-catalogue-disagreements="nvml-odd/gpu0"] li').all_inner_texts() == [DISAGREEMENTS[0]]
    assert rtx.locator('[data-catalogue-disagreements="nvml-odd/gpu1"] li').all_inner_texts() == [DISAGREEMENTS[1]]
    assert host.locator('[data-catalogue-disagreements="nvml-odd"] li').all_inner_texts() == [DISAGREEMENTS[2]]
    # The GPU the catalogue lacks: labelled, and drawn on its NVML table's eight slices (3g.20gb@4 is half).
    label = a800.locator("[data-nvml-model]")
    assert label.inner_text() == "from NVML, not in the catalogue" and label.is_visible()
    assert "A800 40GB PCIe (from NVML, not in the catalogue)" in label.get_attribute("title")
    assert a800.locator("rect.slot").count() == 8
    block = a800.locator('g.block[data-placement="3g.20gb@4"] rect').first.bounding_box()
    svg = a800.locator("svg.mig").bounding_box()
    assert abs(block["x"] - (svg["x"] + svg["width"] / 2)) < svg["width"] * 0.02
    # The RTX PRO 6000: twelve placement units, its 2g.48gb@6 the right half; no NVML label (the catalogue knows it).
    assert rtx.locator("rect.slot").count() == 12 and rtx.locator("[data-nvml-model]").count() == 0
    half = rtx.locator('g.block[data-placement="2g.48gb@6"] rect').first.bounding_box()
    rtx_svg = rtx.locator("svg.mig").bounding_box()
    assert abs(half["width"] - rtx_svg["width"] / 2) < rtx_svg["width"] * 0.02
    # A host whose agent reported no disagreement shows none.
    assert page.locator('[data-host="sim-a100-01"] .badge.catalogue-disagreements').count() == 0
