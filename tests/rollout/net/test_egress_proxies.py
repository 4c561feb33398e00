"""The egress proxy going out through real upstream proxies (tinyproxy on loopback): per-episode
channels stick to one upstream, failover when one dies or is banned, the gate, the user agent,
and the allowlist still enforced; then real Chromium contexts on channels."""

from __future__ import annotations

import asyncio
import contextlib
import re

import aiohttp
import pytest

from rollout.env.pool import DEFAULT_ARGS, BrowserPool, PoolConfig
from rollout.net.egress import (
    NO_UPSTREAM_HEADER,
    REFUSED_HEADER,
    EgressProxy,
    GateRefused,
)
from rollout.net.proxies import ProxyPool
from rollout.net.urls import UrlPolicy
from tests.rollout.net import test_proxies as shared
from tests.rollout.net.test_proxies import Origin, via_of

# The real proxies and the origin, shared with test_proxies.py.
origin_server, origin, tinyproxies = shared.origin_server, shared.origin, shared.tinyproxies
lazy_closer = shared.lazy_closer

pytestmark = pytest.mark.multiprocess
FAST = dict(health_interval_s=0.3, health_timeout_s=5.0, launch_timeout_s=20.0)


def policy_for(origin: Origin) -> UrlPolicy:
    return UrlPolicy(allowed_hosts=(origin.url.removeprefix("http://"),))


@contextlib.asynccontextmanager
async def egress_through(origin: Origin, upstreams: list[str], **kwargs):
    pool = ProxyPool(upstreams) if upstreams else None
    egress = EgressProxy(policy_for(origin), proxies=pool, timeout_s=10, **kwargs)
    await egress.start()
    try:
        yield egress
    finally:
        await egress.close()


