"""The environment with real Chromium on the local web: modes, errors, cookies, crashes."""

import asyncio
import os
import re
import signal

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env import browser_pool, make_env
from rollout.sidecar.procs import group_pids
from shared.config import EnvConfig, RolloutConfig, SearchConfig
from tests.rollout.env.images import MARK_RGB, pixels

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]


@pytest_asyncio.fixture(scope="module")
async def pool(web_url, trouble):
    rollout = RolloutConfig(browsers=2, contexts_per_browser=4)
    async with browser_pool(web_url, config(trouble), rollout) as p:
        yield p
        groups = list(p.pids)
    for g in groups:  # after close, no chromium of ours is left
        assert group_pids(g) == []


@pytest_asyncio.fixture(scope="module")
async def trouble():
    """A second site on loopback with misbehaving pages (allowed by the test's config)."""

    async def hang(request):
        await asyncio.sleep(30)  # longer than any action timeout here
        return web.Response(text="late")

    async def redirect_out(request):
        raise web.HTTPFound("http://127.0.0.2:8081/elsewhere")

    async def dialog(request):
        return web.Response(
            text="<html><body><p id=x>before</p><script>alert('hello there')</script></body></html>",
            content_type="text/html",
        )

    async def js_link(request):
        body = '<html><body><a href="javascript:alert(1)">run</a> <a href="file:///etc/passwd">f</a></body></html>'
        return web.Response(text=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/hang", hang)
    app.router.add_get("/redirect-out", redirect_out)
    app.router.add_get("/dialog", dialog)
    app.router.add_get("/js-link", js_link)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(trouble_url: str = "", **over) -> EnvConfig:
    hosts = (trouble_url.split("//")[1],) if trouble_url else ()
    return EnvConfig(**{"allowed_hosts": hosts, "action_timeout_s": 3.0, **over})


def task(web_url: str, start: str = "/", **over) -> dict:
    return {
        "id": "test-qa-1", "question": "What is the capital of France?", "answer": "Paris",
        "aliases": [], "type": "qa", "hops": 1, "start_url": web_url + start,
        "evidence": [{"url": f"{web_url}/geo/country/FR", "quote": "The capital of France is Paris."}],
        **over,
    }  # fmt: skip


async def browser_env(pool, mode, web_url, cfg=None, start="/"):
    cm = pool.context()
    lease = await cm.__aenter__()
    env = make_env(mode, web_url, cfg or config(), SearchConfig(), lease=lease)
    await env.reset(task(web_url, start))
    return env, cm


async def close(env, cm):
    await env.close()
    await cm.__aexit__(None, None, None)


async def test_js_rendered_content_in_browser_modes_and_not_in_api_mode(pool, web_url):
    for mode in ("playwright", "som"):
        env, cm = await browser_env(pool, mode, web_url, start="/airports/CDG")
        try:
            assert "392 ft" in env.user_prompt() and "Loading details" not in env.user_prompt()
        finally:
            await close(env, cm)
    async with aiohttp.ClientSession() as s:
        env = make_env("api", web_url, config(), SearchConfig(), session=s)
        await env.reset(task(web_url))
        r = await env.step(f"<action>visit</action><url>{web_url}/airports/CDG</url>")
        assert "Loading details" in r.text and "392 ft" not in r.text
        await env.close()


async def test_login_holds_three_steps_later(pool, web_url):
    env, cm = await browser_env(pool, "playwright", web_url, start="/members/login")
    try:
        await env.step('fill("input[name=username]", "reader")')
        await env.step('fill("input[name=password]", "factbook")')
        r = await env.step('click("main form button")')
        assert "Editors' notes" in r.text, r.text[:300]
        for iso in ("FR", "DE", "JP"):
            r = await env.step(f'goto("{web_url}/members/notes/{iso}")')
            assert "Population sources for" in r.text and "Members only" not in r.text
    finally:
        await close(env, cm)


async def test_concurrent_episodes_do_not_share_cookies(pool, web_url):
    (a, ca), (b, cb) = await asyncio.gather(
        browser_env(pool, "playwright", web_url, start="/members/login"),
        browser_env(pool, "playwright", web_url),
    )
    try:
        await a.step('fill("input[name=username]", "reader")')
        await a.step('fill("input[name=password]", "factbook")')
        await a.step('click("main form button")')
        ra, rb = await asyncio.gather(
            a.step(f'goto("{web_url}/members/notes/FR")'),
            b.step(f'goto("{web_url}/members/notes/FR")'),
        )
        assert "Population sources" in ra.text
        assert "Members only" in rb.text
    finally:
        await close(a, ca)
        await close(b, cb)


async def test_pagination_by_click_in_both_browser_modes(pool, web_url):
    env, cm = await browser_env(pool, "playwright", web_url, start="/airports/country/FR?page=1")
    try:
        r = await env.step('click("a[rel=next]")')
        assert "Page 2 of" in r.text and r.observation.url.endswith("page=2")
    finally:
        await close(env, cm)
    env, cm = await browser_env(pool, "som", web_url, start="/airports/country/FR?page=1")
    try:
        n = re.search(r'\[(\d+)\] link "Next page"', env.user_prompt()).group(1)
        r = await env.step(f"click({n})")
        assert "Page 2 of" in r.text
    finally:
        await close(env, cm)


@pytest.mark.reliability
async def test_agent_errors_become_observations_and_the_episode_goes_on(
    pool, web_url, trouble, fault
):
    row = fault(
        "page that never responds; an alert dialog; a redirect from an allowed to a disallowed host; file: URLs",
        "error observations (timed out / dialog dismissed / refused / not allowed); the episode goes on and its answer is scored",
    )
    env, cm = await browser_env(pool, "playwright", web_url, cfg=config(trouble))
    try:
        cases = [
            (f'goto("{trouble}/hang")', "timed out"),
            ('click("#no-such-element")', "no element matches '#no-such-element'"),
            ("I think I should look around first.", "No action found"),
            ('goto("http://evil.example/")', "not allowed"),
            ('goto("file:///etc/passwd")', "not allowed"),
            (f'goto("{trouble}/redirect-out")', "refused to load http://127.0.0.2:8081/elsewhere"),
            (f'goto("{trouble}/dialog")', "a dialog was dismissed: alert: hello there"),
        ]
        for text, expected in cases:
            r = await env.step(text)
            assert not (r.terminated or r.truncated), text
            assert "Error:" in r.text and expected.lower() in r.text.lower(), (text, r.text[:300])
        r = await env.step(f'goto("{web_url}/geo/country/FR")')
        assert "The capital of France is Paris." in r.text and "Error:" not in r.text
        r = await env.step('answer("Paris")')
        assert r.terminated and r.info["status"] == "ok"
        # Correct, less the format penalty for the unparsable replies above.
        assert r.info["reward_breakdown"]["verdict"] == "correct" and 0.5 < r.reward < 1.0
        assert [s.error for s in env.record.steps[:4]] == [
            "timeout",
            "tool_error",
            "parse_error",
            "parse_error",
        ]
    finally:
        await close(env, cm)
    row["observed"] = (
        "timeout, dismissed dialog, refused redirect, refused file: as error observations; answer scored"
    )


@pytest.mark.reliability
async def test_som_marks_elements_and_acts_by_number(pool, web_url, trouble, fault):
    row = fault(
        "javascript: and file: links clicked in som mode", "refused with an error observation"
    )
    env, cm = await browser_env(pool, "som", web_url, cfg=config(trouble))
    try:
        first = env.user_prompt()
        box = re.search(r'\[(\d+)\] searchbox "Search query" value=""', first).group(1)
        button = re.search(r'\[(\d+)\] button "Search"', first.split(f"[{box}]")[1]).group(1)
        r = await env.step(f'type({box}, "Curie discovered")')
        assert f'[{box}] searchbox "Search query" value="Curie discovered"' in r.text
        r = await env.step(f"click({button})")
        assert "Results for" in r.text
        r = await env.step("click(999)")
        assert "there is no element [999]" in r.text
        r = await env.step(f'goto("{trouble}/js-link")')
        for label in ("run", "f"):
            n = re.search(rf'\[(\d+)\] link "{label}"', r.text).group(1)
            refused = await env.step(f"click({n})")
            assert "not an allowed site" in refused.text
    finally:
        await close(env, cm)
    row["observed"] = "both clicks refused: not an allowed site"


@pytest.mark.reliability
async def test_a_killed_browser_ends_only_its_episodes_as_infra_error(web_url, fault):
    row = fault(
        "the browser process killed (SIGKILL)",
        "its episode ends as infra_error; an episode in another browser goes on",
    )
    rollout = RolloutConfig(browsers=2, contexts_per_browser=1)
    async with browser_pool(web_url, config(), rollout) as p:
        (a, ca), (b, cb) = await asyncio.gather(
            browser_env(p, "playwright", web_url), browser_env(p, "playwright", web_url)
        )
        try:
            victim = next(lb for lb in p._browsers if lb.id == a.backend.lease.browser_id)
            os.killpg(victim.pid, signal.SIGKILL)
            deadline = asyncio.get_running_loop().time() + 10
            while not a.backend.lease.browser_lost:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            ra = await a.step(f'goto("{web_url}/geo/country/FR")')
            assert ra.terminated and ra.info["status"] == "infra_error"
            assert a.record.status == "infra_error"
            rb = await b.step(f'goto("{web_url}/geo/country/FR")')
            assert not rb.terminated and "The capital of France is Paris." in rb.text
        finally:
            await close(a, ca)
            await close(b, cb)
    row["observed"] = "infra_error for the victim; the bystander loaded its page"


async def test_budget_truncates_and_answers_terminate(web_url):
    async with aiohttp.ClientSession() as s:
        env = make_env("api", web_url, config(max_steps=2), SearchConfig(), session=s)
        await env.reset(task(web_url))
        r1 = await env.step("<action>search</action><query>France capital</query>")
        assert "Search results" in r1.text and not r1.truncated
        r2 = await env.step(f"<action>visit</action><url>{web_url}/geo/country/FR</url>")
        assert (
            r2.truncated and r2.info["status"] == "truncated" and env.record.status == "truncated"
        )
        with pytest.raises(RuntimeError, match="over"):
            await env.step("<action>answer</action><answer>Paris</answer>")
        await env.close()


def mark_pixels(image: bytes) -> int:
    """How many pixels of an image are (within JPEG's error of) the marks' colour."""
    return pixels(image, MARK_RGB, tolerance=24)


async def test_screenshots_are_pngs_and_som_draws_its_marks(pool, web_url):
    env, cm = await browser_env(pool, "playwright", web_url, start="/geo/country/FR")
    try:
        r = await env.step("screenshot()")
        assert r.observation.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
        assert "bytes PNG]" in r.text and "The capital of France is Paris." in r.text
    finally:
        await close(env, cm)
    marked = config(screenshots=True)
    plain_env, pcm = await browser_env(pool, "som", web_url, start="/geo/country/FR")
    som_env, scm = await browser_env(pool, "som", web_url, cfg=marked, start="/geo/country/FR")
    try:
        assert plain_env.first.screenshot is None
        shot = som_env.first.screenshot
        assert shot is not None and shot[:4] == b"\x89PNG"
        # The marks are drawn for the picture only: the page itself is left unchanged.
        page = som_env.backend.page
        overlay = await page.evaluate("!!document.getElementById('__som_overlay')")
        assert overlay is False
        # ... and they are in the picture: a box and a number tag per element in view
        n_marks = sum(1 for e in som_env.first.elements if 0 <= e["y"] < 720)
        assert n_marks >= 5
        assert mark_pixels(shot) > 100 * n_marks
        assert mark_pixels(await page.screenshot()) == 0
    finally:
        await close(plain_env, pcm)
        await close(som_env, scm)


@pytest.mark.parametrize(
    ("fmt", "magic"), [("jpeg", b"\xff\xd8\xff"), ("webp", b"RIFF"), ("png", b"\x89PNG")]
)
async def test_screenshots_come_in_the_configured_format(pool, web_url, fmt, magic):
    cfg = config(screenshots=True, screenshot_format=fmt, screenshot_quality=60,
                 screenshot_fast=fmt == "png")  # fmt: skip
    env, cm = await browser_env(pool, "som", web_url, cfg=cfg, start="/geo/country/FR")
    try:
        shot = env.first.screenshot
        assert shot[: len(magic)] == magic and mark_pixels(shot) > 500
        r = await env.step('scroll("down")')
        assert r.observation.screenshot[: len(magic)] == magic
        assert f"bytes {fmt.upper()}]" in r.text
    finally:
        await close(env, cm)
    pw, pcm = await browser_env(pool, "playwright", web_url, cfg=cfg, start="/geo/country/FR")
    try:  # the screenshot action too
        assert (await pw.step("screenshot()")).observation.screenshot[: len(magic)] == magic
    finally:
        await close(pw, pcm)


def test_an_image_s_type_is_read_from_its_first_bytes():
    from rollout.env.observation import image_type

    assert image_type(b"\x89PNG\r\n\x1a\n...") == "png"
    assert image_type(b"\xff\xd8\xff\xe0...") == "jpeg"
    assert image_type(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "webp"
    assert image_type(b"") == "png"


def test_api_mode_shows_where_a_script_loads_a_panel_from():
    """api mode runs no JavaScript: a section a script fills from its ``data-src`` gets a
    link to that source, so the agent can visit it (the airport pages' details panel)."""
    from rollout.env.api import html_to_markdown

    page = (
        "<main><h1>Oslo Airport</h1><section id='details' data-src='/airports/api/OSL.json'>"
        "<h2>Details</h2><p class='loading'>Loading details...</p></section></main>"
    )
    _, text = html_to_markdown(page)
    assert "[loaded by JavaScript from this source](/airports/api/OSL.json)" in text, text
    assert text.index("Details") < text.index("/airports/api/OSL.json")
