"""Browser faults on real Chromium: each ends in an error observation (or infra_error) for
its own episode only; a concurrent episode in the same browser is unaffected; no process
is leaked."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env import browser_pool, make_env
from rollout.sidecar.procs import group_pids
from shared.config import EnvConfig, RolloutConfig, SearchConfig
from tests.reliability.test_bad_input import task
from tests.rollout.env.images import MARK_RGB, pixels

pytestmark = [pytest.mark.reliability, pytest.mark.browser, pytest.mark.multiprocess]
BIG = 50 << 20  # bytes of the big page


@pytest_asyncio.fixture(scope="module")
async def hostile():
    """A loopback site of misbehaving pages (allowed by the tests' config)."""

    def html(body: str) -> web.Response:
        return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")

    async def loop(request):
        return html("<p>spinning</p><script>while (true) {}</script>")

    async def big(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        resp.content_length = BIG
        await resp.prepare(request)
        chunk = b"<p>" + b"x" * (1 << 20 - 8) + b"</p>\n"
        sent = 0
        while sent < BIG:
            part = chunk[: BIG - sent]
            await resp.write(part)
            sent += len(part)
        return resp

    async def redirect_loop(request):
        n = int(request.query.get("n", "0"))
        raise web.HTTPFound(f"/redirect-loop?n={n + 1}")

    async def popup(request):
        return html("<p>opening</p><script>setTimeout(() => window.open('/landing'), 10)</script>")

    async def tab(request):
        return html('<a id="tab" href="/landing" target="_blank">open</a>')

    async def dialogs(request):
        return html("<p>asking</p><script>confirm('sure?'); prompt('your name?', 'x')</script>")

    async def landing(request):
        return html("<p>landed here</p>")

    async def norafs(request):  # animation frames that never come, on a page to scroll
        rows = "".join(f'<p>row {i} <a href="/landing">link {i}</a></p>' for i in range(120))
        return html(rows + "<script>window.requestAnimationFrame = () => 0;</script>")

    async def download(request):
        return web.Response(
            body=b"\x00" * 4096,
            headers={"Content-Disposition": 'attachment; filename="data.bin"'},
            content_type="application/octet-stream",
        )

    app = web.Application()
    for path, fn in [("/loop", loop), ("/big", big), ("/redirect-loop", redirect_loop),
                     ("/popup", popup), ("/tab", tab), ("/dialogs", dialogs), ("/landing", landing), ("/download", download), ("/norafs", norafs)]:  # fmt: skip
        app.router.add_get(path, fn)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(hostile: str, **over) -> EnvConfig:
    return EnvConfig(
        **{"allowed_hosts": (hostile.split("//")[1],), "action_timeout_s": 4.0, "max_steps": 50}
        | over
    )


@pytest_asyncio.fixture(scope="module")
async def pool(web_url, hostile):
    rollout = RolloutConfig(browsers=1, contexts_per_browser=4)
    async with browser_pool(web_url, config(hostile), rollout) as p:
        yield p
        groups = list(p.pids)
    for g in groups:
        assert group_pids(g) == []  # nothing of the browser is left


async def _pair(pool, web_url, hostile, mode="playwright", **over):
    """The episode that meets the fault, and a bystander in the same browser."""
    envs, leases = [], []
    for _ in range(2):
        cm = pool.context()
        lease = await cm.__aenter__()
        env = make_env(mode, web_url, config(hostile, **over), SearchConfig(), lease=lease)
        await env.reset(task(web_url))
        envs.append(env)
        leases.append(cm)
    return envs, leases


async def _close(envs, leases):
    for env, cm in zip(envs, leases, strict=True):
        await env.close()
        await cm.__aexit__(None, None, None)


async def _bystander_ok(env, web_url) -> None:
    r = await env.step(f'goto("{web_url}/geo/country/FR")')
    assert "The capital of France is Paris." in r.text and "Error:" not in r.text, r.text[:300]


async def _recovers(env, web_url) -> None:
    """The faulted episode goes on: the next action works."""
    r = await env.step(f'goto("{web_url}/geo/country/DE")')
    assert not r.terminated and "Germany" in r.text and "Error:" not in r.text, r.text[:300]


CASES = {
    "infinite JavaScript loop": ("/loop", "timed out"),
    "50 MB page": ("/big", ""),
    "redirect loop": ("/redirect-loop", "redirect"),
    "file download": ("/download", "download"),
    "confirm and prompt dialogs": ("/dialogs", "dialog was dismissed: confirm: sure?"),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_hostile_page_ends_in_an_error_observation_for_its_episode_only(
    pool, web_url, hostile, fault, name
):
    path, expected = CASES[name]
    row = fault(name, "an error observation (or a truncated page) within the action timeout; "
                "the episode goes on; another episode in the same browser is unaffected")  # fmt: skip
    (victim, other), leases = await _pair(pool, web_url, hostile)
    try:
        t0 = time.monotonic()
        hit, _ = await asyncio.gather(
            victim.step(f'goto("{hostile}{path}")'), _bystander_ok(other, web_url)
        )
        took = time.monotonic() - t0
        assert not hit.terminated, hit.info
        assert took < 30, took
        if expected:
            assert "Error:" in hit.text and expected in hit.text.lower(), hit.text[:400]
        if path == "/dialogs":  # both reported, each once
            assert "prompt: your name?" in hit.text and hit.text.count("confirm: sure?") == 1
        await _recovers(victim, web_url)
        await _bystander_ok(other, web_url)
        lines = hit.text.splitlines()
        shown = next((x for x in lines if x.startswith("Error:")), lines[0] if lines else "")
        row["observed"] = f"{took:.1f} s: {shown[:160]}"
    finally:
        await _close([victim, other], leases)


async def test_popups_and_target_blank_become_the_current_page(pool, web_url, hostile, fault):
    row = fault("popup and target=_blank", "the new tab becomes the current page; no error")
    (env, other), leases = await _pair(pool, web_url, hostile)
    try:
        await env.step(f'goto("{hostile}/popup")')  # window.open from a script
        await _current_page_is(env, f"{hostile}/landing")  # opened 10 ms after the load
        r = await env.step('extract_text("body")')
        assert "landed here" in r.text and "Error:" not in r.text, r.text[:300]
        await env.step(f'goto("{hostile}/tab")')  # a target=_blank link clicked
        r = await env.step('click("#tab")')
        assert "landed here" in r.text and "Error:" not in r.text, r.text[:300]
        await _bystander_ok(other, web_url)
        row["observed"] = "the opened tab is current: " + r.text.splitlines()[-1][:80]
    finally:
        await _close([env, other], leases)


async def _current_page_is(env, url: str, within_s: float = 10.0) -> None:
    """Wait until the episode's current page is the one at ``url`` (a popup adopted)."""
    deadline = time.monotonic() + within_s
    while env.backend.page.url != url:
        assert time.monotonic() < deadline, f"still on {env.backend.page.url} after {within_s} s"
        await asyncio.sleep(0.05)


async def test_a_tab_opened_while_text_is_extracted_is_named_with_the_page_read(
    pool, web_url, hostile, fault
):
    """A tab that becomes the current page while ``extract_text`` or ``screenshot`` runs:
    the observation shows the result with the URL of the new page and says which page
    the text or image is of."""
    row = fault(
        "a tab that opens while extract_text or screenshot runs",
        "the result, with a note naming the page it is of",
    )
    (env, other), leases = await _pair(pool, web_url, hostile)
    try:
        await env.step(f'goto("{hostile}/tab")')
        be, real = env.backend, env.backend._do

        async def then_a_tab_opens(action):
            out = await real(action)
            page = await be.lease.context.new_page()  # the context's page event: adopted
            await page.goto(f"{hostile}/landing")
            return out

        be._do = then_a_tab_opens
        r = await env.step('extract_text("body")')
        be._do = real
        o = r.observation
        assert o.text == "open" and o.url == f"{hostile}/landing" and o.error is None
        assert o.note == (
            f"a new tab opened and is the current page now; the text is of {hostile}/tab, "
            "the page before it"
        )
        r = await env.step('extract_text("body")')  # the next action: the new page
        assert r.observation.text == "landed here" and not r.observation.note
        be._do = then_a_tab_opens  # the same during a screenshot
        r = await env.step("screenshot()")
        be._do = real
        assert r.observation.screenshot[:4] == b"\x89PNG"
        assert r.observation.note == (
            f"a new tab opened and is the current page now; the screenshot is of "
            f"{hostile}/landing, the page before it"
        )
        await _bystander_ok(other, web_url)
        row["observed"] = "Note: " + o.note
    finally:
        await _close([env, other], leases)


async def test_a_page_whose_animation_frames_never_come_is_observed_in_time(
    pool, web_url, hostile, fault
):
    """A page that replaced requestAnimationFrame: the scroll's two-frame wait and the
    marked screenshot's removal of its marks (both wait for animation frames) give up
    on them, and each step is observed within the action's time, marks in its image."""
    row = fault(
        "a page whose animation frames never come (requestAnimationFrame replaced), som "
        "with screenshots",
        "each step observed within the action timeout, the marks in its image",
    )
    (env, other), leases = await _pair(pool, web_url, hostile, mode="som", screenshots=True)
    try:
        took = []
        for action in (f'goto("{hostile}/norafs")', 'scroll("down")', 'scroll("up")'):
            t0 = time.monotonic()
            o = (await env.step(action)).observation
            took.append(time.monotonic() - t0)
            assert o.error is None and "[1]" in o.text, (action, o.error)
            assert pixels(o.screenshot, MARK_RGB) > 0, action
        await _bystander_ok(other, web_url)
        row["observed"] = f"goto, scroll, scroll observed, the slowest in {max(took):.1f} s"
    finally:
        await _close([env, other], leases)


async def test_a_renderer_crash_replaces_the_tab(pool, web_url, hostile, fault):
    row = fault("renderer crash", "an error observation; a fresh tab; the episode goes on")
    (env, other), leases = await _pair(pool, web_url, hostile)
    try:
        cdp = await env.backend.lease.context.new_cdp_session(env.backend.page)
        with contextlib.suppress(Exception):  # the session dies with the renderer
            await asyncio.wait_for(cdp.send("Page.crash"), 2)
        r = await env.step(f'goto("{web_url}/geo/country/FR")')
        if "Error:" in r.text:  # the crash is reported on the next action, then recovered
            assert "crash" in r.text.lower(), r.text[:300]
            r = await env.step(f'goto("{web_url}/geo/country/FR")')
        assert "The capital of France is Paris." in r.text, r.text[:300]
        await _bystander_ok(other, web_url)
        row["observed"] = "reported and replaced; the next goto loads"
    finally:
        await _close([env, other], leases)
