"""robots.txt and per-host limits against a real local server that plays several hosts.

Host names resolve to 127.0.0.1 through a StaticResolver; the server answers by
the Host header, so each name is its own origin.
"""

import asyncio
import itertools
import time

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from rollout.net.politeness import HostLimiter, RobotsCache, host_key, parse_robots
from rollout.net.resolver import SafeResolver, StaticResolver
from rollout.net.urls import UrlPolicy

AGENT = "DeepResearchHarness/0.1 (research agent)"
HOSTS = ["agent.test", "star.test", "missing.test", "down.test", "busy.test", "slow.test",
         "moved.test", "big.test", "a.test", "b.test"]  # fmt: skip

ROBOTS = {
    "agent.test": """# a group for us, one for everyone else
User-agent: *
Disallow: /

User-Agent: deepresearchharness   # the token matches case-insensitively
Disallow: /private
Allow: /private/ok
Disallow: /*.pdf$
Allow: /wiki/
Disallow: /wiki/Special:
Disallow: /tie
Allow: /tie
Crawl-delay: 1.5

User-agent: DeepResearchHarnessX
Disallow: /wiki/
""",
    "star.test": "User-agent: OtherBot\nDisallow: /\n\nUser-agent: *\nDisallow: /cgi-bin/\n",
    "slow.test": "User-agent: *\nDisallow: /nope\n",
    "big.test": "User-agent: *\nDisallow: /early\n" + "#" * (600 * 1024) + "\nDisallow: /late\n",
    "robots-real.txt": "User-agent: *\nDisallow: /after-redirect\n",
}
STATUS = {"missing.test": 404, "down.test": 503, "busy.test": 429}


class Site:
    """The server's record: robots.txt fetches and requests in flight, per host."""

    def __init__(self) -> None:
        self.robots_fetches: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.status = dict(STATUS)

    async def robots(self, request: web.Request) -> web.StreamResponse:
        name = request.host.split(":")[0]
        self.robots_fetches[name] = self.robots_fetches.get(name, 0) + 1
        if name == "slow.test":
            await asyncio.sleep(0.3)
        if name == "moved.test":
            raise web.HTTPMovedPermanently("/robots-real.txt")
        if name in self.status:
            return web.Response(status=self.status[name])
        return web.Response(text=ROBOTS[name])

    async def robots_real(self, request: web.Request) -> web.Response:
        return web.Response(text=ROBOTS["robots-real.txt"])

    async def work(self, request: web.Request) -> web.Response:
        name = request.host.split(":")[0]
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.max_in_flight[name] = max(self.max_in_flight.get(name, 0), self.in_flight[name])
        await asyncio.sleep(float(request.query.get("s", "0.05")))
        self.in_flight[name] -= 1
        return web.Response(text="done")


@pytest_asyncio.fixture(scope="module")
async def web_site():
    """(port, Site, client session resolving every test host to the server)."""
    site = Site()
    app = web.Application()
    app.router.add_get("/robots.txt", site.robots)
    app.router.add_get("/robots-real.txt", site.robots_real)
    app.router.add_get("/work", site.work)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    resolver = StaticResolver({name: ["127.0.0.1"] for name in HOSTS})
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=resolver, limit=0),
        timeout=aiohttp.ClientTimeout(total=10),
    )
    yield runner.addresses[0][1], site, session
    await session.close()
    await runner.cleanup()


def robots_cache(session: aiohttp.ClientSession, **kwargs) -> RobotsCache:
    async def fetch(url: str) -> tuple[int, bytes]:
        async with session.get(url) as resp:  # redirects are followed
            return resp.status, await resp.read()

    return RobotsCache(AGENT, fetch, **kwargs)


# ----------------------------------------------------------------------------- robots.txt


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/", True),  # our group replaces the `*` group, which disallows everything
        ("/private", False),
        ("/private/x", False),
        ("/private/ok", True),  # the longer Allow wins
        ("/private/ok/deeper", True),
        ("/doc.pdf", False),  # wildcard and end anchor
        ("/doc.pdf?x=1", True),  # $ anchors the end of path and query
        ("/wiki/Page", True),
        ("/wiki/Special:Search", False),  # the longer Disallow wins
        ("/wiki/file.pdf", False),  # "/*.pdf$" (7 chars) beats "/wiki/" (6)
        ("/tie", True),  # equal length: Allow wins
        ("/%70rivate", False),  # %70 is "p": decoded before matching
    ],
)
async def test_the_agents_group_with_longest_match_precedence(web_site, path, allowed):
    port, _, session = web_site
    robots = robots_cache(session)
    url = f"http://agent.test:{port}{path}"
    assert await robots.allowed(url) is allowed
    reason = await robots.check(url)
    if not allowed:
        assert reason.startswith(f"robots.txt of agent.test:{port} disallows /")
        assert reason.endswith(" for DeepResearchHarness")


async def test_the_reason_names_host_path_and_agent(web_site):
    port, _, session = web_site
    reason = await robots_cache(session).check(f"http://agent.test:{port}/private?a=1#frag")
    assert (
        reason == f"robots.txt of agent.test:{port} disallows /private?a=1 for DeepResearchHarness"
    )


