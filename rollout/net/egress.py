"""The browsers' only way out: an HTTP forward proxy on loopback that enforces the allowlist.

Every request a pooled browser makes (navigations, redirects, subresources,
popups, iframes, scripts' fetches) goes through this proxy
(``--proxy-server``, with loopback no longer bypassed), and the proxy forwards
only URLs the :class:`~rollout.net.urls.UrlPolicy` allows. A redirect is passed back
to the browser untouched and its target is checked when the browser asks for
it, so a chain of redirects cannot lead anywhere the agent could not go itself.
A refused request gets a 403 page that says why (the agent reads it) and the
``X-Egress-Refused`` header (the environment reports it as an error).

Allowed requests go out directly or, with a :class:`~rollout.net.proxies.ProxyPool`,
through an upstream proxy with the pool's failover policy
(:func:`~rollout.net.proxies.open_via`). An episode gets its own listening port
(:meth:`EgressProxy.open_channel`, passed to its browser context as the context's
proxy) so that its requests stay on its own upstream; requests on the main port
share one pseudo-episode. A ``gate`` (politeness, robots.txt) is entered around
each forwarded request and may refuse it (:class:`GateRefused`).

The proxy keeps no cookies (the browser context owns them, one per episode).
https goes through ``CONNECT`` tunnels: the host and port are checked against the
allowlist and the gate, then bytes are relayed unread (directly, through an http
upstream's own ``CONNECT`` or a socks5 upstream), so a tunnel's later requests are
neither seen nor gated, and bans inside it are not detected.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import socket
from collections import Counter
from collections.abc import Callable

import aiohttp
import python_socks
from aiohttp import web
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict
from python_socks.async_.asyncio import Proxy as SocksProxy

from rollout.net.proxies import (
    DIRECT,
    RESEND_TRACE,
    NoUpstream,
    Opened,
    ProxyPool,
    Upstream,
    connector,
    open_via,
)
from rollout.net.urls import UrlPolicy, UrlRefused, check_url

REFUSED_HEADER = "X-Egress-Refused"
NO_UPSTREAM_HEADER = "X-Egress-No-Upstream"  # on the 502 sent when every upstream is benched
SHARED_EPISODE = "egress:main-port"  # the pseudo-episode of requests without a channel
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "proxy-connection",
}  # fmt: skip

Gate = Callable[[str], contextlib.AbstractAsyncContextManager]


class GateRefused(Exception):
    """Raised by a gate to refuse a request; ``reason`` is shown on the refusal page."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _TunnelRefused(Exception):
    """An http upstream answered our CONNECT with something else than 200."""

    def __init__(self, status: int):
        super().__init__(f"the upstream proxy answered CONNECT with HTTP {status}")
        self.status = status


