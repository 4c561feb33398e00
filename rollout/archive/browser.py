"""Record a browser context's traffic into the web archive, and replay a context from it.

``BrowserRecorder`` writes every HTTP exchange a context's pages make (documents,
scripts, XHR/fetch, images, form POSTs, each redirect hop as its own 3xx) as an
``Exchange`` of kind ``"browser"``; ``BrowserReplayer`` answers every request of a
context from an ``Archive``, so a recorded episode can be driven again offline and
see the very bytes it saw live (playwright and som modes).

DESIGN. Why capture here and not in the egress proxy: an https request crosses the
egress as a CONNECT tunnel, opaque bytes; only the browser sees its bodies after TLS,
and Playwright's network events hand them over. The recorder listens passively
(``requestfinished`` / ``requestfailed`` on the context) and never routes, so the
traffic still leaves through the egress and its allowlist; the cost is one body fetch
over CDP per finished response. Replay routes every request (``context.route``),
which in Chromium also turns the HTTP cache off, so every load is answered from the
archive. Limits: service-worker traffic and websockets are not recorded; a request
whose body Chromium no longer holds (the page navigated away first) or that failed
is skipped and counted; a response revalidated from the browser's cache is recorded
as the browser reported it; POST bodies with random parts (multipart boundaries)
replay only if the archive's lookup matches them. Replay of redirects (see
``BrowserReplayer``): a redirected subresource is answered at the URL it asked for
(a script sees no redirect); a navigation is sent on to the target, and after a
307/308 of a POST (or any method but GET and HEAD) that target is answered with what
the re-sent request, method and body kept, got when recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from playwright.async_api import BrowserContext, Request, Route
from playwright.async_api import Error as PlaywrightError

from rollout.archive.store import Exchange, normalise_url

if TYPE_CHECKING:
    from rollout.archive.store import Archive, ArchiveWriter

KIND = "browser"
# response headers that describe the bytes on the wire, not the decoded body replayed
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
_SCHEMES = ("http://", "https://")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_KEEP_METHOD = frozenset({307, 308})  # the browser re-sends the method and the body
MAX_REDIRECTS = 20  # as Chromium follows


class BrowserRecorder:
    """Writes a context's finished requests to an ``ArchiveWriter``, in finishing order.

    ``stats``: ``recorded`` exchanges written, ``skipped`` requests that failed or
    whose response could not be read."""

    def __init__(
        self,
        context: BrowserContext,
        writer: ArchiveWriter,
        episode: str,
        *,
        timeout_s: float = 10.0,
    ):
        self.context, self.writer, self.episode = context, writer, episode
        self.timeout_s = timeout_s  # for reading one response's headers and body over CDP
        self.stats = {"recorded": 0, "skipped": 0}
        self._wanted: Callable[[Request], bool] = lambda _request: True
        self._inflight: set[Request] = set()  # started, not yet finished or failed
        self._pending: set[asyncio.Task] = set()  # finished, being read and written
        self._last: asyncio.Future | None = None  # the previous write, kept in order

    @classmethod
    async def attach(
        cls,
        context: BrowserContext,
        writer: ArchiveWriter,
        episode: str,
        *,
        timeout_s: float = 10.0,
    ) -> BrowserRecorder:
        """Start recording every request the context's pages make from now on."""
        recorder = cls(context, writer, episode, timeout_s=timeout_s)
        context.on("request", recorder._started)
        context.on("requestfinished", recorder._finished)
        context.on("requestfailed", recorder._failed)
        return recorder

    def record_only(self, wanted: Callable[[Request], bool]) -> None:
        """Record only the requests ``wanted`` accepts (a replayer's live fallbacks)."""
        self._wanted = wanted

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every request started so far has finished and is written; call
        before the context or the page closes (a body is read from the page that made
        the request: a page closed first takes its unread bodies with it, and they are
        counted as skipped). Requests still open after ``timeout_s`` (a long poll) are
        given up and counted as skipped."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._inflight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        self.stats["skipped"] += len(self._inflight)
        self._inflight.clear()
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) until the requests finished so far are read and
        written. The environment calls it after each step's observation: a body is read
        from the page that made the request, and the next action's navigation can take
        an unread one with it (seen under load as a search page missing from a replay)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    def _started(self, request: Request) -> None:
        if request.url.startswith(_SCHEMES):
            self._inflight.add(request)

    def _failed(self, request: Request) -> None:
        self._inflight.discard(request)
        if request.url.startswith(_SCHEMES) and self._wanted(request):
            self.stats["skipped"] += 1

    def _finished(self, request: Request) -> None:
        self._inflight.discard(request)
        if not request.url.startswith(_SCHEMES) or not self._wanted(request):
            return
        previous = self._last
        done = asyncio.get_running_loop().create_future()
        self._last = done
        task = asyncio.create_task(self._record(request, previous, done))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _record(
        self, request: Request, previous: asyncio.Future | None, done: asyncio.Future
    ) -> None:
        """Read the exchange (concurrently with others), then write it after the one
        finished before it, so that repeats of a URL keep their order."""
        try:
            try:
                exchange = await asyncio.wait_for(self._read(request), self.timeout_s)
            except (PlaywrightError, TimeoutError):
                exchange = None
            if previous is not None:
                await previous
            if exchange is None:
                self.stats["skipped"] += 1
            else:
                await asyncio.to_thread(self.writer.write, exchange)  # gzip off the loop
                self.stats["recorded"] += 1
        finally:
            done.set_result(None)

    async def _read(self, request: Request) -> Exchange | None:
        response = await request.response()
        if response is None:
            return None
        redirect = request.redirected_to is not None  # a redirect hop has no body to read
        body = b"" if redirect else await response.body()
        return Exchange(
            method=request.method,
            url=request.url,
            request_headers=_pairs(await request.headers_array()),
            request_body=request.post_data_buffer or b"",
            status=response.status,
            reason=response.status_text,
            response_headers=_pairs(await response.headers_array()),
            response_body=body,
            episode=self.episode,
            kind=KIND,
        )


