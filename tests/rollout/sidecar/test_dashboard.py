"""The sidecar's dashboard in a real Chromium, on a live sidecar (the engine in process, the
oracle in som mode with marked screenshots, real browsers, the real local web): the curves
are drawn and keep updating, the episode table filters, an episode page shows every step,
its observation and its screenshot; no page logs an error. And what the engine keeps of a
long episode stays bounded, and reads one step at a time."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from rollout.env import browsers_for
from rollout.sidecar.buffer import TrajectoryBuffer
from rollout.sidecar.dashboard import Sample, Series
from rollout.sidecar.engine import VIEW_CHARS, EngineStats, RolloutEngine
from rollout.sidecar.server import make_app
from rollout.tasks.generate import generate
from rollout.tracking.records import EpisodeRecord, Step
from shared.config import load
from shared.tokenizer import load_tokenizer

TOKEN = "dash-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STEPS = 50


def long_episode(stats: EngineStats) -> dict:
    """What the engine keeps of a 50-step som episode, through its own ``_remember``."""
    steps = [
        Step(
            index=i, raw=f"I look at item {i}. click({i})", action="click", args={"n": i},
            observation=f'Results page {i}\n[{i}] link "Item {i}" [99] link "Next page"\n'
            + "filler text " * 800,
            summary=f"Opened item {i}", url=f"http://127.0.0.1:1/items/{i}",
            started=1000.0 + i, ended=1000.25 + i,
        )
        for i in range(1, STEPS + 1)
    ]  # fmt: skip
    record = EpisodeRecord("ep-long-1", {"id": "test-long-1"}, "som", steps=steps)
    record.breakdown = {"type": "qa", "answered": False, "score": 0.0, "verdict": "no_answer"}
    env = SimpleNamespace(record=record, backend=SimpleNamespace(last_screenshot=None))
    traj = SimpleNamespace(
        reward=0.0, status="truncated", turn=-1, length=9000, reward_parts={}, timings={}
    )
    task = {"id": "test-long-1", "question": "Which item is the last?", "template": "long_walk"}
    RolloutEngine._remember(SimpleNamespace(stats=stats), task, env, [traj])
    return stats.recent[-1]


def test_each_step_keeps_a_bounded_view():
    stats = EngineStats()
    ep = long_episode(stats)
    assert len(ep["steps"]) == STEPS
    assert all(len(st["view"]) == VIEW_CHARS for st in ep["steps"])  # cut, not dropped
    assert all(st["view_chars"] > VIEW_CHARS for st in ep["steps"])  # ... and says so
    assert ep["steps"][36]["view"].startswith('Results page 37\n[37] link "Item 37"')
    assert ep["steps"][0]["ms"] == 250
    assert (ep["id"], ep["template"], ep["breakdown"]["verdict"]) == (
        "ep-long-1", "long_walk", "no_answer",
    )  # fmt: skip
    assert (stats.scored, stats.reward_sum) == (1, 0.0)


def test_curve_points_are_rates_over_the_window_before_them():
    series = Series(EngineStats(started=0.0))
    series.ring.clear()
    series.ring.extend(
        [Sample(0.0, 1000.0),
         Sample(10.0, 1010.0, episodes=5, infra_errors=1, successes=2, scored=4, reward_sum=3.0,
                timed=4, step_ms_sum=400.0, actions_sum=20, truncated=1),
         Sample(20.0, 1020.0, episodes=5, infra_errors=1, successes=2, scored=4, reward_sum=3.0,
                timed=4, step_ms_sum=400.0, actions_sum=20, truncated=1),
         Sample(80.0, 1080.0, episodes=7, infra_errors=1, successes=4, scored=6, reward_sum=5.0,
                timed=6, step_ms_sum=1000.0, actions_sum=44, truncated=1)]
    )  # fmt: skip
    p10, p20, p80 = series.points(window_s=60.0)
    # at 10 s, over [0, 10]: 5 episodes / 10 s; 2 successes of 5 - 1 infra; 3.0 / 4; 400 / 4;
    # 20 actions / 4 episodes that ran; 1 of the 4 out of budget
    assert p10 == {"t": 1010.0, "episodes_per_s": 0.5, "success_rate": 0.5,
                   "mean_reward": 0.75, "step_ms": 100.0, "episode_actions": 5.0,
                   "ended_budget": 0.25}  # fmt: skip
    # at 20 s, over [0, 20] (all within 60 s): 5 / 20 s, the same episodes
    assert p20["episodes_per_s"] == 0.25 and p20["success_rate"] == 0.5
    # at 80 s, over [20, 80]: 2 episodes / 60 s, both succeeded, 2.0 / 2, 600 ms / 2,
    # 24 actions / 2, none out of budget
    assert p80 == {"t": 1080.0, "episodes_per_s": 2 / 60, "success_rate": 1.0,
                   "mean_reward": 1.0, "step_ms": 300.0, "episode_actions": 12.0,
                   "ended_budget": 0.0}  # fmt: skip
    # a window with no episode: no rate but episodes/s (0), not a 0 % success rate
    series.ring.append(Sample(82.0, 1082.0, 7, 1, 4, 6, 5.0, 6, 1000.0, 44, 1))
    (p82,) = series.points(window_s=1.0, since=1080.0)
    assert p82 == {"t": 1082.0, "episodes_per_s": 0.0, "success_rate": None,
                   "mean_reward": None, "step_ms": None, "episode_actions": None,
                   "ended_budget": None}  # fmt: skip


@pytest_asyncio.fixture(scope="module")
async def sidecar(web_url, local_web, tmp_path_factory):
    """A live sidecar that ran two som groups of two (two templates), plus a long episode;
    (url, engine)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    cfg = load(
        overrides=[
            f"web.url={web_url}", "rollout.policy=oracle", "env.mode=som",
            "env.screenshots=true", "rollout.group_size=2", "rollout.browsers=1",
            "rollout.contexts_per_browser=2", f"rollout.auth_token={TOKEN}",
            "inference.max_context_tokens=8192",
            f"checkpoint.dir={tmp / 'ckpt'}",
        ]
    )  # fmt: skip
    tasks = generate(local_web, "train", 2, types=["qa"], seed=11, base_url=web_url)
    assert len({t["template"] for t in tasks}) == 2
    buffer = TrajectoryBuffer(tmp / "buffer", 8)
    pool_cm = browsers_for("som", web_url, cfg.env, cfg.rollout)
    async with aiohttp.ClientSession() as session, pool_cm as pool:
        engine = RolloutEngine(cfg, web_url, iter(()), load_tokenizer(), buffer, session, pool=pool)
        server = TestServer(make_app(engine, cfg))
        await server.start_server()
        try:
            for i, task in enumerate(tasks):  # while the sidecar samples its counters
                assert await engine.run_group(task, f"dash-{i}") is not None
            long_episode(engine.stats)
            yield str(server.make_url("/")).rstrip("/"), engine
        finally:
            await server.close()
            buffer.close()


