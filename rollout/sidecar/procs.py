"""Child servers on loopback: start one, read the URL it announces, stop it and its group.

Every server of the project prints ``serving on http://HOST:PORT`` once it
listens; parents start children with ``--port 0`` and read that line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from shared.lifeline import group_pids, wait_group_gone

__all__ = ["Child", "ChildFailed", "group_pids", "start_child", "wait_group_gone", "web_for"]

READY = "serving on "
REPO = Path(__file__).resolve().parents[2]


class ChildFailed(RuntimeError):
    pass


class Child:
    def __init__(self, proc: asyncio.subprocess.Process, url: str, name: str):
        self.proc, self.url, self.name = proc, url, name

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM its process group, then SIGKILL if it lingers: nothing is left behind."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # stray grandchildren, if any
            os.killpg(self.proc.pid, signal.SIGKILL)
        await wait_group_gone(self.proc.pid, timeout)


async def start_child(
    module_args: list[str], name: str, *, timeout: float = 240.0, log: Path | None = None
) -> Child:
    """``python -m <module_args>`` in its own process group; returns once it is serving."""
    stderr = open(log, "ab") if log is not None else asyncio.subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", *module_args,
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True,
        )  # fmt: skip
    finally:
        if log is not None:
            stderr.close()
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            if not line:
                raise ChildFailed(f"{name} exited with code {await proc.wait()} before serving")
            text = line.decode(errors="replace").strip()
            if text.startswith(READY):
                return Child(proc, text[len(READY) :], name)
    except (TimeoutError, ChildFailed):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


async def web_for(cache_dir: str, url: str | None) -> tuple[str, Child | None]:
    """The local web's URL: ``url`` when it names a running one, else a child started here
    (the caller stops it)."""
    if url is not None:
        return url, None
    child = await start_child(
        ["rollout.web", "--port", "0", "--set", f"web.cache_dir={cache_dir}"], "web"
    )
    return child.url, child
