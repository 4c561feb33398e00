"""Host memory for XLA:CPU: keep freed memory in the process instead of handing it back.

XLA:CPU allocates each run of a compiled program's temporary buffer afresh (1.9 GB
for the GRPO step on Tunix's example shape, README, "Benchmarks") and many
outputs above glibc's mmap threshold (32 MB at most). glibc serves such requests
with a fresh ``mmap`` and unmaps them on free, so every run touches every page
of them again for the first time: one minor page fault per 4 KiB page, the kernel
zeroing each. Measured on 2 cores: a (24576 x 128) @ (128 x 384) matmul ran at 120
GFLOP/s with the default allocator and 283 GFLOP/s with freed memory kept; the GRPO
step on that shape, its blocks unrolled, 2.13 -> 1.80 s.

:func:`keep_freed_memory` sets glibc's allocator (``mallopt``) so that large
blocks come from the heap and freed memory stays there for the next run: one arena
for every thread (a thread's own arena serves a block larger than 64 MB with
``mmap`` whatever the settings), no ``mmap`` for blocks, no trimming of the heap's
top. It must run before the threads that allocate exist (JAX's CPU client starts
them when the first device is asked for): ``import learner`` calls it, so a program
that imports ``learner`` before it first touches a JAX device gets it.

It is off unless ``LEARNER_KEEP_FREED_MEMORY=1`` is in the environment, because it
is not a win everywhere. The heap still grows now and then, mostly over a program's
first runs (its blocks do not always fit the holes the last run left: a program with
a 256 MB buffer faulted its pages in on 1-10 of 16 runs instead of all 16,
tests/learner/training/test_host_memory.py), and it keeps its high-water mark. On the GRPO
step of Tunix's example shape (4 blocks, 128 rows x 192 tokens) it took 2.17 -> 1.94 s
a step; but on ``bench/learner.py``'s 48M config
(10 blocks, scanned) the step ran at 0.38-0.49 of the matmul peak against 0.53-0.55
without it, with the process's peak resident memory 7.2-12.6 GB against 4.4 GB, and
generation with ``learner.serving.engine`` ran ~6% slower (one arena shared by its threads).
The same as starting the process with
``GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=<huge>``.
Where the C library is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

ENV = "LEARNER_KEEP_FREED_MEMORY"
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

_lock = threading.Lock()
_applied: bool | None = None


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):
        return None  # not glibc (musl has no gnu_get_libc_version)
    return libc


def keep_freed_memory() -> bool:
    """Set the allocator as the module says when the environment asks for it, once per
    process; True when it is set.

    ``mallopt``'s value is a C int: a trim threshold of -1 is read by glibc as the
    largest size_t (never trim), where any positive int would cap it at 2 GiB and
    let a larger temporary buffer be unmapped and faulted in again every run."""
    global _applied
    with _lock:
        if _applied is not None:
            return _applied
        _applied = False
        if os.environ.get(ENV, "0").strip().lower() not in ("1", "true", "yes", "on"):
            return False
        libc = _glibc()
        if libc is None:
            return False
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
        )
        _applied = ok
        return ok


def applied() -> bool:
    """Whether :func:`keep_freed_memory` has set the allocator in this process."""
    return bool(_applied)
