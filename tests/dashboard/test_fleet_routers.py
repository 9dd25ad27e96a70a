"""The fleet page lists the routers' credentials (issued, revoked, last used, reports dropped), never a
secret; and the CLI issues and revokes them, audited."""
import pytest
from typer.testing import CliRunner

from apps.core.models import ObjectChange
from apps.inventory.models import Host, RouterCredential
from apps.inventory.services import router_credential_issue, router_credential_revoke
from controlplane.cli import app as cli
from controlplane.demo import demo_seed

pytestmark = pytest.mark.django_db


def test_the_fleet_page_shows_router_credentials(client):
    demo = demo_seed()
    active, secret = router_credential_issue(name="edge-router-1", description="rack 4")
    revoked, _ = router_credential_issue(name="edge-router-2")
    router_credential_revoke(credential=revoked)
    RouterCredential.objects.filter(pk=active.pk).update(dropped_reports=12)
    Host.objects.filter(name="sim-cpu-01").update(dropped_reports=5)
    assert client.login(username="viewer", password=demo.logins["viewer"])
    html = client.get("/fleet/").content.decode()
    row = html.split('data-router="edge-router-1"', 1)[1].split("</tr>", 1)[0]
    assert active.token_prefix in row and "active" in row and "<td>12</td>" in row and "rack 4" in row
    assert "revoked" in html.split('data-router="edge-router-2"', 1)[1].split("</tr>", 1)[0]
    assert secret not in html and secret[len(active.token_prefix):] not in html
    assert "5 reports dropped" in html.split('data-host="sim-cpu-01"', 1)[1].split("</header>", 1)[0]


def test_the_cli_issues_and_revokes_router_credentials():
    runner = CliRunner()
    issued = runner.invoke(cli, ["router-credential", "issue", "cli-router", "--description", "from the CLI"])
    assert issued.exit_code == 0, issued.output
    secret = issued.output.strip()
    credential = RouterCredential.objects.get(name="cli-router")
    assert secret.startswith("tsr_") and credential.active and credential.token_prefix == secret[:10]
    assert runner.invoke(cli, ["router-credential", "issue", "not a name"]).exit_code == 2
    revoked = runner.invoke(cli, ["router-credential", "revoke", "cli-router"])
    assert revoked.exit_code == 0 and not RouterCredential.objects.get(name="cli-router").active
    assert runner.invoke(cli, ["router-credential", "revoke", "nobody"]).exit_code == 2
    changes = ObjectChange.objects.filter(changed_object_type__model="routercredential").order_by("id")
    assert [(c.action, c.source) for c in changes] == [("create", "command"), ("update", "command")]
