"""Web search behind one interface: ``await client.search(query) -> list[SearchHit]``.

The backends (``search.backend``), each a :class:`SearchClient` that only says how to
ask and how to read the answer:

- ``local``: any endpoint speaking the local web's JSON (``GET {url}?q=...&k=N`` ->
  ``{"results": [{"url", "title", "snippet"}]}``), the local web's ``/api/search`` by default;
- ``searxng``: a SearXNG instance's JSON API (``GET {base}/search?q=...&format=json``);
- ``serper``, ``brave`` and ``tavily``: hosted APIs, keyed by an environment variable.

What they share: every request has a timeout; connection errors, timeouts, 429 and
5xx are retried with exponential backoff (``Retry-After`` honoured, capped); a refused
key or a bad request fails at once; an answer too large, malformed or of the wrong
shape is a :class:`SearchError`, never a crash; ``search.rate_limit_per_s`` is kept by
one limiter per backend and endpoint, shared by every client of the process. An API
key never appears in a message.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from shared.config import ConfigError, SearchConfig

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 2 << 20
MAX_RETRY_AFTER_S = 10.0  # a longer Retry-After is cut to this: an episode cannot wait an hour


async def read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or ``limit + 1`` bytes when it is longer (the caller refuses it).

    ``StreamReader.read(n)`` returns what has arrived so far, up to n bytes, so a
    single call can cut a body short: read until the end or past the limit.
    """
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(64 << 10):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[: limit + 1]


class SearchError(RuntimeError):
    """The search backend failed or answered something unreadable."""


@dataclass(frozen=True)
class SearchHit:
    url: str  # absolute
    title: str
    snippet: str  # plain text: tags stripped, entities decoded, whitespace collapsed


# ----------------------------------------------------------------------------- rate limit


class RateLimiter:
    """Starts of requests at least ``1 / per_s`` seconds apart, whichever task or loop asks.

    Each caller books the next free slot under a thread lock and sleeps until it, so
    no asyncio primitive ties the limiter to one event loop.
    """

    def __init__(self, per_s: float):
        self.interval = 1.0 / per_s
        self._next = 0.0
        self._lock = threading.Lock()

    async def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