async def get(port: int, url: str) -> tuple[int, dict, str]:
    """GET ``url`` through the proxy listening on ``port``, on a fresh connection."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
        s.get(url, proxy=f"http://127.0.0.1:{port}") as r,
    ):
        return r.status, dict(r.headers), await r.text()


def other_port(url: str) -> str:
    """``url`` with the next port: a host:port the allowlist does not hold."""
    return re.sub(r":(\d+)$", lambda m: f":{int(m.group(1)) + 1}", url)


def port_of(options: dict) -> int:
    return int(options["proxy"]["server"].rsplit(":", 1)[1])


# ----------------------------------------------------------------------------- without a browser


async def test_channels_stick_to_their_episodes_upstream(tinyproxies, origin):
    async with egress_through(origin, [p.url for p in tinyproxies]) as egress:
        ports = {e: port_of(await egress.open_channel(e)) for e in "abc"}
        assert await egress.open_channel("a") == {
            "proxy": {"server": f"http://127.0.0.1:{ports['a']}", "bypass": "<-loopback>"}
        }  # the same channel again
        seen = {e: set() for e in "abc"}
        for step in range(3):
            for e, port in ports.items():
                status, _, body = await get(port, f"{origin.url}/{e}/{step}")
                assert status == 200
                seen[e].add(via_of(body.encode()))
        assert all(len(v) == 1 for v in seen.values())  # sticky
        assert set().union(*seen.values()) == {"proxy-0", "proxy-1", "proxy-2"}  # spread
        status, _, body = await get(egress.port, f"{origin.url}/main")  # no channel
        assert status == 200  # through the pool too, as the pseudo-episode SHARED_EPISODE
        await egress.close_channel("a")
        assert sum(s["assigned"] for s in egress.stats()["upstreams"].values()) == 3  # b, c, main
        with pytest.raises(aiohttp.ClientError):
            await get(ports["a"], f"{origin.url}/late")
        assert egress.stats()["channels"] == 2 and egress.stats()["forwarded"] == 10


async def test_a_dead_or_banned_upstream_is_left_for_another(tinyproxies, origin):
    async with egress_through(origin, [p.url for p in tinyproxies]) as egress:
        a, b = [port_of(await egress.open_channel(e)) for e in "ab"]
        via_a = via_of((await get(a, f"{origin.url}/a/0"))[2].encode())
        via_b = via_of((await get(b, f"{origin.url}/b/0"))[2].encode())
        next(p for p in tinyproxies if p.name == via_a).kill()
        origin.bans[via_b] = "429"
        for port in (a, b):
            status, _, body = await get(port, f"{origin.url}/next")
            assert status == 200 and via_of(body.encode()) not in (via_a, via_b, "-")
        stats = egress.stats()["upstreams"]
        by_name = {p.name: stats[p.url] for p in tinyproxies}
        assert by_name[via_a]["benched"] and by_name[via_a]["failures"] == 1
        assert by_name[via_b]["benched"] and by_name[via_b]["bans"] == 1


async def test_a_slow_page_is_relayed_as_it_comes(tinyproxies, origin):
    # The head of a page is read for CAPTCHA markers, but not by waiting for the rest: the
    # first half arrives while the origin holds the second back (30 s, had it to wait)
    async with (
        egress_through(origin, [tinyproxies[0].url]) as egress,
        aiohttp.ClientSession() as s,
        s.get(f"{origin.url}/slow", proxy=f"http://127.0.0.1:{egress.port}") as r,
    ):
        first = await r.content.readany()
        assert b"first half" in first and b"second half" not in first
        origin.release.set()
        assert b"second half" in await r.content.read()


async def test_every_upstream_dead_is_a_502_the_environment_can_see(tinyproxies, origin):
    async with egress_through(origin, [p.url for p in tinyproxies]) as egress:
        port = port_of(await egress.open_channel("a"))
        for p in tinyproxies:
            p.kill()
        status, headers, body = await get(port, f"{origin.url}/x")
        assert status == 502 and headers.get(NO_UPSTREAM_HEADER) == "1"
        assert "benched" in body and "benched" in egress.no_upstream["a"]
        await egress.close_channel("a")
        assert "a" not in egress.no_upstream


async def test_a_form_post_after_a_page_gets_through_an_upstream_that_closed_the_connection(
    lazy_closer, origin
):
    # The upstream keeps no connection past its answer, as tinyproxy does: the egress's
    # pooled connection to it is stale when the browser's POST comes, and is replaced.
    async with egress_through(origin, [lazy_closer.url]) as egress:
        port = port_of(await egress.open_channel("a"))
        status, _, body = await get(port, f"{origin.url}/page")
        assert status == 200 and body.endswith("GET /page")
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
            s.post(f"{origin.url}/form", data=b"q=1", proxy=f"http://127.0.0.1:{port}") as r,
        ):
            assert r.status == 200 and (await r.text()).endswith("POST /form")
    assert lazy_closer.answered == [(1, "GET", "/page"), (2, "POST", "/form")]
    assert lazy_closer.dropped == [(1, "POST", "/form")]


async def test_gate_user_agent_and_allowlist_direct(origin):
    entered: list[str] = []

    @contextlib.asynccontextmanager
    async def gate(url: str):
        entered.append(url)
        if "/private" in url:
            raise GateRefused("robots.txt disallows /private")
        yield

    async with egress_through(origin, [], user_agent="TestBot/1.0", gate=gate) as egress:
        port = port_of(await egress.open_channel("a"))  # without a pool: direct
        status, _, _ = await get(port, f"{origin.url}/ok")
        assert status == 200 and origin.user_agents == ["TestBot/1.0"]
        status, headers, body = await get(port, f"{origin.url}/private")
        assert status == 403 and headers[REFUSED_HEADER] == f"{origin.url}/private"
        assert "robots.txt disallows /private" in body and origin.via("/private") == []
        elsewhere = other_port(origin.url)
        status, headers, body = await get(port, f"{elsewhere}/x")
        assert status == 403 and "not an allowed site" in body
        assert entered == [f"{origin.url}/ok", f"{origin.url}/private"]  # not the refused one
        assert egress.refused == [f"{origin.url}/private", f"{elsewhere}/x"]
        assert egress.stats()["gate_refused"] == 1


# ----------------------------------------------------------------------------- real Chromium


@pytest.mark.browser
@pytest.mark.slow
async def test_browser_contexts_spread_and_survive_a_killed_upstream(tinyproxies, origin):
    async with egress_through(origin, [p.url for p in tinyproxies]) as egress:
        config = PoolConfig(
            browsers=1, contexts_per_browser=6, args=(*DEFAULT_ARGS, *egress.browser_args), **FAST
        )
        async with BrowserPool(config) as browsers:
            loaded: dict[int, list[str]] = {}
            killed = asyncio.Event()
            first = asyncio.Barrier(7)

            async def episode(e: int) -> None:
                async with browsers.context(**await egress.open_channel(f"e{e}")) as lease:
                    page = await lease.context.new_page()
                    loaded[e] = []
                    for step in range(2):
                        response = await page.goto(f"{origin.url}/e{e}/{step}")
                        assert response.status == 200
                        loaded[e].append(await page.inner_text("#via"))
                        if step == 0:
                            await first.wait()
                            await killed.wait()
                    if e == 0:  # the allowlist still holds on a channel
                        response = await page.goto(f"{other_port(origin.url)}/x")
                        assert response.status == 403
                        assert "not an allowed site" in await page.inner_text("body")
                await egress.close_channel(f"e{e}")

            runs = [asyncio.create_task(episode(e)) for e in range(6)]
            async with asyncio.timeout(30):  # an episode that failed early leaves it waiting
                await asyncio.wait(
                    [asyncio.create_task(first.wait()), *runs], return_when="FIRST_COMPLETED"
                )
            for run in runs:
                if run.done():
                    run.result()  # its error
            firsts = [loaded[e][0] for e in range(6)]
            assert sorted(firsts) == ["proxy-0", "proxy-0", "proxy-1", "proxy-1", "proxy-2", "proxy-2"]  # fmt: skip
            victim = tinyproxies[0]
            victim.kill()
            killed.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*runs)
        for e in range(6):
            assert loaded[e][1] != victim.name  # the next page came through another upstream
        stats = egress.stats()
        assert stats["upstreams"][victim.url]["benched"] and stats["channels"] == 0
        assert all(s["assigned"] == 0 for s in stats["upstreams"].values())
        assert [p.requests_logged() > 0 for p in tinyproxies] == [True, True, True]


# ----------------------------------------------------------------------------- https tunnels


async def through_tunnel(port: int, origin: Origin, path: str) -> tuple[bytes, bytes]:
    """CONNECT to the origin through the proxy on ``port``, then plain http inside the
    tunnel (what TLS would carry): (the CONNECT answer's head, the inner answer)."""
    target = origin.url.removeprefix("http://")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if not head.startswith(b"HTTP/1.1 200"):
            return head, await asyncio.wait_for(reader.read(), 10)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
        return head, await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_connect_tunnels_directly_and_through_upstreams(tinyproxies, origin, tmp_path):
    socks = shared.start_microsocks()
    try:
        upstreams = [tinyproxies[0].url, socks.url, tinyproxies[1].url]
        async with egress_through(origin, upstreams) as egress:
            a, b = [port_of(await egress.open_channel(e)) for e in "ab"]
            head, inner = await through_tunnel(a, origin, "/tunnel-a")
            assert head.startswith(b"HTTP/1.1 200") and b"200 OK" in inner
            assert tinyproxies[0].log.read_text().count("CONNECT 127.0.0.1") == 1
            head, inner = await through_tunnel(b, origin, "/tunnel-b")  # socks5
            assert b"200 OK" in inner and origin.via("/tunnel-b") == ["-"]
            tinyproxies[0].kill()  # a's upstream: the next tunnel goes elsewhere
            head, inner = await through_tunnel(a, origin, "/tunnel-a2")
            assert b"200 OK" in inner and egress.stats()["upstreams"][tinyproxies[0].url]["benched"]
            refused = origin.url.rsplit(":", 1)[0] + ":1"
            reader, writer = await asyncio.open_connection("127.0.0.1", a)
            target = refused.removeprefix("http://")
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 403") and REFUSED_HEADER.encode() in answer
            assert egress.stats()["tunnels"] == 3
        async with egress_through(origin, []) as egress:  # direct
            head, inner = await through_tunnel(egress.port, origin, "/tunnel-direct")
            assert b"200 OK" in inner and origin.via("/tunnel-direct") == ["-"]
    finally:
        socks.kill()
