"""Bad input through the whole environment step: fuzzed model outputs and allowlist
bypass attempts, in api mode (HTTP) and in a real browser."""

from __future__ import annotations

import random
import string
from urllib.parse import urlsplit

import aiohttp
import pytest

from rollout.env import browser_pool, make_env
from shared.config import EnvConfig, RolloutConfig, SearchConfig

pytestmark = pytest.mark.reliability


def bypasses(web_url: str) -> list[str]:
    """URLs an agent might use to reach something other than the allowed site."""
    hostport = urlsplit(web_url).netloc
    port = urlsplit(web_url).port
    return [
        "http://127.0.0.1:1/",  # another loopback port
        f"http://127.0.0.1:{port + 1}/",
        f"http://localhost:{port}/",  # the same socket under another name
        f"http://[::1]:{port}/",
        f"http://127.0.0.2:{port}/",
        "http://xn--80ak6aa92e.com/",  # punycode look-alike
        "http://аpple.com/",  # Cyrillic a
        f"http://{hostport}@evil.example/",  # credentials trick
        f"http://evil.example#@{hostport}/",
        f"http://evil.example\\@{hostport}/",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/html,<h1>hi</h1>",
        f"ftp://{hostport}/",
        "view-source:" + web_url,
        "chrome://settings",
    ]


def spellings(web_url: str) -> list[str]:
    """Other spellings of the allowed address itself: canonicalised, they reach only it."""
    port = urlsplit(web_url).port
    return [f"http://0x7f000001:{port}/", f"http://2130706433:{port}/", f"http://127.1:{port}/"]


def fuzzed_outputs(seed: int, n: int, web_url: str) -> list[str]:
    """Model outputs a broken policy could produce: noise, broken and nested tags, huge or
    hostile arguments, mixed dialects."""
    rng = random.Random(seed)
    tags = ["<search>", "</search>", "<visit>", "</visit>", "<answer>", "<action>", "</action>",
            "<query>", "<url>", "</url>", "search(", "visit(", "goto(", ")", '"', "```python\n"]  # fmt: skip
    alphabet = string.printable + "äöü€漢字\u202e\u0000\ufeff"
    out = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))))
        elif kind == 1:
            out.append("".join(rng.choice([*tags, " x ", "\n"]) for _ in range(rng.randint(1, 30))))
        elif kind == 2:
            url = rng.choice(bypasses(web_url))
            out.append(rng.choice([f"<visit>{url}</visit>", f"<visit> {url} </visit>",
                                   f"<action>visit</action><url>{url}</url>"]))  # fmt: skip
        elif kind == 3:
            big = rng.choice(["a", "漢", "<", "%00"]) * rng.choice([5_000, 100_000])
            out.append(rng.choice([f"<search>{big}</search>", f"<visit>{big}</visit>", big]))
        elif kind == 4:
            out.append(f"<search>{rng.choice(tags)}</search><visit>{web_url}</visit>")
        else:
            out.append(
                f"<visit>{web_url}/{''.join(rng.choice('./%?#&=') for _ in range(20))}</visit>"
            )
    return out


def task(web_url: str) -> dict:
    return {
        "id": "test-qa-1", "question": "What is the capital of France?", "answer": "Paris",
        "aliases": [], "type": "qa", "hops": 1, "start_url": web_url + "/",
        "evidence": [{"url": f"{web_url}/geo/country/FR", "quote": "The capital of France is Paris."}],
    }  # fmt: skip


async def test_fuzzed_model_outputs_through_env_step_api(web_url, fault):
    row = fault(
        "fuzzed model outputs (api mode, 600 steps)",
        "every step returns an observation (an error one for bad input); nothing raises; "
        "the episode goes on and a final answer is scored",
    )
    cfg = EnvConfig(max_steps=1000, action_timeout_s=5.0)
    errors = 0
    async with aiohttp.ClientSession() as s:
        env = make_env("api", web_url, cfg, SearchConfig(), session=s)
        await env.reset(task(web_url))
        for text in fuzzed_outputs(0, 600, web_url):
            r = await env.step(text)
            if r.terminated:  # only an answer ends it; the fuzz may contain one
                assert r.info["status"] == "ok", (text[:200], r.info)
                await env.close()
                env = make_env("api", web_url, cfg, SearchConfig(), session=s)
                await env.reset(task(web_url))
                continue
            assert isinstance(r.text, str) and not r.truncated
            errors += "Error:" in r.text
        r = await env.step(f"<visit>{web_url}/geo/country/FR</visit>")
        assert "The capital of France is Paris." in r.text
        r = await env.step("<answer>Paris</answer>")
        assert r.terminated and r.info["status"] == "ok" and r.info["reward_breakdown"]["em"] == 1
        await env.close()
    row["observed"] = f"600 steps, {errors} error observations, no exception; answer scored"
    assert errors >= 300


async def test_allowlist_bypasses_are_refused_in_api_mode(web_url, fault):
    row = fault(
        "URL-allowlist bypass attempts (api mode): other loopback ports and names, punycode, "
        "credentials, numeric IPs, file:/javascript:/data: URLs",
        "each refused with an error observation naming why; nothing fetched",
    )
    async with aiohttp.ClientSession() as s:
        env = make_env("api", web_url, EnvConfig(max_steps=100), SearchConfig(), session=s)
        await env.reset(task(web_url))
        for url in bypasses(web_url):
            r = await env.step(f"<visit>{url}</visit>")
            assert not r.terminated and "Error:" in r.text, (url, r.text[:300])
            assert "not allowed" in r.text or "refused" in r.text, (url, r.text[:300])
        for url in spellings(web_url):  # canonicalised to the allowed site, nothing else
            r = await env.step(f"<visit>{url}</visit>")
            assert r.text.startswith(f"URL: {web_url}/") or "Error:" in r.text, (url, r.text)
        await env.close()
    row["observed"] = f"{len(bypasses(web_url))} URLs, all refused with an error observation"


@pytest.mark.browser
@pytest.mark.multiprocess
async def test_allowlist_bypasses_are_refused_in_the_browser(web_url, fault):
    row = fault(
        "URL-allowlist bypass attempts through the browser (goto)",
        "each refused with an error observation; the page stays on the allowed site",
    )
    rollout = RolloutConfig(browsers=1, contexts_per_browser=1)
    cfg = EnvConfig(max_steps=100, action_timeout_s=5.0)
    async with browser_pool(web_url, cfg, rollout) as pool, pool.context() as lease:
        env = make_env("playwright", web_url, cfg, SearchConfig(), lease=lease)
        await env.reset(task(web_url))
        for url in bypasses(web_url):
            r = await env.step(f'goto("{url}")')
            assert not r.terminated and "Error:" in r.text, (url, r.text[:300])
        r = await env.step(f'goto("{web_url}/geo/country/FR")')
        assert "The capital of France is Paris." in r.text and "Error:" not in r.text
        await env.close()
    row["observed"] = f"{len(bypasses(web_url))} URLs, all refused; the allowed site still loads"
