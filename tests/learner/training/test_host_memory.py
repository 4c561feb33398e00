"""learner.training.host_memory: freed host memory stays in the process, so XLA:CPU's large
per-run buffers are not faulted in afresh on every run (one process per case: the
allocator is set once, before JAX's threads exist)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learner.training import host_memory

REPO = Path(__file__).resolve().parents[3]

# A jitted program with a ~256 MB temporary buffer (and output above glibc's largest
# mmap threshold), run `runs` times after a warm-up; `faults`: each run's minor faults.
FAULTS = r"""
import jax, jax.numpy as jnp, resource

@jax.jit
def f(x):
    y = jnp.exp(x) @ jnp.ones((256, 256), jnp.float32)   # (65536, 256) temporaries: 64 MB each
    return (jnp.sin(y) * jnp.cos(x)).sum(0) + (y * y).sum(0) + jnp.tanh(y).sum(0)

x = jnp.ones((65536, 256), jnp.float32)
f(x).block_until_ready()
faults = []
for _ in range(runs):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
CHILD = (
    r"""
import json
import learner  # sets the allocator before JAX's CPU client starts its threads
from learner.training import host_memory
runs = 16
"""
    + FAULTS
    + r"""
print(json.dumps({"applied": host_memory.applied(), "faults": faults}))
"""
)


def _child(keep: str) -> dict:
    env = {**os.environ, host_memory.ENV: keep, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory._glibc() is None, reason="the setting is glibc's")
def test_later_runs_do_not_fault_their_buffers_in_again():
    kept, default = _child("1"), _child("0")
    assert kept["applied"] is True and default["applied"] is False
    # Without it every run maps its buffers afresh: one fault per 4 KiB page of them
    # (64 MB is 16k pages), and no run is spared. With it the heap still grows now and
    # then (its blocks do not always fit the holes the last run left: measured, 1-10 of 16
    # runs faulted ~50k pages, while 2 cores ran other work), but the other runs reuse its
    # pages: at least a quarter of them is asked for here.
    assert min(default["faults"]) > 16_000, default
    spared = [n for n in kept["faults"] if n < min(default["faults"]) / 10]
    assert len(spared) >= len(kept["faults"]) // 4, (kept, default)


def test_the_setting_is_opt_in_and_made_once(monkeypatch):
    first = host_memory.keep_freed_memory()  # already decided when learner was imported
    assert host_memory.keep_freed_memory() is first and host_memory.applied() is first
    monkeypatch.setattr(host_memory, "_applied", None)
    for off in ("0", "off", ""):
        monkeypatch.setenv(host_memory.ENV, off)
        monkeypatch.setattr(host_memory, "_applied", None)
        assert host_memory.keep_freed_memory() is False and not host_memory.applied()
    monkeypatch.delenv(host_memory.ENV)
    monkeypatch.setattr(host_memory, "_applied", None)
    assert host_memory.keep_freed_memory() is False  # off unless asked for


# ----------------------------------------------------------------------------- huge pages

TUNABLE = host_memory.HUGE_PAGES_TUNABLE
HUGE_OK = (
    host_memory.glibc_version() is not None
    and host_memory.glibc_version() >= (2, 35)
    and host_memory.thp_mode() in ("always", "madvise")
)


def test_huge_pages_env_adds_the_tunable_only_where_it_should():
    env = host_memory.huge_pages_env
    ok = dict(glibc=(2, 36), thp="madvise")
    on = {host_memory.HUGE_PAGES_ENV: "1"}
    assert env({"A": "1", **on}, **ok) == {"A": "1", **on, "GLIBC_TUNABLES": TUNABLE}
    assert env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1", **on}, **ok) == {
        **on,
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=1:{TUNABLE}",
    }  # the caller's tunables kept, first
    assert env({**on}, glibc=(2, 35), thp="always") == {**on, "GLIBC_TUNABLES": TUNABLE}
    assert env({host_memory.HUGE_PAGES_ENV: " Yes "}, **ok) is not None
    for environ in (
        {},  # opt-in
        {host_memory.HUGE_PAGES_ENV: "0"},
        {host_memory.HUGE_PAGES_ENV: "off"},
        {"GLIBC_TUNABLES": TUNABLE, **on},  # already there: no restart loop
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0", **on},  # the caller's own value stands
    ):
        assert env(environ, **ok) is None, environ
    assert env(on, glibc=(2, 34), thp="madvise") is None  # the tunable is glibc 2.35's
    assert env(on, glibc=None, thp="madvise") is None  # not glibc
    assert env(on, glibc=(2, 36), thp="never") is None
    assert env(on, glibc=(2, 36), thp=None) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert host_memory.thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert host_memory.thp_mode(f) == "always"
    assert host_memory.thp_mode(tmp_path / "absent") is None


