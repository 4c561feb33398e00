"""The upstream proxy pool against real proxies on loopback (tinyproxy, microsocks): rotation,
stickiness, failover when a proxy dies or is banned, cool-downs, and credentials kept secret.

The fixtures here (``tinyproxies``, ``microsocks``, ``origin``) are shared with
tests/rollout/net/test_egress_proxies.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from rollout.net.proxies import (
    DIRECT,
    RESEND_TRACE,
    NoUpstream,
    ProxyPool,
    Upstream,
    ban_signal,
    fetch_via,
)

pytestmark = pytest.mark.multiprocess
SECRET = "s3cret-pw"
CAPTCHA = "<html><body><div class='g-recaptcha'>Are you a robot?</div></body></html>"


# ----------------------------------------------------------------------------- real proxies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"proxy on port {port} exited with {proc.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


@dataclass
class Proxy:
    """One proxy process: ``name`` is what tinyproxy writes in the Via header."""

    name: str
    port: int
    proc: subprocess.Popen
    log: Path | None = None
    url: str = field(init=False)

    def __post_init__(self) -> None:
        scheme = "socks5" if self.log is None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL: the proxy vanishes mid-run, connections and all."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)

    def requests_logged(self) -> int:
        return self.log.read_text().count("Request (file descriptor") if self.log else 0


def start_tinyproxy(dir: Path, name: str, auth: tuple[str, str] | None = None) -> Proxy:
    port = free_port()
    log, conf = dir / f"{name}.log", dir / f"{name}.conf"
    lines = [
        f"Port {port}", "Listen 127.0.0.1", "Allow 127.0.0.1", f'LogFile "{log}"',
        "LogLevel Connect", f'PidFile "{dir / name}.pid"', "MaxClients 64",
        f'ViaProxyName "{name}"', "Timeout 30",
    ]  # fmt: skip
    if auth is not None:
        lines.append(f"BasicAuth {auth[0]} {auth[1]}")
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        ["tinyproxy", "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_listening(port, proc)
    return Proxy(name, port, proc, log)


def start_microsocks(auth: tuple[str, str] | None = None) -> Proxy:
    port = free_port()
    args = ["microsocks", "-i", "127.0.0.1", "-p", str(port)]
    if auth is not None:
        args += ["-u", auth[0], "-P", auth[1]]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc)
    return Proxy("socks", port, proc)


def running(procs: list[subprocess.Popen]) -> list[int]:
    """Those of ``procs`` still in the process list."""
    listed = subprocess.run(["ps", "-eo", "pid="], capture_output=True, text=True, check=True)
    alive = {int(p) for p in listed.stdout.split()}
    return [p.pid for p in procs if p.pid in alive]


@contextlib.contextmanager
def proxies(starts) -> Iterator[list[Proxy]]:
    """Start proxies (callables), kill them all at the end and check none is left."""
    started: list[Proxy] = []
    try:
        for start in starts:
            started.append(start())
        yield started
    finally:
        for p in started:
            p.kill()
        assert running([p.proc for p in started]) == [], "a proxy process outlived its test"


@pytest.fixture
def tinyproxies(tmp_path) -> Iterator[list[Proxy]]:
    """Three tinyproxies on free loopback ports, Via names proxy-0, proxy-1, proxy-2."""
    if shutil.which("tinyproxy") is None:
        pytest.skip("tinyproxy is not installed")
    with proxies([lambda i=i: start_tinyproxy(tmp_path, f"proxy-{i}") for i in range(3)]) as ps:
        yield ps


@pytest.fixture
def microsocks() -> Iterator[Proxy]:
    if shutil.which("microsocks") is None:
        pytest.skip("microsocks is not installed")
    with proxies([start_microsocks]) as (p,):
        yield p


# ----------------------------------------------------------------------------- the origin


@dataclass
class Origin:
    """A site recording which proxy each request came through (its Via header)."""

    url: str
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, proxy name or "-")
    bans: dict[str, str] = field(default_factory=dict)  # proxy name -> "429" | "captcha"
    user_agents: list[str] = field(default_factory=list)
    # /slow's second half is sent once this is set (or after 30 s)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def via(self, path: str) -> list[str]:
        return [v for p, v in self.seen if p == path]


@pytest_asyncio.fixture(scope="module")
async def origin_server():
    state = Origin(url="")

    async def page(request: web.Request) -> web.Response:
        match = re.search(r"proxy-\d+", request.headers.get("Via", ""))
        via = match.group(0) if match else "-"
        state.seen.append((request.path, via))
        state.user_agents.append(request.headers.get("User-Agent", ""))
        ban = state.bans.get(via)
        if request.path == "/slow":  # a page whose second half waits for the test's word
            response = web.StreamResponse(headers={"Content-Type": "text/html"})
            await response.prepare(request)
            await response.write(b"<html><body><p>first half</p>")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.release.wait(), 30)
            await response.write(b"<p>second half</p></body></html>")
            return response
        if ban == "429":
            return web.Response(status=429, text="slow down")
        if ban == "captcha":
            return web.Response(text=CAPTCHA, content_type="text/html")
        return web.Response(
            text=f"<html><body><p id=via>{via}</p><p>{request.path}</p></body></html>",
            content_type="text/html",
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


@pytest.fixture
def origin(origin_server) -> Origin:
    origin_server.seen.clear()
    origin_server.bans.clear()
    origin_server.user_agents.clear()
    origin_server.release = asyncio.Event()
    return origin_server


class Sessions:
    """Api mode's sessions: one per upstream on the pool's shared connectors."""

    def __init__(self, pool: ProxyPool | None):
        self.pool = pool
        self._by_name: dict[str, aiohttp.ClientSession] = {}

    def __call__(self, upstream: Upstream) -> aiohttp.ClientSession:
        if upstream.name not in self._by_name:
            shared = upstream is not DIRECT and self.pool is not None
            self._by_name[upstream.name] = aiohttp.ClientSession(
                connector=self.pool.connector(upstream) if shared else aiohttp.TCPConnector(),
                connector_owner=not shared,
                timeout=aiohttp.ClientTimeout(total=10),
                trace_configs=[RESEND_TRACE],  # as api mode's sessions (rollout.net.core)
            )
        return self._by_name[upstream.name]

    async def close(self) -> None:
        for s in self._by_name.values():
            await s.close()
        if self.pool is not None:
            await self.pool.close()


@contextlib.asynccontextmanager
async def sessions(pool: ProxyPool | None):
    s = Sessions(pool)
    try:
        yield s
    finally:
        await s.close()


def via_of(body: bytes) -> str:
    return re.search(rb"<p id=via>([^<]*)</p>", body).group(1).decode()


# ----------------------------------------------------------------------------- through tinyproxy


async def test_episodes_spread_across_upstreams_and_stick(tinyproxies, origin):
    pool = ProxyPool([p.url for p in tinyproxies])
    async with sessions(pool) as s:
        for round in range(3):
            for e in range(6):
                got = await fetch_via(
                    pool, f"e{e}", "GET", f"{origin.url}/e{e}/{round}", session_for=s
                )
                assert got.status == 200 and got.ban is None
    by_episode = {e: {v for p, v in origin.seen if p.startswith(f"/e{e}/")} for e in range(6)}
    assert all(len(v) == 1 for v in by_episode.values()), by_episode  # sticky
    used = [next(iter(v)) for v in by_episode.values()]
    assert sorted(used) == ["proxy-0", "proxy-0", "proxy-1", "proxy-1", "proxy-2", "proxy-2"]
    assert [p.requests_logged() for p in tinyproxies] == [6, 6, 6]  # each one's own log
    stats = pool.stats()
    assert [stats[p.url]["assigned"] for p in tinyproxies] == [2, 2, 2]
    assert [stats[p.url]["requests"] for p in tinyproxies] == [6, 6, 6]
    pool.release("e0")
    back = pool.assign("e0")  # the one left with fewest episodes
    assert back.name == tinyproxies[0].url and pool.stats()[back.name]["assigned"] == 2


async def test_a_proxy_killed_mid_run_is_benched_and_episodes_finish_elsewhere(tinyproxies, origin):
    pool = ProxyPool([p.url for p in tinyproxies])
    first_done = asyncio.Barrier(7)
    victim = tinyproxies[1]

    async def episode(e: int, s: Sessions) -> list[str]:
        served = []
        for step in range(4):
            got = await fetch_via(pool, f"e{e}", "GET", f"{origin.url}/e{e}/{step}", session_for=s)
            assert got.status == 200
            served.append(via_of(got.body))
            if step == 0:
                await first_done.wait()  # every episode has a keep-alive connection open
                await first_done.wait()  # ... and the victim is dead
        return served

    async with sessions(pool) as s:
        runs = [asyncio.create_task(episode(e, s)) for e in range(6)]
        await first_done.wait()
        victim.kill()
        await first_done.wait()
        served = await asyncio.gather(*runs)
    moved = [v for v in served if v[0] == victim.name]
    assert len(moved) == 2
    for v in served:
        assert victim.name not in v[1:] and len(set(v[1:])) == 1  # moved once, then sticky
    stats = pool.stats()[victim.url]
    assert stats["benched"] and stats["failures"] >= 1 and stats["assigned"] == 0
    assert "ClientProxyConnectionError" in stats["reason"] or "Connector" in stats["reason"]


@pytest.mark.parametrize("ban, signal_", [("429", "HTTP 429"), ("captcha", "a CAPTCHA page")])
async def test_a_banned_proxy_is_benched_and_the_get_retried_elsewhere(
    tinyproxies, origin, ban, signal_
):
    pool = ProxyPool([p.url for p in tinyproxies])
    async with sessions(pool) as s:
        first = pool.assign("a")
        banned = next(p for p in tinyproxies if p.url == first.name)
        origin.bans[banned.name] = ban
        got = await fetch_via(pool, "a", "GET", f"{origin.url}/one", session_for=s)
        assert got.status == 200 and got.ban is None and got.upstream != first
        assert origin.via("/one") == [banned.name, via_of(got.body)]  # tried, then retried
        stats = pool.stats()[first.name]
        assert stats["bans"] == 1 and stats["benched"] and stats["reason"] == signal_
        again = await fetch_via(pool, "a", "GET", f"{origin.url}/two", session_for=s)
        assert again.upstream == got.upstream  # the episode's next request: the new one
        # A POST is not retried: the ban answer comes back, and the episode moves on.
        origin.bans[via_of(again.body)] = ban
        post = await fetch_via(pool, "a", "POST", f"{origin.url}/three", data=b"x", session_for=s)
        assert post.ban == signal_ and post.upstream == got.upstream
        assert pool.assign("a") not in (first, got.upstream)


async def test_every_proxy_dead_is_no_upstream(tinyproxies, origin):
    pool = ProxyPool([p.url for p in tinyproxies])
    for p in tinyproxies:
        p.kill()
    async with sessions(pool) as s:
        with pytest.raises(NoUpstream, match="all 3 upstream proxies are benched"):
            await fetch_via(pool, "a", "GET", f"{origin.url}/x", session_for=s)
    assert all(st["benched"] and st["failures"] == 1 for st in pool.stats().values())
    assert origin.seen == []


async def test_socks5_through_microsocks(microsocks, origin):
    pool = ProxyPool([microsocks.url])
    async with sessions(pool) as s:
        got = await fetch_via(pool, "a", "GET", f"{origin.url}/socks", session_for=s)
    assert got.status == 200 and got.upstream.scheme == "socks5"
    assert origin.via("/socks") == ["-"]  # no Via: a socks proxy relays bytes


async def test_direct_when_there_is_no_pool(origin):
    for pool in (None, ProxyPool([])):
        async with sessions(pool) as s:
            got = await fetch_via(pool, "a", "GET", f"{origin.url}/direct", session_for=s)
        assert got.status == 200 and got.upstream is DIRECT


async def test_max_bytes_caps_the_body(tinyproxies, origin):
    pool = ProxyPool([tinyproxies[0].url])
    async with sessions(pool) as s:
        got = await fetch_via(pool, "a", "GET", f"{origin.url}/big", session_for=s, max_bytes=10)
    assert len(got.body) == 11  # one more than the cap: the caller knows it was cut


# ----------------------------------------------------------------------------- stale connections


@dataclass
class LazyCloser:
    """An http proxy on loopback that answers every request itself, keeps the connection
    open after the answer (HTTP/1.1, no ``Connection: close``) and closes a connection,
    unanswered, when a second request arrives on it: the race where a proxy (tinyproxy)
    closes after its answer but the client takes the connection from its pool first,
    made certain. A request for ``/die`` is closed unanswered on any connection."""

    url: str = ""
    answered: list[tuple[int, str, str]] = field(default_factory=list)  # (connection, method, path)
    dropped: list[tuple[int, str, str]] = field(default_factory=list)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn, served = self.connections, 0
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode().split("\r\n")
                method, target, _ = line.split(" ")
                path = "/" + target.split("/", 3)[3]
                size = next(
                    (
                        int(f.split(":")[1])
                        for f in fields
                        if f.lower().startswith("content-length")
                    ),
                    0,
                )
                await reader.readexactly(size)
                if served or path == "/die":
                    self.dropped.append((conn, method, path))
                    return
                served += 1
                self.answered.append((conn, method, path))
                body = f"<p id=via>lazy</p>{method} {path}".encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def lazy_closer():
    proxy = LazyCloser()
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    proxy.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield proxy


async def test_a_post_on_a_kept_alive_connection_the_proxy_closed_is_sent_again(lazy_closer):
    pool = ProxyPool([lazy_closer.url])
    site = "http://127.0.0.1:9"  # never reached: the proxy answers itself
    async with sessions(pool) as s:
        got = await fetch_via(pool, "a", "GET", f"{site}/one", session_for=s)
        post = await fetch_via(pool, "a", "POST", f"{site}/two", data=b"x", session_for=s)
    assert got.status == 200 and post.status == 200 and post.body.endswith(b"POST /two")
    assert lazy_closer.answered == [(1, "GET", "/one"), (2, "POST", "/two")]  # sent again, anew
    assert lazy_closer.dropped == [(1, "POST", "/two")]
    stats = pool.stats()[lazy_closer.url]
    assert stats["failures"] == 0 and not stats["benched"]  # not the proxy's fault


async def test_a_post_goes_through_every_closed_connection_in_the_pool(lazy_closer):
    # Two pages at once leave two kept-alive connections in the pool, both closed by the
    # proxy: the POST is sent on each, then on a new one.
    method = "POST"
    pool = ProxyPool([lazy_closer.url])
    site = "http://127.0.0.1:9"
    async with sessions(pool) as s:
        pages = [fetch_via(pool, "a", "GET", f"{site}/{i}", session_for=s) for i in (1, 2)]
        assert [p.status for p in await asyncio.gather(*pages)] == [200, 200]
        got = await fetch_via(pool, "a", method, f"{site}/three", data=b"x", session_for=s)
    assert got.status == 200 and got.body.endswith(f"{method} /three".encode())
    assert sorted(c for c, *_ in lazy_closer.dropped) == [1, 2]  # each stale one, once
    assert lazy_closer.answered[-1] == (3, method, "/three")


async def test_a_post_is_sent_again_only_when_its_connection_was_a_kept_alive_one(lazy_closer):
    pool = ProxyPool([lazy_closer.url])
    site = "http://127.0.0.1:9"
    async with sessions(pool) as s:
        with pytest.raises(aiohttp.ServerDisconnectedError):  # a new connection: not resent
            await fetch_via(pool, "a", "POST", f"{site}/die", data=b"x", session_for=s)
    assert lazy_closer.dropped == [(1, "POST", "/die")]
    # A session without RESEND_TRACE cannot tell a kept-alive connection: the error stands.
    async with aiohttp.ClientSession() as bare:
        await fetch_via(pool, "b", "GET", f"{site}/one", session_for=lambda u: bare)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await fetch_via(pool, "b", "POST", f"{site}/two", data=b"x", session_for=lambda u: bare)
    assert lazy_closer.dropped == [(1, "POST", "/die"), (2, "POST", "/two")]


# ----------------------------------------------------------------------------- credentials


async def test_credentials_work_and_never_show(tmp_path, origin, caplog):
    caplog.set_level(logging.DEBUG)
    with proxies(
        [
            lambda: start_tinyproxy(tmp_path, "proxy-7", auth=("bob", SECRET)),
            lambda: start_microsocks(auth=("bob", SECRET)),
        ]
    ) as (http, socks):
        good = [f"http://bob:{SECRET}@127.0.0.1:{http.port}", f"socks5://bob:{SECRET}@127.0.0.1:{socks.port}"]  # fmt: skip
        for url in good:
            pool = ProxyPool([url])
            async with sessions(pool) as s:
                got = await fetch_via(pool, "a", "GET", f"{origin.url}/auth", session_for=s)
            assert got.status == 200
            shown = [repr(pool.upstreams), str(pool.upstreams[0]), repr(pool.stats())]
            assert not any(SECRET in text for text in shown)
        wrong = good[1].replace(SECRET, "wrong-pw-123")
        pool = ProxyPool([wrong])
        async with sessions(pool) as s:
            with pytest.raises(NoUpstream, match="authentication failure") as e:
                await fetch_via(pool, "a", "GET", f"{origin.url}/auth", session_for=s)
        messages = [str(e.value), repr(pool.stats()), caplog.text]
        assert not any(("wrong-pw-123" in m or SECRET in m) for m in messages), messages
        assert pool.stats()[f"socks5://127.0.0.1:{socks.port}"]["benched"]


async def test_a_407_from_an_http_proxy_fails_over(tinyproxies, origin):
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=407, headers={"Proxy-Authenticate": 'Basic realm="p"'})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    picky = f"http://bob:{SECRET}@127.0.0.1:{runner.addresses[0][1]}"
    try:
        pool = ProxyPool([picky, tinyproxies[0].url])
        async with sessions(pool) as s:
            got = await fetch_via(pool, "a", "GET", f"{origin.url}/x", session_for=s)
        assert got.status == 200 and got.upstream.name == tinyproxies[0].url
        (stats,) = [st for name, st in pool.stats().items() if name != tinyproxies[0].url]
        assert stats["benched"] and stats["reason"] == "HTTP 407 (proxy credentials refused)"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://127.0.0.1:21", "scheme must be http or socks5"),
        ("socks4://127.0.0.1:1080", "scheme must be http or socks5"),
        ("http://127.0.0.1", "no port"),
        (f"http://user:{SECRET}@proxy.example", "no port"),
        ("http://:8080", "no host"),
        ("http://127.0.0.1:8080/path", "no path"),
        ("http://127.0.0.1:notaport", "not a proxy URL"),
        ("127.0.0.1:8080", "scheme must be"),
    ],
)
def test_bad_urls_are_refused_clearly(url, why):
    with pytest.raises(ValueError, match=why) as e:
        ProxyPool([url])
    assert SECRET not in str(e.value)


def test_the_same_proxy_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        ProxyPool(["http://a:1", "http://a:1"])


# ----------------------------------------------------------------------------- the pool alone


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_benched_upstreams_come_back_after_the_cool_down():
    clock = Clock()
    pool = ProxyPool(["http://a:1", "http://b:2"], cooldown_s=60, clock=clock)
    a, b = pool.upstreams
    assert pool.assign("e1") == a and pool.assign("e2") == b and pool.assign("e1") == a
    assert pool.failover("e1", a, "HTTP 429", ban=True) == b
    assert pool.stats()["http://a:1"] | {"reason": ""} == {
        "assigned": 0, "requests": 0, "failures": 0, "bans": 1,
        "benched": True, "benched_s": 60.0, "reason": "",
    }  # fmt: skip
    assert pool.assign("e3") == b  # the only healthy one
    clock.now += 59.0
    assert pool.stats()["http://a:1"]["benched_s"] == 1.0
    assert pool.assign("e4") == b
    clock.now += 1.0
    assert not pool.stats()["http://a:1"]["benched"]
    assert pool.assign("e5") == a  # back, and the least assigned


def test_failover_on_an_already_benched_upstream_keeps_its_bench_time():
    clock = Clock()
    pool = ProxyPool(["http://a:1", "http://b:2", "http://c:3"], cooldown_s=60, clock=clock)
    a = pool.assign("e1")
    assert pool.assign("e2") != a
    pool.failover("e1", a, "down")
    clock.now += 30
    pool.failover("e1", a, "down again")  # a late failure seen by a concurrent request
    assert pool.stats()[a.name]["benched_s"] == 30.0 and pool.stats()[a.name]["failures"] == 2


def test_all_benched_raises_no_upstream_and_releases_the_episode():
    clock = Clock()
    pool = ProxyPool(["http://a:1", "http://b:2"], cooldown_s=10, clock=clock)
    a = pool.assign("e")
    b = pool.failover("e", a, "down")
    with pytest.raises(NoUpstream, match=r"all 2 upstream proxies are benched .*back in 10 s"):
        pool.failover("e", b, "down")
    assert all(s["assigned"] == 0 for s in pool.stats().values())
    with pytest.raises(NoUpstream):
        pool.assign("other")
    clock.now += 10
    assert pool.assign("other") in (a, b)


def test_rotation_breaks_ties_round_robin():
    pool = ProxyPool(["http://a:1", "http://b:2", "http://c:3"])
    picks = []
    for e in range(6):
        picks.append(pool.assign(str(e)).host)
        pool.release(str(e))  # every upstream back to 0 assigned: only the rotation differs
    assert picks == ["a", "b", "c", "a", "b", "c"]


# ----------------------------------------------------------------------------- ban signals


@pytest.mark.parametrize(
    "status, headers, body, expected",
    [
        (429, {}, b"", "HTTP 429"),
        (403, {}, b"forbidden", "HTTP 403"),
        (403, {"Content-Type": "text/html"}, CAPTCHA.encode(), "a CAPTCHA page"),
        (200, {"Content-Type": "text/html"}, CAPTCHA.encode(), "a CAPTCHA page"),
        (503, {"Content-Type": "text/html"}, b"<div id=cf-challenge-running>", "a CAPTCHA page"),
        (200, {}, b"Our systems have detected unusual traffic from your network", "a CAPTCHA page"),
        (200, {"Content-Type": "text/html", "Content-Encoding": "gzip"}, gzip.compress(CAPTCHA.encode(), mtime=0), "a CAPTCHA page"),
        (200, {"Content-Type": "text/html"}, b"<p>an ordinary page</p>", None),
        (200, {"Content-Type": "application/pdf"}, b"%PDF captcha", None),  # not a page
        (404, {"Content-Type": "text/html"}, CAPTCHA.encode(), None),
        (500, {}, b"", None),
        (200, {"Content-Type": "text/html"}, b"x" * 9000 + b"captcha", None),  # past the head
    ],
)  # fmt: skip
def test_ban_signal(status, headers, body, expected):
    assert ban_signal(status, headers, body[: 8 << 10]) == expected
