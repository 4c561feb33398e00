"""A pool of Chromium processes, each hosting a few browser contexts (one per episode).

The pool starts ``chromium-headless-shell`` itself, each in its own process
group with a throw-away profile directory, and drives it through Playwright over
CDP. Owning the processes is what makes the guarantees possible:

- ``async with pool.context() as lease``: a fresh context (cookies and storage
  of one episode only) on the least-loaded healthy browser; waits when every
  browser is full.
- A watchdog checks each browser every ``health_interval_s``; one that exited,
  or does not answer a CDP call in time, is killed with its whole process group
  and replaced. Leases on it see ``lease.browser_lost`` set and their Playwright
  calls fail: the environment ends those episodes as ``infra_error``.
- A browser is recycled (drained, closed, replaced) after ``recycle_after``
  contexts, which bounds the memory a long run can leak.
- ``close()`` kills every process group it started: no chromium of ours is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, BrowserContext, Playwright, async_playwright

from rollout.env.devtools import DevTools
from rollout.env.frames import BEGIN_FRAME_ARGS, FrameClock
from shared.lifeline import wait_group_gone

DEFAULT_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)


class BrowserLost(RuntimeError):
    """The browser under a lease crashed or stopped answering (an infrastructure error)."""


@dataclass(frozen=True)
class PoolConfig:
    browsers: int = 2  # browser processes
    contexts_per_browser: int = 8  # leases one browser hosts at once
    recycle_after: int = 200  # contexts a browser serves before it is replaced
    executable: str = "/usr/bin/chromium-headless-shell"
    args: tuple[str, ...] = DEFAULT_ARGS
    launch_timeout_s: float = 30.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 5.0
    # Consecutive unanswered checks before a live browser counts as hung: on a starved
    # machine one slow answer is not a hang (a process that exits is lost at once).
    health_failures: int = 3
    close_timeout_s: float = 5.0
    # Who draws the pages' frames: "environment", each lease's FrameClock
    # (rollout.env.frames: screenshots drawn on demand, ~2x faster); "chromium", its own
    # 60 Hz clock
    frame_clock: str = "environment"

    def __post_init__(self):
        if self.frame_clock not in ("chromium", "environment"):
            raise ValueError(
                f"frame_clock must be 'chromium' or 'environment', not {self.frame_clock!r}"
            )


@dataclass(eq=False)
class _Browser:
    id: int
    proc: asyncio.subprocess.Process
    profile: Path
    browser: Browser | None = None
    active: int = 0
    served: int = 0
    draining: bool = False
    lost: bool = False
    failed_checks: int = 0
    leases: set[Lease] = field(default_factory=set)
    port: int = 0  # its DevTools port on loopback
    frame_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one frame at a time

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(eq=False)
class Lease:
    """One episode's browser context; ``browser_lost`` turns true if its browser dies."""

    context: BrowserContext
    browser_id: int
    pid: int
    browser_lost: bool = False
    recorder: Any = None  # the archive's recorder of this context's traffic, when recording
    replayer: Any = None  # the archive answering this context's requests, when replaying
    devtools_port: int = 0  # the browser's DevTools port on loopback
    frames: FrameClock | None = None  # who draws its pages' frames, if not Chromium's clock
    _devtools: DevTools | None = None
    _devtools_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def devtools(self) -> DevTools:
        """The browser's DevTools on an uncompressed channel of this lease's own
        (``rollout.env.devtools``: what screenshots go through), opened on first use and
        closed with the lease."""
        async with self._devtools_lock:
            if self._devtools is None or self._devtools.closed:
                self._devtools = await DevTools.connect(self.devtools_port)
            return self._devtools

    async def close_devtools(self) -> None:
        """Close the channel; one being opened meanwhile (a frame clock's tick asking for
        it) is closed once open, so no channel outlives this call."""
        async with self._devtools_lock:
            dt, self._devtools = self._devtools, None
            if dt is not None:
                await dt.close()