# Counts the page's own fetch() and XMLHttpRequest calls still waiting for their answer
# (``window.__archivePending``): in replay each answer takes a round trip to this process, and
# a request the network service reports after the page's load event would otherwise be
# missed by a wait for requests in flight; the environment waits for this count instead.
PENDING_JS = r"""
(() => {
  if (window.__archivePending !== undefined) return;
  window.__archivePending = 0;
  const done = () => setTimeout(() => { window.__archivePending--; }, 0);
  const fetch0 = window.fetch;
  if (fetch0) {
    window.fetch = function () {
      window.__archivePending++;
      const p = Reflect.apply(fetch0, this, arguments);
      p.then(done, done);
      return p;
    };
  }
  const send0 = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function () {
    window.__archivePending++;
    this.addEventListener('loadend', done, {once: true});
    return Reflect.apply(send0, this, arguments);
  };
})();
"""


@dataclass(frozen=True)
class Miss:
    """A request the archive had no answer for."""

    url: str
    resource_type: str  # Playwright's: "document", "script", "xhr", "fetch", "image", ...
    is_navigation: bool  # a main-frame navigation: the page the agent asked for is missing


class BrowserReplayer:
    """Answers every request of a context from an ``Archive``.

    A request not in the archive gets a 404 page saying so and is listed in ``misses``;
    with a ``fallback`` recorder it goes to the network instead (through the egress)
    and the recorder records it. ``stats``: ``served`` from the archive (a redirect hop
    counts once), ``misses`` answered with the 404, ``live`` sent to the network.

    Redirects: Playwright never routes the request a browser makes to follow a
    redirect it was given (it would leave for the network), so a recorded redirect is
    replayed as Playwright's own HAR replay does it: a navigation is sent on to the
    redirect's target (``route._redirect_navigation_request``, which the ``goto`` in
    progress waits for; that request is routed again), and a subresource is answered
    with the end of its redirect chain, looked up hop by hop. The cookies a skipped
    hop set are added to the context, so a login that redirects still signs in. The
    navigation Playwright sends on is a GET; after a 307 or 308, which a browser follows
    with the same method and body (a form POST re-posted), the replayer remembers them
    and answers that GET with the recorded re-sent request's response.
    """

    def __init__(
        self,
        context: BrowserContext,
        archive: Archive,
        episode: str,
        fallback: BrowserRecorder | None,
    ):
        self.context, self.archive, self.episode = context, archive, episode
        self.fallback = fallback
        self.misses: list[Miss] = []
        self.stats = {"served": 0, "misses": 0, "live": 0}
        self._live: set[Request] = set()  # continued to the network, for the fallback
        # navigations sent on after a 307/308: normalised target URL -> (method, body)
        # to look it up with, as the browser re-sent it when recorded
        self._resend: dict[str, tuple[str, bytes]] = {}

    @classmethod
    async def attach(
        cls,
        context: BrowserContext,
        archive: Archive,
        episode: str,
        *,
        fallback: BrowserRecorder | None = None,
    ) -> BrowserReplayer:
        """Route every request of the context to the archive from now on."""
        replayer = cls(context, archive, episode, fallback)
        if fallback is not None:
            fallback.record_only(replayer._went_live)
        await context.add_init_script(script=PENDING_JS)
        await context.route("**/*", replayer._handle)
        return replayer

    def missed_navigation(self, url: str) -> bool:
        """Whether a main-frame navigation to ``url`` was missing from the archive."""
        return any(m.is_navigation and m.url == url for m in self.misses)

    def _went_live(self, request: Request) -> bool:
        if request in self._live:
            self._live.discard(request)
            return True
        return False

    def _lookup(self, method: str, url: str, body: bytes) -> Exchange | None:
        found = self.archive.lookup(method, url, body, episode=self.episode)
        if found is not None:
            self.stats["served"] += 1
        return found

    async def _handle(self, route: Route, request: Request) -> None:
        with contextlib.suppress(PlaywrightError):  # the page closed meanwhile
            if not request.url.startswith(_SCHEMES):
                await route.continue_()
                return
            method, body = request.method, request.post_data_buffer or b""
            navigation = request.is_navigation_request()
            if navigation and method == "GET":
                method, body = self._resend.pop(normalise_url(request.url), (method, body))
            found = self._lookup(method, request.url, body)
            target = _redirect_target(found) if found is not None else None
            if found is not None and target is not None:
                await self._set_cookies(found)
                if navigation:
                    if found.status in _KEEP_METHOD and method not in ("GET", "HEAD"):
                        self._resend[normalise_url(target)] = (method, body)
                    await _redirect_navigation(route, target)
                    return
                found = await self._follow(found, target, body)
            if found is not None:
                await route.fulfill(
                    status=found.status,
                    headers=_fulfil_headers(found.response_headers),
                    body=found.response_body,
                )
            elif self.fallback is not None:
                self.stats["live"] += 1
                self._live.add(request)
                await route.continue_()
            else:
                self.stats["misses"] += 1
                self.misses.append(Miss(request.url, request.resource_type, _main_nav(request)))
                await route.fulfill(
                    status=404,
                    content_type="text/html; charset=utf-8",
                    body=_miss_page(request.url),
                )

    async def _follow(self, hop: Exchange, target: str, body: bytes) -> Exchange | None:
        """The end of a subresource's redirect chain in the archive; None if a hop is
        missing or the chain is longer than a browser follows."""
        method = hop.method
        for _ in range(MAX_REDIRECTS):
            if hop.status == 303 or (hop.status in (301, 302) and method == "POST"):
                method, body = "GET", b""
            hop = self._lookup(method, target, body)
            if hop is None:
                return None
            target = _redirect_target(hop)
            if target is None:
                return hop
            await self._set_cookies(hop)
        return None

    async def _set_cookies(self, hop: Exchange) -> None:
        """Store the cookies a redirect hop set, as the browser would have."""
        for cookie, expired in _cookies(hop):
            with contextlib.suppress(PlaywrightError):  # one the browser would refuse
                if expired:
                    await self.context.clear_cookies(
                        name=cookie["name"], domain=cookie["domain"], path=cookie["path"]
                    )
                else:
                    await self.context.add_cookies([cookie])


