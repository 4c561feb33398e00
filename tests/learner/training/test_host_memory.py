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
# mmap threshold), run a few times; the minor page faults of the later runs are counted.
CHILD = r"""
import json, resource, sys
import learner  # sets the allocator before JAX's CPU client starts its threads
import jax, jax.numpy as jnp
from learner.training import host_memory

@jax.jit
def f(x):
    y = jnp.exp(x) @ jnp.ones((256, 256), jnp.float32)   # (65536, 256) temporaries: 64 MB each
    return (jnp.sin(y) * jnp.cos(x)).sum(0) + (y * y).sum(0) + jnp.tanh(y).sum(0)

x = jnp.ones((65536, 256), jnp.float32)
f(x).block_until_ready()
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": host_memory.applied(), "faults": faults}))
"""


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