async def test_the_star_group_applies_when_no_group_names_the_agent(web_site):
    port, _, session = web_site
    robots = robots_cache(session)
    assert await robots.allowed(f"http://star.test:{port}/page")
    assert not await robots.allowed(f"http://star.test:{port}/cgi-bin/x")
    assert await robots.crawl_delay(f"http://star.test:{port}/") is None
    assert await robots.crawl_delay(f"http://agent.test:{port}/") == 1.5


@pytest.mark.parametrize(("host", "allowed"), [("missing.test", True), ("moved.test", True)])
async def test_no_robots_txt_allows_everything(web_site, host, allowed):
    port, _, session = web_site
    robots = robots_cache(session)
    assert await robots.allowed(f"http://{host}:{port}/anything") is allowed
    if host == "moved.test":  # the redirect was followed, its target's rules apply
        assert not await robots.allowed(f"http://{host}:{port}/after-redirect")


@pytest.mark.parametrize(("host", "status"), [("down.test", 503), ("busy.test", 429)])
async def test_an_unreachable_robots_txt_disallows_for_a_while(web_site, host, status):
    port, site, session = web_site
    now = [1000.0]
    robots = robots_cache(session, clock=lambda: now[0], failure_ttl_s=60)
    url = f"http://{host}:{port}/page"
    assert await robots.check(url) == (
        f"robots.txt of {host}:{port} could not be fetched (HTTP {status})"
    )
    site.status[host] = 404  # the server recovers: no robots.txt
    try:
        now[0] += 59
        assert not await robots.allowed(url)  # still within the failure TTL
        now[0] += 2
        assert await robots.allowed(url)  # fetched again
    finally:
        site.status[host] = status


async def test_a_network_error_disallows(web_site):
    port, _, session = web_site
    robots = robots_cache(session)
    reason = await robots.check(f"http://unknown.test:{port}/page")  # not in the static DNS
    assert reason == (
        f"robots.txt of unknown.test:{port} could not be fetched (ClientConnectorDNSError)"
    )


async def test_a_refused_address_is_the_reason(web_site):
    port, _, _ = web_site
    policy = UrlPolicy(("public",))
    resolver = SafeResolver(policy, StaticResolver({"inside.test": ["10.0.0.1"]}))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver)) as s:
        reason = await robots_cache(s).check(f"http://inside.test:{port}/page")
    assert reason == "inside.test resolves to 10.0.0.1, a private address, which is not allowed"


async def test_a_hanging_fetch_times_out(web_site):
    port, _, session = web_site
    robots = robots_cache(session, fetch_timeout_s=0.05)
    reason = await robots.check(f"http://slow.test:{port}/page")  # takes 0.3 s
    assert reason == f"robots.txt of slow.test:{port} could not be fetched (TimeoutError)"


async def test_concurrent_first_requests_share_one_fetch(web_site):
    port, site, session = web_site
    robots = robots_cache(session)
    before = site.robots_fetches.get("slow.test", 0)
    paths = ["/a", "/nope", "/b", "/nope/x"] * 5
    answers = await asyncio.gather(*(robots.allowed(f"http://slow.test:{port}{p}") for p in paths))
    assert answers == [True, False, True, False] * 5
    assert site.robots_fetches["slow.test"] == before + 1
    assert await robots.allowed(f"http://slow.test:{port}/c")  # cached: no fetch
    assert site.robots_fetches["slow.test"] == before + 1


async def test_cache_expires_after_ttl_and_is_bounded(web_site):
    port, site, session = web_site
    now = [0.0]
    robots = robots_cache(session, clock=lambda: now[0], ttl_s=100, max_hosts=2)

    def fetches() -> list[int]:
        return [site.robots_fetches.get(h, 0) for h in ("agent.test", "star.test", "missing.test")]

    start = fetches()
    for host in ("agent.test", "star.test", "agent.test"):
        await robots.allowed(f"http://{host}:{port}/")
    assert [b - a for a, b in zip(start, fetches(), strict=True)] == [1, 1, 0]
    await robots.allowed(f"http://missing.test:{port}/")  # evicts star.test, least recently used
    await robots.allowed(f"http://star.test:{port}/")
    await robots.allowed(f"http://agent.test:{port}/")  # evicted by star.test: fetched again
    assert [b - a for a, b in zip(start, fetches(), strict=True)] == [2, 2, 1]
    now[0] = 101.0
    await robots.allowed(f"http://star.test:{port}/")
    assert [b - a for a, b in zip(start, fetches(), strict=True)] == [2, 3, 1]


async def test_only_the_first_500_kib_are_read(web_site):
    port, _, session = web_site
    robots = robots_cache(session)
    assert not await robots.allowed(f"http://big.test:{port}/early")
    assert await robots.allowed(f"http://big.test:{port}/late")  # past the cap