# Restarts itself, then maps a 256 MB buffer and runs a jitted program with ~64 MB
# temporaries as CHILD does: its pid and tunables at each start, the buffer's huge pages
# (/proc/self/smaps) and the page faults of the program's later runs.
RESTARTING = (
    r"""
import json, os, sys
print(json.dumps({"start": os.getpid(), "tunables": os.environ.get("GLIBC_TUNABLES")}), flush=True)
from learner.training.host_memory import restart_with_huge_pages
restart_with_huge_pages()
import numpy as np
a = np.ones(64 << 20, np.float32)
addr, inside, huge = a.ctypes.data, False, None
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= addr < hi
    elif inside and head == "AnonHugePages:":
        huge = int(line.split()[1])
runs = 6
"""
    + FAULTS
    + r"""
print(json.dumps({"pid": os.getpid(), "huge_kib": huge, "faults": faults}))
"""
)


def _without_huge_pages() -> dict[str, str]:
    """This environment without the tunables and the huge-pages switch."""
    drop = ("GLIBC_TUNABLES", host_memory.HUGE_PAGES_ENV)
    return {k: v for k, v in os.environ.items() if k not in drop}


def _restarting(**env) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-c", RESTARTING],
        cwd=REPO,
        env={**_without_huge_pages(), "JAX_PLATFORMS": "cpu", host_memory.ENV: "0", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not HUGE_OK, reason="needs glibc >= 2.35 and transparent huge pages")
def test_a_command_restarts_itself_with_huge_pages_and_its_buffers_get_them():
    *starts, end = _restarting(LEARNER_HUGE_PAGES="1")
    assert [s["start"] for s in starts] == [end["pid"]] * 2  # execve: the same process
    assert starts[0]["tunables"] is None and starts[1]["tunables"] == TUNABLE
    assert end["huge_kib"] > 128 << 10  # most of the 256 MB buffer on 2 MiB pages
    *off_starts, off = _restarting()  # opt-in: no restart
    assert len(off_starts) == 1 and off_starts[0]["tunables"] is None
    if host_memory.thp_mode() == "madvise":  # with "always" both get huge pages
        assert off["huge_kib"] == 0
        # 4 KiB faults on every run without it (64 MB temporaries: 16k pages each)
        assert min(off["faults"]) > 16_000 and max(end["faults"]) < min(off["faults"]) / 10
    # The caller's own value of the tunable stands: no restart.
    (only, _) = _restarting(LEARNER_HUGE_PAGES="1", GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
    assert only["tunables"] == "glibc.malloc.hugetlb=0"


@pytest.mark.skipif(not HUGE_OK, reason="needs glibc >= 2.35 and transparent huge pages")
@pytest.mark.parametrize(
    "command", ["learner.train", "learner.serve", "learner.sft", "learner.base"]
)
def test_the_commands_restart_before_jax_is_imported(command):
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", command, "--help"],
        cwd=REPO,
        env={**_without_huge_pages(), "JAX_PLATFORMS": "cpu", host_memory.HUGE_PAGES_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    lives = [i for i, name in enumerate(imported) if name == "encodings"]  # each start's first
    assert len(lives) == 2, "the command did not start again"
    first = imported[lives[0] : lives[1]]
    assert "learner.training.host_memory" in first and "jax" not in first
