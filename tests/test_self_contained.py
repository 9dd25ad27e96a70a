"""The repository stands on its own: no tracked file names a path outside it, and the reference data that
the demo, the tests and the benchmarks read is bundled, cited and intact (issue 37)."""
from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from engine.reference.profiles import (
    BUNDLED_REFERENCE_DATA,
    gpulet_inference_read,
    gpulet_interference_read,
    gpulet_mem_util_read,
    reference_data_dir,
)
from engine.reference.proteus_artifact import proteus_recorded_figures

REPO = Path(__file__).resolve().parents[1]

# Names of places beside the repository that earlier versions read, and the setting that pointed there. Built
# from parts, so that this file does not itself name them.
_BESIDE = "sha" + "red"
OUTSIDE_NAMES = re.compile(
    rf"{_BESIDE}/(data|papers|hooks)\b|{_BESIDE}/ARCHITECTURE|TESSERA_{_BESIDE.upper()}_DATA|/wo" r"rk/"
    rf"|[/\"']\s*[\"']{_BESIDE}[\"']\s*/"
)
# A relative path that climbs: `../x`, possibly several levels.
CLIMBING_PATH = re.compile(r"(?<![\w.])((?:\.\./)+)([\w.-]+)")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = []
    for name in listed.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file() or path.suffix in {".png", ".onnx", ".ico", ".woff2", ".woff", ".gz"}:
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        files.append(path)
    return files


def _escapes_repo(base: Path, climb: str, first: str) -> bool:
    """Whether `climb + first`, read from `base` (a folder inside the repository), leaves it."""
    target = (base / climb / first).resolve()
    return REPO != target and REPO not in target.parents


def test_no_tracked_file_names_a_path_outside_the_repository():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    offenders = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if OUTSIDE_NAMES.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
                continue
            for climb, first in CLIMBING_PATH.findall(line):
                # Read relative to the file's folder (links, includes) and to the repository root (commands
                # run there); either way it must stay inside.
                if _escapes_repo(path.parent, climb, first) and _escapes_repo(REPO, climb, first):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
                    break
    assert not offenders, "tracked files name paths outside the repository:\n" + "\n".join(offenders)


def test_reference_data_is_bundled_by_default(monkeypatch):
    monkeypatch.delenv("TESSERA_REFERENCE_DATA", raising=False)
    assert reference_data_dir() == BUNDLED_REFERENCE_DATA
    assert REPO in BUNDLED_REFERENCE_DATA.resolve().parents


def test_reference_data_setting_points_elsewhere_or_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_REFERENCE_DATA", str(tmp_path))
    assert reference_data_dir() == tmp_path
    monkeypatch.setenv("TESSERA_REFERENCE_DATA", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="TESSERA_REFERENCE_DATA"):
        reference_data_dir()


def test_bundled_gpulet_data_matches_its_published_checksums():
    """The README beside the data lists the SHA-256 of each file as published: the copy is unchanged."""
    readme = (BUNDLED_REFERENCE_DATA / "README.md").read_text()
    listed = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+\.csv)$", readme, re.M))
    assert set(listed) == {"inference.csv", "interference.csv", "mem_util.csv"}
    for name, digest in listed.items():
        assert hashlib.sha256((BUNDLED_REFERENCE_DATA / "gpulet" / name).read_bytes()).hexdigest() == digest, name


def test_bundled_reference_data_reads_as_its_readme_says():
    inference = gpulet_inference_read()
    assert len(inference) == 420
    assert {p.model for p in inference} == {
        "vgg16", "vgg19", "resnet50", "resnet101", "resnet152", "densenet121", "densenet169", "densenet201",
        "inception", "mobilenet",
    }
    assert {p.partition_pct for p in inference} == {20, 40, 50, 60, 80, 100}
    # resnet101 alone on the whole GPU at batch 1: 0.0091133 s in the file, 9.11 ms per batch once read.
    point = next(p for p in inference if (p.model, p.batch, p.partition_pct) == ("resnet101", 1, 100))
    assert point.latency_ms == pytest.approx(9.1133, abs=1e-4)
    assert len(gpulet_interference_read()) == 3675
    assert len(gpulet_mem_util_read()) == 455
    recorded = proteus_recorded_figures(BUNDLED_REFERENCE_DATA / "proteus" / "recorded_figures.csv")
    assert {(r.scenario, r.system) for r in recorded} >= {("zipf", "proteus"), ("bursty", "proteus"), ("mnl", "proteus")}
    assert len(recorded) == 15
