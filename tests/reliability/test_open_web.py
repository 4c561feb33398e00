"""The open web's faults through an api-mode episode: robots.txt, PDFs, oversize pages, wrong
charsets, redirects and names that lead to non-public addresses. A real HTTP server on
loopback plays the sites; a static resolver gives their names the addresses the open web
could (the cloud metadata address, private networks) without any traffic leaving 127.0.0.1."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from aiohttp import web

from rollout.env import browser_pool, episode_lease, make_env
from rollout.net.core import Net
from rollout.net.resolver import StaticResolver
from shared.config import EnvConfig, RolloutConfig, SearchConfig
from tests.reliability.test_bad_input import bypasses
from tests.rollout.env.test_reader import make_pdf
from tests.rollout.net.test_proxies import origin, origin_server, tinyproxies  # noqa: F401

pytestmark = pytest.mark.reliability

NAMES = {
    "site.example.test": ["127.0.0.1"],  # the site itself, listed exactly (as the local web is)
    "other.example.test": ["127.0.0.1"],  # admitted only by `public`: its loopback address is not
    "meta.example.test": ["169.254.169.254"],
    "inner.example.test": ["10.0.0.7"],
    "split.example.test": ["93.184.215.14", "192.168.0.3"],
}
CAP = 64 << 10


def _origin() -> web.Application:
    async def robots(_):
        return web.Response(text="User-agent: *\nDisallow: /private\n")

    async def page(_):
        return web.Response(
            text="<html><title>Open</title><main><p>The open page.</p></main></html>",
            content_type="text/html",
        )

    async def pdf(_):
        body = make_pdf(["Annual report", "Revenue rose by 12 percent"], title="Report")
        return web.Response(body=body, content_type="application/pdf")

    async def big(_):
        return web.Response(text="<p>" + "x" * (CAP * 2) + "</p>", content_type="text/html")

    async def wrong_charset(_):  # windows-1252 bytes sent as UTF-8
        body = "<p>Le café coûte 3 € à Paris, déjà réglé.</p>".encode("cp1252")
        return web.Response(body=body, headers={"Content-Type": "text/html; charset=utf-8"})

    async def image(_):
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(64), content_type="image/png")

    def redirect(target: str):
        async def handler(request):
            raise web.HTTPFound(target.format(port=request.url.port))

        return handler

    app = web.Application()
    for path, handler in {
        "/robots.txt": robots, "/": page, "/private/page": page, "/report.pdf": pdf,
        "/big": big, "/latin": wrong_charset, "/image": image,
        "/to-private": redirect("http://10.0.0.5/admin"),
        "/to-metadata-name": redirect("http://meta.example.test:{port}/latest/meta-data/"),
        "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
    }.items():  # fmt: skip
        app.router.add_get(path, handler)
    return app


@pytest.fixture
async def site():
    runner = web.AppRunner(_origin(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    yield f"http://site.example.test:{port}"
    await runner.cleanup()


def _env(site: str, session, allowed=("public",)):
    cfg = EnvConfig(
        max_steps=100, allowed_hosts=allowed, robots_txt="on", max_page_bytes=CAP,
        action_timeout_s=5.0,
    )  # fmt: skip
    net = Net(site, cfg, resolver=StaticResolver(NAMES))
    return make_env("api", site, cfg, SearchConfig(url=site + "/none"), session=session, net=net)


def _task(site: str) -> dict:
    return {
        "id": "open-web-1", "question": "Who?", "answer": "x", "aliases": [], "type": "qa",
        "hops": 1, "start_url": site + "/", "evidence": [],
    }  # fmt: skip


async def _visit(env, url: str) -> str:
    r = await env.step(f"<visit>{url}</visit>")
    assert not r.terminated, r.info
    return r.text


async def test_open_web_faults_become_error_observations(site, fault):
    rows = {
        "robots": fault(
            "robots.txt disallows the page",
            "an error observation naming robots.txt; the allowed page still reads",
        ),
        "pdf": fault("a PDF", "its text, page by page"),
        "big": fault("an oversize page", "refused before it is read, with the size cap named"),
        "charset": fault("a page whose header names the wrong charset", "the text decoded right"),
        "private": fault("a redirect to a private address", "refused at that hop"),
        "meta": fault("a name resolving to 169.254.169.254 (cloud metadata)", "refused"),
    }
    async with aiohttp.ClientSession() as s:
        env = _env(site, s)
        await env.reset(_task(site))
        text = await _visit(env, f"{site}/private/page")
        assert "Error:" in text and "robots.txt" in text and "disallows" in text, text
        assert "The open page." in await _visit(env, f"{site}/")
        rows["robots"]["observed"] = text.splitlines()[-1][:200]

        text = await _visit(env, f"{site}/report.pdf")
        assert "Annual report" in text and "--- page 2 ---" in text and "Revenue rose" in text
        rows["pdf"]["observed"] = " / ".join(line for line in text.splitlines() if line)[-120:]

        text = await _visit(env, f"{site}/big")
        assert "Error:" in text and "larger than" in text, text
        rows["big"]["observed"] = text.splitlines()[-1][:200]

        text = await _visit(env, f"{site}/latin")
        assert "Le café coûte 3 € à Paris, déjà réglé." in text, text
        rows["charset"]["observed"] = "cp1252 sent as utf-8: " + text.splitlines()[-1][:80]

        text = await _visit(env, f"{site}/image")
        assert "Error:" in text and "image/png" in text, text

        text = await _visit(env, f"{site}/to-private")
        assert "Error:" in text and "10.0.0.5" in text and "private address" in text, text
        rows["private"]["observed"] = text.splitlines()[-1][:200]

        meta = []
        for url in (
            f"{site}/to-metadata-name",
            f"{site}/to-metadata",
            f"http://meta.example.test:{site.rsplit(':', 1)[1]}/latest/meta-data/",
        ):
            text = await _visit(env, url)
            assert "Error:" in text and "169.254.169.254" in text, (url, text)
            meta.append(text.splitlines()[-1][:160])
        rows["meta"]["observed"] = meta[-1]
        await env.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://other.example.test:{port}/", "loopback"),
        ("http://inner.example.test/", "private"),
        ("http://split.example.test/", "private"),  # one public and one private address
        ("http://127.0.0.1:{port}/", "loopback"),  # the site's address, not its listed name
        ("http://[::ffff:127.0.0.1]:{port}/", "loopback"),
        ("http://169.254.169.254/", "metadata"),
        ("http://[fe80::1]/", "link-local"),
    ],
)
async def test_names_and_addresses_that_are_not_public_are_refused(site, url, expected):
    port = site.rsplit(":", 1)[1]
    async with aiohttp.ClientSession() as s:
        env = _env(site, s)
        await env.reset(_task(site))
        text = await _visit(env, url.format(port=port))
        assert "Error:" in text and expected in text.lower(), text
        await env.close()


@pytest.mark.parametrize("allowed", [("*.example.org",), ("public",), ("*.example.org", "public")])
async def test_allowlist_bypasses_are_refused_with_patterns_and_public(site, fault, allowed):
    """The bypass cases of the local web, with patterns and `public` in the list: each is
    refused, or (only where `public` admits any public name) fails to resolve; none reaches
    the site under another name or address."""
    row = fault(
        f"URL-allowlist bypass attempts with {list(allowed)} in the list (api mode)",
        "each refused with an error observation; nothing but the listed site reached",
    )
    async with aiohttp.ClientSession() as s:
        env = _env(site, s, allowed)
        await env.reset(_task(site))
        refused = 0
        for url in bypasses(site):
            text = await _visit(env, url)
            assert "Error:" in text, (url, text[:300])
            assert "The open page." not in text, (url, text[:300])
            refused += "not allowed" in text or "refused" in text
        await env.close()
    row["observed"] = f"{len(bypasses(site))} URLs: {refused} refused, the rest unresolvable"


# ----------------------------------------------------------------------------- proxies


async def _episode_reads(env, origin_url: str, name: str, pages: int, between=None) -> list[str]:
    """Visit ``pages`` pages of the origin; the proxy (Via) each was served through."""
    got = []
    await env.reset(_task(origin_url))
    for k in range(pages):
        text = await _visit(env, f"{origin_url}/{name}/{k}")
        assert "Error:" not in text, text
        got.append(re.search(r"proxy-\d+", text).group(0))
        if between is not None:
            await between(name, k)
    await env.close()
    return got


@pytest.mark.multiprocess
async def test_a_proxy_killed_mid_run_loses_no_episode(tinyproxies, origin, fault):  # noqa: F811
    row = fault(
        "an upstream proxy killed (SIGKILL) mid-run (api mode, 3 tinyproxies, 6 episodes)",
        "no episode lost: its next request moves to another upstream; the dead one benched",
    )
    cfg = EnvConfig(max_steps=100, proxies=tuple(p.url for p in tinyproxies))
    net = Net(origin.url, cfg)
    killed = asyncio.Event()

    async def kill_once(name: str, k: int) -> None:
        if name == "e0" and k == 0 and not killed.is_set():
            tinyproxies[0].kill()  # the proxy e0 was assigned first
            killed.set()
        await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as s:
        envs = [
            make_env("api", origin.url, cfg, SearchConfig(), session=s, net=net, episode_id=f"e{i}")
            for i in range(6)
        ]
        runs = await asyncio.gather(
            *(_episode_reads(env, origin.url, f"e{i}", 3, kill_once) for i, env in enumerate(envs))
        )
    await net.close()
    assert killed.is_set() and all(len(r) == 3 for r in runs), runs
    assert runs[0][0] == "proxy-0" and "proxy-0" not in runs[0][1:], runs[0]
    stats = net.proxies.stats()[tinyproxies[0].url]
    assert stats["benched"] and stats["failures"] >= 1, stats
    row["observed"] = (
        f"6/6 episodes read 3/3 pages; the killed proxy benched after {stats['failures']} "
        f"failed connect(s); e0 went {' -> '.join(runs[0])}"
    )


@pytest.mark.multiprocess
async def test_a_proxy_answering_429_is_benched(tinyproxies, origin, fault):  # noqa: F811
    row = fault(
        "an upstream proxy whose traffic is answered 429 (api mode)",
        "benched; the page is fetched through another upstream; later episodes avoid it",
    )
    origin.bans["proxy-1"] = "429"
    cfg = EnvConfig(max_steps=100, proxies=tuple(p.url for p in tinyproxies))
    net = Net(origin.url, cfg)
    async with aiohttp.ClientSession() as s:
        runs = []
        for i in range(6):
            env = make_env(
                "api", origin.url, cfg, SearchConfig(), session=s, net=net, episode_id=f"b{i}"
            )
            runs.append(await _episode_reads(env, origin.url, f"b{i}", 2))
    await net.close()
    stats = net.proxies.stats()[tinyproxies[1].url]
    assert stats["benched"] and stats["bans"] == 1, stats
    assert all("proxy-1" not in r for r in runs), runs  # every page came through another
    (banned,) = [path for path, via in origin.seen if via == "proxy-1"]  # answered 429 once
    assert len(origin.via(banned)) == 2 and origin.via(banned)[1] != "proxy-1"
    row["observed"] = (
        f"{banned} answered 429 through proxy-1, fetched again through {origin.via(banned)[1]}; "
        "proxy-1 benched; 6/6 episodes read every page, none through it again"
    )


@pytest.mark.browser
@pytest.mark.multiprocess
async def test_the_browser_goes_by_the_same_rules(site, tinyproxies, origin, fault):  # noqa: F811
    """playwright mode through browser_pool and episode_lease, as the engine runs it: robots.txt
    and the address rule at the egress, then episodes over three proxies, one killed."""
    row = fault(
        "the browser modes: robots.txt, a name resolving to 169.254.169.254, a proxy killed",
        "refusal pages as error observations; episodes move to another upstream and go on",
    )
    rollout = RolloutConfig(browsers=1, contexts_per_browser=4)
    cfg = EnvConfig(max_steps=100, allowed_hosts=("public",), robots_txt="on", action_timeout_s=8)
    net = Net(site, cfg, resolver=StaticResolver(NAMES))
    pool_cm = browser_pool(site, cfg, rollout, net)
    async with pool_cm as pool, episode_lease(pool, "rules") as lease:
        env = make_env("playwright", site, cfg, lease=lease, net=net)
        await env.reset(_task(site))
        r = await env.step(f'goto("{site}/private/page")')
        assert "Error:" in r.text and "robots.txt" in r.text, r.text[:400]
        port = site.rsplit(":", 1)[1]
        r = await env.step(f'goto("http://meta.example.test:{port}/")')
        assert "Error:" in r.text and "169.254.169.254" in r.text, r.text[:400]
        r = await env.step(f'goto("{site}/")')
        assert "The open page." in r.text and "Error:" not in r.text, r.text[:400]
        await env.close()
    observed = ["robots.txt and 169.254.169.254 refused"]

    cfg = EnvConfig(max_steps=100, proxies=tuple(p.url for p in tinyproxies), action_timeout_s=8)
    net = Net(origin.url, cfg)
    # Proxy-0 dies between every episode's first page and its second: each episode waits
    # for the others' first pages and for the kill (a slow first step of episode 0 let
    # another episode read its second page through proxy-0 before the kill).
    first_pages = asyncio.Barrier(3)
    killed = asyncio.Event()
    async with browser_pool(origin.url, cfg, rollout, net) as pool:

        async def episode(i: int) -> list[str]:
            seen = []
            async with episode_lease(pool, f"p{i}") as lease:
                env = make_env("playwright", origin.url, cfg, lease=lease, net=net)
                await env.reset(_task(origin.url))
                for k in range(3):
                    if k == 1:
                        await asyncio.wait_for(first_pages.wait(), 60)
                        if i == 0:
                            tinyproxies[0].kill()  # returns once the process is gone
                            killed.set()
                        await asyncio.wait_for(killed.wait(), 60)
                    r = await env.step(f'goto("{origin.url}/p{i}/{k}")')
                    assert "Error:" not in r.text, r.text[:400]
                    seen.append(re.search(r"proxy-\d+", r.text).group(0))
                await env.close()
            return seen

        runs = await asyncio.gather(*(episode(i) for i in range(3)))
    await net.close()
    assert sorted(r[0] for r in runs) == ["proxy-0", "proxy-1", "proxy-2"], runs
    assert all("proxy-0" not in r[1:] for r in runs), runs
    observed.append("3/3 episodes read 3/3 pages; " + "; ".join(" -> ".join(r) for r in runs))
    row["observed"] = "; ".join(observed)