@pytest.fixture
async def page(browser):
    """A page that sends the bearer token, with every console message and page error."""
    ctx = await browser.new_context(
        extra_http_headers=AUTH, viewport={"width": 1280, "height": 900}
    )
    pg = await ctx.new_page()
    pg.messages, pg.errors = [], []
    pg.on("console", lambda m: pg.messages.append(f"{m.type}: {m.text}"))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    try:
        yield pg
    finally:
        await ctx.close()
    errors = [m for m in pg.messages if m.startswith("error")]
    assert not errors and not pg.errors, (errors, pg.errors)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


async def path_points(page, chart: str) -> int:
    d = await page.get_attribute(f"#chart-{chart} path.line", "d")
    return d.count("M") + d.count("L")


@pytest.mark.browser
async def test_every_dashboard_route_wants_the_token(sidecar):
    url, _ = sidecar
    paths = ["/", "/api/summary", "/api/episodes", "/api/episode/x", "/episode/x",
             "/dashboard/overview.js"]  # fmt: skip
    async with aiohttp.ClientSession() as s:
        for path in paths:
            async with s.get(url + path) as r:
                assert r.status == 401, path
        async with s.get(url + "/dashboard/../serve.py", headers=AUTH) as r:
            assert r.status == 404


@pytest.mark.browser
@pytest.mark.slow
async def test_the_overview_draws_live_curves_and_filters_episodes(sidecar, page):
    url, engine = sidecar
    await page.goto(url + "/")
    await page.wait_for_selector("#episodes tbody tr")
    await page.wait_for_selector("#chart-success_rate path.line", state="attached")
    charts = ("success_rate", "mean_reward", "episodes_per_s", "step_ms", "episode_actions",
              "ended_budget")  # fmt: skip
    for chart in charts:
        assert await page.locator(f"#chart-{chart} path.line").count() == 1, chart
    assert await path_points(page, "episodes_per_s") >= 2
    assert await page.inner_text("#chart-success_rate .chart-value") == "100%"  # the oracle's
    # the oracle answers every episode, each after at least one action before the answer
    assert engine.stats.truncated == 0 and engine.stats.actions_sum >= 2 * 4
    assert await page.inner_text("#chart-ended_budget .chart-value") == "0%"
    # the mean over the episodes of the last point's window (the arithmetic is checked by
    # hand above): some of the four, each of one action (its answer) or more
    shown = float(await page.inner_text("#chart-episode_actions .chart-value"))
    assert 1.0 <= shown <= engine.stats.actions_sum - 3
    counters = await page.inner_text("#counters")
    assert "EPISODES\n4" in counters.upper(), counters
    shot = await page.screenshot(full_page=True)
    w, h = png_size(shot)
    assert w == 1280 and h >= 600 and len(shot) > 20_000

    # live: a later poll brings the sampler's new points
    before = await path_points(page, "episodes_per_s")
    await page.wait_for_function(
        "n => { const d = document.querySelector('#chart-episodes_per_s path.line')"
        ".getAttribute('d'); return d.split(/[ML]/).length - 1 > n }",
        arg=before, timeout=10_000,
    )  # fmt: skip

    rows = page.locator("#episodes tbody tr")
    eps = list(engine.stats.recent)
    assert await rows.count() == len(eps) == 5
    one = eps[0]["template"]
    await page.select_option("#f-template", one)
    templates = await rows.evaluate_all("rs => rs.map(r => r.dataset.template)")
    assert templates == [one, one]
    await page.select_option("#f-template", "")
    await page.select_option("#f-status", "truncated")
    assert await rows.evaluate_all("rs => rs.map(r => r.dataset.id)") == ["ep-long-1"]
    await page.select_option("#f-status", "")
    await page.fill("#f-reward", "1")
    rewards = await rows.evaluate_all("rs => rs.map(r => Number(r.dataset.reward))")
    assert len(rewards) == 4 and all(r >= 1 for r in rewards)
    assert "#min_reward=1" in page.url  # the filters survive a reload
    await page.reload()
    await page.wait_for_selector("#episodes tbody tr")
    assert await rows.count() == 4