_LIMITERS: dict[tuple[str, str], RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(backend: str, endpoint: str, per_s: float) -> RateLimiter | None:
    """The process's limiter for ``backend`` at ``endpoint`` (None when ``per_s`` is 0); when
    clients ask for different rates, the slowest holds for all of them."""
    if per_s <= 0:
        return None
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.setdefault((backend, endpoint), RateLimiter(per_s))
        limiter.interval = max(limiter.interval, 1.0 / per_s)
    return limiter


# ----------------------------------------------------------------------------- answers


_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_SPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Plain text of an HTML fragment: ``"a <strong>b</strong>  &amp;\\nc"`` -> ``"a b & c"``."""
    return _SPACE.sub(" ", html.unescape(_TAG.sub("", text))).strip()


def _items(data: Any, *path: str, optional: bool = False) -> list[dict[str, Any]]:
    """The list of result objects at ``path`` (``web.results``); [] when ``optional`` and absent."""
    where = ".".join(path)
    for key in path:
        if not isinstance(data, dict):
            raise ValueError(f"expected an object holding {where}")
        if key not in data:
            if optional:
                return []
            raise ValueError(f"no {where} in the answer")
        data = data[key]
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise ValueError(f"{where} is not a list of objects")
    return data


def _hit(item: dict[str, Any], url: str, title: str, snippet: str, *, markup: bool) -> SearchHit:
    """One hit from a result object's fields; ``markup``: title and snippet may hold HTML."""
    link = item.get(url)
    if not isinstance(link, str) or not link:
        raise ValueError(f"a result without a {url}")
    texts = ["" if item.get(k) is None else str(item[k]) for k in (title, snippet)]
    if markup:
        texts = [clean_text(t) for t in texts]
    return SearchHit(link, *texts)


def _retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After: <seconds>`` header; None when absent or not a number."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class _Request:
    method: str
    params: dict[str, str] | None = None
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


# ----------------------------------------------------------------------------- backends


class SearchClient:
    """The ``local`` backend, and the request loop every backend shares (timeout, retries,
    rate limit, size cap, answer checks); a backend overrides ``_request`` and ``_parse``."""

    backend = "local"
    what = "the local search endpoint"  # names the backend in messages

    def __init__(
        self,
        endpoint: str,
        session: aiohttp.ClientSession,
        *,
        top_k: int = 10,
        timeout_s: float = 5.0,
        retries: int = 2,
        rate_limit_per_s: float = 0.0,
        backoff_s: float = 0.1,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
    ):
        self.endpoint = endpoint
        self.session = session
        self.top_k = top_k
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.limiter = shared_limiter(self.backend, endpoint, rate_limit_per_s)

    async def search(self, query: str) -> list[SearchHit]:
        """Up to ``top_k`` hits, best first ([] when none); :class:`SearchError` on failure."""
        tries = self.retries + 1
        for attempt in range(1, tries + 1):
            try:
                return await self._once(query)
            except TimeoutError:
                reason, retry_after = f"no answer within {self.timeout.total} s", None
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                reason, retry_after = f"{type(e).__name__}: {e}", None
            except _Retryable as e:
                reason, retry_after = e.reason, e.retry_after
            if attempt < tries:
                delay = self._delay(attempt, retry_after)
                log.info(
                    "%s search: %s; retry %d of %d in %.2f s",
                    self.backend, reason, attempt, self.retries, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
        raise SearchError(f"{self.what} failed after {tries} tries: {reason}")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter, or the server's ``Retry-After`` (capped) if longer."""
        backoff = self.backoff_s * 2 ** (attempt - 1) * random.uniform(1.0, 1.5)
        if retry_after is None:
            return backoff
        return max(backoff, min(retry_after, self.max_retry_after_s))

    async def _once(self, query: str) -> list[SearchHit]:
        req = self._request(query)
        if self.limiter is not None:
            await self.limiter.wait()
        async with self.session.request(
            req.method, self.endpoint, params=req.params, json=req.json, headers=req.headers,
            timeout=self.timeout,
        ) as r:  # fmt: skip
            if r.status == 429 or r.status >= 500:
                raise _Retryable(f"HTTP {r.status}", _retry_after(r.headers.get("Retry-After")))
            body = await read_limited(r, MAX_RESPONSE_BYTES)
            status = r.status
        if status in (401, 403):
            raise SearchError(self._refused(status))
        if status != 200:
            detail = self._redact(clean_text(body[:300].decode("utf-8", "replace")))
            raise SearchError(f"{self.what} rejected the request (HTTP {status}): {detail}")
        if len(body) > MAX_RESPONSE_BYTES:
            raise SearchError(f"{self.what} answered more than {MAX_RESPONSE_BYTES >> 20} MB")
        try:
            data = json.loads(body)
        except ValueError:
            raise SearchError(f"{self.what} answered something that is not JSON") from None
        try:
            return self._parse(data)[: self.top_k]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SearchError(f"unexpected answer from {self.what}: {e}") from None

    def _request(self, query: str) -> _Request:
        return _Request("GET", params={"q": query, "k": str(self.top_k)})

    def _parse(self, data: Any) -> list[SearchHit]:
        hits = [_hit(x, "url", "title", "snippet", markup=False) for x in _items(data, "results")]
        return [SearchHit(urljoin(self.endpoint, h.url), h.title, h.snippet) for h in hits]

    def _refused(self, status: int) -> str:
        return f"{self.what} refused the request (HTTP {status})"

    def _redact(self, text: str) -> str:
        return text


class SearxngClient(SearchClient):
    """A SearXNG instance: ``GET {base}/search?q=&format=json`` -> ``results[].url/title/content``.
    It has no count parameter: one page of results, cut to ``top_k``."""

    backend = "searxng"
    what = "the searxng instance"

    def _request(self, query: str) -> _Request:
        return _Request("GET", params={"q": query, "format": "json"})

    def _parse(self, data: Any) -> list[SearchHit]:
        return [_hit(x, "url", "title", "content", markup=True) for x in _items(data, "results")]

    def _refused(self, status: int) -> str:
        hint = " (is `json` in its settings.yml search.formats?)" if status == 403 else ""
        return f"{self.what} refused the request (HTTP {status}){hint}"


class HostedClient(SearchClient):
    """A hosted API: its key (from the environment) goes in a header, never in a message."""

    default_endpoint: str
    key_env: str  # the environment variable read when search.api_key_env is unset
    max_count: int  # most results one request may ask for

    def __init__(self, endpoint: str, session: aiohttp.ClientSession, *, api_key: str, **kw: Any):
        if not api_key:
            raise ConfigError(f"the {self.backend} API needs a key")
        super().__init__(endpoint, session, **kw)
        self._key = api_key

    @property
    def count(self) -> int:
        return min(self.top_k, self.max_count)

    def _refused(self, status: int) -> str:
        return f"{self.what} refused the key (HTTP {status})"

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "[key]")


class SerperClient(HostedClient):
    """Google results through serper.dev: ``POST {"q", "num"}`` with ``X-API-KEY`` ->
    ``organic[].link/title/snippet`` (absent when nothing matched)."""

    backend = "serper"
    what = "the serper API"
    default_endpoint = "https://google.serper.dev/search"
    key_env = "SERPER_API_KEY"
    max_count = 100

    def _request(self, query: str) -> _Request:
        return _Request(
            "POST", json={"q": query, "num": self.count}, headers={"X-API-KEY": self._key}
        )

    def _parse(self, data: Any) -> list[SearchHit]:
        items = _items(data, "organic", optional=True)
        return [_hit(x, "link", "title", "snippet", markup=True) for x in items]


class BraveClient(HostedClient):
    """The Brave Search API: ``GET ?q=&count=`` with ``X-Subscription-Token`` ->
    ``web.results[].url/title/description`` (``web`` absent when nothing matched)."""

    backend = "brave"
    what = "the brave API"
    default_endpoint = "https://api.search.brave.com/res/v1/web/search"
    key_env = "BRAVE_API_KEY"
    max_count = 20

    def _request(self, query: str) -> _Request:
        headers = {"X-Subscription-Token": self._key, "Accept": "application/json"}
        return _Request("GET", params={"q": query, "count": str(self.count)}, headers=headers)

    def _parse(self, data: Any) -> list[SearchHit]:
        items = _items(data, "web", "results", optional=True)
        return [_hit(x, "url", "title", "description", markup=True) for x in items]


class TavilyClient(HostedClient):
    """Tavily: ``POST {"query", "max_results"}`` with ``Authorization: Bearer`` ->
    ``results[].url/title/content``."""

    backend = "tavily"
    what = "the tavily API"
    default_endpoint = "https://api.tavily.com/search"
    key_env = "TAVILY_API_KEY"
    max_count = 20

    def _request(self, query: str) -> _Request:
        body = {"query": query, "max_results": self.count}
        return _Request("POST", json=body, headers={"Authorization": f"Bearer {self._key}"})

    def _parse(self, data: Any) -> list[SearchHit]:
        return [_hit(x, "url", "title", "content", markup=True) for x in _items(data, "results")]


HOSTED: dict[str, type[HostedClient]] = {
    "serper": SerperClient,
    "brave": BraveClient,
    "tavily": TavilyClient,
}
BACKENDS: dict[str, type[SearchClient]] = {
    "local": SearchClient,
    "searxng": SearxngClient,
    **HOSTED,
}


def searxng_endpoint(base: str) -> str:
    """``{base}/search``; a URL already ending in ``/search`` is taken as it is."""
    base = base.rstrip("/")
    return base if urlsplit(base).path.endswith("/search") else f"{base}/search"


def make_search_client(
    config: SearchConfig, web_url: str, session: aiohttp.ClientSession
) -> SearchClient:
    """The client ``config`` describes; ``web_url`` is the local web's base URL (the ``local``
    backend's default endpoint). A missing URL or key is a :class:`ConfigError` naming it."""
    common: dict[str, Any] = dict(
        top_k=config.top_k, timeout_s=config.timeout_s, retries=config.retries,
        rate_limit_per_s=config.rate_limit_per_s,
    )  # fmt: skip
    if config.backend == "local":
        if not config.url and not web_url:
            raise ConfigError("search.backend = 'local' needs search.url or a running local web")
        return SearchClient(config.url or f"{web_url.rstrip('/')}/api/search", session, **common)
    if config.backend == "searxng":
        if not config.url:
            raise ConfigError(
                "search.url is required when search.backend = 'searxng' (the instance's base URL)"
            )
        return SearxngClient(searxng_endpoint(config.url), session, **common)
    cls = HOSTED[config.backend]
    key_env = config.api_key_env or cls.key_env
    key = os.environ.get(key_env, "").strip()
    if not key:
        raise ConfigError(
            f"search.backend = {config.backend!r} needs an API key in the environment "
            f"variable {key_env}, which is unset or empty"
        )
    return cls(config.url or cls.default_endpoint, session, api_key=key, **common)
