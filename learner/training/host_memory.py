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

Huge pages are the other remedy, also opt-in (``LEARNER_HUGE_PAGES=1``): with
``glibc.malloc.hugetlb=1`` in ``GLIBC_TUNABLES`` (glibc 2.35 or later) glibc asks the
kernel for transparent huge pages on every block it maps (``madvise``), so a fresh
1.3 GB temporary buffer costs some 650 faults of 2 MiB instead of 330,000 of 4 KiB,
and memory is handed back as before (the peak resident memory does not grow). A
tunable is read when the process starts, so :func:`restart_with_huge_pages` starts the
command again (``execve``: the same process, arguments and descriptors) with it added,
before JAX is imported; ``python -m learner.train``, ``learner.serve``, ``learner.sft``
and ``learner.base`` call it, and their children inherit it. It does nothing where the
kernel's transparent huge pages are ``never``, glibc is older or absent, or
``GLIBC_TUNABLES`` already names ``glibc.malloc.hugetlb``. Measured side by side by
``bench/host_memory.py``: 97% fewer page faults, but more kernel time zeroing whole
2 MiB pages, and step times from 6% slower to 12% faster over three runs on 2 cores,
within this machine's spread; hence opt-in (docs: results, learner).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

ENV = "LEARNER_KEEP_FREED_MEMORY"
HUGE_PAGES_ENV = "LEARNER_HUGE_PAGES"
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
ON = ("1", "true", "yes", "on")
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
        if os.environ.get(ENV, "0").strip().lower() not in ON:
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


# ---------------------------------------------------------------------------- huge pages


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None."""
    libc = _glibc()
    if libc is None:
        return None
    major, minor, *_ = [*libc.gnu_get_libc_version().decode().split("."), "0"]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), the
    bracketed word of ``path``; None where there is no such file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def huge_pages_wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``LEARNER_HUGE_PAGES`` asks for huge pages (off unless it says 1/true/yes/on)."""
    return environ.get(HUGE_PAGES_ENV, "0").strip().lower() in ON


def huge_pages_env(
    environ: Mapping[str, str],
    *,
    glibc: tuple[int, int] | str | None = "detect",
    thp: str | None = "detect",
) -> dict[str, str] | None:
    """``environ`` with :data:`HUGE_PAGES_TUNABLE` added to ``GLIBC_TUNABLES`` (after any
    tunables already there), or None when it should not be: not asked for
    (:func:`huge_pages_wanted`), ``glibc.malloc.hugetlb`` already set (to any value: the
    caller's choice stands), glibc older than 2.35 or absent, or transparent huge
    pages ``never`` (or unknown). ``glibc`` and ``thp`` default to this machine's."""
    if not huge_pages_wanted(environ):
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in tunables:
        return None
    glibc = glibc_version() if glibc == "detect" else glibc
    if glibc is None or glibc < (2, 35):
        return None
    thp = thp_mode() if thp == "detect" else thp
    if thp not in ("always", "madvise"):
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
    return env


def restart_with_huge_pages() -> None:
    """Start this command again with :func:`huge_pages_env`'s environment, when it gives
    one: ``execve`` of the same interpreter with the same arguments (``sys.orig_argv``),
    so the process id, open descriptors and signal handling by a parent stay. Call it
    first in a command's ``__main__``, before JAX is imported; nothing happens for a
    program read from standard input, or when the environment needs no change."""
    env = huge_pages_env(os.environ)
    argv = list(getattr(sys, "orig_argv", []))
    if env is None or len(argv) < 2 or sys.argv[0] in ("", "-"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
