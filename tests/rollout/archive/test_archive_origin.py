"""An archive recorded while the local web listened at one address replays in a run whose web
listens at another: the recorded origin is matched to the new one in requests and rewritten
to it in answers. Also the browser's re-sent POST after a 307/308, replayed as recorded."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from rollout.archive.format import request_key
from rollout.archive.origin import Rewrite, origin_of
from rollout.archive.store import Archive, ArchiveWriter, Exchange
from tests.conftest import REPO, WEB_CACHE

OLD, NEW = "http://127.0.0.1:38931", "http://127.0.0.1:39153"


def _ex(url: str, body: bytes = b"", **kw) -> Exchange:
    fields = {
        "method": "GET", "url": url, "request_headers": (), "request_body": b"",
        "status": 200, "reason": "OK", "response_headers": (), "response_body": body,
        "episode": "e", "kind": "page",
    }  # fmt: skip
    return Exchange(**{**fields, **kw})


def _write(directory: Path, exchanges: list[Exchange], origin: str | None) -> None:
    with ArchiveWriter(directory, origin=origin) as writer:
        for ex in exchanges:
            writer.write(ex)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- the mapping


def test_the_origin_is_rewritten_in_each_form_and_nowhere_else():
    rewrite = Rewrite(OLD, NEW)
    text = (
        f'<a href="{OLD}/a">, //127.0.0.1:38931/b, Host: 127.0.0.1:38931, '
        "?next=http%3A%2F%2F127.0.0.1%3a38931%2Fc, HTTP://127.0.0.1:38931/d."
    )
    assert rewrite.text(text) == (
        f'<a href="{NEW}/a">, //127.0.0.1:39153/b, Host: 127.0.0.1:39153, '
        "?next=http%3A%2F%2F127.0.0.1%3A39153%2Fc, http://127.0.0.1:39153/d."
    )
    others = "http://127.0.0.1:389310/x http://127.0.0.1:3893/y http://10.127.0.0.1:38931/z http://127.0.0.1/w"  # fmt: skip
    assert rewrite.text(others) == others
    assert rewrite.bytes(text.encode()) == rewrite.text(text).encode()
    named = Rewrite("http://site.test", "http://127.0.0.1:5")  # a default port
    assert named.text("http://site.test/a site.test.evil/ mysite.test site.test:81") == (
        "http://127.0.0.1:5/a site.test.evil/ mysite.test site.test:81"
    )
    assert origin_of("HTTP://Example.COM:80/path?q") == "http://example.com"
    assert origin_of("http://127.0.0.1:38931/") == OLD


def test_keys_match_across_origins_and_only_the_web_origin():
    def key(url: str, origin: str, body: bytes = b"") -> bytes:
        return request_key("POST", url, body, (origin,))

    assert key(f"{OLD}/p?x=1", OLD) == key(f"{NEW}/p?x=1", NEW)
    assert key(f"{OLD}/p", OLD, b"next=http%3A%2F%2F127.0.0.1%3A38931%2F") == key(
        f"{NEW}/p", NEW, b"next=http%3A%2F%2F127.0.0.1%3A39153%2F"
    )
    assert key(f"{OLD}/p", OLD) != key(f"{NEW}/q", NEW)
    assert key("http://other.test/p", OLD) == key("http://other.test/p", NEW)
    assert key(f"{OLD}/p", NEW) != key(f"{NEW}/p", NEW)  # the old origin is just another host


# ----------------------------------------------------------------------------- the archive


def _recorded_at_old() -> list[Exchange]:
    hits = json.dumps([{"url": f"{OLD}/page/1", "title": "one", "snippet": "..."}]).encode()
    return [
        _ex(f"{OLD}/api/search?q=one&k=10", hits, kind="search", episode=""),
        _ex(f"{OLD}/page/1", f'<a href="{OLD}/page/2">two</a> <a href="/page/3">3</a>'.encode(),
            response_headers=(("Access-Control-Allow-Origin", OLD), ("Content-Type", "text/html"))),
        _ex(f"{OLD}/old", status=301, reason="Moved", response_headers=(("Location", f"{OLD}/page/1"),)),
        _ex(f"{OLD}/login", b"welcome", method="POST",
            request_body=b"next=http%3A%2F%2F127.0.0.1%3A38931%2Fmembers"),
        _ex("http://other.test/x", f"see {OLD}/page/1".encode()),
    ]  # fmt: skip


def test_an_archive_recorded_at_one_origin_answers_at_another(tmp_path):
    recorded = _recorded_at_old()
    _write(tmp_path, recorded, OLD)
    archive = Archive.open(tmp_path, origin=NEW)
    assert archive.origins == [OLD] and archive.origin == NEW
    hits = archive.lookup("GET", f"{NEW}/api/search?q=one&k=10")
    assert json.loads(hits.response_body)[0]["url"] == f"{NEW}/page/1"
    page = archive.lookup("GET", f"{NEW}/page/1", episode="e")
    assert page.url == f"{NEW}/page/1"
    assert page.response_body == f'<a href="{NEW}/page/2">two</a> <a href="/page/3">3</a>'.encode()
    assert ("Access-Control-Allow-Origin", NEW) in page.response_headers
    moved = archive.lookup("GET", f"{NEW}/old", episode="e")
    assert ("Location", f"{NEW}/page/1") in moved.response_headers
    body = b"next=http%3A%2F%2F127.0.0.1%3A39153%2Fmembers"
    assert archive.lookup("POST", f"{NEW}/login", body).response_body == b"welcome"
    other = archive.lookup("GET", "http://other.test/x")
    assert (
        other.url == "http://other.test/x" and other.response_body == f"see {NEW}/page/1".encode()
    )
    assert archive.lookup("GET", f"{OLD}/page/1") is None  # no web listens there in this run
    # opened without an origin: the archive answers at the recorded one, as recorded
    as_recorded = Archive.open(tmp_path)
    assert list(as_recorded.exchanges()) == recorded
    assert as_recorded.lookup("GET", f"{OLD}/page/1").response_body == recorded[1].response_body
    # the files themselves hold what was sent, and name the origin for any reader
    (path,) = tmp_path.glob("*.warc.gz")
    with path.open("rb") as f:
        info = next(iter(ArchiveIterator(f))).content_stream().read().decode()
    assert f"web-origin: {OLD}" in info and NEW not in path.read_bytes().decode("latin-1")


def test_an_archive_recorded_without_an_origin_still_replays_at_its_own(tmp_path):
    recorded = _recorded_at_old()
    _write(tmp_path, recorded, None)  # as every archive was before origins were recorded
    archive = Archive.open(tmp_path, origin=OLD)
    assert archive.origins == []
    assert archive.lookup("GET", f"{OLD}/page/1").response_body == recorded[1].response_body
    body = b"next=http%3A%2F%2F127.0.0.1%3A38931%2Fmembers"
    assert archive.lookup("POST", f"{OLD}/login", body).response_body == b"welcome"


async def test_api_episodes_recorded_on_the_web_replay_with_the_web_elsewhere(
    web_url, local_web, tmp_path
):
    """What a sidecar and rollout.eval do (``Net``'s archive): oracle episodes recorded
    against the running web, replayed by a ``Net`` whose web is at a port nowhere listens."""
    from rollout.agent.policies import scripted_oracle
    from rollout.env import make_env
    from rollout.net.core import Net
    from rollout.tasks.generate import generate
    from shared.config import EnvConfig, RolloutConfig, SearchConfig

    async def run(web: str, archive: str) -> list[tuple[list[str], float]]:
        cfg = EnvConfig(archive=archive, archive_dir=str(tmp_path / "archive"))
        net, out = Net(web, cfg), []
        async with aiohttp.ClientSession() as session:
            for i, task in enumerate(generate(local_web, "test", 4, base_url=web)):
                env = make_env("api", web, cfg, SearchConfig(), session=session, net=net, episode_id=f"e{i}")  # fmt: skip
                await env.reset(task)
                policy, text, texts = scripted_oracle("api", task, web, RolloutConfig()), env.user_prompt(), []  # fmt: skip
                while True:
                    r = await env.step(policy.next(text))
                    text = r.text
                    texts.append(text)
                    if r.terminated or r.truncated:
                        break
                await env.close()
                out.append((texts, r.reward))
        await net.close()
        return out

    elsewhere = f"http://127.0.0.1:{_free_port()}"
    recorded, replayed = await run(web_url, "record"), await run(elsewhere, "replay")
    port = urlsplit(web_url).netloc
    assert [r for _, r in recorded] == [1.0] * 4
    assert replayed == [([t.replace(port, urlsplit(elsewhere).netloc) for t in texts], r) for texts, r in recorded]  # fmt: skip
    assert any(urlsplit(elsewhere).netloc in t for texts, _ in replayed for t in texts)


# ----------------------------------------------------------------------------- the browser


class Site:
    """Pages that name their own origin (absolute links, JSON, a redirect's Location) and
    a form whose POST is redirected with 307 or 308."""

    def __init__(self, status: int = 307):
        self.status, self.url, self.runner = status, "", None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/start", self.start_page)
        app.router.add_get("/data.json", self.data)
        app.router.add_get("/next", self.next_page)
        app.router.add_get("/old", self.old)
        app.router.add_get("/form", self.form)
        app.router.add_post("/submit", self.submit)
        app.router.add_post("/done", self.done)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    @staticmethod
    def html(body: str) -> web.Response:
        return web.Response(text=f"<!doctype html><body>{body}</body>", content_type="text/html")

    async def start_page(self, request: web.Request) -> web.Response:
        return self.html(
            f"<h1>Start</h1><a id=next href='{self.url}/next'>next</a><div id=panel>loading</div>"
            f"<script>fetch('{self.url}/data.json').then(r => r.json()).then(d => {{"
            " const p = document.getElementById('panel');"
            " p.textContent = 'data for ' + d.page; p.className = 'filled'; });</script>"
        )

    async def data(self, request: web.Request) -> web.Response:
        return web.json_response({"page": f"{self.url}/next"})

    async def next_page(self, request: web.Request) -> web.Response:
        return self.html(f"<h1>Next</h1>back at {self.url}/start")

    async def old(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{self.url}/next")

    async def form(self, request: web.Request) -> web.Response:
        return self.html(
            "<form method=post action=/submit><input name=q value=hello><button>go</button></form>"
        )

    async def submit(self, request: web.Request) -> web.Response:
        redirect = web.HTTPTemporaryRedirect if self.status == 307 else web.HTTPPermanentRedirect
        raise redirect("/done")

    async def done(self, request: web.Request) -> web.Response:
        return self.html(f"{request.method} {(await request.read()).decode()}")


async def _visit_links(ctx, base: str, before_close=None) -> list[tuple[str, str]]:
    """(URL, text) after each step: a page whose script fetches an absolute URL, a click
    on an absolute link, an absolute redirect."""
    page = await ctx.new_page()
    page.set_default_timeout(10_000)
    seen = []

    async def read() -> None:
        seen.append((page.url, await page.evaluate("document.body.innerText")))

    await page.goto(f"{base}/start")
    await page.wait_for_selector("#panel.filled")
    await read()
    async with page.expect_navigation(url="**/next"):
        await page.click("#next")
    await read()
    await page.goto(f"{base}/old")
    await read()
    if before_close is not None:
        await before_close()
    await page.close()
    return seen


async def _post_then_redirect(ctx, base: str, before_close=None) -> list[tuple[str, str]]:
    """A form POST whose answer is a 307/308 (the browser posts again to the target), then
    the same by fetch()."""
    page = await ctx.new_page()
    page.set_default_timeout(10_000)
    await page.goto(f"{base}/form")
    async with page.expect_navigation(url="**/done"):
        await page.click("button")
    seen = [(page.url, await page.evaluate("document.body.innerText"))]
    # replay answers a script's request at the URL it asked for (it sees no redirect)
    fetched = await page.evaluate(
        "fetch('/submit', {method: 'POST', body: 'via=fetch'}).then(r => r.text())"
    )
    seen.append(("fetch", re.sub(r"<[^>]+>", "", fetched)))
    if before_close is not None:
        await before_close()
    await page.close()
    return seen


async def _record_and_replay(browser, tmp_path, site: Site, session, replay_at: str | None):
    """``session`` recorded against the live site, then replayed with the site stopped, at
    ``replay_at`` (an address nothing listens on) or at the site's own address."""
    from rollout.archive.browser import BrowserRecorder, BrowserReplayer

    await site.start()
    ctx = await browser.new_context()
    try:
        with ArchiveWriter(tmp_path, origin=site.url) as writer:
            recorder = await BrowserRecorder.attach(ctx, writer, "ep")
            live = await session(ctx, site.url, recorder.flush)
    finally:
        await ctx.close()
        await site.stop()
    base = replay_at or site.url
    ctx = await browser.new_context()
    try:
        archive = Archive.open(tmp_path, origin=base)
        replayer = await BrowserReplayer.attach(ctx, archive, "ep")
        replayed = await session(ctx, base)
    finally:
        await ctx.close()
    return live, replayed, recorder, replayer


@pytest.mark.browser
async def test_a_browser_recording_replays_at_another_address(browser, tmp_path):
    site, elsewhere = Site(), f"http://127.0.0.1:{_free_port()}"
    live, replayed, recorder, replayer = await _record_and_replay(
        browser, tmp_path, site, _visit_links, elsewhere
    )
    assert live[0][1].startswith("Start") and "data for " in live[0][1]
    assert replayed == [(u.replace(site.url, elsewhere), t.replace(site.url, elsewhere)) for u, t in live]  # fmt: skip
    assert replayed[1] == (f"{elsewhere}/next", f"Next\nback at {elsewhere}/start")
    assert replayer.misses == [] and replayer.stats["served"] == recorder.stats["recorded"]


@pytest.mark.browser
@pytest.mark.parametrize("status", [307, 308])
async def test_a_post_redirected_with_307_or_308_replays_the_post_it_recorded(
    browser, tmp_path, status
):
    site = Site(status)
    live, replayed, _, replayer = await _record_and_replay(
        browser, tmp_path, site, _post_then_redirect, None
    )
    assert live == [(f"{site.url}/done", "POST q=hello"), ("fetch", "POST via=fetch")]
    exchanges = [(ex.method, urlsplit(ex.url).path, ex.status, ex.request_body) for ex in Archive.open(tmp_path).exchanges()]  # fmt: skip
    assert ("POST", "/done", 200, b"q=hello") in exchanges  # the browser's re-sent POST
    assert replayed == live and replayer.misses == []


# ----------------------------------------------------------------------------- rollout.eval


def _eval(mode: str, out: Path, archive: str, archive_dir: Path) -> dict:
    """``python -m rollout.eval`` as the issue ran it, in a process (and a web) of its own."""
    args = [
        sys.executable, "-m", "rollout.eval", "--mode", mode, "--policy", "oracle",
        "--split", "test", "--n", "4", "--out", str(out),
        "--set", f"env.archive={archive}", "--set", f'env.archive_dir="{archive_dir}"',
        "--set", f"web.cache_dir={WEB_CACHE}",
    ]  # fmt: skip
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(out: Path) -> tuple[str, dict[str, list[str]]]:
    """The run's web origin, and each episode's observations."""
    episodes, origin = {}, ""
    for path in sorted(out.glob("*.trajectory.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line]
        origin = origin_of(events[0]["task"]["start_url"])
        episodes[path.name] = [e["observation"] for e in events if e.get("event") == "step"]
    return origin, episodes


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "mode",
    ["api", pytest.param("playwright", marks=pytest.mark.browser), pytest.param("som", marks=pytest.mark.browser)],
)  # fmt: skip
def test_an_evaluation_recorded_by_one_process_replays_in_another(tmp_path, mode):
    """Two invocations, each starting its own local web; the recording's port is held
    while the replay runs, so its web gets another one and nothing answers at the old."""
    archive_dir = tmp_path / "W"
    recorded = _eval(mode, tmp_path / "R", "record", archive_dir)
    old, before = _run(tmp_path / "R")
    with socket.socket() as hold:
        hold.bind(("127.0.0.1", urlsplit(old).port))
        replayed = _eval(mode, tmp_path / "P", "replay", archive_dir)
    new, after = _run(tmp_path / "P")
    assert old != new and Archive.open(archive_dir).origins == [old]
    assert recorded["success_rate"] == 1.0 and replayed["success_rate"] == recorded["success_rate"]
    assert replayed["mean_reward"] == recorded["mean_reward"] and replayed["infra_errors"] == 0
    assert before.keys() == after.keys() and len(before) == 4
    old_netloc, new_netloc = urlsplit(old).netloc, urlsplit(new).netloc
    for name, observations in after.items():
        assert not any("not in the archive" in o or old_netloc in o for o in observations)
        assert observations == [o.replace(old_netloc, new_netloc) for o in before[name]], name
    assert any(new_netloc in o for obs in after.values() for o in obs)  # URLs were shown