def test_the_product_token_is_matched_exactly_not_as_a_substring():
    text = "User-agent: Deep\nDisallow: /\n\nUser-agent: DeepResearchHarness/2.0\nDisallow: /x\n"
    rules = parse_robots(text, "DeepResearchHarness")
    assert rules.disallows("/x") and not rules.disallows("/y")  # "Deep" is another agent
    assert parse_robots(text, "Other").disallows("/y") is False  # no group, no `*`: all allowed


def test_rules_outside_groups_and_empty_rules_are_ignored():
    text = "\ufeffDisallow: /\nUser-agent: *\nDisallow:\nAllow:\nDisallow: /a*b\n"  # with a BOM
    rules = parse_robots(text, "X")
    assert not rules.disallows("/") and rules.disallows("/a-then-b") and rules.disallows("/ab")
    assert not rules.disallows("/robots.txt")  # always allowed


def test_the_user_agent_needs_a_product_token():
    with pytest.raises(ValueError, match="product token"):
        RobotsCache("/0.1", lambda url: None)  # type: ignore[arg-type, return-value]


# ----------------------------------------------------------------------------- HostLimiter


class Clock:
    """time.monotonic, remembering its last reading: the one a start was granted at."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.monotonic()
        return self.last


async def get(
    session: aiohttp.ClientSession, limiter: HostLimiter, url: str, log=None, clock=None
) -> None:
    """GET ``url`` in a slot, logging (url, the limiter's ``clock`` reading at the start)."""
    async with limiter.slot(url):
        if log is not None:  # no await since the limiter's last clock reading
            log.append((url, clock.last if clock is not None else 0.0))
        async with session.get(url) as resp:
            assert resp.status == 200


async def test_the_concurrency_cap_holds_per_host(web_site):
    port, site, session = web_site
    site.max_in_flight.pop("a.test", None)
    limiter = HostLimiter(concurrency=2)
    await asyncio.gather(*(get(session, limiter, f"http://a.test:{port}/work") for _ in range(8)))
    assert site.max_in_flight["a.test"] == 2
    assert len(limiter) == 0  # idle hosts are forgotten


async def test_callers_are_admitted_in_order(web_site):
    port, _, session = web_site
    limiter = HostLimiter(concurrency=1)
    log: list[tuple[str, float]] = []
    urls = [f"http://a.test:{port}/work?s=0.01&i={i}" for i in range(6)]
    await asyncio.gather(*(get(session, limiter, url, log) for url in urls))
    assert [url for url, _ in log] == urls


async def test_starts_are_spaced_by_the_interval(web_site):
    port, _, session = web_site
    clock = Clock()
    limiter = HostLimiter(interval_s=0.1, clock=clock)
    log: list[tuple[str, float]] = []
    url = f"http://a.test:{port}/work?s=0"
    began = time.monotonic()
    await asyncio.gather(*(get(session, limiter, url, log, clock) for _ in range(4)))
    starts = [t for _, t in log]
    assert all(b - a >= 0.1 for a, b in itertools.pairwise(starts))
    assert time.monotonic() - began < 2.0  # 3 intervals, with generous slack
    assert len(limiter) == 1  # remembered until the interval has run out
    await asyncio.sleep(0.15)
    assert len(limiter) == 0


async def test_different_hosts_do_not_wait_on_each_other(web_site):
    port, _, session = web_site
    clock = Clock()
    limiter = HostLimiter(concurrency=1, interval_s=0.5, clock=clock)
    log: list[tuple[str, float]] = []
    a, b = f"http://a.test:{port}/work?s=0", f"http://b.test:{port}/work?s=0"
    await asyncio.gather(*(get(session, limiter, url, log, clock) for url in (a, a, b)))
    (first_a, t_a1), (second, t_b), (third, t_a2) = log
    assert (first_a, second, third) == (a, b, a)
    assert t_b - t_a1 < 0.25  # b did not wait for a's interval
    assert t_a2 - t_a1 >= 0.5


async def test_zero_config_adds_no_waiting(web_site):
    port, site, session = web_site
    site.max_in_flight.pop("b.test", None)
    limiter = HostLimiter()
    url = f"http://b.test:{port}/work?s=0.2"
    await asyncio.gather(*(get(session, limiter, url) for _ in range(20)))
    assert site.max_in_flight["b.test"] == 20  # all at once
    assert len(limiter) == 0  # no state kept at all


async def test_a_cancelled_waiter_leaves_the_queue_moving():
    limiter = HostLimiter(concurrency=1)
    entered: list[int] = []
    release = asyncio.Event()

    async def hold(i: int) -> None:
        async with limiter.slot("x.test"):
            entered.append(i)
            await release.wait()

    holder = asyncio.create_task(hold(0))
    waiters = [asyncio.create_task(hold(i)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    waiters[0].cancel()
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, waiters[1]), 2)
    assert entered == [0, 2]
    assert len(limiter) == 0


def test_host_keys_are_normalised():
    assert host_key("http://Example.ORG./x") == "example.org:80"
    assert host_key("https://example.org/") == "example.org:443"
    assert host_key("http://[0:0::1]:8900/") == "[::1]:8900"
    assert host_key("localhost:8900") == "localhost:8900"


def test_negative_limits_are_refused():
    with pytest.raises(ValueError):
        HostLimiter(concurrency=-1)