class BrowserPool:
    def __init__(self, config: PoolConfig = PoolConfig()):
        self.config = config
        self._pw: Playwright | None = None
        self._browsers: list[_Browser] = []
        self._cond = asyncio.Condition()
        self._next_id = 0
        self._watchdog: asyncio.Task | None = None
        self._launch_lock = asyncio.Lock()
        self._closed = False
        self.stats = {"launched": 0, "recycled": 0, "lost": 0, "leases": 0}
        self.egress = None  # the egress proxy its browsers go out through, when one is set
        self.net = None  # what its episodes share to reach the web (rollout.net.core), when set

    async def __aenter__(self) -> BrowserPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if not Path(self.config.executable).exists():
            raise FileNotFoundError(
                f"{self.config.executable} not found: install chromium-headless-shell "
                "(`make setup` does)"
            )
        self._pw = await async_playwright().start()
        try:
            await asyncio.gather(*(self._launch() for _ in range(self.config.browsers)))
        except BaseException:
            await self.close()
            raise
        self._watchdog = asyncio.create_task(self._watch(), name="browser-pool-watchdog")

    @property
    def pids(self) -> list[int]:
        """Process ids of the live browsers (their process groups are ours)."""
        return [b.pid for b in self._browsers]

    @property
    def live_browsers(self) -> int:
        return sum(1 for b in self._browsers if not b.lost)

    # ------------------------------------------------------------------ leases

    @contextlib.asynccontextmanager
    async def context(self, **context_options: object) -> AsyncIterator[Lease]:
        b = await self._acquire()
        lease: Lease | None = None
        try:
            try:
                ctx = await asyncio.wait_for(
                    b.browser.new_context(**context_options), self.config.health_timeout_s
                )
            except Exception as e:
                await self._lose(b, f"new_context failed: {e}")
                raise BrowserLost(f"browser {b.id} failed to open a context: {e}") from e
            lease = Lease(ctx, b.id, b.pid, b.lost, devtools_port=b.port)
            b.leases.add(lease)
            if self.config.frame_clock == "environment":
                lease.frames = FrameClock(ctx, lease.devtools, lock=b.frame_lock)
                await lease.frames.start()
            self.stats["leases"] += 1
            yield lease
        finally:
            if lease is not None:
                b.leases.discard(lease)
                if lease.frames is not None:
                    await lease.frames.close()
                await lease.close_devtools()
                if not b.lost:
                    try:
                        await asyncio.wait_for(lease.context.close(), self.config.close_timeout_s)
                    except Exception as e:  # a context that will not close: the browser is sick
                        await self._lose(b, f"context close failed: {e}")
            await self._release(b)

    async def _acquire(self) -> _Browser:
        async with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the browser pool is closed")
                ready = [
                    b
                    for b in self._browsers
                    if b.browser is not None
                    and not (b.lost or b.draining)
                    and b.active < self.config.contexts_per_browser
                ]
                if ready:
                    b = min(ready, key=lambda x: (x.active, x.id))
                    b.active += 1
                    b.served += 1
                    if b.served >= self.config.recycle_after:
                        b.draining = True
                    return b
                await self._cond.wait()

    async def _release(self, b: _Browser) -> None:
        async with self._cond:
            b.active -= 1
            retire = b.draining and b.active == 0 and not b.lost
        if retire:
            self.stats["recycled"] += 1
            await self._retire(b)
            await self._top_up()
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ processes

    async def _top_up(self) -> None:
        """Launch browsers until the pool has its configured number (one launcher at a time)."""
        async with self._launch_lock:
            while not self._closed and len(self._browsers) < self.config.browsers:
                try:
                    await self._launch()
                except Exception:  # the watchdog tries again on its next round
                    return

    async def _launch(self) -> None:
        cfg = self.config
        profile = Path(tempfile.mkdtemp(prefix="drh-chromium-"))
        proc = await asyncio.create_subprocess_exec(
            cfg.executable,
            *cfg.args,
            *(BEGIN_FRAME_ARGS if cfg.frame_clock == "environment" else ()),
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its own process group: killed as a whole
        )
        self._next_id += 1
        b = _Browser(self._next_id, proc, profile)
        self._browsers.append(b)
        try:
            port = b.port = await self._devtools_port(b)
            b.browser = await asyncio.wait_for(
                self._pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}"),
                cfg.launch_timeout_s,
            )
        except Exception:
            await self._retire(b)
            raise
        self.stats["launched"] += 1
        async with self._cond:
            self._cond.notify_all()

    async def _devtools_port(self, b: _Browser) -> int:
        """Chromium writes the port it chose to <profile>/DevToolsActivePort."""
        deadline = time.monotonic() + self.config.launch_timeout_s
        f = b.profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if b.proc.returncode is not None:
                raise RuntimeError(f"chromium exited at start with code {b.proc.returncode}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(f.read_text().split("\n")[0])
            await asyncio.sleep(0.02)
        raise TimeoutError(
            f"chromium did not open its DevTools port in {self.config.launch_timeout_s} s"
        )

    async def _lose(self, b: _Browser, why: str) -> None:
        """Kill a crashed or hung browser, fail its leases, and start a replacement."""
        if b.lost:
            return
        b.lost = True
        self.stats["lost"] += 1
        for lease in b.leases:
            lease.browser_lost = True
        await self._retire(b)
        await self._top_up()
        async with self._cond:
            self._cond.notify_all()

    async def _retire(self, b: _Browser) -> None:
        if b in self._browsers:  # first: the watchdog and _acquire no longer see it
            self._browsers.remove(b)
        if b.browser is not None and not b.lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(b.browser.close(), self.config.close_timeout_s)
        _kill_group(b.proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(b.proc.wait(), self.config.close_timeout_s)
        # the renderers and helpers of its group die a moment after the SIGKILL: close()
        # returns when none is left
        await wait_group_gone(b.proc.pid, self.config.close_timeout_s)
        shutil.rmtree(b.profile, ignore_errors=True)

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.health_interval_s)
            for b in list(self._browsers):
                if b.browser is None or b.lost or b not in self._browsers:
                    continue
                if b.proc.returncode is not None or not b.browser.is_connected():
                    await self._lose(b, "process exited")
                elif await self._answers(b):
                    b.failed_checks = 0
                elif b in self._browsers:
                    b.failed_checks += 1
                    if b.failed_checks >= self.config.health_failures:
                        await self._lose(b, f"no answer to {b.failed_checks} health checks")
            await self._top_up()

    async def _answers(self, b: _Browser) -> bool:
        try:
            session = await asyncio.wait_for(
                b.browser.new_browser_cdp_session(), self.config.health_timeout_s
            )
            await asyncio.wait_for(session.send("Browser.getVersion"), self.config.health_timeout_s)
            await asyncio.wait_for(session.detach(), self.config.health_timeout_s)
            return True
        except Exception:
            return False

    async def check_now(self) -> None:
        """Run one health check of every browser immediately (for tests and operators)."""
        for b in list(self._browsers):
            if not b.lost and (b.proc.returncode is not None or not await self._answers(b)):
                await self._lose(b, "failed an on-demand check")

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watchdog
        async with self._cond:
            self._cond.notify_all()
        for b in list(self._browsers):
            await self._retire(b)
        if self._pw is not None:
            with contextlib.suppress(Exception):
                await self._pw.stop()
            self._pw = None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
