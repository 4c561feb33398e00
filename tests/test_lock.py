"""The Python dependency lock: every package pinned and hashed, the train lock free of
the test-only packages, consistent with the test lock, and installed exactly."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"


def pins(name: str) -> dict[str, str]:
    """{package: version} of a lock file; every pin carries at least one sha256 hash."""
    text = (LOCKS / name).read_text()
    out = {}
    for block in re.split(r"\n(?=[^\s#])", text):
        m = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if not m:
            continue
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{name}: {m[1]} has no hash"
        out[canonicalize_name(m[1])] = m[2]
    return out


def test_every_dependency_is_pinned_with_hashes_and_the_locks_agree():
    train, test, torch = pins("train.txt"), pins("test.txt"), pins("torch.txt")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dep.name)
        assert name in train and name in test, name
        assert dep.specifier.contains(train[name], prereleases=True), (name, train[name])
    extras = project["optional-dependencies"]
    for extra in ("dev", "hftest", "trackers"):
        for dep in map(Requirement, extras[extra]):
            name = canonicalize_name(dep.name)
            assert name in test or name in torch, (extra, name)
            assert name not in train, f"{name} ({extra}) is in the train lock"
    assert list(torch) == ["torch"] and torch["torch"].endswith("+cpu")
    assert "torch" not in test
    for name, version in train.items():  # make test installs test.txt over train.txt
        assert test.get(name, version) == version, (name, version, test[name])


def test_the_environment_has_exactly_the_locked_versions():
    locked = {**pins("train.txt"), **pins("test.txt"), **pins("torch.txt")}
    wrong = {}
    for name, version in locked.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if have != version:
            wrong[name] = (version, have)
    assert not wrong, f"installed versions differ from the lock (make setup-test): {wrong}"


def test_building_the_project_prints_no_deprecation(tmp_path):
    """``make setup`` installs the project (``pip install -e .``): its metadata is what
    setuptools expects today (an SPDX ``license`` string, not the deprecated table that
    printed a warning box per build step)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
         str(ROOT), "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stdout + out.stderr
    assert list(tmp_path.glob("deep_research_harness-*.whl")), log[-3000:]
    assert "deprecat" not in log.lower(), log[-3000:]
