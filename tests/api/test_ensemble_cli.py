"""`tessera ensemble show|set|clear`: the same service as the API, exit 0 fine, 1 refused by the rules
(nothing stored), 2 a malformed command line or an unknown application; audited as a command."""
import json

import pytest
from typer.testing import CliRunner

from apps.core.models import ObjectChange
from apps.policies.models import EnsemblePolicy
from controlplane.cli import app as cli
from controlplane.cli.ensemble import MODES, VOTES
from engine.ensembles.policy import ENSEMBLE_MODES, ENSEMBLE_VOTES
from tests.factories import ApplicationFactory, ModelVariantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def robust(db):
    application = ApplicationFactory(name="robust")
    return {name: ModelVariantFactory(application=application, name=name) for name in ("a", "b", "c")}


def test_the_cli_spells_the_engines_modes_and_votes():
    assert MODES == ENSEMBLE_MODES and VOTES == ENSEMBLE_VOTES


def test_set_show_clear(robust):
    runner = CliRunner()
    shown = runner.invoke(cli, ["ensemble", "show", "robust"])
    assert shown.exit_code == 0 and "no ensemble policy" in shown.output
    done = runner.invoke(cli, ["ensemble", "set", "robust", "--member", "a=0.5:2", "--member", f"{robust['b'].pk}=0.3", "-m", "c=0.2",
                               "--min-size", "2", "--vote", "hard"])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[0] == "robust: random ensemble of 2..3 member(s), hard vote"
    policy = EnsemblePolicy.objects.get()
    assert [(m.variant.name, m.probability, m.weight) for m in policy.member_list()] == [("a", 0.5, 2.0), ("b", 0.3, 1.0), ("c", 0.2, 1.0)]
    shown = runner.invoke(cli, ["ensemble", "show", "robust", "--json"])
    assert shown.exit_code == 0
    assert json.loads(shown.output)["members"][0] == {"variant": "a", "variant_id": robust["a"].pk, "probability": 0.5, "weight": 2.0}
    assert "b" in runner.invoke(cli, ["ensemble", "show", "robust"]).output
    cleared = runner.invoke(cli, ["ensemble", "clear", "robust"])
    assert cleared.exit_code == 0 and not EnsemblePolicy.objects.exists()
    assert runner.invoke(cli, ["ensemble", "clear", "robust"]).exit_code == 0
    sources = set(ObjectChange.objects.filter(changed_object_type__model="ensemblepolicy").values_list("source", "action"))
    assert sources == {("command", "create"), ("command", "delete")}


@pytest.mark.parametrize("args, code, text", [
    (["--member", "a=0.5", "--member", "b=0.6"], 1, "members: the probabilities must sum to 1"),
    (["--member", "a=1", "--max-size", "2"], 1, "max_size: need 1 <= min_size <= max_size <= 1"),
    (["--member", "zzz=1"], 1, "'zzz' is not a variant of robust"),
    (["--member", "a=1", "--mode", "learned"], 1, "scheduler: a learned policy needs the scheduler"),
    (["--member", "a"], 2, "expected VARIANT=PROBABILITY"),
    (["--member", "a=half"], 2, "expected VARIANT=PROBABILITY"),
    (["--member", "a=1", "--mode", "sometimes"], 2, "--mode must be one of single, random, learned"),
    (["--member", "a=1", "--vote", "loud"], 2, "--vote must be one of soft, hard"),
])
def test_refusals_store_nothing(robust, args, code, text):
    result = CliRunner().invoke(cli, ["ensemble", "set", "robust", *args])
    assert result.exit_code == code, result.output
    assert text in result.output
    assert not EnsemblePolicy.objects.exists()


def test_an_unknown_application_is_malformed(robust):
    for args in (["show", "nope"], ["clear", "nope"], ["set", "nope", "--member", "a=1"]):
        result = CliRunner().invoke(cli, ["ensemble", *args])
        assert result.exit_code == 2 and "no application 'nope'" in result.output
