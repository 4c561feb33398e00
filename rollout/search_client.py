"""The search backend the api mode (and the oracle) calls: any HTTP endpoint speaking the
local web's JSON (``GET {url}?q=...&k=N`` -> ``{"results": [{"url", "title", "snippet"}]}``).

By default that is the local web's ``/api/search``; ``search.url`` in the config
names another. Each call has a timeout and is retried with backoff on connection
errors and 5xx answers; a malformed answer is a :class:`SearchError`, never a crash.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

MAX_RESPONSE_BYTES = 2 << 20


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
    snippet: str


class SearchClient:
    def __init__(
        self,
        endpoint: str,
        session: aiohttp.ClientSession,
        *,
        top_k: int = 10,
        timeout_s: float = 5.0,
        retries: int = 2,
    ):
        self.endpoint = endpoint
        self.session = session
        self.top_k = top_k
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.retries = retries

    async def search(self, query: str) -> list[SearchHit]:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.1 * 2 ** (attempt - 1))
            try:
                return await self._once(query)
            except (TimeoutError, aiohttp.ClientConnectionError, _Retryable) as e:
                last = e
        raise SearchError(f"search failed after {self.retries + 1} tries: {last!r}")

    async def _once(self, query: str) -> list[SearchHit]:
        params = {"q": query, "k": str(self.top_k)}
        async with self.session.get(self.endpoint, params=params, timeout=self.timeout) as r:
            if r.status >= 500:
                raise _Retryable(f"HTTP {r.status}")
            if r.status != 200:
                raise SearchError(f"search answered HTTP {r.status}")
            body = await read_limited(r, MAX_RESPONSE_BYTES)
        if len(body) > MAX_RESPONSE_BYTES:
            raise SearchError("search answer too large")
        try:
            results = json.loads(body)["results"]
            return [
                SearchHit(urljoin(self.endpoint, str(x["url"])), str(x["title"]), str(x["snippet"]))
                for x in results[: self.top_k]
            ]
        except (ValueError, KeyError, TypeError) as e:
            raise SearchError(f"unreadable search answer: {e}") from None


class _Retryable(Exception):
    pass
