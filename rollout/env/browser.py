"""The browser modes' backends: a real Chromium page per episode (one context per lease).

``PlaywrightBackend`` (playwright mode) acts with selectors and shows the page's
readable text; ``SomBackend`` (som mode) numbers the interactive elements and
acts on them by number through the ``data-som-id`` attribute the labeler sets.

Every request the page makes leaves the browser through the egress proxy
(``rollout.egress``), which forwards only allowed URLs: a link, a redirect or a
script cannot take the agent to a host it could not name itself. A refusal is
reported as the step's error. Dialogs are dismissed and reported, popups
become the current page, and a crashed tab is replaced; only a lost browser is
an infrastructure error.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urldefrag, urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request
from playwright.async_api import TimeoutError as PlaywrightTimeout

from rollout.actions import (
    Action,
    Back,
    Click,
    ExtractText,
    Fill,
    Goto,
    Screenshot,
    Scroll,
    SomClick,
    SomScroll,
    SomType,
)
from rollout.browser_pool import Lease
from rollout.egress import REFUSED_HEADER
from rollout.env.core import ActionTimeout, InfraError, ToolError
from rollout.env.observation import Observation
from rollout.env.som_js import LABEL_JS, OVERLAY_JS, REMOVE_OVERLAY_JS
from rollout.urls import UrlPolicy, is_allowed

SETTLE_S = 0.5  # after an action, wait at most this long for the page's own requests


class PlaywrightBackend:
    mode = "playwright"

    def __init__(self, lease: Lease, policy: UrlPolicy, *, action_timeout_s: float = 10.0):
        self.lease, self.policy = lease, policy
        self.timeout_ms = max(1000, int(action_timeout_s * 1000) - 500)
        self.page: Page | None = None
        self.refused: list[str] = []
        self.dialogs: list[str] = []
        self.inflight = 0

    @property
    def url(self) -> str | None:
        return self.page.url if self.page is not None and self.page.url != "about:blank" else None

    # ------------------------------------------------------------------ setup

    async def start(self, start_url: str) -> Observation:
        ctx = self.lease.context
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
        page.on("response", self._response)

    def _adopt(self, page: Page) -> None:  # a popup or target=_blank: it becomes current
        if page is not self.page:
            self.page = page
            self.inflight = 0
            self._watch(page)

    def _count_up(self, request: Request) -> None:
        self.inflight += 1

    def _count_down(self, request: Request) -> None:
        self.inflight = max(0, self.inflight - 1)

    async def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}"[:200])
        with contextlib.suppress(PlaywrightError):
            await dialog.dismiss()

    def _response(self, response) -> None:
        refused = response.headers.get(REFUSED_HEADER.lower())
        if refused:
            self.refused.append(refused)

    # ------------------------------------------------------------------ actions

    async def act(self, action: Action) -> Observation:
        self.refused.clear()
        self.dialogs.clear()
        shot = None
        try:
            shot = await self._do(action)
            await self._settle()
            obs = await self._observe()
        except PlaywrightError as e:
            if self.lease.browser_lost:
                raise InfraError(f"the browser was lost: {_first_line(e)}") from None
            if "crash" in str(e).lower():  # the tab died, the browser lives: a new tab
                await self._replace_page()
                raise ToolError("the page crashed; a blank page is open now") from None
            if isinstance(e, PlaywrightTimeout):
                await self.recover()
                raise ActionTimeout(f"{action.name} timed out: {_first_line(e)}") from None
            await self._quiesce()
            raise ToolError(self._explain(action, e)) from None
        return self._decorate(obs, shot)

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
                await self._click(await self._present(sel))
            case Fill(selector=sel, value=value):
                await (await self._present(sel)).fill(value)
            case Scroll(dx=dx, dy=dy):
                await page.evaluate("([x, y]) => window.scrollBy(x, y)", [dx, dy])
            case Back():
                if await page.go_back(wait_until="load") is None:
                    raise ToolError("there is no previous page")
            case ExtractText(selector=sel):
                texts = await page.locator(sel).all_inner_texts()
                if not texts:
                    raise ToolError(f"no element matches {sel!r}")
                self._extracted = "\n".join(texts)
            case Screenshot():
                return await page.screenshot(type="png")
            case _:
                raise ToolError(f"{action.name} is not available in {self.mode} mode")
        return None

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

    async def _present(self, selector: str):
        """The first element a selector matches, failing at once (not after the timeout)
        when none does: an agent's wrong selector is its error to fix, not a wait."""
        loc = self.page.locator(selector)
        if await loc.count() == 0:
            raise ToolError(f"no element matches {selector!r}")
        return loc.first

    async def _settle(self) -> None:
        """Give the page's own requests (JavaScript fetching content) a moment to finish."""
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while self.inflight > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def _observe(self) -> Observation:
        page = self.page
        extracted, self._extracted = getattr(self, "_extracted", None), None
        if extracted is not None:
            text = extracted
        elif await page.evaluate("window.scrollY") > 0:
            view = await page.evaluate(
                LABEL_JS, {"marks": False, "fromViewport": True, "maxLabels": 0}
            )
            text = view["text"]
        else:
            text = await page.evaluate("document.body ? document.body.innerText : ''")
        title = await page.title()
        return Observation(
            text, url=page.url, title=title, summary=_summary(page.url, title), page_text=text
        )

    def _decorate(self, obs: Observation, shot: bytes | None) -> Observation:
        errors = []
        if self.refused:
            errors.append(f"refused to load {self.refused[0]} (not an allowed site)")
        if self.dialogs:
            errors.append("a dialog was dismissed: " + "; ".join(self.dialogs))
        if not errors and shot is None:
            return obs
        return Observation(
            obs.text,
            url=obs.url,
            title=obs.title,
            error="; ".join(errors) or None,
            summary=obs.summary,
            screenshot=shot,
            page_text=obs.page_text,
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
        self.inflight = 0

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

    def __init__(self, lease: Lease, policy: UrlPolicy, *, action_timeout_s: float = 10.0,
                 screenshots: bool = False, max_labels: int = 1000):  # fmt: skip
        super().__init__(lease, policy, action_timeout_s=action_timeout_s)
        self.screenshots, self.max_labels = screenshots, max_labels
        self.last_screenshot: bytes | None = None  # the latest marked view, for the dashboard

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
                sign = -1 if d == "up" else 1
                await page.evaluate("s => window.scrollBy(0, s * window.innerHeight * 0.8)", sign)
            case Goto() | Back():
                return await super()._do(action)
            case _:
                raise ToolError(f"{action.name} is not available in som mode")
        return None

    async def _marked(self, n: int):
        for frame in self.page.frames:
            loc = frame.locator(f'[data-som-id="{n}"]')
            if await loc.count():
                return loc.first
        raise ToolError(f"there is no element [{n}] on this view; use a number shown in it")

    async def _observe(self) -> Observation:
        page = self.page
        opts = {"marks": True, "fromViewport": True, "maxLabels": self.max_labels}
        view = await page.evaluate(LABEL_JS, opts)
        shot = None
        if self.screenshots:
            await page.evaluate(OVERLAY_JS, view["elements"])
            try:
                shot = await page.screenshot(type="png")
            finally:
                await page.evaluate(REMOVE_OVERLAY_JS)
            self.last_screenshot = shot
        title = view["title"]
        return Observation(
            view["text"], url=page.url, title=title, summary=_summary(page.url, title),
            screenshot=shot, page_text=view["text"],
        )  # fmt: skip


def _harmless_href(href: str) -> bool:
    """In-page anchors need no check; every other href is checked as a URL."""
    return href.startswith("#")


def _summary(url: str, title: str) -> str:
    path = urlsplit(url).path or url
    return f"{title or 'untitled'} ({path})"[:100]


def _first_line(e: Exception) -> str:
    return str(e).strip().split("\n")[0][:300]
