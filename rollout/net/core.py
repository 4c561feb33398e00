"""What every episode of one rollout process shares to reach the web, and the rules it goes by.

A :class:`Net` holds, for one web (the local one or the open web) and one
:class:`~shared.config.EnvConfig`:

- the URL allowlist (:func:`policy_for`: the web's own host plus ``env.allowed_hosts``);
- a resolver that refuses non-public addresses after DNS resolution unless their
  host is listed exactly (:class:`~rollout.net.resolver.SafeResolver`), used by every
  connection api mode and the browsers' egress proxy open;
- politeness: robots.txt (``env.robots_txt``), at most ``env.host_concurrency``
  requests in flight per host and ``env.host_interval_s`` between two starts to
  one host, across all episodes (:mod:`rollout.net.politeness`), and the
  ``env.user_agent`` every request carries;
- the upstream proxy pool (``env.proxies``), sticky per episode (:mod:`rollout.net.proxies`).

One is shared per event loop and (web, config) by :func:`net_for`, so the
politeness limits hold across all the episodes of a sidecar without any caller
passing it around; tests build their own (with a :class:`~rollout.net.resolver.StaticResolver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from rollout.net.politeness import HostLimiter, RobotsCache
from rollout.net.proxies import DIRECT, RESEND_TRACE, ProxyPool, Upstream, fetch_via
from rollout.net.resolver import SafeResolver
from rollout.net.urls import UrlPolicy, UrlRefused, check_url
from shared.config import EnvConfig

ROBOTS_MAX_BYTES = 500 << 10
ROBOTS_REDIRECTS = 5
ROBOTS_EPISODE = "robots.txt"  # the pool's pseudo-episode robots.txt files are fetched as


def policy_for(web_url: str, env: EnvConfig) -> UrlPolicy:
    """The allowlist: the web's own host and port, plus the configured extra hosts."""
    netloc = urlsplit(web_url).netloc
    return UrlPolicy(allowed_hosts=(netloc, *env.allowed_hosts))


class RobotsRefused(RuntimeError):
    """robots.txt disallows the URL for our user agent; the message says so, for the agent."""


