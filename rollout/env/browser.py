"""The browser modes' backends: a real Chromium page per episode (one context per lease).

``PlaywrightBackend`` (playwright mode) acts with selectors and shows the page's
readable text; ``SomBackend`` (som mode) numbers the interactive elements and
acts on them by number through the ``data-som-id`` attribute the labeler sets.

Every request the page makes leaves the browser through the egress proxy
(``rollout.net.egress``), which forwards only allowed URLs: a link, a redirect or a
script cannot take the agent to a host it could not name itself. A refusal is
reported as the step's error. Dialogs are dismissed and reported, popups
become the current page, and a crashed tab is replaced; only a lost browser is
an infrastructure error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from urllib.parse import urldefrag, urlsplit

import aiohttp
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request
from playwright.async_api import TimeoutError as PlaywrightTimeout

from rollout.agent.actions import (
    Action,
    Back,
    Click,
    ExtractText,
    Fill,
    Forward,
    Goto,
    Observe,
    Screenshot,
    Scroll,
    SomClick,
    SomScroll,
    SomType,
)
from rollout.env.core import ActionTimeout, InfraError, ToolError
from rollout.env.devtools import DevToolsError, page_target_id
from rollout.env.frames import FrameError, NoImage
from rollout.env.observation import Observation, ScreenshotOptions
from rollout.env.pool import Lease
from rollout.env.som_js import (
    LABEL_CALL_JS,
    LABEL_CALL_OVERLAY_JS,
    LABEL_JSON_JS,
    LABEL_JSON_OVERLAY_JS,
    LABELLER_INIT_JS,
    LISTENER_INIT_JS,
    OVERLAY_JS,
    REMOVE_OVERLAY_JS,
    UNMARK_AFTER_FRAME_JS,
    UNMARKED_TEXT_CALL_JS,
    UNMARKED_TEXT_JSON_JS,
    UNWATCH_JS,
    WATCH_JS,
)
from rollout.net.egress import NO_UPSTREAM_HEADER, REFUSED_HEADER
from rollout.net.urls import UrlPolicy, is_allowed

PNG_FAST = ScreenshotOptions()  # the default: env.screenshot_* as declared
SETTLE_S = 0.5  # after an action, wait at most this long for the page's own requests
NAV_START_S = 0.05  # after a click, how long a navigation it caused may take to start
# an observation's page_text (the whole page, for the citation verifier) stops here
PAGE_TEXT_CHARS = 1_000_000
# the labeller's options for that text: from the top, without numbers
_WHOLE_PAGE = {"marks": False, "fromViewport": False, "maxChars": PAGE_TEXT_CHARS, "maxLabels": 0}
# after a frame is drawn, how long its page may take to run its animation frame's task
# before frames are drawn until it has (SomBackend._drawn_shot)
UNMARKED_WAIT_S = 0.5
# the longest wait for a page's animation frames (two take ~33 ms): a page where they
# never come (requestAnimationFrame replaced, say) is read as it is after this
FRAMES_WAIT_S = 1.0
# what Playwright's call log says when an element could not be acted on, in the agent's words
_BLOCKERS = (
    ("intercepts pointer events", "it is covered"),
    ("not visible", "it is not visible"),
    ("not enabled", "it is disabled"),
    ("not editable", "it is not editable"),
    ("not stable", "it keeps moving"),
    ("outside of the viewport", "it lies outside the page"),
)


class PlaywrightBackend:
    mode = "playwright"

    def __init__(
        self,
        lease: Lease,
        policy: UrlPolicy,
        *,
        action_timeout_s: float = 10.0,
        observation_chars: int = 4000,
        observation: str = "text",
        screenshot: ScreenshotOptions = PNG_FAST,
    ):
        self.lease, self.policy = lease, policy
        self.shot_options = screenshot
        self._cdp = None  # (page, DevTools, session id): the screenshots' way to the page
        self.action_timeout_s = action_timeout_s
        self.timeout_ms = max(1000, int(action_timeout_s * 1000) - 500)
        self.observation_chars, self.observation = observation_chars, observation
        self.page: Page | None = None
        self.refused: list[str] = []
        self.no_upstream = False  # the egress had no upstream proxy left for this episode
        self.dialogs: list[str] = []
        self.inflight = 0
        self.navigations = 0  # main-frame navigations committed (same-document ones too)
        self.nav_pending = 0  # main-frame navigation requests not yet committed or failed
        self.frame_pending = 0  # the same in iframes (a form submitted inside one)
        self.frames_moved: list = []  # iframes that navigated, since the action began
        self.scrolled = False  # the last scroll action moved the view
        self._report: str | None = None  # what a history move did, for the observation
        self._problem: str | None = None  # an error shown with the page's text
        self._extracted: str | None = None  # what extract_text read, for the observation

    @property
    def url(self) -> str | None:
        return self.page.url if self.page is not None and self.page.url != "about:blank" else None

    # ------------------------------------------------------------------ setup

    async def start(self, start_url: str) -> Observation:
        ctx = self.lease.context
        await self._guarded(ctx.add_init_script(script=LISTENER_INIT_JS))
        await self._guarded(ctx.add_init_script(script=LABELLER_INIT_JS))
        ctx.on("page", self._adopt)
        self.page = await self._guarded(ctx.new_page())
        self._watch(self.page)
        return await self.act(Goto(start_url))

    def _watch(self, page: Page) -> None:
        if getattr(page, "_harness_watched", False):  # the context's "page" event and
            return  # start() can both see the first page: handlers once, dialogs once
        page._harness_watched = True
        page.set_default_timeout(self.timeout_ms)
        page.on("dialog", self._dialog)
        page.on("request", self._count_up)
        page.on("requestfinished", self._count_down)
        page.on("requestfailed", self._count_down)
        page.on("requestfinished", self._nav_done)
        page.on("requestfailed", self._nav_done)
        page.on("response", self._response)
        page.on("framenavigated", self._navigated)

    def _adopt(self, page: Page) -> None:  # a popup or target=_blank: it becomes current
        if page is not self.page:
            self.page = page
            self.inflight = self.nav_pending = self.frame_pending = 0
            self._watch(page)

    def _main(self, frame) -> bool:
        return self.page is not None and frame is self.page.main_frame

    def _count_up(self, request: Request) -> None:
        self.inflight += 1
        if request.is_navigation_request():
            if self._main(request.frame):
                self.nav_pending += 1
            else:
                self.frame_pending += 1

    def _count_down(self, request: Request) -> None:
        self.inflight = max(0, self.inflight - 1)

    def _nav_done(self, request: Request) -> None:
        if request.is_navigation_request():
            if self._main(request.frame):
                self.nav_pending = max(0, self.nav_pending - 1)
            else:
                self.frame_pending = max(0, self.frame_pending - 1)

    def _navigated(self, frame) -> None:
        if self._main(frame):
            self.navigations += 1
            self.nav_pending = 0
        elif self.page is not None and frame.page is self.page:
            self.frames_moved.append(frame)

    async def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}"[:200])
        with contextlib.suppress(PlaywrightError):
            await dialog.dismiss()

    def _response(self, response) -> None:
        refused = response.headers.get(REFUSED_HEADER.lower())
        if refused:
            self.refused.append(refused)
        if response.headers.get(NO_UPSTREAM_HEADER.lower()):
            self.no_upstream = True

    # ------------------------------------------------------------------ actions

    async def act(self, action: Action) -> Observation:
        frames = self.lease.frames
        if frames is None:  # Chromium's own clock draws the frames
            return await self._act(action)
        async with frames.acting():  # the environment's (rollout.env.frames)
            return await self._act(action)

    async def _act(self, action: Action) -> Observation:
        self.refused.clear()
        self.dialogs.clear()
        self._report = self._problem = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.action_timeout_s - 0.25
        shot = None
        replayer = self.lease.replayer
        misses = len(replayer.misses) if replayer is not None else 0
        try:
            navigations = self.navigations
            self.frames_moved = []
            acted_on, acted_url = self.page, self.page.url
            shot = await self._do(action)
            may_navigate = isinstance(action, Click | SomClick | SomType)
            await self._after_navigation(navigations, deadline, may_navigate)
            if isinstance(action, Scroll | SomScroll) and self.scrolled:
                async with self._quiet():
                    await self._after_scroll()
            await self._settle(deadline if replayer is not None else None)
            async with self._quiet():
                obs = await self._observe()
            if self.page is not acted_on and isinstance(action, ExtractText | Screenshot):
                # a popup or a new tab became the current page while the action ran
                what = "text" if isinstance(action, ExtractText) else "screenshot"
                self._report = (
                    f"a new tab opened and is the current page now; the {what} is of "
                    f"{acted_url}, the page before it"
                )
            if self.lease.recorder is not None:  # recording: the bodies are read before
                # the next action can navigate away from them
                await self.lease.recorder.settle(max(0.5, deadline - loop.time()))
            if self.no_upstream:  # every upstream proxy is benched: not the agent's doing
                raise InfraError("no upstream proxy is left to reach the web through")
            if replayer is not None:  # replaying: the page asked for is not archived
                missed = [m.url for m in replayer.misses[misses:] if m.is_navigation]
                if missed:
                    raise ToolError(f"not in the archive: {missed[-1]}")
        except PlaywrightError as e:
            if self.lease.browser_lost:
                raise InfraError(f"the browser was lost: {_first_line(e)}") from None
            if "crash" in str(e).lower():  # the tab died, the browser lives: a new tab
                await self._replace_page()
                raise ToolError("the page crashed; a blank page is open now") from None
            if isinstance(e, PlaywrightTimeout):
                blocked = _blocked_because(e)
                if blocked:  # the element is there but cannot be used: say why
                    raise ToolError(f"{action.name} timed out: {blocked}") from None
                await self.recover()
                raise ActionTimeout(f"{action.name} timed out: {_first_line(e)}") from None
            await self._quiesce()
            raise ToolError(self._explain(action, e)) from None
        return self._decorate(obs, shot)

    def _quiet(self) -> contextlib.AbstractAsyncContextManager:
        """While the page is read: no frames but those asked for (FrameClock.quiet)."""
        frames = self.lease.frames
        return frames.quiet() if frames is not None else contextlib.nullcontext()

    async def _frames_wait(self, page: Page) -> None:
        """Two animation frames of ``page``: Chromium's next two, or with the
        environment's clock two drawn at once (FrameClock.through); at most
        FRAMES_WAIT_S."""
        frames = self.lease.frames
        with contextlib.suppress(TimeoutError):  # they do not come: read the page as it is
            if frames is None:
                await asyncio.wait_for(page.evaluate(_FRAMES_JS), FRAMES_WAIT_S)
            else:
                await frames.through(page, page.evaluate(_FRAMES_JS), within=FRAMES_WAIT_S)

    async def _after_navigation(self, navigations: int, deadline: float, wait: bool) -> None:
        """Wait for the navigation the action caused, if any: its start (after a click,
        a moment for the page's handler to begin it), its commit, the load event, then
        the scroll to its ``#fragment``; all within the action's time."""
        loop = asyncio.get_running_loop()
        start_by = loop.time() + (NAV_START_S if wait else 0.0)
        requested = False
        while self.navigations == navigations and loop.time() < deadline:
            if self.nav_pending or self.frame_pending:
                requested = True  # a request went out: wait for its commit
            elif self.frames_moved or requested or loop.time() >= start_by:
                break  # none started, or it ended without a new document (204, download)
            await asyncio.sleep(0.01)
        remaining_ms = max(100, int((deadline - loop.time()) * 1000))
        if self.navigations != navigations:
            await self.page.wait_for_load_state("load", timeout=remaining_ms)
            await self._fragment_scroll()
            return
        for frame in dict.fromkeys(self.frames_moved):  # a form's answer shown in its iframe
            if not frame.is_detached():
                with contextlib.suppress(PlaywrightError):  # gone meanwhile: nothing to wait for
                    await frame.wait_for_load_state("load", timeout=remaining_ms)

    async def _fragment_scroll(self) -> None:
        """The browser scrolls to a URL's ``#fragment`` after load; make sure it did before
        the page is read (the observation window starts where the view does)."""
        if "#" not in self.page.url:
            return
        await self.page.evaluate(_FRAGMENT_JS)

    async def _quiesce(self) -> None:
        """After a failed navigation (a redirect loop, a refused load) Chromium is still
        committing its error page; let it finish, so that it cannot interrupt the next
        action's navigation."""
        with contextlib.suppress(PlaywrightError, asyncio.TimeoutError):
            await asyncio.wait_for(self.page.wait_for_load_state("load", timeout=2000), 3)

    async def _do(self, action: Action) -> bytes | None:
        page = self.page
        match action:
            case Goto(url=url):
                await self._goto(page, url)
            case Click(selector=sel):
                await self._click(await self._usable(sel, "click"))
            case Fill(selector=sel, value=value):
                await (await self._usable(sel, "fill")).fill(value)
            case Scroll(dx=dx, dy=dy):
                self.scrolled = await page.evaluate(_SCROLL_JS, [dx, dy, 0])
            case Back() | Forward():
                await self._history(action)
            case Observe():
                pass
            case ExtractText(selector=sel):
                texts = await page.locator(sel).all_inner_texts()
                if not texts:
                    raise ToolError(f"no element matches {sel!r}")
                self._extracted = "\n".join(texts)
            case Screenshot():
                return await self._capture()
            case _:
                raise ToolError(f"{action.name} is not available in {self.mode} mode")
        return None

    async def _capture(self, again: bool = True, answered: bool = False) -> bytes:
        """The viewport as the compositor draws it, encoded as env.screenshot_* say, by
        Chromium's Page.captureScreenshot on a session of the page's own, over the
        lease's uncompressed DevTools channel (``rollout.env.devtools``: Playwright's
        socket deflates every reply, ~20 ms of a PNG's cost). ``page.screenshot`` costs
        more per shot still (it waits for web fonts and restyles every frame to hide the
        caret, round trips each) for nothing a policy would see. Errors come as
        Playwright's, so ``act`` explains them as it does any other. With the
        environment's frame clock (env.frame_clock, ``rollout.env.frames``) the image is
        of a frame drawn at once instead: no wait for Chromium's next frames (``again``
        and ``answered``, a call into the page just returned: as ``FrameClock.frame``
        takes them; its ``NoImage`` is raised as it is)."""
        page, o = self.page, self.shot_options
        params: dict = {"format": o.format, "optimizeForSpeed": o.fast}
        if o.format != "png":
            params["quality"] = o.quality
        if self.lease.frames is not None:  # a frame drawn now, with its image
            try:
                async with asyncio.timeout(self.timeout_ms / 1000):
                    return await self.lease.frames.frame(
                        page, screenshot=params, again=again, answered=answered
                    )
            except NoImage:
                raise
            except TimeoutError:
                raise PlaywrightTimeout(
                    f"Timeout {self.timeout_ms}ms exceeded taking a screenshot"
                ) from None
            except (FrameError, OSError, aiohttp.ClientError) as e:
                raise PlaywrightError(f"screenshot failed: {e}") from None
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                dt = await self.lease.devtools()
                if self._cdp is None or self._cdp[0] is not page or self._cdp[1] is not dt:
                    target = await page_target_id(self.lease.context, page)
                    self._cdp = (page, dt, await dt.attach(target))
                shot = await dt.send("Page.captureScreenshot", params, session=self._cdp[2])
        except TimeoutError:
            raise PlaywrightTimeout(
                f"Timeout {self.timeout_ms}ms exceeded taking a screenshot"
            ) from None
        except (DevToolsError, OSError, aiohttp.ClientError) as e:
            self._cdp = None
            raise PlaywrightError(f"screenshot failed: {e}") from None
        return base64.b64decode(shot["data"])

    async def _goto(self, page: Page, url: str) -> None:
        """``page.goto``, surviving the error page of an earlier failed load (a redirect
        loop) committing over this navigation: wait for it, then navigate again."""
        for attempt in range(3):
            try:
                await page.goto(url, wait_until="load")
                return
            except PlaywrightError as e:
                if "interrupted by another navigation" not in str(e) or attempt == 2:
                    raise
            with contextlib.suppress(PlaywrightError):
                await page.wait_for_load_state("load", timeout=2000)
            if urldefrag(page.url).url == urldefrag(url).url:
                return  # what interrupted it was this very navigation, now loaded

    async def _history(self, action: Back | Forward) -> None:
        """``back`` / ``forward``, reporting what the browser did: another page, a move
        within the same page (an anchor), or nothing (no page that way); the observation
        shows the page either way."""
        page, before = self.page, self.page.url
        move = page.go_back if isinstance(action, Back) else page.go_forward
        response = await move(wait_until="load")
        if response is None:  # same-document move, or none at all
            loop = asyncio.get_running_loop()
            until = loop.time() + 0.3
            while page.url == before and loop.time() < until:
                await asyncio.sleep(0.02)
        way = "back" if isinstance(action, Back) else "forward"
        if page.url == before and response is None:
            self._problem = f"there is no page to go {way} to; still on this page"
        elif urldefrag(page.url).url == urldefrag(before).url:
            self._report = f"went {way} to {page.url} (a move within the same page)"
            await self._fragment_scroll()
        else:
            self._report = f"went {way} to {page.url}"

    async def _click(self, target) -> None:
        """Click; a link that opens a new tab (target=_blank) makes that tab current."""
        if await target.evaluate("e => (e.closest('a[target]') || {}).target === '_blank'"):
            async with self.page.context.expect_page(timeout=self.timeout_ms) as opened:
                await target.click()
            page = await opened.value
            self._adopt(page)
            await page.wait_for_load_state("load")
        else:
            await target.click()

    async def _usable(self, selector: str, verb: str):
        """The first element a selector matches that a person could use: visible and
        enabled. When none is, fail at once (not after the timeout) saying what matched
        and why none could be used: an agent's wrong selector is its error to fix."""
        loc = self.page.locator(selector)
        count = await loc.count()
        for frame in self.page.frames[1:]:  # not on the page: in an iframe, as a person sees it
            if count:
                break
            with contextlib.suppress(PlaywrightError):  # a frame detached meanwhile
                loc = frame.locator(selector)
                count = await loc.count()
        if count == 0:
            raise ToolError(f"no element matches {selector!r}")
        visible = loc.filter(visible=True)
        shown = await visible.count()
        for i in range(min(shown, 20)):
            candidate = visible.nth(i)
            if await candidate.is_enabled():
                return candidate
        first = await _describe(loc.first)
        if shown == 0:
            why = "none is visible" if count > 1 else "it is not visible"
        else:
            why = "every visible one is disabled" if shown > 1 else "it is disabled"
        matches = f"{count} elements match" if count > 1 else "1 element matches"
        raise ToolError(f"cannot {verb} {selector!r}: {matches} ({first}) but {why}")

    async def _after_scroll(self) -> None:
        """What the page does when scrolled (its scroll and intersection observers, lazy
        loading) starts by the next frame: two animation frames before it is read. A
        scroll that moved nothing (up at the top) has nothing to wait for."""
        await self._frames_wait(self.page)

    async def _settle(self, until: float | None = None) -> None:
        """Give the page's own requests (JavaScript fetching content) a moment to finish:
        SETTLE_S, or in replay until they have (``until``, the action's deadline), since
        each is answered by the archive through a round trip to this process and a page
        read before its answer arrived would differ from the recorded one."""
        deadline = until if until is not None else asyncio.get_running_loop().time() + SETTLE_S
        if until is not None:  # the page's own count of its fetches (rollout.archive.browser)
            with contextlib.suppress(PlaywrightError):
                while await self.page.evaluate(_PENDING_JS) > 0:
                    if asyncio.get_running_loop().time() >= deadline:
                        break
                    await asyncio.sleep(0.01)
        waited = False
        while self.inflight > 0 and asyncio.get_running_loop().time() < deadline:
            waited = True
            await asyncio.sleep(0.01)
        if waited:  # the page's handlers for what arrived run before it is read
            await self._frames_wait(self.page)

    async def _label(self, marks: bool, overlay: bool = False) -> dict:
        """The labeller's pass: the text from where the view starts, within the budget."""
        opts = {
            "marks": marks,
            "fromViewport": "scrolled",
            "maxChars": self.observation_chars,
            "maxLabels": 0,
        }
        return await run_labeller(self.page, opts, overlay)

    async def _page_text(self, view: dict | None) -> str:
        """The whole page's text, as the labeller writes it without numbers (what the
        citation verifier reads: a quote below the window the agent saw is still on the
        page). ``view``: the observation's own pass, reused when it already is that text."""
        if (
            view is not None
            and not view["elements"]
            and not view["more"]
            and view.get("scrollY", 0) == 0
        ):
            return view["text"]
        whole = await run_labeller(self.page, _WHOLE_PAGE)
        return whole["text"]

    async def _observe(self) -> Observation:
        page = self.page
        extracted, self._extracted = self._extracted, None
        if extracted is not None:
            text, title = extracted, await page.title()
            page_text = await self._page_text(None)
        elif self.observation == "axtree":
            text, title = await self._axtree(), await page.title()
            page_text = await self._page_text(None)
        else:
            view = await self._label(marks=False)
            text, title = _with_more(view), view["title"]
            page_text = await self._page_text(view)
        return Observation(
            text, url=page.url, title=title, summary=_summary(page.url, title), page_text=page_text
        )

    async def _axtree(self) -> str:
        return await self.page.locator("body").aria_snapshot(timeout=self.timeout_ms)

    def _decorate(self, obs: Observation, shot: bytes | None) -> Observation:
        errors = []
        if self._problem:
            errors.append(self._problem)
        if self.refused:
            errors.append(f"refused to load {self.refused[0]} (not an allowed site)")
        if self.dialogs:
            errors.append("a dialog was dismissed: " + "; ".join(self.dialogs))
        if not errors and shot is None and not self._report:
            return obs
        return dataclasses.replace(
            obs,
            error="; ".join(errors) or None,
            note=self._report or obs.note,
            screenshot=shot if shot is not None else obs.screenshot,
        )

    def _explain(self, action: Action, e: PlaywrightError) -> str:
        msg = _first_line(e)
        if "Timeout" in msg:
            return f"{action.name} timed out: {msg}"
        if self.refused:
            return f"refused to load {self.refused[0]} (not an allowed site)"
        return f"{action.name} failed: {msg}"

    async def recover(self) -> None:
        """After a timeout: stop the page loading, so the next action meets the page the
        agent was on (a navigation that never commits would otherwise block every call)."""
        try:
            cdp = await asyncio.wait_for(self.lease.context.new_cdp_session(self.page), 2)
            await asyncio.wait_for(cdp.send("Page.stopLoading"), 2)
            await asyncio.wait_for(cdp.detach(), 2)
        except (PlaywrightError, TimeoutError):
            if self.lease.browser_lost:
                return
            await self._replace_page()
        self.inflight = self.nav_pending = self.frame_pending = 0

    async def _replace_page(self) -> None:
        page = await self._guarded(self.lease.context.new_page())
        self.page = page
        self._watch(page)

    async def _guarded(self, coro):
        try:
            return await coro
        except PlaywrightError as e:
            if self.lease.browser_lost:
                raise InfraError(f"the browser was lost: {_first_line(e)}") from None
            raise

    async def close(self) -> None:
        pass  # the lease's context is closed by the pool


class SomBackend(PlaywrightBackend):
    """Set-of-Mark: numbered elements, acted on by number; optional marked screenshots."""

    mode = "som"

    def __init__(
        self,
        lease: Lease,
        policy: UrlPolicy,
        *,
        action_timeout_s: float = 10.0,
        screenshots: bool = False,
        observation_chars: int = 4000,
        observation: str = "text",
        screenshot: ScreenshotOptions = PNG_FAST,
    ):
        super().__init__(
            lease, policy, action_timeout_s=action_timeout_s,
            observation_chars=observation_chars, observation=observation, screenshot=screenshot,
        )  # fmt: skip
        self.screenshots = screenshots
        self.last_screenshot: bytes | None = None  # the latest marked view, for the dashboard
        self.shown: frozenset[int] = frozenset()  # the numbers the last observation showed
        # (page, pass, layout, marked shot, page text) taken during a scroll's wait
        self._early: tuple[Page, dict, dict, bytes, str] | None = None

    @property
    def _shoots(self) -> bool:
        """Observations carry a marked screenshot drawn by the labelling pass itself."""
        return self.screenshots and self.observation != "axtree"

    async def act(self, action: Action) -> Observation:
        self._early = None
        try:
            return await super().act(action)
        finally:
            if self._early is not None:  # the action failed after the early capture
                page, self._early = self._early[0], None
                with contextlib.suppress(PlaywrightError):
                    await page.evaluate(UNWATCH_JS)

    async def _after_scroll(self) -> None:
        """With screenshots on, the scroll's two-frame wait is also the capture's: the
        page is labelled and the marks drawn at once, then the view is captured and the
        whole page's text read while the page's observers run; the observation keeps
        them only if the page held still meanwhile (``_early_shot``). Without, the wait
        alone."""
        if not self._shoots or self.lease.frames is not None:  # (the environment's clock
            return await super()._after_scroll()  # draws the two frames at once)
        page = self.page
        try:
            view = await self._label(marks=True, overlay=True)
        except PlaywrightError:
            self.shown = frozenset()
            raise
        try:
            before = await page.evaluate(WATCH_JS)
            done = _raise_first(
                await asyncio.gather(
                    self._capture(),
                    self._page_text(view),
                    self._frames_wait(page),
                    return_exceptions=True,
                )
            )
        except BaseException:
            with contextlib.suppress(PlaywrightError):
                await page.evaluate(UNWATCH_JS)
            raise
        shot, page_text, _ = done
        if before is not None:
            self._early = (page, view, before, shot, page_text)
        else:  # nothing could watch this page: read it again after the wait
            await page.evaluate(UNWATCH_JS)

    async def _do(self, action: Action) -> bytes | None:
        page = self.page
        match action:
            case SomClick(n=n):
                target = await self._marked(n)
                href = await target.get_attribute("href")
                if href is not None and not _harmless_href(href):
                    absolute = await target.evaluate("e => e.href")
                    if not is_allowed(absolute, self.policy):
                        raise ToolError(f"[{n}] links to {absolute}, which is not an allowed site")
                await self._click(target)
            case SomType(n=n, text=text):
                target = await self._marked(n)
                tag = await target.evaluate("e => e.tagName")
                if tag == "SELECT":
                    await target.select_option(label=text)
                else:
                    await target.fill(text)
            case SomScroll(direction=d):
                self.scrolled = await page.evaluate(_SCROLL_JS, [0, 0, -0.8 if d == "up" else 0.8])
            case Goto() | Back() | Forward() | Observe():
                return await super()._do(action)
            case _:
                raise ToolError(f"{action.name} is not available in som mode")
        return None

    async def _drawn_shot(self, view: dict) -> tuple[bytes, str]:
        """With the environment's frame clock, the marks drawn: the image of one frame
        drawn now, and the whole page's text. The page takes its marks off in the task
        after that frame's animation frames (the frame is painted then) and the text is
        read after it, while the browser encodes the image (reading it with the marks
        drawn would redo the layout they changed). A first frame drawn without its image
        (a new renderer) means the marks may be gone from the next: they are drawn again
        for the frame that has it (``view``'s: the text's pass has replaced the page's
        own copy of the last pass)."""
        page = self.page
        if not await page.evaluate(UNMARK_AFTER_FRAME_JS):  # a window that cannot keep it
            shot = await self._capture_then_unmark()
            return shot, await self._page_text(None)
        text = asyncio.ensure_future(self._unmarked_text())
        try:
            try:
                shot = await self._capture(again=False, answered=True)
            except NoImage:  # the marks off and the text read, then the marks again, for
                page_text = await self._unmarked(text)  # a frame that has its image
                await page.evaluate(OVERLAY_JS, view["elements"])
                return await self._capture_then_unmark(), page_text
            return shot, await self._unmarked(text)
        except BaseException:
            if not text.done():
                text.cancel()
            with contextlib.suppress(PlaywrightError):
                await page.evaluate(REMOVE_OVERLAY_JS)
            raise

    async def _capture_then_unmark(self) -> bytes:
        """The marked page's image, its marks taken off afterwards whatever happens."""
        try:
            return await self._capture(answered=True)  # the marks were drawn just now
        finally:
            await self.page.evaluate(REMOVE_OVERLAY_JS)

    async def _unmarked(self, text: asyncio.Future) -> str:
        """``text``'s result once the frame is drawn: if the page has not run its task
        after the frame in UNMARKED_WAIT_S, frames are drawn until it has, for
        FRAMES_WAIT_S; a page whose animation frames never come (its
        ``requestAnimationFrame`` replaced, say) has its marks taken off and its text
        read by the environment instead."""
        if not text.done():
            done, _ = await asyncio.wait({text}, timeout=UNMARKED_WAIT_S)
            if not done:
                with contextlib.suppress(TimeoutError):
                    await self.lease.frames.through(self.page, text, within=FRAMES_WAIT_S)
        if text.done() and not text.cancelled():
            return text.result()
        await self.page.evaluate(REMOVE_OVERLAY_JS)
        return await self._page_text(None)

    async def _unmarked_text(self) -> str:
        """``_page_text(None)``, read once the page has taken its marks off (_drawn_shot)."""
        raw = await self.page.evaluate(UNMARKED_TEXT_CALL_JS, _WHOLE_PAGE)
        if raw is None:
            raw = await self.page.evaluate(UNMARKED_TEXT_JSON_JS, _WHOLE_PAGE)
        return json.loads(raw)["text"]

    async def _marked_shot(self) -> bytes:
        """A screenshot with the last pass's marks drawn (OVERLAY_JS), then removed."""
        await self.page.evaluate(OVERLAY_JS)
        try:
            shot = await self._capture(answered=True)
        finally:
            await self.page.evaluate(REMOVE_OVERLAY_JS)
        self.last_screenshot = shot
        return shot

    async def _marked(self, n: int):
        """The element numbered ``n`` in the last observation. A number that observation
        did not show is refused: numbers always mean what the agent saw."""
        if n not in self.shown:
            raise ToolError(f"there is no element [{n}] in the last view; use a number shown in it")
        for frame in self.page.frames:
            loc = frame.locator(f'[data-som-id="{n}"]')
            if await loc.count():
                return loc.first
        raise ToolError(f"element [{n}] is gone from the page (it changed); look again")

    async def _early_shot(self) -> tuple[dict, bytes, str] | None:
        """The pass, shot and page text taken during the scroll's wait, if the page held
        still: no change to the document since the marks were drawn (a MutationObserver's
        records) and the same layout now (scroll offsets, scroll size, the box of every
        numbered element, all of which are in the top document). The marks are removed
        either way; ``None`` sends the observation down the ordinary path."""
        early, self._early = self._early, None
        if early is None:
            return None
        page, view, before, shot, page_text = early
        if page is not self.page:  # a popup became current: the marks come off the old page
            with contextlib.suppress(PlaywrightError):
                await page.evaluate(UNWATCH_JS)
            return None
        now = await page.evaluate(UNWATCH_JS)
        still = (
            now is not None
            and now["n"] == 0
            and now["fp"] == before["fp"]
            and now["count"] == before["count"] == len(view["elements"])
        )
        return (view, shot, page_text) if still else None

    async def _observe(self) -> Observation:
        page = self.page
        shoot = self._shoots
        try:
            early = await self._early_shot()
            # with screenshots on, the same call draws the marks (OVERLAY_JS)
            view = early[0] if early else await self._label(marks=True, overlay=shoot)
        except PlaywrightError:
            self.shown = frozenset()
            raise
        shot = None
        if early:
            _, shot, page_text = early
            self.last_screenshot = shot
        elif shoot and self.lease.frames is not None:
            shot, page_text = await self._drawn_shot(view)
            self.last_screenshot = shot
        elif shoot:  # the capture overlaps the text pass: the compositor draws, the page reads
            done = await asyncio.gather(
                self._capture(), self._page_text(None), return_exceptions=True
            )
            await page.evaluate(REMOVE_OVERLAY_JS)
            shot, page_text = _raise_first(done)
            self.last_screenshot = shot
        else:
            page_text = await self._page_text(None)  # a text-only pass keeps the numbers
        elements = tuple(view["elements"])
        self.shown = frozenset(e["id"] for e in elements)
        text = _with_more(view)
        if self.observation == "axtree":
            listed = "\n".join(_element_line(e) for e in elements)
            text = await self._axtree() + ("\n\nNumbered elements:\n" + listed if listed else "")
        if self.screenshots and not shoot:  # the axtree pass moved nothing: draw, then shoot
            shot = await self._marked_shot()
        title = view["title"]
        return Observation(
            text, url=page.url, title=title, summary=_summary(page.url, title),
            screenshot=shot, page_text=page_text, elements=elements,
        )  # fmt: skip


def _raise_first(results: list) -> list:
    """``asyncio.gather(..., return_exceptions=True)``'s results; its first exception raised."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


async def run_labeller(page: Page, opts: dict, overlay: bool = False) -> dict:
    """The labeller's result for ``opts`` (see ``som_js``): the copy installed in the
    document by ``LABELLER_INIT_JS``, or the whole labeller where there is none. With
    ``overlay`` the same call then draws the marks of the elements in view (OVERLAY_JS)."""
    raw = await page.evaluate(LABEL_CALL_OVERLAY_JS if overlay else LABEL_CALL_JS, opts)
    if raw is None:
        raw = await page.evaluate(LABEL_JSON_OVERLAY_JS if overlay else LABEL_JSON_JS, opts)
    return json.loads(raw)


# a scroll by (x, y) pixels plus ``screens`` view heights, at once even where the page asks
# for smooth scrolling (a view read mid-glide would start anywhere); whether the view moved
_SCROLL_JS = """([x, y, screens]) => {
  const x0 = window.scrollX, y0 = window.scrollY;
  window.scrollBy({left: x, top: y + screens * window.innerHeight, behavior: 'instant'});
  return window.scrollX !== x0 || window.scrollY !== y0;
}"""
# two animation frames: scroll and intersection observers have run, timers of 0 too
_PENDING_JS = "() => window.__archivePending || 0"
_FRAMES_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"

_FRAGMENT_JS = r"""
async () => {
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  await frame(); await frame();
  let id = location.hash.slice(1);
  try { id = decodeURIComponent(id); } catch (e) {}
  if (!id) return;
  const el = document.getElementById(id) || document.getElementsByName(id)[0];
  if (!el) return;
  const r = el.getBoundingClientRect();
  if (r.top < -1 || r.top > innerHeight / 2) el.scrollIntoView({block: 'start'});
}
"""


async def _describe(locator) -> str:
    """A short description of an element for an error: tag, id or class, text."""
    with contextlib.suppress(PlaywrightError):
        return await locator.evaluate(
            """e => { const t = (e.innerText || e.value || '').replace(/\\s+/g, ' ').trim();
              const id = e.id ? '#' + e.id : (e.classList[0] ? '.' + e.classList[0] : '');
              return '<' + e.tagName.toLowerCase() + id + '>' + (t ? ' "' + t.slice(0, 40) + '"' : ''); }""",
            timeout=1000,
        )
    return "an element"


def _blocked_because(e: PlaywrightError) -> str | None:
    """Why Playwright could not act on an element it found, from its call log."""
    log = str(e)
    for line in reversed(log.splitlines()):
        for needle, words in _BLOCKERS:
            if needle in line:
                detail = line.strip().lstrip("- ").strip()
                return f"{words} ({detail[:200]})"
    return None


def _with_more(view: dict) -> str:
    text = view["text"]
    if view.get("more"):
        text += "\n[... more below: scroll down to read on]"
    return text


def _element_line(e: dict) -> str:
    value = e.get("value")
    line = f'[{e["id"]}] {e["role"]} "{e["name"]}"'
    return line + (f' value="{value}"' if value is not None else "")


def _harmless_href(href: str) -> bool:
    """In-page anchors need no check; every other href is checked as a URL."""
    return href.startswith("#")


def _summary(url: str, title: str) -> str:
    path = urlsplit(url).path or url
    return f"{title or 'untitled'} ({path})"[:100]


def _first_line(e: Exception) -> str:
    return str(e).strip().split("\n")[0][:300]
