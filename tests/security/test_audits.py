"""The code and the dependencies audited (issue 44, security), in `make test` and so in CI.

bandit, configured in pyproject.toml's [tool.bandit], over every severity and confidence: any finding
fails, printed; one accepted carries `# nosec BXXX - why` on its line, and a `# nosec` that names no test or
gives no reason fails too (it would silence everything on its line).

pip-audit over requirements/lock.txt and requirements/gpu.txt as pinned and hashed (no resolution, pip not
used), against PyPI's advisories (OSV's where PyPI's cannot be reached): a known vulnerability fails, printed,
unless ACCEPTED_VULNERABILITIES names it with why; so does a dependency it could not audit. When neither
service can be reached from this machine the test is skipped saying so, CI included: its machines reach a
PyPI mirror that has no per-version JSON and no route to api.osv.dev, and an internet service is not one CI
provides (TESSERA_REQUIRE_SERVICES is about PostgreSQL and Redis). `make audit` runs the same audit by hand
where the network reaches either (docs/testing.md)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from tests.deploy.commands import REPO

BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKS = ("requirements/lock.txt", "requirements/gpu.txt")
# {advisory id: why it does not apply or cannot be fixed yet}: each is passed to pip-audit's --ignore-vuln.
ACCEPTED_VULNERABILITIES: dict[str, str] = {}
NOSEC = re.compile(r"#\s*nosec\b(?P<rest>.*)$")
JUSTIFIED = re.compile(r"^:?\s*B\d{3}(\s*,\s*B\d{3})*\s+-\s+\S")


# --------------------------------------------------------------------------- bandit


def _bandit_targets() -> list[str]:
    return PYPROJECT["tool"]["bandit"]["targets"]


def test_bandit_finds_nothing_unjustified_in_the_code():
    result = subprocess.run([str(BIN / "bandit"), "-c", "pyproject.toml", "-r", *_bandit_targets(), "-f", "json", "-q"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    report = json.loads(result.stdout)
    assert not report["errors"], report["errors"]
    findings = [f"{r['filename']}:{r['line_number']}: {r['test_id']} ({r['issue_severity']}, {r['issue_confidence']} confidence) "
                f"{r['issue_text']}\n    {r['code'].strip().splitlines()[0] if r['code'].strip() else ''}" for r in report["results"]]
    assert not findings, "bandit: fix each, or accept it on its line with `# nosec BXXX - why`:\n" + "\n".join(findings)
    assert result.returncode == 0, result.stderr[-2000:]
    scanned = set(report["metrics"]) - {"_totals"}
    assert any("/migrations/" not in name for name in scanned) and not any("/migrations/" in name for name in scanned)
    assert {Path(name).parts[0] for name in scanned} == set(_bandit_targets())


def test_every_nosec_names_its_test_and_says_why():
    bare = []
    for target in _bandit_targets():
        for path in sorted((REPO / target).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = NOSEC.search(line)
                if match and not JUSTIFIED.match(match.group("rest")):
                    bare.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not bare, "a `# nosec` names the test it accepts and why (`# nosec B603 - ...`):\n" + "\n".join(bare)


def test_the_nosec_rule_refuses_a_bare_one():
    for accepted in (" B603 - an argument list", " B105, B106 - a prefix", ": B311 - jitter"):
        assert JUSTIFIED.match(accepted), accepted
    for refused in ("", " B603", " - why", " jitter"):
        assert not JUSTIFIED.match(refused), refused


# --------------------------------------------------------------------------- pip-audit


def _pinned(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", (REPO / LOCKS[0]).read_text(), flags=re.M | re.I)
    assert match, name
    return match.group(1)


def _advisory_service() -> str:
    """The vulnerability service pip-audit can reach from here ("pypi" or "osv"), asked about the pinned
    Django as pip-audit will ask about every package; the test is skipped, saying why, when neither answers."""
    version = _pinned("django")
    probes = {
        "pypi": ("GET", f"https://pypi.org/pypi/django/{version}/json", None, "vulnerabilities"),
        "osv": ("POST", "https://api.osv.dev/v1/query", {"package": {"name": "django", "ecosystem": "PyPI"}, "version": version}, None),
    }
    failures = []
    for service, (method, url, body, key) in probes.items():
        try:
            response = httpx.request(method, url, json=body, timeout=15)
            if response.status_code == 200 and (key is None or key in response.json()):
                return service
            failures.append(f"{url}: HTTP {response.status_code}")
        except (httpx.HTTPError, ValueError) as exc:
            failures.append(f"{url}: {type(exc).__name__}: {exc}")
    pytest.skip("pip-audit's vulnerability services cannot be reached from this machine (" + "; ".join(failures) + ")")


def _vulnerability_line(dependency: dict, vulnerability: dict) -> str:
    aliases = ", ".join(vulnerability.get("aliases", []))
    fixed = ", ".join(vulnerability.get("fix_versions", [])) or "no release yet"
    summary = (vulnerability.get("description") or "").strip().split("\n")[0][:200]
    return f"{dependency['name']} {dependency['version']}: {vulnerability['id']} ({aliases}) fixed in {fixed}: {summary}"


def test_pip_audit_finds_no_known_vulnerability_in_the_locked_dependencies():
    service = _advisory_service()
    ignores = [arg for vuln in ACCEPTED_VULNERABILITIES for arg in ("--ignore-vuln", vuln)]
    files = [arg for lock in LOCKS for arg in ("-r", lock)]
    result = subprocess.run([str(BIN / "pip-audit"), *files, "--disable-pip", "--require-hashes", "--vulnerability-service", service,
                             "--format", "json", "--desc", "on", "--aliases", "on", "--progress-spinner", "off", *ignores],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.stdout.strip(), result.stderr[-3000:]
    dependencies = json.loads(result.stdout)["dependencies"]
    assert len(dependencies) >= 150 and any(d["name"] == "django" for d in dependencies)
    vulnerable = [_vulnerability_line(d, v) for d in dependencies for v in d.get("vulns", [])]
    unaudited = [f"{d['name']}: {d['skip_reason']}" for d in dependencies if d.get("skip_reason")]
    assert not vulnerable, (f"pip-audit ({service}): upgrade in pyproject.toml and `make lock`, or accept in "
                            "ACCEPTED_VULNERABILITIES with why:\n" + "\n".join(vulnerable))
    assert not unaudited, f"pip-audit ({service}) could not audit:\n" + "\n".join(unaudited)