class Net:
    def __init__(
        self,
        web_url: str,
        env: EnvConfig,
        *,
        resolver: AbstractResolver | None = None,
        timeout_s: float = 10.0,
    ):
        self.web_url = web_url
        self.env = env
        self.policy = policy_for(web_url, env)
        self.resolver = SafeResolver(self.policy, resolver)
        self.user_agent = env.user_agent
        self.limiter = HostLimiter(env.host_concurrency, env.host_interval_s)
        self.robots = (
            RobotsCache(env.user_agent, self._fetch_robots) if env.robots_txt != "off" else None
        )
        self._robots_exempt = (
            {urlsplit(web_url).netloc.lower()} if env.robots_txt == "auto" else set()
        )
        self.proxies = (
            ProxyPool(env.proxies, cooldown_s=env.proxy_cooldown_s) if env.proxies else None
        )
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.archive_mode = env.archive
        self._writer = None
        self._archive = None

    # ------------------------------------------------------------------ rules

    def robots_apply(self, url: str) -> bool:
        return self.robots is not None and urlsplit(url).netloc.lower() not in self._robots_exempt

    async def robots_check(self, url: str) -> None:
        """Raise :class:`RobotsRefused` when robots.txt disallows ``url`` (and it applies)."""
        if self.robots_apply(url):
            reason = await self.robots.check(url)
            if reason is not None:
                raise RobotsRefused(reason)

    @contextlib.asynccontextmanager
    async def gate(self, url: str) -> AsyncIterator[None]:
        """Around one request to ``url``: robots.txt, then a politeness slot for its host."""
        await self.robots_check(url)
        async with self.limiter.slot(url):
            yield

    # ------------------------------------------------------------------ the archive

    def _archive_dir(self) -> Path:
        if self.env.archive_dir is None:
            raise ValueError(
                f"env.archive = {self.env.archive!r} needs env.archive_dir (the sidecar and "
                "rollout.eval --out set it to <run>/archive)"
            )
        return Path(self.env.archive_dir)

    @property
    def recording(self) -> bool:
        """Whether responses that went to the network are written to the archive."""
        return self.archive_mode == "record" or (
            self.archive_mode == "replay" and self.env.archive_fallback == "live"
        )

    @property
    def writer(self):
        """The process's :class:`~rollout.archive.store.ArchiveWriter` (None unless recording)."""
        if self._writer is None and self.recording:
            from rollout.archive.store import ArchiveWriter

            self._writer = ArchiveWriter(
                self._archive_dir(), max_bytes=self.env.archive_max_bytes, origin=self.web_url
            )
        return self._writer

    @property
    def archive(self):
        """The :class:`~rollout.archive.store.Archive` replayed from (None unless replaying), at
        this web's origin whatever origin it was recorded at."""
        if self._archive is None and self.archive_mode == "replay":
            from rollout.archive.store import Archive

            directory = self._archive_dir()
            if not directory.is_dir():
                raise ValueError(f"env.archive = 'replay': no archive at {directory}")
            self._archive = Archive.open(directory, origin=self.web_url)
        return self._archive

    # ------------------------------------------------------------------ connections

    def connector(self) -> aiohttp.TCPConnector:
        """A direct connector whose every address passed the egress rules."""
        return aiohttp.TCPConnector(resolver=self.resolver, limit=16)

    def session(self, upstream: Upstream = DIRECT, **kwargs) -> aiohttp.ClientSession:
        """A session going out through ``upstream``: directly, on a connector of its own
        whose every address passed the egress rules; or on the proxy pool's shared
        connector for that upstream. ``kwargs`` (a cookie jar) go to the session."""
        common = dict(
            headers={"User-Agent": self.user_agent}, timeout=self.timeout,
            trace_configs=[RESEND_TRACE], **kwargs,
        )  # fmt: skip
        if upstream is DIRECT:
            return aiohttp.ClientSession(connector=self.connector(), **common)
        connector = self.proxies.connector(upstream)
        return aiohttp.ClientSession(connector=connector, connector_owner=False, **common)

    async def check_host(self, url: str) -> None:
        """Resolve ``url``'s host here and apply the address rule, for requests an upstream
        proxy resolves (the resolver never sees those names otherwise)."""
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        await self.resolver.resolve(host, port, socket.AF_UNSPEC)

    async def _fetch_robots(self, url: str) -> tuple[int, bytes]:
        """(status, body) of a robots.txt, redirects followed (each hop allowlisted), through
        the proxy pool when there is one (as the pages themselves are fetched)."""
        jar = aiohttp.DummyCookieJar()
        sessions: dict[str, aiohttp.ClientSession] = {}

        def session_for(upstream: Upstream) -> aiohttp.ClientSession:
            if upstream.name not in sessions:
                sessions[upstream.name] = self.session(upstream, cookie_jar=jar)
            return sessions[upstream.name]

        try:
            for _ in range(ROBOTS_REDIRECTS + 1):
                if self.proxies is not None:
                    await self.check_host(url)
                got = await fetch_via(
                    self.proxies, ROBOTS_EPISODE, "GET", url, session_for=session_for,
                    max_bytes=ROBOTS_MAX_BYTES, allow_redirects=False,
                )  # fmt: skip
                location = got.headers.get("Location")
                if got.status in (301, 302, 303, 307, 308) and location:
                    try:
                        url = check_url(urljoin(url, location), self.policy)
                    except UrlRefused:
                        return 404, b""  # robots.txt elsewhere, off limits: as if none
                    continue
                return got.status, got.body[:ROBOTS_MAX_BYTES]
            return 404, b""  # too many redirects: RFC 9309 reads that as unavailable (allow)
        finally:
            for session in sessions.values():
                await session.close()

    async def close(self) -> None:
        """Close the proxy pool's shared connections (sessions close their own) and the
        archive being written."""
        if self.proxies is not None:
            await self.proxies.close()
        if self._writer is not None:
            self._writer.close()


_NETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def net_for(web_url: str, env: EnvConfig) -> Net:
    """The :class:`Net` shared by every caller in this event loop for this web and config."""
    loop = asyncio.get_running_loop()
    nets = _NETS.setdefault(loop, {})
    key = (web_url, env)
    if key not in nets:
        nets[key] = Net(web_url, env)
    return nets[key]
