"""The local web's build cache: old builds are pruned, the current one and the one
before it kept, a killed writer's temporary file removed once stale."""

from __future__ import annotations

import os
import time

import pytest

from rollout.web import build as web_build


def _touch(path, age_s: float) -> None:
    path.write_bytes(b"x")
    t = time.time() - age_s
    os.utime(path, (t, t))


def test_prune_keeps_the_newest_builds_and_the_current_one(tmp_path):
    for name, age in [("web-a.pkl", 10), ("web-b.pkl", 20), ("web-c.pkl", 30), ("web-d.pkl", 40)]:
        _touch(tmp_path / name, age)
    _touch(tmp_path / "web-a.tmp123", 2 * web_build.STALE_TMP_S)  # a killed writer's
    _touch(tmp_path / "web-b.tmp456", 5)  # a writer at work
    _touch(tmp_path / "notes.txt", 1000)  # not the cache's
    # the current build is kept even when it is not among the newest by time
    removed = web_build.prune(tmp_path, keep=2, current=tmp_path / "web-d.pkl")
    assert sorted(p.name for p in removed) == ["web-a.tmp123", "web-b.pkl", "web-c.pkl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt",
        "web-a.pkl",
        "web-b.tmp456",
        "web-d.pkl",
    ]
    assert web_build.prune(tmp_path, keep=2, current=tmp_path / "web-d.pkl") == []
    # no current build named: the newest ones stay
    assert [p.name for p in web_build.prune(tmp_path, keep=1)] == ["web-d.pkl"]


def test_load_writes_a_new_build_and_prunes_the_old_ones(tmp_path, monkeypatch):
    built: list[str] = []

    def fake_build(world=None, key=""):
        built.append(key)
        return web_build.LocalWeb(None, None, {}, None, [], key)

    monkeypatch.setattr(web_build, "build", fake_build)
    monkeypatch.setattr(web_build, "cache_key", lambda: "new")
    _touch(tmp_path / "web-old1.pkl", 100)
    _touch(tmp_path / "web-old2.pkl", 200)
    web = web_build.load(tmp_path)
    assert web.key == "new" and built == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["web-new.pkl", "web-old1.pkl"]
    # the next start reads the cached build: nothing is built
    monkeypatch.setattr(web_build, "build", lambda *a, **k: pytest.fail("rebuilt"))
    assert web_build.load(tmp_path).key == "new"
