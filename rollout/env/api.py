"""The api mode's backend: ``search`` calls the search backend, ``visit`` fetches a page over
HTTP and reads it (:mod:`rollout.env.reader`: HTML as Markdown or by main-content
extraction, PDFs as text, any charset). No browser: JavaScript never runs, so content a
page renders with JavaScript is not seen here; an element that a script fills from a
``data-src`` URL gets a link to that source, which ``visit`` reads.

Each episode has its own cookie jar. Every fetch goes by the process's
:class:`~rollout.net.core.Net`: robots.txt, a politeness slot for its host, the address
rule after DNS resolution, and the episode's upstream proxy when there are any.
Redirects are followed by hand, each target checked against the URL allowlist (and
each hop's address and robots.txt again), so a redirect cannot take the agent
somewhere it could not go itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from http import HTTPStatus
from urllib.parse import urlencode, urljoin, urlsplit

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from rollout.agent.actions import Action, Search, Visit
from rollout.archive.store import Exchange
from rollout.env.core import InfraError, ToolError
from rollout.env.observation import Observation
from rollout.env.reader import Reader, Unreadable, html_to_markdown, read_page
from rollout.net.core import Net, RobotsRefused
from rollout.net.proxies import DIRECT, Fetched, NoUpstream, Upstream, fetch_via
from rollout.net.resolver import AddressRefused, describe_refusal
from rollout.net.search_client import SearchClient, SearchError, SearchHit
from rollout.net.urls import UrlRefused, check_url

__all__ = ["ApiBackend", "html_to_markdown"]

MAX_PAGE_BYTES = 5 << 20
MAX_REDIRECTS = 5
_STATUSES = {s.value for s in HTTPStatus}


class ApiBackend:
    """api mode's actions for one episode. ``net`` is what the process's episodes share (the
    allowlist, the safe resolver, politeness and the proxy pool); ``episode`` names this
    one to the pool, so its fetches keep one upstream."""

    def __init__(
        self,
        search: SearchClient,
        net: Net,
        *,
        episode: str = "episode",
        timeout_s: float = 10.0,
        reader: Reader = "markdown",
        max_page_bytes: int = MAX_PAGE_BYTES,
    ):
        self.search_client = search
        self.net = net
        self.policy = net.policy
        self.episode = episode
        self.reader = reader
        self.max_page_bytes = max_page_bytes
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        # One cookie jar per episode: cookies persist within it and never leak across.
        self.cookies = aiohttp.CookieJar(unsafe=True)
        self._sessions: dict[str, aiohttp.ClientSession] = {}  # per upstream (or direct)
        self._url: str | None = None

    @property
    def url(self) -> str | None:
        return self._url

    async def start(self, start_url: str) -> Observation:
        self._url = start_url
        return Observation(
            "Use search to find pages and visit to read them.",
            url=start_url,
            summary="ready",
        )

    async def act(self, action: Action) -> Observation:
        if isinstance(action, Search):
            return await self._search(action.query)
        if isinstance(action, Visit):
            return await self._visit(action.url)
        raise ToolError(f"{action.name} is not available in api mode")

    async def _search(self, query: str) -> Observation:
        try:
            hits = await self._search_hits(query)
        except SearchError as e:
            raise ToolError(f"search failed: {e}") from None
        if not hits:
            return Observation(f'No results for "{query}".', summary="Got 0 results")
        lines = [f'Search results for "{query}":']
        for i, h in enumerate(hits, 1):
            lines.append(f"{i}. {h.title}\n   {h.url}\n   {h.snippet}")
        top = urlsplit(hits[0].url).path or hits[0].url
        return Observation("\n".join(lines), summary=f"Got {len(hits)} results, top: {top}")

    async def _search_hits(self, query: str) -> list[SearchHit]:
        """The backend's hits, or in replay the archived ones (recorded as a JSON list under
        a URL naming the endpoint, the query and the result count)."""
        client, net = self.search_client, self.net
        key = f"{client.endpoint}?{urlencode({'q': query, 'k': client.top_k})}"
        if net.archive_mode == "replay":
            ex = net.archive.lookup("GET", key, episode=self.episode)
            if ex is not None:
                return [SearchHit(**hit) for hit in json.loads(ex.response_body)]
            if self.net.env.archive_fallback != "live":
                raise ToolError(f"not in the archive: the search {query!r}")
        hits = await client.search(query)
        if net.writer is not None:
            body = json.dumps([dataclasses.asdict(h) for h in hits], ensure_ascii=False).encode()
            ex = Exchange(
                method="GET", url=key, request_headers=(), request_body=b"", status=200,
                reason="OK", response_headers=(("Content-Type", "application/json"),),
                response_body=body, episode=self.episode, kind="search",
            )  # fmt: skip
            net.writer.write(ex)
        return hits

    async def _visit(self, url: str) -> Observation:
        try:
            return await self._fetch(url)
        except NoUpstream as e:  # every proxy is benched: not the agent's doing
            raise InfraError(str(e)) from None
        except aiohttp.ClientError as e:
            refused = describe_refusal(e)
            if refused is not None:
                raise ToolError(f"{url} is not an allowed site: {refused}") from None
            raise ToolError(f"could not fetch {url}: {type(e).__name__}: {e}") from None

    def _session_for(self, upstream: Upstream) -> aiohttp.ClientSession:
        """The episode's session through ``upstream`` (all share the episode's cookies)."""
        if upstream.name not in self._sessions:
            self._sessions[upstream.name] = self.net.session(upstream, cookie_jar=self.cookies)
        return self._sessions[upstream.name]

    async def _get(self, url: str) -> Fetched:
        """One GET under the egress rules: the address rule (resolved and checked here first,
        since an upstream proxy resolves names itself; the direct connection checks again
        what it connects to), robots.txt, a politeness slot, then the request through the
        episode's upstream. In replay the archive answers instead, and nothing is sent."""
        net = self.net
        if net.archive_mode == "replay":
            ex = net.archive.lookup("GET", url, episode=self.episode)
            if ex is not None:
                headers = CIMultiDictProxy(CIMultiDict(ex.response_headers))
                return Fetched(ex.status, headers, ex.response_body, url, DIRECT, None)
            if net.env.archive_fallback != "live":
                raise ToolError(f"not in the archive: {url}")
        got = await self._get_live(url)
        if net.writer is not None:
            reason = HTTPStatus(got.status).phrase if got.status in _STATUSES else ""
            ex = Exchange(
                method="GET", url=url, request_headers=(("User-Agent", net.user_agent),),
                request_body=b"", status=got.status, reason=reason,
                response_headers=tuple(got.headers.items()), response_body=got.body,
                episode=self.episode, kind="page",
            )  # fmt: skip
            net.writer.write(ex)
        return got

    async def _get_live(self, url: str) -> Fetched:
        try:
            await self.net.check_host(url)
            await self.net.robots_check(url)
        except RobotsRefused as e:
            raise ToolError(f"{url} is off limits: {e}") from None
        except AddressRefused as e:
            raise ToolError(f"{url} is not an allowed site: {e.reason}") from None
        except OSError as e:  # the name does not resolve
            raise ToolError(f"could not fetch {url}: {e}") from None
        async with self.net.limiter.slot(url):
            return await fetch_via(
                self.net.proxies, self.episode, "GET", url, session_for=self._session_for,
                max_bytes=self.max_page_bytes, allow_redirects=False, timeout=self.timeout,
            )  # fmt: skip

    async def _fetch(self, url: str) -> Observation:
        for _ in range(MAX_REDIRECTS + 1):
            got = await self._get(url)
            location = got.headers.get("Location")
            if got.status in (301, 302, 303, 307, 308) and location:
                target = urljoin(url, location)
                try:  # each hop is checked as if the agent had asked for it
                    url = check_url(target, self.policy)
                except UrlRefused as e:
                    raise ToolError(f"redirect to {target} refused: {e.reason}") from None
                continue
            break
        else:
            raise ToolError(f"too many redirects (more than {MAX_REDIRECTS})")
        self._url = url
        if len(got.body) > self.max_page_bytes:
            cap = self.max_page_bytes
            size = f"{cap / (1 << 20):g} MB" if cap >= 1 << 20 else f"{cap / 1024:g} KB"
            raise ToolError(f"the page is larger than {size}: not read")
        fragment = urlsplit(url).fragment or None
        read = functools.partial(
            read_page, got.body, got.headers.get("Content-Type"), url,
            reader=self.reader, fragment=fragment,
        )  # fmt: skip
        try:  # a large page takes a while to read: not on the event loop
            page = await asyncio.to_thread(read) if len(got.body) > (256 << 10) else read()
        except Unreadable as e:
            raise ToolError(str(e)) from None
        error = f"HTTP {got.status}" if got.status >= 400 else None
        summary = f"HTTP {got.status}, {page.title or url}"[:100]
        return Observation(
            page.text, url=url, title=page.title, error=error, summary=summary,
            page_text=page.text,
        )  # fmt: skip

    async def recover(self) -> None:
        pass  # a timed-out request was cancelled with its task: nothing lingers

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        if self.net.proxies is not None:  # its upstream counts one episode fewer
            self.net.proxies.release(self.episode)
