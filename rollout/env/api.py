"""The api mode's backend: ``search`` calls the search API, ``visit`` fetches a page over
HTTP and turns its HTML into Markdown (markdownify). No browser: JavaScript never
runs, so content a page renders with JavaScript is not seen here; an element that a
script fills from a ``data-src`` URL gets a link to that source, which ``visit`` reads.

Each episode has its own HTTP session and cookie jar. Redirects are followed by
hand, each target checked against the URL allowlist, so a redirect cannot take
the agent somewhere it could not go itself.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

import aiohttp
from bs4 import BeautifulSoup
from markdownify import markdownify

from rollout.actions import Action, Search, Visit
from rollout.env.core import ToolError
from rollout.env.observation import Observation
from rollout.search_client import SearchClient, SearchError, read_limited
from rollout.urls import UrlPolicy, UrlRefused, check_url

MAX_PAGE_BYTES = 5 << 20
MAX_REDIRECTS = 5
_BLANK_LINES = re.compile(r"\n{3,}")


_ANCHOR = "\ue000anchor\ue000"


def html_to_markdown(html: str, fragment: str | None = None) -> tuple[str | None, str]:
    """(title, Markdown of the page's main region, or of its body when it has none).

    With a ``fragment`` naming an element id on the page, the text starts at that
    element, as a browser scrolls to it: long pages are read section by section.
    """
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "template"]):
        tag.decompose()
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    for el in soup.find_all(attrs={"data-src": True}):  # filled by JavaScript from a source:
        link = soup.new_tag("a", href=el["data-src"])  # here, a link to read it by
        link.string = "loaded by JavaScript from this source"
        para = soup.new_tag("p")
        para.append(link)
        el.append(para)
    main = soup.find("main") or soup.find(attrs={"role": "main"}) or soup.body or soup
    target = (
        (soup.find(id=fragment) or soup.find("a", attrs={"name": fragment})) if fragment else None
    )
    if target is not None:
        target.insert(0, _ANCHOR)
        if main is not soup and _ANCHOR not in str(main):
            main = soup.body or soup  # the anchor lies outside the main region
    text = markdownify(
        str(main), heading_style="ATX", bullets="-",
        escape_underscores=False, escape_asterisks=False, escape_misc=False,
    )  # fmt: skip
    if target is not None and _ANCHOR in text:
        text = text[text.index(_ANCHOR) + len(_ANCHOR) :]
    return title, _BLANK_LINES.sub("\n\n", text).strip()


class ApiBackend:
    def __init__(self, search: SearchClient, policy: UrlPolicy, *, timeout_s: float = 10.0):
        self.search_client = search
        self.policy = policy
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        # One cookie jar per episode: cookies persist within it and never leak across.
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
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
            hits = await self.search_client.search(query)
        except SearchError as e:
            raise ToolError(f"search failed: {e}") from None
        if not hits:
            return Observation(f'No results for "{query}".', summary="Got 0 results")
        lines = [f'Search results for "{query}":']
        for i, h in enumerate(hits, 1):
            lines.append(f"{i}. {h.title}\n   {h.url}\n   {h.snippet}")
        top = urlsplit(hits[0].url).path or hits[0].url
        return Observation("\n".join(lines), summary=f"Got {len(hits)} results, top: {top}")

    async def _visit(self, url: str) -> Observation:
        try:
            return await self._fetch(url)
        except aiohttp.ClientError as e:
            raise ToolError(f"could not fetch {url}: {type(e).__name__}: {e}") from None

    async def _fetch(self, url: str) -> Observation:
        for _ in range(MAX_REDIRECTS + 1):
            async with self.session.get(url, allow_redirects=False, timeout=self.timeout) as r:
                if r.status in (301, 302, 303, 307, 308) and "Location" in r.headers:
                    target = urljoin(url, r.headers["Location"])
                    try:
                        url = check_url(target, self.policy)
                    except UrlRefused as e:
                        raise ToolError(f"redirect to {target} refused: {e.reason}") from None
                    continue
                body = await read_limited(r, MAX_PAGE_BYTES)
                ctype = r.headers.get("Content-Type", "")
                status = r.status
            break
        else:
            raise ToolError(f"too many redirects (more than {MAX_REDIRECTS})")
        self._url = url
        if len(body) > MAX_PAGE_BYTES:
            raise ToolError(f"the page is larger than {MAX_PAGE_BYTES >> 20} MB")
        text = body.decode("utf-8", errors="replace")
        if "html" in ctype:
            title, text = html_to_markdown(text, urlsplit(url).fragment or None)
        elif "json" in ctype or ctype.startswith("text/"):
            title = None
        else:
            raise ToolError(f"cannot read a page of type {ctype or 'unknown'}")
        error = f"HTTP {status}" if status >= 400 else None
        summary = f"HTTP {status}, {title or url}"[:100]
        return Observation(text, url=url, title=title, error=error, summary=summary, page_text=text)

    async def recover(self) -> None:
        pass  # a timed-out request was cancelled with its task: nothing lingers

    async def close(self) -> None:
        await self.session.close()