class _Feed:
    """Receives a tunnel's bytes from the browser once aiohttp stops parsing HTTP
    (``request.protocol.set_parser``, as aiohttp's own websockets do)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.queue.put_nowait(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self.queue.put_nowait(b"")


# Failures to reach an upstream while opening a tunnel: fail over to the next one.
_TUNNEL_UPSTREAM_ERRORS = (OSError, TimeoutError, python_socks.ProxyError)


def _forwardable(headers) -> CIMultiDict:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


class EgressProxy:
    """The forward proxy: ``start()``, give browsers :attr:`browser_args`, and per episode
    ``options = await open_channel(id)`` before ``pool.context(**options)`` and
    ``await close_channel(id)`` after the context closed; ``close()`` at the end."""

    def __init__(
        self,
        policy: UrlPolicy,
        *,
        timeout_s: float = 30.0,
        proxies: ProxyPool | None = None,
        resolver: AbstractResolver | None = None,
        user_agent: str | None = None,
        gate: Gate | None = None,
    ):
        """``proxies``: upstreams to go out through (None or empty: direct); ``resolver``:
        used by the direct path and http upstreams' connections; ``user_agent``: replaces
        the browser's; ``gate(url)``: entered around each forwarded request."""
        self.policy = policy
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.proxies = proxies if proxies else None
        self.resolver = resolver
        self.user_agent = user_agent
        self.gate = gate
        self.refused: list[str] = []  # every refusal, for operators and tests
        self.counters: Counter[str] = Counter()
        self.no_upstream: dict[str, str] = {}  # episode -> why it has no upstream left
        self._runner: web.AppRunner | None = None
        self._sessions: dict[str, aiohttp.ClientSession] = {}  # per upstream name
        self._channels: dict[int, str] = {}  # listening port -> episode
        self._sites: dict[str, tuple[int, web.SockSite]] = {}  # episode -> (port, site)
        self.port: int | None = None

    @property
    def browser_args(self) -> tuple[str, ...]:
        """Chromium flags sending all traffic, loopback included, through this proxy."""
        return (f"--proxy-server=http://127.0.0.1:{self.port}", "--proxy-bypass-list=<-loopback>")

    async def start(self) -> int:
        app = web.Application(client_max_size=64 << 20, middlewares=[self._connect_first])
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self.port, _ = await self._listen()
        return self.port

    async def _listen(self) -> tuple[int, web.SockSite]:
        """A new listening port on the same app: (port, site)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        return sock.getsockname()[1], site

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    # ------------------------------------------------------------------ channels

    async def open_channel(self, episode: str) -> dict:
        """A listening port for ``episode`` alone; returns the browser-context options
        (``pool.context(**options)``) that send the context's traffic through it."""
        if episode not in self._sites:
            port, site = await self._listen()
            self._sites[episode] = (port, site)
            self._channels[port] = episode
        port = self._sites[episode][0]
        return {"proxy": {"server": f"http://127.0.0.1:{port}", "bypass": "<-loopback>"}}

    async def close_channel(self, episode: str) -> None:
        """Stop the episode's port and release its upstream (after its context closed)."""
        port, site = self._sites.pop(episode, (None, None))
        if site is not None:
            self._channels.pop(port, None)
            await site.stop()
        if self.proxies is not None:
            self.proxies.release(episode)
        self.no_upstream.pop(episode, None)

    def stats(self) -> dict:
        """Counters (requests, forwarded, tunnels, refused, gate_refused, bans_passed,
        upstream_error, no_upstream), open channels and, with a pool, its per-upstream stats."""
        out: dict = {**self.counters, "channels": len(self._sites)}
        if self.proxies is not None:
            out["upstreams"] = self.proxies.stats()
        return out

    # ------------------------------------------------------------------ forwarding

    def _episode_of(self, request: web.Request) -> str | None:
        """The episode whose channel the request came in on; SHARED_EPISODE for the main
        port; None for the port of a channel since closed."""
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        port = sockname[1] if sockname else self.port
        if port == self.port:
            return SHARED_EPISODE
        return self._channels.get(port)

    def _session(self, upstream: Upstream) -> aiohttp.ClientSession:
        if upstream.name not in self._sessions:
            self._sessions[upstream.name] = aiohttp.ClientSession(
                # The resolver's address rule is for connections to sites; an upstream proxy
                # is reached as configured (the gate checks the site's address first).
                connector=connector(
                    upstream, resolver=self.resolver if upstream is DIRECT else None
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                timeout=self.timeout,
                trace_configs=[RESEND_TRACE],
            )
        return self._sessions[upstream.name]

    @web.middleware
    async def _connect_first(self, request: web.Request, handler) -> web.StreamResponse:
        """CONNECT's target is ``host:port``, which no route matches: handle it here."""
        if request.method != "CONNECT":
            return await handler(request)
        response = await self._tunnel(request)
        if not response.prepared:  # a refusal: the connection is no use after it
            response.force_close()
        return response

    def _admitted(self, request: web.Request, url: str) -> str | web.Response:
        """The episode a request for ``url`` belongs to, or the answer refusing it: a URL off
        the allowlist, or a request on the port of a channel since closed."""
        try:
            check_url(url, self.policy)
        except UrlRefused as e:
            return self._refuse(url, e.reason)
        episode = self._episode_of(request)
        if episode is None:
            return web.Response(status=502, text="this episode's egress channel is closed")
        return episode

    def _gate(self, url: str) -> contextlib.AbstractAsyncContextManager:
        return self.gate(url) if self.gate is not None else contextlib.nullcontext()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.counters["requests"] += 1
        url = str(request.url)
        episode = self._admitted(request, url)
        if isinstance(episode, web.Response):
            return episode
        headers = _forwardable(request.headers)
        if self.user_agent:
            headers["User-Agent"] = self.user_agent
        data = await request.read() if request.body_exists else None
        gate = self._gate(url)
        try:
            async with (
                gate,
                open_via(
                    self.proxies,
                    episode,
                    request.method,
                    url,
                    session_for=self._session,
                    headers=headers,
                    data=data,
                    allow_redirects=False,
                ) as got,
            ):
                return await self._relay(request, got)
        except GateRefused as e:
            self.counters["gate_refused"] += 1
            return self._refuse(url, e.reason, "was refused")
        except NoUpstream as e:
            return self._no_upstream(episode, e)
        except (aiohttp.ClientError, TimeoutError) as e:
            self.counters["upstream_error"] += 1
            return web.Response(status=502, text=f"upstream error: {type(e).__name__}: {e}")

    async def _relay(self, request: web.Request, got: Opened) -> web.StreamResponse:
        """Stream the answer back: the head already read, then the rest as it arrives."""
        up = got.response
        self.counters["forwarded"] += 1
        self.counters["bans_passed"] += got.ban is not None
        response = web.StreamResponse(status=up.status, reason=up.reason)
        response.headers.extend(_forwardable(up.headers))
        await response.prepare(request)
        try:
            await response.write(got.head)
            async for chunk in up.content.iter_chunked(64 << 10):
                await response.write(chunk)
            await response.write_eof()
        except (aiohttp.ClientError, TimeoutError):
            # Cut short after the status went out: drop the connection so the browser
            # sees a broken response, not a complete short one.
            self.counters["upstream_error"] += 1
            if request.transport is not None:
                request.transport.close()
        return response

    # ------------------------------------------------------------------ https tunnels

    async def _tunnel(self, request: web.Request) -> web.StreamResponse:
        """``CONNECT host:port``: check it, open the tunnel (with failover), relay bytes."""
        self.counters["requests"] += 1
        host, port = request.url.host, request.url.port
        url = f"https://{request.raw_path}/"
        if not host or port is None:
            return self._refuse(url, "CONNECT needs host:port")
        episode = self._admitted(request, url)
        if isinstance(episode, web.Response):
            return episode
        gate = self._gate(url)
        try:
            async with gate:
                reader, writer = await self._open_tunnel(episode, host, port)
        except GateRefused as e:
            self.counters["gate_refused"] += 1
            return self._refuse(url, e.reason, "was refused")
        except NoUpstream as e:
            return self._no_upstream(episode, e)
        except (*_TUNNEL_UPSTREAM_ERRORS, _TunnelRefused) as e:
            self.counters["upstream_error"] += 1
            return web.Response(status=502, text=f"tunnel error: {type(e).__name__}: {e}")
        self.counters["tunnels"] += 1
        response = web.StreamResponse(status=200, reason="Connection established")
        response.force_close()
        try:
            await response.prepare(request)
            feed = _Feed()
            request.protocol.set_parser(feed)
            await _relay_tunnel(feed, reader, writer, response)
        finally:
            writer.close()
        return response

    async def _open_tunnel(
        self, episode: str, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to host:port through the episode's upstream; a failure to reach
        an upstream fails over to the next (at most once per upstream)."""
        pool = self.proxies
        upstream = pool.assign(episode) if pool is not None else DIRECT
        tries = len(pool) if pool is not None else 0
        while True:
            try:
                return await asyncio.wait_for(self._dial(upstream, host, port), self.timeout.total)
            except (*_TUNNEL_UPSTREAM_ERRORS, _TunnelRefused) as e:
                refused = isinstance(e, _TunnelRefused) and e.status != 407
                if upstream is DIRECT or refused or tries <= 0:
                    raise
                tries -= 1
                upstream = pool.failover(episode, upstream, f"{type(e).__name__}: {e}")

    async def _dial(
        self, upstream: Upstream, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if upstream.scheme == "socks5":
            proxy = SocksProxy.from_url(upstream.url, rdns=True)
            return await asyncio.open_connection(sock=await proxy.connect(host, port))
        if upstream.scheme == "http":
            reader, writer = await asyncio.open_connection(upstream.host, upstream.port)
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            auth = ""
            if upstream.username is not None:
                basic = aiohttp.encode_basic_auth(upstream.username, upstream.password or "")
                auth = f"Proxy-Authorization: {basic}\r\n"
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(None, 2)[1])
            if status != 200:
                writer.close()
                raise _TunnelRefused(status)
            return reader, writer
        address = host
        if self.resolver is not None:  # the same address rules as every other connection
            address = (await self.resolver.resolve(host, port))[0]["host"]
        return await asyncio.open_connection(address, port)

    def _no_upstream(self, episode: str, e: NoUpstream) -> web.Response:
        """Every upstream is benched: a 502 the environment reads as an infrastructure error."""
        self.counters["no_upstream"] += 1
        self.no_upstream[episode] = str(e)
        return web.Response(
            status=502, text=f"no upstream proxy: {e}", headers={NO_UPSTREAM_HEADER: "1"}
        )

    def _refuse(self, url: str, reason: str, what: str = "is not an allowed site") -> web.Response:
        self.refused.append(url)
        self.counters["refused"] += 1
        body = (
            "<!doctype html><html><head><title>Refused</title></head><body><main>"
            f"<h1>Refused</h1><p>{html.escape(url)} {what}: {html.escape(reason)}</p>"
            "</main></body></html>"
        )
        # Header values must be latin-1: percent-encode anything else.
        safe = url.encode("ascii", "backslashreplace").decode("ascii")[:500]
        return web.Response(
            status=403, text=body, content_type="text/html", headers={REFUSED_HEADER: safe}
        )


async def _relay_tunnel(
    feed: _Feed,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    response: web.StreamResponse,
) -> None:
    """Relay both ways until the far side closes (or, after the browser's side closed,
    for at most 5 s more)."""

    async def up() -> None:
        while chunk := await feed.queue.get():
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def down() -> None:
        while data := await reader.read(64 << 10):
            await response.write(data)

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done and tasks[0].exception() is None:
            await asyncio.wait([tasks[1]], timeout=5.0)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, aiohttp.ClientError):
                await t