@pytest.mark.browser
@pytest.mark.slow
async def test_an_episode_page_shows_each_step_and_the_marked_view(sidecar, page):
    url, engine = sidecar
    ep = next(e for e in engine.stats.recent if e["screenshot"])
    await page.goto(url + "/")
    await page.click(f"#episodes tbody tr[data-id='{ep['id']}'] td.q")
    await page.wait_for_selector("#steps li.step")
    assert page.url.endswith(f"/episode/{ep['id']}")
    steps = page.locator("#steps li.step")
    assert await steps.count() == len(ep["steps"]) >= 2
    first = ep["steps"][0]
    assert first["action"] in await steps.first.locator(".call").inner_text()
    assert await steps.first.locator("pre.raw").inner_text() == first["raw"]
    view = await steps.first.locator("pre.view").inner_text()
    assert view == first["view"] and "[1]" in view  # the numbered view the model got
    assert await page.locator("#steps li.step.answer").count() == 1
    await page.wait_for_function(
        "() => { const i = document.getElementById('screenshot'); "
        "return i.complete && i.naturalWidth > 0 }"
    )
    # each step's own marked view beside its observation (the answer step has none)
    shots = steps.locator(".step-shot img")
    assert await shots.count() == len(ep["steps"]) - 1 == len(ep["step_screenshots"])
    await page.wait_for_function(
        "() => [...document.querySelectorAll('.step-shot img')]"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )
    n = ep["steps"][0]["index"]
    assert png_size(ep["step_screenshots"][n])[0] > 0
    assert await page.locator("#breakdown td", has_text="verdict").count() == 1
    assert (await page.inner_text("#reward")).startswith("1.000")
    w, h = png_size(await page.screenshot(full_page=True))
    assert w == 1280 and h >= 600


@pytest.mark.browser
@pytest.mark.slow
async def test_a_fifty_step_episode_reads_one_step_at_a_time(sidecar, page):
    url, _ = sidecar
    await page.goto(url + "/episode/ep-long-1")
    await page.wait_for_selector("#steps li.step")
    assert await page.locator("#steps li.step").count() == STEPS
    assert await page.locator("#strip a").count() == STEPS
    view = page.locator("#step-37 pre.view")
    text = await view.inner_text()
    assert text.startswith('Results page 37\n[37] link "Item 37"'), text[:80]
    assert "click" in await page.locator("#step-37 .call").inner_text()
    # each observation scrolls in its own box: the page stays readable
    assert await view.evaluate("e => e.scrollHeight > 2 * e.clientHeight")
    assert "(first 6,000 of 9,658 chars)" in await page.locator("#step-37 h3").nth(1).text_content()
    assert await page.locator("#shot-box").is_hidden()  # it had no screenshot
    await page.click("#strip a[href='#step-37']")
    await asyncio.sleep(0.2)
    assert await page.locator("#step-37").is_visible()
    shot = await page.screenshot()
    assert png_size(shot) == (1280, 900)


def test_per_step_screenshots_stay_within_their_budget():
    from collections import deque

    from rollout.sidecar.engine import bound_screenshots

    def ep(i: int) -> dict:
        shots = {1: b"x" * 100, 2: b"y" * 100}
        return {"id": i, "screenshot": b"last", "step_screenshots": shots,
                "steps": [{"index": 1, "screenshot": True}, {"index": 2, "screenshot": True}]}  # fmt: skip

    recent = deque([ep(0), ep(1), ep(2)])
    bound_screenshots(recent, 450)  # 600 bytes kept: the oldest episode's go
    assert [len(e["step_screenshots"]) for e in recent] == [0, 2, 2]
    assert [st["screenshot"] for st in recent[0]["steps"]] == [False, False]
    assert recent[0]["screenshot"] == b"last"  # its last marked view stays
    bound_screenshots(recent, 1000)
    assert [len(e["step_screenshots"]) for e in recent] == [0, 2, 2]
    bound_screenshots(recent, 0)
    assert all(not e["step_screenshots"] for e in recent)
