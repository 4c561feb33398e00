"""The sidecar's dashboard on a long episode: 50 steps stay one collapsed line per episode,
each step opens on its own to the model's text and the (som) view it got back."""

from types import SimpleNamespace

import pytest

from rollout.engine import VIEW_CHARS, EngineStats, RolloutEngine
from rollout.records import EpisodeRecord, Step
from rollout.serve import episode_html

pytestmark = pytest.mark.browser
STEPS = 50


def long_episode() -> dict:
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
    record = EpisodeRecord("ep-1", {"id": "test-long-1"}, "som", steps=steps)
    env = SimpleNamespace(record=record, backend=SimpleNamespace(last_screenshot=None))
    traj = SimpleNamespace(reward=1.0, status="ok", turn=-1, length=9000)
    holder = SimpleNamespace(stats=EngineStats())
    task = {"id": "test-long-1", "question": "Which item is the last?"}
    RolloutEngine._remember(holder, task, env, [traj])
    return holder.stats.recent[-1]


def test_each_step_keeps_a_bounded_view():
    ep = long_episode()
    assert len(ep["steps"]) == STEPS
    assert all(len(st["view"]) == VIEW_CHARS for st in ep["steps"])  # cut, not dropped
    assert ep["steps"][36]["view"].startswith('Results page 37\n[37] link "Item 37"')
    assert ep["steps"][0]["ms"] == 250


async def test_a_fifty_step_episode_in_a_real_browser(browser):
    html = f"<table id=episodes>{episode_html(long_episode())}</table>"
    page = await browser.new_page(viewport={"width": 1200, "height": 800})
    try:
        await page.set_content(html)
        row = page.locator("#episodes tr")
        assert (await row.bounding_box())["height"] < 120  # one collapsed line
        assert await page.locator("details.steps > summary").inner_text() == (
            "50 steps, last: click"
        )
        items = page.locator("details.steps li")
        assert await items.count() == STEPS
        assert not await items.first.is_visible()
        await page.locator("details.steps > summary").click()
        assert await items.nth(STEPS - 1).is_visible()
        view = page.locator("details.step pre.view").nth(36)
        assert not await view.is_visible()  # each step collapsed in turn
        await items.nth(36).locator("summary").click()
        assert await view.is_visible()
        text = await view.inner_text()
        assert text.startswith('Results page 37\n[37] link "Item 37"'), text[:80]
        assert "click(37)" in await items.nth(36).locator("pre.raw").inner_text()
        assert await page.locator("details.step pre.view:visible").count() == 1
    finally:
        await page.close()
