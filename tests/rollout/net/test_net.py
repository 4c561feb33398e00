"""What the episodes of one process share to reach the web (rollout.net.core), through api-mode
episodes against a real HTTP server on loopback: politeness across episodes, the
User-Agent, robots.txt's `auto` setting and the page reader chosen by the config."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import aiohttp
import pytest
from aiohttp import web

from rollout.env import make_env, net_for
from rollout.net.politeness import host_key
from shared.config import EnvConfig, SearchConfig

NAV = "<nav>" + " ".join(f"<a href='/s{i}'>Section {i}</a>" for i in range(30)) + "</nav>"
ARTICLE = (
    "<article><h1>The Loire</h1><p>The Loire is the longest river in France, flowing for "
    "about a thousand kilometres from the Massif Central to the Atlantic Ocean.</p><p>Its "
    "valley is famous for its chateaux, its vineyards and the towns along its banks, from "
    "Orleans to Angers, which draw visitors from all over the world every summer.</p></article>"
)


class Site:
    def __init__(self) -> None:
        self.url = ""
        self.starts: list[float] = []
        self.in_flight = self.most_in_flight = 0
        self.agents: set[str] = set()
        self.robots_fetches = 0

    def app(self) -> web.Application:
        async def robots(_):
            self.robots_fetches += 1
            return web.Response(text="User-agent: *\nDisallow: /hidden\n")

        async def page(request):
            self.starts.append(time.monotonic())
            self.agents.add(request.headers.get("User-Agent", ""))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.05)
            finally:
                self.in_flight -= 1
            body = f"<html><title>Loire</title><body><main>{NAV}{ARTICLE}{NAV}</main></body></html>"
            return web.Response(text=body, content_type="text/html")

        app = web.Application()
        app.router.add_get("/robots.txt", robots)
        app.router.add_get("/{tail:.*}", page)
        return app


@pytest.fixture
async def site():
    s = Site()
    runner = web.AppRunner(s.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    s.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield s
    await runner.cleanup()


def _task(url: str) -> dict:
    return {
        "id": "net-1", "question": "?", "answer": "x", "aliases": [], "type": "qa",
        "hops": 1, "start_url": url + "/", "evidence": [],
    }  # fmt: skip


async def _episodes(site: Site, cfg: EnvConfig, n: int, pages: int) -> list[str]:
    async with aiohttp.ClientSession() as s:

        async def one(i: int) -> list[str]:
            env = make_env("api", site.url, cfg, SearchConfig(), session=s, episode_id=f"e{i}")
            await env.reset(_task(site.url))
            texts = [
                (await env.step(f"<visit>{site.url}/p{i}/{k}</visit>")).text for k in range(pages)
            ]
            await env.close()
            return texts

        return [t for texts in await asyncio.gather(*(one(i) for i in range(n))) for t in texts]


async def test_one_net_per_loop_web_and_config(site):
    cfg = EnvConfig(host_interval_s=0.1)
    assert net_for(site.url, cfg) is net_for(site.url, cfg)
    assert net_for(site.url, cfg) is not net_for(site.url, EnvConfig())
    async with aiohttp.ClientSession() as s:
        a = make_env("api", site.url, cfg, SearchConfig(), session=s)
        b = make_env("api", site.url, cfg, SearchConfig(), session=s)
        assert a.backend.net is b.backend.net is net_for(site.url, cfg)
        await a.close()
        await b.close()


async def test_the_interval_between_requests_to_a_host_holds_across_episodes(site):
    """Each request leaves 0.15 s after the one before it, across four episodes, and the
    site never receives one ahead of that schedule.

    The spacing is asserted where the requests leave (the host's slot, exactly), and the
    site's arrivals against that schedule: an arrival can be late (the loop was busy) but
    never early. Gaps between two arrivals are not asserted: one late arrival followed by
    one on time makes a gap shorter than the interval that no request caused."""
    cfg = EnvConfig(host_interval_s=0.15, max_steps=50)
    limiter = net_for(site.url, cfg).limiter
    slot, released = limiter.slot, []

    @contextlib.asynccontextmanager
    async def timed_slot(url):
        async with slot(url):
            # the limiter's own clock reading at the release: its next start less the interval
            released.append(limiter._hosts[host_key(url)].next_start - cfg.host_interval_s)
            yield

    limiter.slot = timed_slot
    texts = await _episodes(site, cfg, n=4, pages=2)
    assert all("The Loire is the longest river" in t for t in texts)
    assert len(released) == len(site.starts) == 8
    gaps = [b - a for a, b in itertools.pairwise(released)]
    eps = 1e-9  # float rounding of the clock arithmetic, nothing more
    assert min(gaps) >= 0.15 - eps, gaps
    schedule = [released[0] + 0.15 * k - eps for k in range(8)]
    arrivals = sorted(site.starts)
    assert all(t >= due for t, due in zip(arrivals, schedule, strict=True)), [
        t - released[0] for t in arrivals
    ]


async def test_requests_in_flight_to_a_host_are_capped_across_episodes(site):
    await _episodes(site, EnvConfig(host_concurrency=1, max_steps=50), n=4, pages=2)
    assert site.most_in_flight == 1
    site.most_in_flight = 0
    await _episodes(site, EnvConfig(max_steps=50), n=4, pages=2)  # no cap: they overlap
    assert site.most_in_flight > 1


async def test_requests_carry_the_configured_user_agent(site):
    await _episodes(site, EnvConfig(user_agent="ResearchBot/2.0 (+ops@example.org)"), 1, 1)
    assert site.agents == {"ResearchBot/2.0 (+ops@example.org)"}


async def test_robots_auto_spares_the_local_web_and_on_applies_everywhere(site):
    await _episodes(site, EnvConfig(robots_txt="auto"), 2, 2)
    assert site.robots_fetches == 0  # the web's own host is exempt under `auto`
    texts = await _episodes(site, EnvConfig(robots_txt="on"), 2, 2)
    assert site.robots_fetches == 1 and all("Error:" not in t for t in texts)  # fetched once
    async with aiohttp.ClientSession() as s:
        env = make_env("api", site.url, EnvConfig(robots_txt="on"), SearchConfig(), session=s)
        await env.reset(_task(site.url))
        r = await env.step(f"<visit>{site.url}/hidden/page</visit>")
        assert "Error:" in r.text and "robots.txt" in r.text
        await env.close()


@pytest.mark.parametrize("reader", ["markdown", "trafilatura"])
async def test_the_page_reader_is_chosen_by_the_config(site, reader):
    (text,) = await _episodes(site, EnvConfig(page_reader=reader), 1, 1)
    assert "The Loire is the longest river in France" in text
    # markdown reads the <main> region whole, menus too; trafilatura keeps the article
    assert ("Section 3" in text) == (reader == "markdown"), text
