"""Ensemble policies on the Policies page through Django's test client: viewers see each policy and the
routers' counts read-only; operators create, edit and clear one through `ensemble_policy_set` (audited as
web changes), and refused input comes back inline with status 400 and nothing saved."""
import pytest
from django.utils import timezone

from apps.core.models import ObjectChange
from apps.policies.models import EnsemblePolicy
from apps.policies.services import ensemble_policy_set
from apps.telemetry.models import ApplicationSample
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def pools(db):
    robust = ApplicationFactory(name="robust")
    for name in ("a", "b", "c"):
        ModelVariantFactory(application=robust, name=name)
    plain = ApplicationFactory(name="plain")
    for name in ("x", "y"):
        ModelVariantFactory(application=plain, name=name)
    ApplicationFactory(name="empty")  # no variant: nothing to draw from
    policy = ensemble_policy_set(application=robust, data={"members": {"a": 0.5, "b": 0.3, "c": 0.2}, "min_size": 2, "max_size": 2})
    ApplicationSample.objects.create(router="router-1", application=robust, application_name="robust", at=timezone.now(), interval_s=1.0,
                                     ensembles=[{"queries": 10, "chosen": {"a": 10, "b": 6, "c": 4}, "voted": {"a": 9, "b": 6, "c": 4},
                                                 "sizes": {"2": 10}, "scheduler": "random"}])
    return {"robust": robust, "plain": plain, "policy": policy}


def _form(pk, **fields):
    form = {"kind": "ensemble", "pk": str(pk), "mode": "random", "members": "a=0.5\nb=0.3\nc=0.2", "min_size": "2", "max_size": "2",
            "vote": "soft", "scheduler": ""}
    form.update(fields)
    return form


def test_viewers_see_policies_and_counts_without_forms(client, users, pools):
    client.force_login(users["viewer"])
    html = client.get("/policies/").content.decode()
    pk = pools["policy"].pk
    assert f'data-policy="ensemble-{pk}"' in html and "<dt>Members per query</dt><dd>2..2</dd>" in html
    assert 'data-member="a"' in html and "<td>0.474</td><td>10</td><td>9</td>" in html  # 9 of the 19 votes cast
    assert "10 queries in the last 300 s, 2.00 members each on average; randomness bias" in html
    assert 'name="members"' not in html and "ensemble-new" not in html
    assert "No ensemble policy for: plain." in html  # "empty" has no variant to draw from


def test_operators_create_edit_and_clear(client, users, pools):
    client.force_login(users["operator"])
    html = client.get("/policies/").content.decode()
    pk = pools["policy"].pk
    assert f'id="id_ensemble{pk}_members"' in html and "a=0.5:1.0" in html and 'data-policy="ensemble-new"' in html
    assert '<option value="%d"' % pools["plain"].pk in html and '<option value="%d"' % pools["robust"].pk not in html

    response = client.post("/policies/", _form("new", application=str(pools["plain"].pk), members="x=0.6:2, y=0.4", min_size="", max_size=""),
                           follow=True)
    assert response.status_code == 200 and "Ensemble policy of plain saved." in response.content.decode()
    created = EnsemblePolicy.objects.get(application=pools["plain"])
    assert (created.min_size, created.max_size) == (1, 2) and [m.weight for m in created.member_list()] == [2.0, 1.0]

    response = client.post("/policies/", _form(pk, vote="hard", members="a=0.25\nc=0.75", min_size="1"))
    assert response.status_code == 302
    policy = EnsemblePolicy.objects.get(pk=pk)
    assert policy.vote == "hard" and [(m.variant.name, m.probability) for m in policy.member_list()] == [("a", 0.25), ("c", 0.75)]
    change = ObjectChange.objects.filter(changed_object_type__model="ensemblepolicy", changed_object_id=str(pk), action="update").get()
    assert change.user == users["operator"] and change.source == "web" and "members" in change.changed_fields

    response = client.post("/policies/", {"kind": "ensemble", "pk": str(pk), "clear": ""}, follow=True)
    assert "Ensemble policy of robust cleared" in response.content.decode()
    assert not EnsemblePolicy.objects.filter(pk=pk).exists()


@pytest.mark.parametrize("fields, field, text", [
    ({"members": "a=0.5\nb=0.6"}, "members", "sum to 1"),
    ({"members": "a=half"}, "members", "expected VARIANT=PROBABILITY"),
    ({"members": "zzz=1"}, "members", "not a variant of robust"),
    ({"max_size": "4"}, "max_size", "max_size &lt;= 3"),
    ({"mode": "learned"}, "scheduler", "a learned policy needs the scheduler"),
    ({"min_size": "two"}, "min_size", "Enter a whole number."),
])
def test_refused_input_is_shown_inline_and_nothing_changes(client, users, pools, fields, field, text):
    client.force_login(users["operator"])
    pk = pools["policy"].pk
    before, changes = pools["policy"].audit_snapshot(), ObjectChange.objects.count()
    response = client.post("/policies/", _form(pk, **fields))
    assert response.status_code == 400
    html = response.content.decode()
    assert f'data-error-field="{field}"' in html and text in html, html[html.find("form-errors"):][:2000]
    assert "Nothing was saved." in html
    assert EnsemblePolicy.objects.get(pk=pk).audit_snapshot() == before and ObjectChange.objects.count() == changes


def test_viewers_cannot_post(client, users, pools):
    client.force_login(users["viewer"])
    pk = pools["policy"].pk
    assert client.post("/policies/", _form(pk, vote="hard")).status_code == 403
    assert client.post("/policies/", {"kind": "ensemble", "pk": str(pk), "clear": ""}).status_code == 403
    assert client.post("/policies/", _form("new", application=str(pools["plain"].pk), members="x=1")).status_code == 403
    assert EnsemblePolicy.objects.count() == 1 and EnsemblePolicy.objects.get().vote == "soft"


def test_unknown_ensemble_policy_is_404(client, users, pools):
    client.force_login(users["operator"])
    assert client.post("/policies/", _form("424242")).status_code == 404
    assert client.post("/policies/", _form("nonsense")).status_code == 404


def test_the_table_shows_the_latest_schedulers_draws_and_names_the_earlier(client, users, pools):
    robust = pools["robust"]
    ApplicationSample.objects.create(router="router-1", application=robust, application_name="robust", at=timezone.now(), interval_s=1.0,
                                     ensembles=[{"queries": 3, "chosen": {"a": 3, "c": 3}, "voted": {"a": 3, "c": 3}, "sizes": {"2": 3},
                                                 "scheduler": "learned (favour-a-c)"}])
    client.force_login(users["viewer"])
    html = client.get("/policies/").content.decode()
    assert "3 queries in the last 300 s" in html and '<span data-scheduler>learned (favour-a-c)</span>' in html
    assert "Before it in the window: 10 by <span data-scheduler-earlier>random</span>." in html
    assert 'data-member="b"' in html and "<td>0.000</td><td>0</td><td>0</td>" in html  # b was not drawn by the learned policy
