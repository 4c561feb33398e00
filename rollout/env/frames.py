"""Frames issued by the environment instead of Chromium's 60 Hz clock (env.frame_clock).

Chromium draws a page at its compositor's next frame, and ``Page.captureScreenshot``
hands the view over a frame or two after it is asked: on a 2-core machine ~45-50 ms a
shot whatever is captured, most of it waiting for the clock (a 10 x 10 pixel capture
costs the same as the whole view). With ``--enable-begin-frame-control`` and
``--run-all-compositor-stages-before-draw`` Chromium draws no frame until one is asked
for with ``HeadlessExperimental.beginFrame``, and that call can carry a screenshot of
the frame it draws: a capture is then one frame drawn now (~20 ms on the same machine).

The price is that every frame, not only a screenshot's, must now be issued by someone:
``requestAnimationFrame``, CSS animations, intersection observers and Playwright's own
actionability checks wait for frames. :class:`FrameClock` issues them for every page of
one lease's context, over the lease's DevTools channel (``rollout.env.devtools``):

- ``ACTING_HZ`` (60, Chromium's own rate) while the environment acts on the lease
  (``async with clock.acting():`` around each action and its observation);
- between actions, when no one is expected to read the page, ``IDLE_HZ`` at first and
  ever more rarely after (the wait doubles after each frame, up to ``IDLE_MAX_S``): its
  scripts and network run as ever, its rendering (animation frames, observers,
  animations) advances now and then, so a page the agent has not acted on does not
  change under it much, and a page waiting for the policy's next action costs a frame
  every two seconds instead of sixty a second;
- one at once for a screenshot (:meth:`FrameClock.frame` with ``screenshot``).

One frame at a time per browser (a lock the pool shares among its leases' clocks: two
pages' frames drawn at once crash the GPU process): a screenshot waits at most for the
frame in flight. A page whose main thread runs a script cannot draw until the script
ends, and while its frame waits no other page of the browser may be given one (drawn
then, they crashed the GPU process too): so a frame is asked for only once the page has
answered a trivial script, waited for without the lock (skipped where the caller has just
had an answer from the page: ``answered``). A frame not drawn in ``FRAME_TIMEOUT_S``
(the page's answer, the lock and the frame together) is given up by its caller with
:class:`FrameError` (the lock stays held until the browser answers: a page that began a
script just after it answered, or runs one inside the frame, holds it) and asked for
again at the next tick; a page that closes is dropped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import aiohttp
from playwright.async_api import Error as PlaywrightError

from rollout.env.devtools import DevTools, DevToolsError, page_target_id

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from playwright.async_api import BrowserContext, Page

# the browser's switches for frames issued by the environment (PoolConfig.frame_clock)
BEGIN_FRAME_ARGS = ("--enable-begin-frame-control", "--run-all-compositor-stages-before-draw")
ACTING_HZ = 60.0  # while the environment acts: Chromium's own rate
IDLE_HZ = 4.0  # between actions
IDLE_MAX_S = 2.0  # between actions the wait doubles from 1 / IDLE_HZ up to this
FRAME_TIMEOUT_S = 2.0  # a frame not drawn by then is given up and asked for again
_PROBE = {"expression": "0", "returnByValue": True}  # answered by the page's main thread


T = TypeVar("T")


def _retrieved(f: asyncio.Future) -> None:
    """Marks ``f``'s error as seen: a probe's or a frame's whose caller stopped waiting
    (it has been told), not the event loop's to report."""
    if not f.cancelled():
        f.exception()


class FrameError(Exception):
    """A frame (or its screenshot) the browser did not draw."""


class NoImage(FrameError):
    """A frame drawn without the image asked for (its renderer is new)."""


@dataclass(eq=False)
class _Target:
    session: str
    devtools: DevTools


