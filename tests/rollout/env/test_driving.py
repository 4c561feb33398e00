"""Driving the environment from outside: reset/step results, make_env without a search
config, page-defined rewards (real Chromium, a page server of our own on loopback) and
the documented example (docs/concepts/driving.md), run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env import StepResult, browser_pool, make_env, render
from rollout.env.page_reward import last_number, validate
from rollout.sidecar.procs import group_pids
from rollout.verifiers import Reward
from shared.config import EnvConfig, RolloutConfig, SearchConfig

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_MARK = "# example: driving the environment"

COUNTER = """<!doctype html><html><head><title>Counter</title></head><body>
<p>Clicks: <span id="count">0</span></p>
<button id="add" onclick="count.textContent = Number(count.textContent) + 1">Add one</button>
<p id="last">Last reward: 0.99</p>
<p id="words">no digits here</p>
</body></html>"""

QA = """<!doctype html><html><head><title>France</title></head><body>
<p>The capital of France is Paris.</p></body></html>"""


@pytest_asyncio.fixture(scope="module")
async def site():
    """A page server of our own on loopback: a counter page and a fact page."""

    def page(body: str):
        async def handler(request):
            return web.Response(text=body, content_type="text/html")

        return handler

    app = web.Application()
    app.router.add_get("/", page(COUNTER))
    app.router.add_get("/fr", page(QA))
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(**over) -> EnvConfig:
    return EnvConfig(**{"action_timeout_s": 3.0, **over})


@pytest_asyncio.fixture(scope="module")
async def pool(site):
    async with browser_pool(site, config(), RolloutConfig(browsers=1, contexts_per_browser=4)) as p:
        yield p
        groups = list(p.pids)
    for g in groups:
        assert group_pids(g) == []


def task(site: str, reward=None, **over) -> dict:
    t = {"id": "drive-1", "question": "Press the button.", "start_url": site + "/"}
    if reward is not None:
        t["reward"] = reward
    return {**t, **over}


class Episode:
    """An environment on a leased context, closed (env and lease) on exit."""

    def __init__(self, pool, mode: str, site: str, cfg: EnvConfig | None = None, **kw):
        self.pool, self.mode, self.site, self.cfg, self.kw = pool, mode, site, cfg, kw

    async def __aenter__(self):
        self.cm = self.pool.context()
        lease = await self.cm.__aenter__()
        self.env = make_env(self.mode, self.site, self.cfg or config(), lease=lease, **self.kw)
        return self.env

    async def __aexit__(self, *exc):
        try:
            await self.env.close()
        finally:
            await self.cm.__aexit__(*exc)


def button(text: str) -> str:
    return re.search(r'\[(\d+)\] button "Add one"', text).group(1)


# ----------------------------------------------------------------------------- reset, make_env


@pytest.mark.parametrize("mode", ["som", "playwright"])
async def test_reset_returns_a_step_result_like_step_without_a_search_config(pool, site, mode):
    async with Episode(pool, mode, site) as env:
        first = await env.reset(task(site, {"page_js": "1"}))
        assert type(first) is StepResult
        assert first.reward == 0.0 and not first.terminated and not first.truncated
        assert first.info == {}
        assert first.observation is env.first
        assert first.text == render(env.first, env.limits.observation_chars)
        assert "Clicks: 0" in first.text and first.text in env.user_prompt()
        assert [m["role"] for m in env.messages()] == ["system", "user"]
        act = f"click({button(first.text)})" if mode == "som" else 'click("#add")'
        r = await env.step(act)
        assert type(r) is StepResult and "Clicks: 1" in r.text
        assert not r.terminated and not r.truncated


async def test_api_mode_without_a_search_config_uses_the_defaults(site):
    async with aiohttp.ClientSession() as s:
        env = make_env("api", site, config(), session=s)
        defaults = SearchConfig()
        client = env.backend.search_client
        assert client.endpoint == f"{site}/api/search" and client.top_k == defaults.top_k
        first = await env.reset(task(site, {"verifier": "qa"}, answer="Paris"))
        assert type(first) is StepResult and first.reward == 0.0 and first.info == {}
        assert first.text == render(env.first, env.limits.observation_chars)
        r = await env.step(f"<visit>{site}/fr</visit>")
        assert type(r) is StepResult and "The capital of France is Paris." in r.text
        await env.close()


# ----------------------------------------------------------------------------- page rewards


@pytest.mark.parametrize(
    ("expression", "clicks", "value", "verdict"),
    [
        ("Number(document.querySelector('#count').textContent)", 2, 2.0, "correct"),
        ("document.querySelector('#count').textContent === '1'", 1, 1.0, "correct"),
        ("document.querySelector('#count').textContent === '1'", 0, 0.0, "incorrect"),
        ("'0.25'", 0, 0.25, "partial"),
        ("() => Promise.resolve(Number(count.textContent) / 4)", 1, 0.25, "partial"),
    ],
)
async def test_page_js_reward(pool, site, expression, clicks, value, verdict):
    async with Episode(pool, "som", site) as env:
        first = await env.reset(task(site, {"page_js": expression}))
        for _ in range(clicks):
            await env.step(f"click({button(first.text)})")
        r = await env.step('answer("done")')
        assert r.terminated and r.info["status"] == "ok"
        assert r.reward == value
        b = r.info["reward_breakdown"]
        assert b["type"] == "page" and b["source"] == "page_js" and b["verdict"] == verdict
        assert b["read_ok"] is True and b["answered"] is True and "page_reward_error" not in b
        assert env.record.reward == value and env.record.status == "ok"


async def test_page_text_reward_takes_the_last_number(pool, site):
    async with Episode(pool, "playwright", site) as env:
        await env.reset(task(site, {"page_text": "#last"}))
        r = await env.step('answer("done")')
        assert r.reward == 0.99
        b = r.info["reward_breakdown"]
        assert b["source"] == "page_text" and b["verdict"] == "partial" and b["read_ok"] is True


def test_last_number_rule():
    assert last_number("Last reward: 0.99") == 0.99
    assert last_number("3 of 5") == 5.0
    assert last_number("score -0.5") == -0.5
    assert last_number("step-2") == 2.0
    assert last_number("Reward: 3.") == 3.0
    assert last_number("1e-3") == 0.001
    assert last_number("Reward<b>.5</b>") == 0.5
    assert last_number("none") is None


async def test_verifier_by_name_scores_the_answer(site):
    async with aiohttp.ClientSession() as s:
        for answer, value in (("Paris", 1.0), ("Lyon", 0.0)):
            env = make_env("api", site, config(), session=s)
            t = task(site, {"verifier": "qa"}, start_url=site + "/fr", answer="Paris")
            await env.reset(t)
            r = await env.step(f"<answer>{answer}</answer>")
            b = r.info["reward_breakdown"]
            assert b["type"] == "qa" and b["em"] == value and "f1" in b
            assert (r.reward >= 1.0) == (value == 1.0)
            await env.close()


FAILURES = [
    ("page_js", "(() => { throw new Error('boom') })()", "boom"),
    ("page_js", "'hello'", "not a number"),
    ("page_js", "({a: 1})", "not a number"),
    ("page_js", "undefined", "not a number"),
    ("page_js", "NaN", "not a"),
    ("page_js", "new Promise(() => {})", "longer than"),
    ("page_js", "this is not javascript", "SyntaxError"),
    ("page_text", "#no-such-element", "no element matches '#no-such-element'"),
    ("page_text", "#words", "no number in the text of '#words'"),
    ("page_text", "##", "Error"),
]


@pytest.mark.parametrize(("kind", "arg", "reason"), FAILURES)
async def test_a_failed_page_read_is_zero_with_the_reason(pool, site, kind, arg, reason):
    async with Episode(pool, "playwright", site, config(action_timeout_s=1.5)) as env:
        await env.reset(task(site, {kind: arg}))
        r = await env.step('answer("done")')
        assert r.terminated and r.info["status"] == "ok" and r.reward == 0.0
        b = r.info["reward_breakdown"]
        assert reason.lower() in b["page_reward_error"].lower(), b
        assert b["verdict"] == "page reward error" and b["read_ok"] is False


async def test_a_closed_page_is_zero_with_the_reason(pool, site):
    async with Episode(pool, "som", site) as env:
        await env.reset(task(site, {"page_js": "1"}))
        await env.backend.page.close()
        r = await env.step('answer("done")')
        assert r.reward == 0.0 and "closed" in r.info["reward_breakdown"]["page_reward_error"]


async def test_reward_parts_do_not_depend_on_the_outcome(pool, site, tmp_path):
    keys = []
    for expression in ("1", "throw 1"):
        async with Episode(pool, "playwright", site, run_dir=tmp_path) as env:
            await env.reset(task(site, {"page_js": expression}))
            r = await env.step('answer("done")')
            keys.append(sorted(Reward(r.reward, r.info["reward_breakdown"]).parts()))
            episode_id = env.episode_id
        end = [json.loads(line) for line in next(tmp_path.rglob(f"*{episode_id}*.jsonl")).open()]
        assert end[-1]["event"] == "end" and end[-1]["breakdown"]["type"] == "page"
    assert keys[0] == keys[1] == ["answered", "read_ok", "score"]


# ----------------------------------------------------------------------------- truncation


async def test_the_step_budget_truncation_reads_the_page_reward(pool, site):
    async with Episode(pool, "som", site, config(max_steps=2)) as env:
        first = await env.reset(task(site, {"page_js": "Number(count.textContent)"}))
        n = button(first.text)
        r = await env.step(f"click({n})")
        assert not r.truncated and r.reward == 0.0
        r = await env.step(f"click({n})")
        assert r.truncated and not r.terminated and r.info["status"] == "truncated"
        assert r.reward == 2.0 and r.info["reward_breakdown"]["answered"] is False
        assert env.record.status == "truncated" and env.record.reward == 2.0


async def test_truncate_reads_the_page_reward(pool, site):
    async with Episode(pool, "playwright", site) as env:
        await env.reset(task(site, {"page_text": "#count"}))
        await env.step('click("#add")')
        reward = await env.truncate()
        assert reward.value == 1.0 and reward.breakdown["source"] == "page_text"
        assert env.done and env.record.status == "truncated"
        with pytest.raises(RuntimeError, match="over"):
            await env.truncate()


# ----------------------------------------------------------------------------- refusals


BAD_SPECS = [
    ({"page_js": ""}, "non-empty string"),
    ({"page_js": 3}, "non-empty string"),
    ({"page_text": "   "}, "non-empty string"),
    ({"bogus": "x"}, "unknown keys ['bogus']"),
    ({}, "exactly one"),
    ({"page_js": "1", "page_text": "#a"}, "exactly one"),
    ({"verifier": "nope"}, "unknown verifier 'nope'"),
    ("page_js", "must be an object"),
]


@pytest.mark.parametrize(("spec", "why"), BAD_SPECS)
async def test_an_invalid_reward_spec_is_refused_at_reset(pool, site, spec, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        validate(spec)
    async with Episode(pool, "som", site) as env:
        with pytest.raises(ValueError, match=r"task 'drive-1': .*" + re.escape(why)):
            await env.reset(task(site, spec))
        assert env.record is None  # nothing started: the episode can still be reset


async def test_tasks_that_cannot_be_scored_are_refused_at_reset(pool, site):
    async with Episode(pool, "som", site) as env:
        with pytest.raises(ValueError, match=r"task 'drive-1': unknown type None"):
            await env.reset(task(site))  # neither a type nor a reward
        with pytest.raises(ValueError, match=r"'drive-1' has no answer .*qa verifier"):
            await env.reset(task(site, {"verifier": "qa"}))
        with pytest.raises(ValueError, match=r"task 'drive-1': no question"):
            await env.reset({"id": "drive-1", "start_url": site, "reward": {"page_js": "1"}})
        first = await env.reset(task(site, type="qa", answer="x"))  # still startable
        assert "Clicks: 0" in first.text


async def test_api_mode_refuses_a_page_reward(site):
    async with aiohttp.ClientSession() as s:
        for spec in ({"page_js": "1"}, {"page_text": "#count"}):
            env = make_env("api", site, config(), session=s)
            with pytest.raises(ValueError, match=r"task 'drive-1': .*api mode has no page"):
                await env.reset(task(site, spec))
            await env.close()


# ----------------------------------------------------------------------------- the docs


def documented_example() -> str:
    text = (REPO / "docs" / "concepts" / "driving.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b for b in blocks if b.startswith(EXAMPLE_MARK + "\n")]
    assert len(found) == 1, f"one code block of driving.md starts with {EXAMPLE_MARK!r}"
    return found[0]


def test_the_documented_example_runs(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(documented_example(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout, whatever is installed
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r'\[\d+\] button "Add one"', out) and "Clicks: 1" in out, out
    assert out.strip().splitlines()[-1] == "reward: 1.0 correct", out
