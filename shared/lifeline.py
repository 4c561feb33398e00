"""A child that ends with the process that started it.

``learner.train`` starts the web, the inference server and the sidecars as
children in process groups of their own (``learner.embedded.children.Children``) and
stops them on its way out, however it ends, except one way: a SIGKILL (or an
out-of-memory kill) gives it no way out, and its children would run on. So
``Children`` names itself in the child's environment (:data:`ENV`), and the
child's entry point calls :func:`watch_parent`: a daemon thread that sees the
parent gone (the child re-parented) and stops the child's whole process group
as ``Children.stop`` would, SIGTERM and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

ENV = "DRH_PARENT_PID"  # set by learner.embedded.children.Children for its children only


def watch_parent(every_s: float = 1.0, grace_s: float = 10.0) -> bool:
    """Start the watch if this process was started by ``Children`` (``ENV`` names its
    parent); whether it started. The variable is removed, so this process's own
    children do not take its parent for theirs."""
    value = os.environ.pop(ENV, None)
    if not value or not value.isdigit() or os.getppid() != int(value):
        return False  # not started by Children, or its parent is already gone
    parent = int(value)
    leader = os.getpgrp() == os.getpid()  # its own group (start_new_session): stop it all

    def stop(sig: int) -> None:
        if leader:
            os.killpg(os.getpgrp(), sig)
        else:
            os.kill(os.getpid(), sig)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        stop(signal.SIGTERM)
        time.sleep(grace_s)
        stop(signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return True


def group_pids(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of a process group: what a stopped child or a
    closed browser pool must leave empty."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


async def wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until a killed process group has no live member. SIGKILL is delivered at once,
    but each process takes a moment to tear down (and ones whose parent died are reaped
    by init), so a ``killpg`` alone does not mean the group is gone when it returns.
    False if members are still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while group_pids(pgid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
    return True
