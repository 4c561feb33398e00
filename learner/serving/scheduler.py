"""Dynamic batching: requests that arrive within a few milliseconds share one batch.

The scheduler owns the engine's single worker thread. It waits for a request,
keeps collecting for ``wait_ms`` (or until ``max_batch`` are queued), and runs
them as one padded batch; requests arriving meanwhile form the next batch.
Weight updates run on the same thread, so they never overlap a batch. Pausing
stops new batches from starting; the running batch is aborted (``mode="abort"``)
or held between decode chunks (``"in_place"``/``"retract"``) until continued. A
weight update while held in place takes effect from the next chunk: the held
sequences continue with the new weights, as SGLang's in-place pause allows.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from learner.serving.engine import Engine, Request

T = TypeVar("T")
ABORTED = {"type": "abort", "message": "aborted"}


class Scheduler:
    """Queues requests and feeds batches to the engine on one worker thread."""

    def __init__(self, engine: Engine, *, max_batch: int = 64, wait_ms: float = 5.0) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.wait_s = wait_ms / 1000
        self.queue: deque[tuple[Request, asyncio.Future]] = deque()
        self.running: list[Request] = []
        self.paused = False
        self.held_in_place = False  # paused with the running batch parked between chunks
        self.batches = 0  # batches run so far (for tests and metrics)
        self._wake = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.abort(None)
        self.engine.resume.set()
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def submit(self, reqs: list[Request]) -> None:
        """Queue requests and wait until all are finished (or aborted)."""
        loop = asyncio.get_running_loop()
        futures = []
        for r in reqs:
            fut = loop.create_future()
            self.queue.append((r, fut))
            futures.append(fut)
        self._wake.set()
        await asyncio.gather(*futures)

    async def run_exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the engine thread, between batches."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------------- control

    def abort(self, rid: str | None) -> int:
        """Abort the request ``rid`` (every request when None), queued or running."""
        n = 0
        for r in self.running:
            if (rid is None or r.rid == rid) and r.finish_reason is None:
                r.aborted = True
                n += 1
        kept: deque[tuple[Request, asyncio.Future]] = deque()
        for r, fut in self.queue:
            if rid is None or r.rid == rid:
                r.finish_reason = dict(ABORTED)
                if not fut.done():
                    fut.set_result(None)
                n += 1
            else:
                kept.append((r, fut))
        self.queue = kept
        return n

    def pause(self, mode: str = "abort") -> int:
        """Hold new batches; ``abort`` also ends every queued and running request (how many)."""
        self.paused = True
        self._unpaused.clear()
        if mode == "abort":
            return self.abort(None)
        self.held_in_place = True
        self.engine.resume.clear()
        return 0

    def resume(self) -> None:
        self.paused = self.held_in_place = False
        self._unpaused.set()
        self.engine.resume.set()
        self._wake.set()

    # ------------------------------------------------------------------------- the loop

    async def _loop(self) -> None:
        while True:
            await self._unpaused.wait()
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = time.monotonic() + self.wait_s
            while len(self.queue) < self.max_batch and time.monotonic() < deadline:
                await asyncio.sleep(min(0.001, self.wait_s))
            if self.paused:
                continue
            batch = [self.queue.popleft() for _ in range(min(self.max_batch, len(self.queue)))]
            await self._run(batch)

    async def _run(self, batch: list[tuple[Request, asyncio.Future]]) -> None:
        reqs = [r for r, _ in batch]
        self.running = reqs
        try:
            await self.run_exclusive(self.engine.generate, reqs)
            self.batches += 1
        except Exception as e:  # a failed batch fails its requests, not the server
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        finally:
            self.running = []
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)