async def _redirect_navigation(route: Route, url: str) -> None:
    """Abandon this navigation for one to ``url``, which the ``goto`` in progress waits
    for: Playwright's HAR replay does this (``har_router.py``); it is not public API."""
    await route._impl_obj._redirect_navigation_request(url)


def _pairs(headers: list[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((h["name"], h["value"]) for h in headers)


def _redirect_target(ex: Exchange) -> str | None:
    """The absolute URL a recorded redirect sends the browser to, if it is one."""
    if ex.status not in _REDIRECTS:
        return None
    location = next((v for k, v in ex.response_headers if k.lower() == "location"), None)
    return urljoin(ex.url, location) if location else None


def _fulfil_headers(headers: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Recorded headers as ``route.fulfill`` takes them: one value per name, repeats of
    Set-Cookie joined by newlines (Playwright splits them again), others by commas."""
    merged: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in _WIRE_HEADERS:
            continue
        if key in merged:
            merged[key] += ("\n" if key == "set-cookie" else ", ") + value
        else:
            merged[key] = value
    return merged


def _cookies(ex: Exchange) -> list[tuple[dict, bool]]:
    """The response's Set-Cookie headers as ``add_cookies`` takes them (RFC 6265 defaults
    for domain and path), each with whether it deletes the cookie (expired)."""
    parts = urlsplit(ex.url)
    default_path = parts.path[: parts.path.rfind("/")] or "/"
    out = []
    for name, header in ex.response_headers:
        if name.lower() != "set-cookie":
            continue
        pair, *attributes = header.split(";")
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            continue
        cookie: dict = {"name": key.strip(), "value": value.strip(), "domain": parts.hostname}
        cookie["path"], expires = default_path, None
        for attribute in attributes:
            attr, _, arg = attribute.partition("=")
            attr, arg = attr.strip().lower(), arg.strip()
            if attr == "domain" and arg:
                cookie["domain"] = "." + arg.lstrip(".")
            elif attr == "path" and arg.startswith("/"):
                cookie["path"] = arg
            elif attr == "max-age" and arg.lstrip("-").isdigit():
                expires = time.time() + int(arg)
            elif attr == "expires" and expires is None:
                with contextlib.suppress(TypeError, ValueError):
                    expires = parsedate_to_datetime(arg).timestamp()
            elif attr in ("secure", "httponly"):
                cookie["secure" if attr == "secure" else "httpOnly"] = True
            elif attr == "samesite" and arg.capitalize() in ("Strict", "Lax", "None"):
                cookie["sameSite"] = arg.capitalize()
        if expires is not None:
            cookie["expires"] = expires
        out.append((cookie, expires is not None and expires <= time.time()))
    return out


def _main_nav(request: Request) -> bool:
    if not request.is_navigation_request():
        return False
    try:
        return request.frame.parent_frame is None
    except PlaywrightError:  # a service worker's request has no frame
        return False


def _miss_page(url: str) -> bytes:
    text = escape(f"not in the archive: {url}")
    return f"<!doctype html><title>{text}</title><p>{text}</p>".encode()
