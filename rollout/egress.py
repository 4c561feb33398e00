"""The browsers' only way out: an HTTP forward proxy on loopback that enforces the allowlist.

Every request a pooled browser makes (navigations, redirects, subresources,
popups, iframes, scripts' fetches) goes through this proxy
(``--proxy-server``, with loopback no longer bypassed), and the proxy forwards
only URLs the :class:`~rollout.urls.UrlPolicy` allows. A redirect is passed back
to the browser untouched and its target is checked when the browser asks for
it, so a chain of redirects cannot lead anywhere the agent could not go itself.
A refused request gets a 403 page that says why (the agent reads it) and the
``X-Egress-Refused`` header (the environment reports it as an error).

The proxy keeps no cookies (the browser context owns them, one per episode)
and does not tunnel ``CONNECT``: only http is proxied, which is all the local
web needs; an https site would be refused with a clear message.
"""

from __future__ import annotations

import html

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from rollout.urls import UrlPolicy, UrlRefused, check_url

REFUSED_HEADER = "X-Egress-Refused"
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "proxy-connection",
}  # fmt: skip


def _forwardable(headers) -> CIMultiDict:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


class EgressProxy:
    def __init__(self, policy: UrlPolicy, *, timeout_s: float = 30.0):
        self.policy = policy
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.refused: list[str] = []  # every refusal, for operators and tests
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port: int | None = None

    @property
    def browser_args(self) -> tuple[str, ...]:
        """Chromium flags sending all traffic, loopback included, through this proxy."""
        return (f"--proxy-server=http://127.0.0.1:{self.port}", "--proxy-bypass-list=<-loopback>")

    async def start(self) -> int:
        self._session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, timeout=self.timeout
        )
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        url = str(request.url)
        if request.method == "CONNECT":
            return self._refuse(url, "https tunnelling is not available to the agent's browser")
        try:
            check_url(url, self.policy)
        except UrlRefused as e:
            return self._refuse(url, e.reason)
        try:
            async with self._session.request(
                request.method,
                url,
                headers=_forwardable(request.headers),
                data=await request.read() if request.body_exists else None,
                allow_redirects=False,
            ) as up:
                response = web.StreamResponse(status=up.status, reason=up.reason)
                response.headers.extend(_forwardable(up.headers))
                await response.prepare(request)
                async for chunk in up.content.iter_chunked(64 << 10):
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError) as e:
            return web.Response(status=502, text=f"upstream error: {type(e).__name__}: {e}")

    def _refuse(self, url: str, reason: str) -> web.Response:
        self.refused.append(url)
        body = (
            "<!doctype html><html><head><title>Refused</title></head><body><main>"
            f"<h1>Refused</h1><p>{html.escape(url)} is not an allowed site: {html.escape(reason)}</p>"
            "</main></body></html>"
        )
        # Header values must be latin-1: percent-encode anything else.
        safe = url.encode("ascii", "backslashreplace").decode("ascii")[:500]
        return web.Response(
            status=403, text=body, content_type="text/html", headers={REFUSED_HEADER: safe}
        )
