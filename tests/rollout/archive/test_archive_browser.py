"""Recording a real Chromium context's traffic against a local site, then replaying it
with the site stopped: the pages read the same, logins replay, misses are reported."""

from __future__ import annotations

import base64
from collections import defaultdict

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.archive.browser import BrowserRecorder, BrowserReplayer, Miss
from rollout.archive.store import Archive, ArchiveWriter

pytestmark = [pytest.mark.browser]

EPISODE = "ep-1"
GONE = "http://127.0.0.1:1/gone.png"  # nothing listens there: the request fails
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


# ----------------------------------------------------------------------------- the site


class Site:
    """Pages that exercise what a recording must hold."""

    def __init__(self) -> None:
        self.visits = 0
        self.url = ""
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        routes = [
            ("GET", "/panel", self.panel),
            ("GET", "/app.js", self.script),
            ("GET", "/api/panel", self.panel_moved),
            ("GET", "/api/panel.json", self.panel_json),
            ("GET", "/logo.png", self.logo),
            ("GET", "/list", self.listing),
            ("GET", "/login", self.login_form),
            ("POST", "/login", self.login),
            ("GET", "/members", self.members),
            ("GET", "/prefs", self.prefs),
            ("GET", "/old", self.old),
            ("GET", "/counter", self.counter),
            ("GET", "/fresh", self.fresh),
            ("GET", "/broken", self.broken),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    async def start(self, port: int = 0) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    @staticmethod
    def html(body: str, **kw) -> web.Response:
        return web.Response(
            text=f"<!doctype html><body>{body}</body>", content_type="text/html", **kw
        )

    async def panel(self, request: web.Request) -> web.Response:
        return self.html(
            "<h1>Dashboard</h1><div id=panel>loading</div>"
            "<img src=/logo.png onload=\"shown.textContent='image '+this.naturalWidth+'x'+this.naturalHeight\">"
            "<span id=shown>no image</span><script src=/app.js></script>"
        )

    async def script(self, request: web.Request) -> web.Response:
        js = (
            "fetch('/api/panel').then(r => r.json()).then(d => {"
            " const p = document.getElementById('panel');"
            " p.textContent = d.text + ' (' + d.items.join(', ') + ')'; p.className = 'filled'; });"
            + " // padding so that compression applies"
            * 40
        )
        resp = web.Response(text=js, content_type="application/javascript")
        resp.enable_compression()  # replay must drop Content-Encoding: the body is decoded
        return resp

    async def panel_moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/api/panel.json")  # a redirect inside an XHR

    async def panel_json(self, request: web.Request) -> web.Response:
        return web.json_response({"text": "panel from xhr", "items": ["alpha", "beta"]})

    async def logo(self, request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def listing(self, request: web.Request) -> web.Response:
        page = int(request.query.get("page", "1"))
        items = "".join(f"<li>item {10 * (page - 1) + i}</li>" for i in range(1, 4))
        nav = f"<a id=next href='/list?page={page + 1}'>next</a>" if page < 2 else "last page"
        return self.html(f"<h1>List, page {page}</h1><ul>{items}</ul>{nav}")

    async def login_form(self, request: web.Request) -> web.Response:
        return self.html(
            "<form method=post action=/login><input name=user><button>Sign in</button></form>"
        )

    async def login(self, request: web.Request) -> web.Response:
        user = (await request.post()).get("user", "")
        resp = web.HTTPSeeOther("/members")  # the cookies come on the redirect
        resp.set_cookie("session", f"s-{user}", path="/")
        raise resp

    async def prefs(self, request: web.Request) -> web.Response:
        resp = self.html("preferences saved")  # two cookies on an ordinary 200
        resp.set_cookie("theme", "dark", path="/")
        resp.set_cookie("lang", "en", path="/")
        return resp

    async def members(self, request: web.Request) -> web.Response:
        session = request.cookies.get("session", "")
        if not session.startswith("s-"):
            return self.html("please sign in", status=403)
        theme, lang = request.cookies.get("theme", "-"), request.cookies.get("lang", "-")
        return self.html(f"<h1>Members</h1>welcome {session[2:]} (theme {theme}, lang {lang})")

    async def old(self, request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/list?page=1")

    async def counter(self, request: web.Request) -> web.Response:
        self.visits += 1
        return self.html(f"visit {self.visits}", headers={"Cache-Control": "no-store"})

    async def broken(self, request: web.Request) -> web.Response:
        return self.html(f"an image that cannot load <img src={GONE}>")

    async def fresh(self, request: web.Request) -> web.Response:
        return self.html("a page first seen after the recording")


async def session(context, base: str, before_close=None) -> list[str]:
    """Visit the site's pages in order; the body's text after each load. A recording
    flushes (``before_close``) before the page closes: a response's body is read from
    the page that made it, so a page closed first can take the last one with it."""
    page = await context.new_page()
    page.set_default_timeout(10_000)
    texts: list[str] = []

    async def read() -> None:
        texts.append(await page.evaluate("document.body.innerText"))

    await page.goto(f"{base}/panel")
    await page.wait_for_selector("#panel.filled")
    await read()
    await page.goto(f"{base}/list?page=1")
    await read()
    await page.click("#next")
    await page.wait_for_url("**/list?page=2")
    await read()
    await page.goto(f"{base}/login")
    await page.fill("input[name=user]", "ada")
    async with page.expect_navigation(url="**/members"):
        await page.click("button")
    await read()
    await page.goto(f"{base}/prefs")
    await read()
    await page.goto(f"{base}/members")
    await read()
    await page.goto(f"{base}/old")
    await read()
    await page.goto(f"{base}/counter")
    await read()
    await page.reload()
    await read()
    await page.goto(f"{base}/broken")
    await read()
    if before_close is not None:
        await before_close()
    await page.close()
    return texts


# ----------------------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(scope="module")
async def recorded(browser, tmp_path_factory):
    """One recorded session in a WARC directory; the site is stopped afterwards (the
    live-fallback test starts it again)."""
    site, directory = Site(), tmp_path_factory.mktemp("archive")
    await site.start()
    ctx = await browser.new_context()
    with ArchiveWriter(directory) as writer:
        recorder = await BrowserRecorder.attach(ctx, writer, EPISODE)
        texts = await session(ctx, site.url, recorder.flush)
    await ctx.close()
    await site.stop()
    return site, directory, recorder, texts


@pytest_asyncio.fixture
async def replay(browser, recorded):
    """A fresh context replaying the recording, no fallback."""
    site, directory, _, _ = recorded
    ctx = await browser.new_context()
    replayer = await BrowserReplayer.attach(ctx, Archive.open(directory), EPISODE)
    yield ctx, replayer, site.url
    await ctx.close()


# ----------------------------------------------------------------------------- tests


async def test_recording_holds_every_kind_of_request(recorded):
    site, directory, recorder, texts = recorded
    exchanges = list(Archive.open(directory).exchanges())
    assert texts[0].startswith("Dashboard\npanel from xhr (alpha, beta)")
    assert "image 1x1" in texts[0]
    assert "welcome ada (theme -, lang -)" in texts[3]
    assert "welcome ada (theme dark, lang en)" in texts[5]
    assert texts[6].startswith("List, page 1")  # after the redirect
    assert texts[7:9] == ["visit 1", "visit 2"]
    by_path = defaultdict(list)
    for ex in exchanges:
        assert ex.kind == "browser" and ex.episode == EPISODE
        by_path[(ex.method, ex.url.removeprefix(site.url))].append(ex)
    assert by_path[("GET", "/logo.png")][0].response_body == PNG
    assert b"panel from xhr" in by_path[("GET", "/api/panel.json")][0].response_body
    assert b"fetch(" in by_path[("GET", "/app.js")][0].response_body  # decoded, not gzip
    (login,) = by_path[("POST", "/login")]
    assert login.request_body == b"user=ada" and login.status == 303
    (prefs,) = by_path[("GET", "/prefs")]
    cookies = [v for k, v in prefs.response_headers if k.lower() == "set-cookie"]
    assert len(cookies) == 2  # the repeated header is kept as two
    for hop, status, location in [
        ("/old", 301, "/list?page=1"),
        ("/api/panel", 302, "/api/panel.json"),
    ]:
        (ex,) = by_path[("GET", hop)]  # each redirect hop is its own exchange
        assert ex.status == status and ("Location", location) in ex.response_headers
        assert ex.response_body == b""
    assert len(by_path[("GET", "/counter")]) == 2
    assert recorder.stats == {"recorded": len(exchanges), "skipped": 1}  # GONE


async def test_replay_with_the_site_stopped_reads_the_same(recorded, replay):
    _, _, recorder, texts = recorded
    ctx, replayer, base = replay
    assert await session(ctx, base) == texts  # the xhr panel, the login, the counter as recorded
    assert replayer.misses == [Miss(GONE, "image", False)]  # it failed when recorded
    assert not replayer.missed_navigation(GONE)
    # every recorded exchange answered once, redirect hops included
    assert replayer.stats == {"served": recorder.stats["recorded"], "misses": 1, "live": 0}


async def test_cookies_set_in_replay_are_stored_and_sent(replay):
    ctx, _, base = replay
    page = await ctx.new_page()
    await page.goto(f"{base}/login")
    await page.fill("input[name=user]", "ada")
    async with page.expect_navigation(url="**/members") as nav:
        await page.click("button")
    assert await _cookies(ctx) == {"session": "s-ada"}  # set by the 303 hop
    assert "session=s-ada" in await _sent_cookie(await nav.value)
    await page.goto(f"{base}/prefs")  # a fulfilled 200 with two Set-Cookie headers
    assert await _cookies(ctx) == {"session": "s-ada", "theme": "dark", "lang": "en"}
    sent = await _sent_cookie(await page.goto(f"{base}/members"))
    assert all(c in sent for c in ("session=s-ada", "theme=dark", "lang=en"))


async def _cookies(ctx) -> dict[str, str]:
    return {c["name"]: c["value"] for c in await ctx.cookies()}


async def _sent_cookie(response) -> str:
    return (await response.request.all_headers()).get("cookie", "")


async def test_an_unrecorded_url_is_a_404_and_a_miss(replay):
    ctx, replayer, base = replay
    page = await ctx.new_page()
    response = await page.goto(f"{base}/never")
    assert response.status == 404
    assert await page.evaluate("document.body.innerText") == f"not in the archive: {base}/never"
    assert replayer.misses == [Miss(f"{base}/never", "document", True)]
    assert replayer.missed_navigation(f"{base}/never")
    assert not replayer.missed_navigation(f"{base}/panel")


async def test_with_a_live_fallback_new_urls_are_fetched_and_recorded(browser, recorded, tmp_path):
    site, directory, _, _ = recorded
    await site.start(int(site.url.rsplit(":", 1)[1]))  # the recorded origin, running again
    ctx = await browser.new_context()
    try:
        with ArchiveWriter(tmp_path) as live:
            fallback = await BrowserRecorder.attach(ctx, live, EPISODE)
            replayer = await BrowserReplayer.attach(
                ctx, Archive.open(directory), EPISODE, fallback=fallback
            )
            page = await ctx.new_page()
            await page.goto(f"{site.url}/counter")
            assert await page.evaluate("document.body.innerText") == "visit 1"  # archived
            await page.goto(f"{site.url}/fresh")
            text = await page.evaluate("document.body.innerText")
            assert text == "a page first seen after the recording"
            await fallback.flush()
    finally:
        await ctx.close()
        await site.stop()
    (fresh,) = Archive.open(tmp_path).exchanges()  # only the live one, not the archived
    assert fresh.url == f"{site.url}/fresh" and b"first seen" in fresh.response_body
    assert replayer.stats == {"served": 1, "misses": 0, "live": 1} and replayer.misses == []
    assert site.visits == 2  # the recorded two: the replayed counter never reached the site
