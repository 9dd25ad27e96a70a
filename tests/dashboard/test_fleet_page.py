"""The dashboard's fleet page through Django's test client: login, role permissions, and the MIG drawing."""
import re

import pytest

from apps.deployments.models import Runtime
from apps.inventory.models import GpuInstance, Host, MpsPartition
from apps.registry.models import Application
from apps.users.choices import RoleChoices
from controlplane.demo import demo_seed
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(db):
    return demo_seed()


def test_anonymous_is_sent_to_login(client):
    response = client.get("/fleet/")
    assert response.status_code == 302
    assert response.headers["Location"] == "/login/?next=/fleet/"
    assert client.get("/login/").status_code == 200


def test_user_without_role_is_forbidden(client, roles):
    client.force_login(UserFactory(username="nobody"))
    assert client.get("/fleet/").status_code == 403


def test_viewer_sees_every_host_and_one_block_per_gpu_instance(client, demo):
    assert client.login(username="viewer", password=demo.logins["viewer"])
    response = client.get("/fleet/")
    assert response.status_code == 200
    html = response.content.decode()
    for host in Host.objects.all():
        assert f'data-host="{host.name}"' in html
    assert html.count("simulated</span>") == Host.objects.count()
    found = re.findall(r'data-placement="([^"]+)"', html)
    placements = [p for p in found if not p.startswith("mps")]  # MIG instances; "mps60@0" are MPS partitions
    assert len(placements) == GpuInstance.objects.count()
    assert sorted(placements) == sorted(gi.placement for gi in GpuInstance.objects.all())
    assert sorted(p for p in found if p.startswith("mps")) == sorted(p.slot for p in MpsPartition.objects.all())
    assert 'data-placement="4g.20gb@0"' in html and 'data-placement="3g.40gb@4"' in html
    assert html.count("data-whole-gpu=") == 2  # sim-a100-02 gpu1 and sim-h100-01 gpu1 run MIG off
    assert "16 cores" in html


def test_runtimes_label_and_colour_their_blocks(client, demo):
    host = Host.objects.get(name="sim-a100-01")
    application = Application.objects.order_by("name").first()
    variant = application.variants.first()
    Runtime.objects.create(host=host, key="gpu0/4g.20gb@0", application=application, variant=variant, state="ready", simulated=True)
    cpu_host = Host.objects.get(name="sim-cpu-01")
    Runtime.objects.create(host=cpu_host, key="cpu0/0", application=application, variant=variant, state="ready", simulated=True)
    assert client.login(username="viewer", password=demo.logins["viewer"])
    html = client.get("/fleet/").content.decode()
    block = re.search(r'<g class="block" data-placement="4g.20gb@0"[^>]*>.*?</g>', html, re.S).group(0)
    assert f'data-application="{application.name}"' in block and variant.name in block
    assert 'data-runtime="cpu0/0"' in html
