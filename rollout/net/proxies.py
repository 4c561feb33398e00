"""Upstream proxies: which one each episode goes out through, and what to do when one fails.

The open web bans addresses that send it many requests, so training traffic can go
out through a pool of upstream proxies (``env.proxies``: ``http://host:port`` or
``socks5://host:port``, with ``user:pass@`` allowed). The policy, one place for api
mode (:func:`fetch_via`) and the browsers' egress proxy (:mod:`rollout.net.egress`):

- An episode keeps one upstream (:meth:`ProxyPool.assign` is sticky) so a site sees
  one visitor per episode; new episodes go to the healthy upstream with the fewest
  episodes, ties broken round robin.
- An upstream that cannot be connected to, or whose answer looks like a ban
  (:func:`ban_signal`), is benched for ``cooldown_s`` and the episode moves to
  another (:meth:`ProxyPool.failover`). A request that never reached the upstream is
  retried on the next one; a GET/HEAD answered with a ban is retried once.
- A request sent on a kept-alive connection that the far side had closed (tinyproxy,
  for one, closes after every answer while its answers announce HTTP/1.1) is sent
  again, whatever its method, as browsers do: the far side closed before answering,
  on a connection it had already finished with. The session must carry
  :data:`RESEND_TRACE` to know a kept-alive connection from a new one.
- When every upstream is benched :class:`NoUpstream` is raised: the caller ends the
  episode as an infrastructure error.

Credentials never leave :class:`Upstream`: its name, repr and every message show
``scheme://host:port`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import aiohttp
import aiohttp_socks
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict, CIMultiDictProxy

log = logging.getLogger(__name__)

SCHEMES = ("http", "socks5")
BAN_HEAD_BYTES = 8 << 10  # how much of a body is searched for a CAPTCHA page
HEAD_WAIT_S = 0.5  # how long, after its first chunk, a body's head is waited for
# Lowercase markers of a bot check, searched in the head of a 200/403/503 body. Kept
# specific: words that a normal page about CAPTCHAs would rarely all avoid are not here.
CAPTCHA_MARKERS = (
    b"g-recaptcha", b"h-captcha", b"hcaptcha.com", b"cf-challenge", b"cf_chl_",
    b"challenges.cloudflare.com", b"captcha-delivery.com", b"unusual traffic",
    b"are you a robot", b"are you a human", b"verify you are human", b"not a robot",
    b"/sorry/index", b"captcha",
)  # fmt: skip
MAX_RESENDS = 8  # sendings on kept-alive connections found closed, per request
# Failures that happen before a request reaches the upstream's far side: safe to retry.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientProxyConnectionError,
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp_socks.ProxyConnectionError,
    aiohttp_socks.ProxyError,
    aiohttp_socks.ProxyTimeoutError,
)


class NoUpstream(RuntimeError):
    """Every upstream proxy is benched: the episode ends as an infrastructure error."""


@dataclass(frozen=True)
class Upstream:
    """One upstream proxy. ``name`` (also its ``str`` and ``repr``) has no credentials."""

    name: str  # scheme://host:port
    scheme: str  # "http" | "socks5" | "direct"
    host: str
    port: int
    url: str = field(repr=False)  # as configured, credentials included: never show it
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, url: str, index: int = 0) -> Upstream:
        """An upstream from ``http://[user:pass@]host:port`` or ``socks5://...``, else ValueError
        (whose message names the proxy by position, host and port, never its credentials)."""
        try:
            parts = urlsplit(url.strip())
            host, port = parts.hostname, parts.port
        except ValueError as e:  # a port that is not a number, a bad IPv6 literal
            raise ValueError(f"env.proxies[{index}]: not a proxy URL ({e})") from None
        where = f"env.proxies[{index}] ({parts.scheme}://{host or '?'}:{port or '?'})"
        if parts.scheme not in SCHEMES:
            raise ValueError(f"{where}: the scheme must be http or socks5")
        if not host:
            raise ValueError(f"{where}: no host")
        if port is None:
            raise ValueError(f"{where}: no port (write {parts.scheme}://host:port)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{where}: a proxy URL has no path, query or fragment")
        shown = f"[{host}]" if ":" in host else host
        return cls(
            name=f"{parts.scheme}://{shown}:{port}",
            scheme=parts.scheme,
            host=host,
            port=port,
            url=url.strip(),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


DIRECT = Upstream(name="direct", scheme="direct", host="", port=0, url="")


def connector(
    upstream: Upstream, *, resolver: AbstractResolver | None = None
) -> aiohttp.BaseConnector:
    """A new connector reaching the web through ``upstream`` (or directly, for :data:`DIRECT`).

    ``resolver`` resolves the direct path's and an http upstream's names; a socks5
    upstream resolves the sites' names itself (``rdns``), so it never sees them.
    """
    if upstream.scheme == "socks5":
        return aiohttp_socks.ProxyConnector.from_url(upstream.url, rdns=True)
    return aiohttp.TCPConnector(resolver=resolver)


def request_kwargs(upstream: Upstream, url: str, headers: Mapping[str, str] | None = None) -> dict:
    """Keyword arguments for ``session.request(method, url, **kwargs)`` sending it through
    ``upstream``, with ``headers`` (the caller's) merged in.

    An http upstream's credentials go in ``proxy_headers`` (used for an https site's
    CONNECT) and, for an http site, in the request's own ``Proxy-Authorization`` header
    (aiohttp sends ``proxy_headers`` only with CONNECT).
    """
    kwargs: dict = {"headers": headers} if headers is not None else {}
    if upstream.scheme != "http":
        return kwargs  # direct, or socks5 (the connector does it)
    kwargs["proxy"] = upstream.name
    if upstream.username is not None:
        auth = aiohttp.encode_basic_auth(upstream.username, upstream.password or "")
        kwargs["proxy_headers"] = {"Proxy-Authorization": auth}
        if not url.lower().startswith("https:"):
            merged = CIMultiDict(headers or {})
            merged["Proxy-Authorization"] = auth
            kwargs["headers"] = merged
    return kwargs


@dataclass
class _State:
    upstream: Upstream
    assigned: int = 0
    requests: int = 0
    failures: int = 0
    bans: int = 0
    benched_until: float = float("-inf")
    last_reason: str = ""


class ProxyPool:
    """Upstream proxies shared by every episode of a process: sticky assignment,
    rotation, benching with a cool-down (see the module docstring)."""

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if cooldown_s <= 0:
            raise ValueError("cooldown_s must be positive")
        parsed = [Upstream.parse(u, i) for i, u in enumerate(upstreams)]
        if len({u.name for u in parsed}) != len(parsed):
            raise ValueError("env.proxies: the same proxy is listed twice")
        self.upstreams = tuple(parsed)
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._states = {u.name: _State(u) for u in parsed}
        self._episodes: dict[str, Upstream] = {}
        self._cursor = 0
        self._connectors: dict[tuple[str, int], aiohttp.BaseConnector] = {}

    def __len__(self) -> int:
        return len(self.upstreams)

    # ------------------------------------------------------------------ assignment

    def healthy(self) -> list[Upstream]:
        now = self._clock()
        return [u for u in self.upstreams if self._states[u.name].benched_until <= now]

    def assign(self, episode: str) -> Upstream:
        """The episode's upstream: the same one until it is released or failed over;
        :data:`DIRECT` for an empty pool; :class:`NoUpstream` when all are benched."""
        if not self.upstreams:
            return DIRECT
        current = self._episodes.get(episode)
        if current is not None:
            return current
        return self._pick(episode)

    def _pick(self, episode: str) -> Upstream:
        healthy = self.healthy()
        if not healthy:
            raise NoUpstream(self._none_left())
        n = len(self.upstreams)
        rotated = [self.upstreams[(self._cursor + i) % n] for i in range(n)]
        choice = min(
            (u for u in rotated if u in healthy), key=lambda u: self._states[u.name].assigned
        )
        self._cursor = (self.upstreams.index(choice) + 1) % n
        self._episodes[episode] = choice
        self._states[choice.name].assigned += 1
        return choice

    def failover(
        self, episode: str, upstream: Upstream, reason: str, *, ban: bool = False
    ) -> Upstream:
        """Bench ``upstream`` (unless it already is) and move the episode to a healthy one,
        which is returned; :class:`NoUpstream` when none is left (the episode is released).

        ``ban`` counts the event as a ban rather than a connection failure. When the
        episode has already moved on (a concurrent request failed over first) its
        current upstream is kept.
        """
        if not self.upstreams:
            raise NoUpstream(f"the direct connection failed: {reason}")
        state = self._states[upstream.name]
        state.bans += ban
        state.failures += not ban
        now = self._clock()
        if state.benched_until <= now:
            state.benched_until = now + self.cooldown_s
            state.last_reason = reason
            log.warning("proxy %s benched for %.0f s: %s", upstream, self.cooldown_s, reason)
        current = self._episodes.get(episode)
        if current is not None and current != upstream and current in self.healthy():
            return current
        self.release(episode)
        try:
            return self._pick(episode)
        except NoUpstream:
            raise NoUpstream(f"{self._none_left()} (last: {upstream}: {reason})") from None

    def release(self, episode: str) -> None:
        """The episode is over (or leaves its upstream): it no longer counts as assigned."""
        upstream = self._episodes.pop(episode, None)
        if upstream is not None:
            self._states[upstream.name].assigned -= 1

    def note_request(self, upstream: Upstream) -> None:
        """Count one answered request through ``upstream``."""
        if upstream.name in self._states:
            self._states[upstream.name].requests += 1

    def _none_left(self) -> str:
        now = self._clock()
        soonest = min(s.benched_until for s in self._states.values()) - now
        return (
            f"all {len(self.upstreams)} upstream proxies are benched "
            f"(the first is back in {max(soonest, 0):.0f} s)"
        )

    def stats(self) -> dict[str, dict]:
        """Per upstream name: assigned episodes, requests, failures, bans, benched
        (bool), benched_s (seconds left) and the reason it was last benched."""
        now = self._clock()
        return {
            name: {
                "assigned": s.assigned,
                "requests": s.requests,
                "failures": s.failures,
                "bans": s.bans,
                "benched": s.benched_until > now,
                "benched_s": max(0.0, s.benched_until - now),
                "reason": s.last_reason,
            }
            for name, s in self._states.items()
        }

    # ------------------------------------------------------------------ connections

    def connector(
        self, upstream: Upstream, *, resolver: AbstractResolver | None = None
    ) -> aiohttp.BaseConnector:
        """The pool's shared connector for ``upstream`` (and ``resolver``): sessions use it
        with ``connector_owner=False``; :meth:`close` closes them all."""
        key = (upstream.name, id(resolver))
        if key not in self._connectors or self._connectors[key].closed:
            self._connectors[key] = connector(upstream, resolver=resolver)
        return self._connectors[key]

    async def close(self) -> None:
        for c in self._connectors.values():
            await c.close()
        self._connectors.clear()


# ---------------------------------------------------------------------------- bans


def ban_signal(status: int, headers: Mapping[str, str], body_head: bytes) -> str | None:
    """Why an answer looks like the site banning the upstream's address, or None.

    429 (too many requests) and 403 (forbidden) are bans; so is a 200/403/503 page
    whose first :data:`BAN_HEAD_BYTES` (decompressed when gzip or deflate) hold a
    marker of a bot check (:data:`CAPTCHA_MARKERS`: reCAPTCHA, hCaptcha, Cloudflare's
    challenge, "unusual traffic", "are you a robot", ...). Only html/text bodies are
    searched, so a binary file that happens to hold the bytes does not count.
    """
    if status == 429:
        return "HTTP 429"
    if status in (200, 403, 503):
        kind = headers.get("Content-Type", "text/html").lower()
        if "html" in kind or kind.startswith("text/"):
            head = _decoded(body_head, headers.get("Content-Encoding", "")).lower()
            if any(m in head for m in CAPTCHA_MARKERS):
                return "a CAPTCHA page"
    if status == 403:
        return "HTTP 403"
    return None


def _decoded(head: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        wbits = 47 if encoding != "deflate" else zlib.MAX_WBITS  # 47: gzip or zlib header
        try:
            return zlib.decompressobj(wbits).decompress(head, BAN_HEAD_BYTES)
        except zlib.error:
            return b""
    return head if not encoding or encoding == "identity" else b""


# ---------------------------------------------------------------------------- stale connections


class _Attempt:
    """One sending of a request: whether it went out on a connection taken from the pool."""

    reused = False


async def _on_reuse(session, ctx, params) -> None:
    if isinstance(ctx.trace_request_ctx, _Attempt):
        ctx.trace_request_ctx.reused = True


# Give sessions that :func:`open_via` sends through ``trace_configs=[RESEND_TRACE]``: it
# is how a request learns that its connection was a kept-alive one.
RESEND_TRACE = aiohttp.TraceConfig()
RESEND_TRACE.on_connection_reuseconn.append(_on_reuse)
RESEND_TRACE.freeze()
# What a kept-alive connection closed by the far side before any answer raises.
STALE_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)


# ---------------------------------------------------------------------------- the policy


@dataclass
class Opened:
    """An answer being received: ``head`` (up to :data:`BAN_HEAD_BYTES`) is already read
    from ``response``; the rest can still be streamed from ``response.content``."""

    response: aiohttp.ClientResponse
    head: bytes
    upstream: Upstream
    ban: str | None  # set when this is a ban answer returned unretried


@contextlib.asynccontextmanager
async def open_via(
    pool: ProxyPool | None,
    episode: str,
    method: str,
    url: str,
    *,
    session_for: Callable[[Upstream], aiohttp.ClientSession],
    retry_ban: bool = True,
    headers: Mapping[str, str] | None = None,
    **kwargs,
) -> AsyncIterator[Opened]:
    """Send one request through the episode's upstream, with the failover policy.

    ``session_for(upstream)`` is the session to send it with (one whose connector
    goes through that upstream: :meth:`ProxyPool.connector`); ``kwargs`` go to
    ``session.request``. A failure to connect fails over and retries on the next
    upstream (at most once per upstream), as does an http upstream's 407 (credentials
    refused; tinyproxy's non-standard 401 is passed on as an answer); a ban fails over
    and, for GET/HEAD when ``retry_ban``, retries once. A request that went out on a
    kept-alive connection which turns out closed before any answer is sent again on
    the same upstream, until it goes out on a new connection (at most
    :data:`MAX_RESENDS` times; the session must carry :data:`RESEND_TRACE`; aiohttp
    does it once by itself for idempotent methods; the direct path too). Other errors
    after the request was sent propagate, as do :class:`NoUpstream` and, on the direct
    path (no pool, or an empty one), every other error.
    """
    upstream = pool.assign(episode) if pool is not None else DIRECT
    connects_left = len(pool) if pool is not None else 0
    ban_retries = 1 if retry_ban and method.upper() in ("GET", "HEAD") else 0
    resends = MAX_RESENDS
    async with contextlib.AsyncExitStack() as stack:
        while True:
            attempt = _Attempt()
            try:
                response = await stack.enter_async_context(
                    session_for(upstream).request(
                        method,
                        url,
                        trace_request_ctx=attempt,
                        **kwargs,
                        **request_kwargs(upstream, url, headers),
                    )
                )
            except CONNECT_ERRORS as e:
                if upstream is DIRECT or connects_left <= 0:
                    raise
                connects_left -= 1
                upstream = pool.failover(episode, upstream, f"{type(e).__name__}: {e}")
                continue
            except STALE_ERRORS as e:
                if not (attempt.reused and resends > 0 and _replayable(kwargs.get("data"))):
                    raise
                resends -= 1
                log.info(
                    "%s %s: its kept-alive connection was closed (%s): sent again", method, url, e
                )
                continue
            if response.status == 407 and upstream.scheme == "http" and connects_left > 0:
                # The proxy refused our credentials: the request never reached the site.
                connects_left -= 1
                response.release()
                await stack.aclose()
                upstream = pool.failover(episode, upstream, "HTTP 407 (proxy credentials refused)")
                continue
            head = await _read_head(response)
            if pool is not None:
                pool.note_request(upstream)
            ban = ban_signal(response.status, response.headers, head) if pool else None
            if ban is None or upstream is DIRECT:
                yield Opened(response, head, upstream, None)
                return
            served = upstream
            upstream = pool.failover(episode, upstream, ban, ban=True)
            if ban_retries <= 0:
                yield Opened(response, head, served, ban)
                return
            ban_retries -= 1
            response.release()
            await stack.aclose()


def _replayable(data) -> bool:
    """Whether a request body can be sent a second time as it was the first."""
    return data is None or isinstance(data, (bytes, bytearray, str))


async def _read_head(response: aiohttp.ClientResponse) -> bytes:
    """The first bytes of a body that could be a CAPTCHA page (see :func:`ban_signal`), so
    bans are seen before anything is relayed: up to :data:`BAN_HEAD_BYTES`, and no more
    than what arrives within :data:`HEAD_WAIT_S` after the first chunk, so a slow
    stream is not held back. Nothing for other answers."""
    kind = response.headers.get("Content-Type", "text/html").lower()
    if response.status not in (200, 403, 503) or "event-stream" in kind:
        return b""
    if "html" not in kind and not kind.startswith("text/"):
        return b""
    chunks, size = [], 0
    deadline = asyncio.get_running_loop().time() + HEAD_WAIT_S
    while size < BAN_HEAD_BYTES:
        left = deadline - asyncio.get_running_loop().time()
        if chunks and left <= 0:
            break
        try:
            chunk = await asyncio.wait_for(
                response.content.read(BAN_HEAD_BYTES - size), left if chunks else None
            )
        except TimeoutError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class Fetched:
    """A whole answer (body capped) and the upstream that served it."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes  # at most max_bytes + 1 bytes: longer means the body was cut
    url: str  # the final URL
    upstream: Upstream
    ban: str | None  # the ban signal when the answer is a ban that was not retried


async def fetch_via(
    pool: ProxyPool | None,
    episode: str,
    method: str,
    url: str,
    *,
    session_for: Callable[[Upstream], aiohttp.ClientSession],
    max_bytes: int = 5 << 20,
    retry_ban: bool = True,
    **kwargs,
) -> Fetched:
    """:func:`open_via`, body read (up to ``max_bytes + 1`` bytes: more means too big).

    In api mode: ``await fetch_via(net.proxies, episode_id, "GET", url,
    session_for=sessions.get)`` with one session per (episode, upstream), each on
    ``pool.connector(upstream, resolver=...)`` with ``connector_owner=False``; catch
    :class:`NoUpstream` as an infrastructure error.
    """
    async with open_via(
        pool, episode, method, url, session_for=session_for, retry_ban=retry_ban, **kwargs
    ) as got:
        chunks, size = [got.head], len(got.head)
        while size <= max_bytes:
            chunk = await got.response.content.read(64 << 10)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        r = got.response
        body = b"".join(chunks)[: max_bytes + 1]
        return Fetched(r.status, r.headers, body, str(r.url), got.upstream, got.ban)