class FrameClock:
    """The frames of one browser context's pages; see the module's docstring.

    ``await clock.start()``; ``async with clock.acting(): ...``; ``await clock.frame(page,
    screenshot={...})`` gives the PNG/JPEG/WebP bytes of a frame drawn now;
    ``await clock.close()`` stops issuing frames (the context closes after it)."""

    def __init__(
        self,
        context: BrowserContext,
        devtools: Callable[[], Awaitable[DevTools]],
        *,
        acting_hz: float = ACTING_HZ,
        idle_hz: float = IDLE_HZ,
        lock: asyncio.Lock | None = None,
    ):
        self.context, self._devtools = context, devtools
        # Frames of two pages of one browser drawn at once crash its GPU process ("Got
        # overlapping IssueExternalBeginFrame"), and a page's second frame asked for while
        # its first is drawn is refused: the pool gives every clock of a browser its lock
        self._lock = lock if lock is not None else asyncio.Lock()
        self.acting_interval, self.idle_interval = 1.0 / acting_hz, 1.0 / idle_hz
        self._targets: dict[Page, _Target] = {}
        self._attaching = asyncio.Lock()  # pages' sessions are attached one at a time
        self._tasks: dict[Page, asyncio.Task] = {}
        self._acting = 0
        self._quiet = 0
        self._ticking = 0  # the clock's own frames being drawn
        self._still = asyncio.Event()  # set while none is
        self._still.set()
        self._busy = asyncio.Event()  # set while acting: idle waits end at once
        self._closed = False
        self.frames = 0  # frames drawn (every page), for tests and benchmarks

    async def start(self) -> None:
        self.context.on("page", self._track)
        for page in self.context.pages:
            self._track(page)

    @contextlib.asynccontextmanager
    async def acting(self) -> AsyncIterator[None]:
        """Frames at ``ACTING_HZ`` for the duration (nested and concurrent uses count)."""
        self._acting += 1
        self._busy.set()
        try:
            yield
        finally:
            self._acting -= 1
            if self._acting == 0:
                self._busy.clear()

    @contextlib.asynccontextmanager
    async def quiet(self) -> AsyncIterator[None]:
        """No frames but those asked for (:meth:`frame`, :meth:`through`) for the
        duration: an observation reads the page's DOM and layout, which need no frame, and
        its screenshot is then the one frame drawn, not the second in a row. A frame of
        the clock's own begun before is drawn first (at most ``FRAME_TIMEOUT_S``): drawn
        later, it would run the animation frames the observation waits on (a marked
        screenshot's marks taken off before its frame, on a loaded machine)."""
        self._quiet += 1
        try:
            if not self._still.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._still.wait(), FRAME_TIMEOUT_S)
            yield
        finally:
            self._quiet -= 1

    async def through(self, page: Page, waiting: Awaitable[T], within: float | None = None) -> T:
        """``waiting`` (a script waiting for animation frames, say), with ``page``'s
        frames drawn back to back until it is done: two animation frames cost two frames
        drawn, not two ticks of a 60 Hz clock. ``within`` seconds at most: then
        ``waiting`` is cancelled and TimeoutError raised (a deadline of its own, not an
        outer ``wait_for``, whose cancellation a frame answered at that moment may
        swallow on Python 3.11, leaving the loop drawing for ever)."""
        task = asyncio.ensure_future(waiting)
        loop = asyncio.get_running_loop()
        until = None if within is None else loop.time() + within
        try:
            answered = False  # after one frame drawn, the next back to back: no probe
            while not task.done():
                if until is not None and loop.time() >= until:
                    raise TimeoutError(f"not done after {within} s of frames")
                try:
                    await self.frame(page, answered=answered)
                    answered = True
                except FrameError:  # not drawn now: the page's own pace, until it is done
                    answered = False
                    await asyncio.wait({task}, timeout=self.acting_interval)
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def frame(
        self,
        page: Page,
        screenshot: dict | None = None,
        *,
        again: bool = True,
        answered: bool = False,
    ) -> bytes | None:
        """Draw one frame of ``page`` now; with ``screenshot`` (``format``, ``quality``,
        ``optimizeForSpeed``, as ``Page.captureScreenshot`` takes them) the image of that
        frame. Raises :class:`FrameError` when the browser does not draw it.

        A frame drawn while the page's renderer is new (the first frames after a
        navigation to another site, which moves the page to another process) comes back
        without its image: frames are drawn until one has it, for ``FRAME_TIMEOUT_S``;
        with ``again=False`` the image is of the first frame or :class:`NoImage` is
        raised (for a caller whose page changes once that frame is drawn).

        The frame is asked for once the page's main thread has answered a trivial script
        (the module's docstring), unless ``answered``: the caller has just had an answer
        from the page (a call into the page returned a moment ago), which tells the same
        for one round trip less (~1.3 ms on a page being acted on)."""
        params: dict = {"interval": self.acting_interval * 1000}
        if screenshot is None:
            await self._draw(page, params, answered)
            return None
        params["screenshot"] = screenshot
        loop = asyncio.get_running_loop()
        give_up = loop.time() + FRAME_TIMEOUT_S
        while True:
            data = (await self._draw(page, params, answered)).get("screenshotData")
            if data is not None:
                return base64.b64decode(data)
            if not again:
                raise NoImage("the frame was drawn without its image")
            if loop.time() >= give_up:
                raise FrameError(f"no frame with its screenshot drawn in {FRAME_TIMEOUT_S} s")
            await asyncio.sleep(0)  # the browser's other pages may draw in between

    async def _draw(self, page: Page, params: dict, answered: bool = False) -> dict:
        if self._closed:
            raise FrameError("the frame clock is closed")
        loop = asyncio.get_running_loop()
        until = loop.time() + FRAME_TIMEOUT_S
        target = await self._target(page)
        if not answered:
            # a frame of a page whose main thread runs a script is not drawn until the
            # script ends, and no other page of the browser can draw meanwhile: the frame
            # is asked for only once the page has answered (waited for without the lock)
            free = asyncio.ensure_future(
                target.devtools.send("Runtime.evaluate", _PROBE, session=target.session)
            )
            free.add_done_callback(_retrieved)
            await asyncio.wait({free}, timeout=max(0.0, until - loop.time()))
            if not free.done():
                raise FrameError(f"the page was busy in a script for {FRAME_TIMEOUT_S} s")
        await self._acquire(until)  # one frame at a time in the whole browser (__init__)
        try:
            drawn = asyncio.ensure_future(
                target.devtools.send(
                    "HeadlessExperimental.beginFrame", params, session=target.session
                )
            )
        except BaseException:
            self._lock.release()
            raise
        # the lock is the browser's until it answers, even if this call stops waiting
        drawn.add_done_callback(self._answered)
        try:
            r = await asyncio.wait_for(asyncio.shield(drawn), max(0.0, until - loop.time()))
        except TimeoutError:
            raise FrameError(f"no frame drawn in {FRAME_TIMEOUT_S} s") from None
        except DevToolsError as e:
            self._targets.pop(page, None)  # attach again next time
            raise FrameError(f"the frame failed: {e}") from None
        self.frames += 1
        return r

    async def _acquire(self, until: float) -> None:
        """The browser's frame lock, or :class:`FrameError` when it is not free by
        ``until``: a frame asked for just as its page began a long script holds it
        until the script ends."""
        left = until - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(self._lock.acquire(), max(0.0, left))
        except TimeoutError:
            raise FrameError(f"another page's frame was not drawn in {FRAME_TIMEOUT_S} s") from None

    def _answered(self, drawn: asyncio.Future) -> None:
        self._lock.release()
        _retrieved(drawn)

    async def close(self) -> None:
        self._closed = True
        self.context.remove_listener("page", self._track)
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._targets.clear()

    # ------------------------------------------------------------------ internals

    def _track(self, page: Page) -> None:
        if self._closed or page in self._tasks:
            return
        self._tasks[page] = asyncio.create_task(self._tick(page), name="frame-clock")
        page.once("close", lambda p: self._forget(p))

    def _forget(self, page: Page) -> None:
        self._targets.pop(page, None)
        task = self._tasks.pop(page, None)
        if task is not None:
            task.cancel()

    async def _target(self, page: Page) -> _Target:
        target = self._targets.get(page)
        try:
            dt = await self._devtools()
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            raise FrameError(f"cannot open the DevTools channel: {e}") from None
        if target is not None and target.devtools is dt:
            return target
        async with self._attaching:  # a tick's frame and a screenshot's: one session
            target = self._targets.get(page)
            if target is None or target.devtools is not dt:
                try:
                    session = await dt.attach(await page_target_id(self.context, page))
                except (PlaywrightError, DevToolsError) as e:
                    raise FrameError(f"cannot reach the page's target: {e}") from None
                target = self._targets[page] = _Target(session, dt)
        return target

    async def _tick(self, page: Page) -> None:
        """One page's frames, at the acting rate while the environment acts; between
        actions at the idle rate, the wait doubling after each frame up to ``IDLE_MAX_S``
        (Chromium's ``hasDamage`` cannot tell a still page from one that animates: it
        reported none for most frames of a page redrawn every animation frame)."""
        loop = asyncio.get_running_loop()
        idle = self.idle_interval
        while not (self._closed or page.is_closed()):
            began = loop.time()
            if not self._quiet:  # counted from here on, before anything is awaited (quiet)
                self._ticking += 1
                self._still.clear()
                try:
                    with contextlib.suppress(Exception):  # a page that did not draw: next tick
                        await self.frame(page)
                finally:
                    self._ticking -= 1
                    if not self._ticking:
                        self._still.set()
            if self._acting:
                idle = self.idle_interval
                await asyncio.sleep(max(0.0, self.acting_interval - (loop.time() - began)))
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._busy.wait(), idle)
                idle = min(2 * idle, IDLE_MAX_S)
