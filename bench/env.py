"""The environment's overhead over plain Playwright, the Set-of-Mark labeler, and throughput.

In one run, against the local web (a child process):
- ``harness_step_p50_ms``: a playwright-mode step ``goto(url)`` through the whole
  harness (parser, egress proxy, settle, text extraction, episode record) on the
  evidence pages of test tasks;
- ``raw_step_p50_ms``: plain Playwright doing the same navigation and text
  extraction (``goto`` + ``document.body.innerText``) on the same pages, in a
  browser of the same kind without the harness; the ratio of the two;
- ``som_label_ms_25`` / ``som_label_ms_600``: the labeler on pages with 25 and
  600 interactive elements;
- ``episodes_per_s``: oracle episodes (playwright mode) finished per second at
  1, 4, 8 and 16 episodes at once.

    python bench/env.py [--pages 60] [--episodes 32]

Final line: {"bench": "env", "harness_step_p50_ms", "raw_step_p50_ms",
"harness_vs_raw_ratio", "som_label_ms_25", "som_label_ms_600", "episodes_per_s": {...}}
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from playwright.async_api import async_playwright  # noqa: E402

from rollout.browser_pool import DEFAULT_ARGS  # noqa: E402
from rollout.env import browser_pool, make_env  # noqa: E402
from rollout.env.som_js import LABEL_JS  # noqa: E402
from rollout.eval import run_all  # noqa: E402
from rollout.procs import start_child  # noqa: E402
from rollout.tasks.generate import generate  # noqa: E402
from rollout.web.build import load  # noqa: E402
from shared.config import RolloutConfig, RunConfig  # noqa: E402

CHROMIUM = "/usr/bin/chromium-headless-shell"


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


async def harness_steps(web_url: str, urls: list[str], cfg: RunConfig) -> list[float]:
    out = []
    pool_cm = browser_pool(web_url, cfg.env, RolloutConfig(browsers=1))
    async with pool_cm as pool, pool.context() as lease:
        env = make_env("playwright", web_url, cfg.env, cfg.search, lease=lease)
        task = {"id": "test-qa-0", "question": "?", "answer": "x", "type": "qa",
                "start_url": web_url + "/", "evidence": [], "aliases": [], "hops": 1}  # fmt: skip
        await env.reset(task)
        for url in urls:
            t0 = time.perf_counter()
            r = await env.step(f'goto("{url}")')
            out.append((time.perf_counter() - t0) * 1e3)
            assert not r.observation.error, r.observation.error
            if env.done:
                break
        await env.close()
    return out


async def raw_steps(urls: list[str]) -> list[float]:
    out = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=list(DEFAULT_ARGS[1:-1]))
        page = await (await browser.new_context()).new_page()
        await page.goto(urls[0])
        for url in urls:
            t0 = time.perf_counter()
            await page.goto(url, wait_until="load")
            await page.evaluate("document.body ? document.body.innerText : ''")
            await page.title()
            out.append((time.perf_counter() - t0) * 1e3)
        await browser.close()
    return out


async def label_ms(n: int, repeats: int = 20) -> float:
    items = "".join(
        f'<li><a href="/x/{i}">item {i}</a></li>' if i % 2 else f"<li><button>b{i}</button></li>"
        for i in range(n)
    )
    html = f"<html><body><main><h1>Page</h1><ul>{items}</ul><p>text</p></main></body></html>"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=list(DEFAULT_ARGS[1:-1]))
        page = await browser.new_page()
        await page.set_content(html)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            view = await page.evaluate(
                LABEL_JS, {"marks": True, "fromViewport": True, "maxLabels": 1000}
            )
            times.append((time.perf_counter() - t0) * 1e3)
        assert len(view["elements"]) == n, len(view["elements"])
        await browser.close()
    return p50(times)


async def throughput(web_url: str, tasks: list[dict], cfg: RunConfig, levels) -> dict[str, float]:
    out = {}
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, policy="oracle"))
    rollout = RolloutConfig(browsers=2, contexts_per_browser=8)
    async with browser_pool(web_url, cfg.env, rollout) as pool:
        for level in levels:
            args = argparse.Namespace(mode="playwright", policy="oracle", out=None, parallel=level)
            result = await run_all(cfg, args, tasks, web_url, pool)
            out[str(level)] = result["episodes_per_s"]
    return out


async def main_async(args: argparse.Namespace) -> dict:
    cfg = RunConfig()
    web = await start_child(["rollout.web", "--port", "0"], "web")
    try:
        lw = load(cfg.web.cache_dir)
        tasks = generate(lw, "test", max(args.pages, args.episodes), seed=3, base_url=web.url)
        urls = list(dict.fromkeys(e["url"] for t in tasks for e in t["evidence"]))[: args.pages]
        raw = await raw_steps(urls)
        harness = await harness_steps(web.url, urls, cfg)
        return {
            "bench": "env",
            "harness_step_p50_ms": p50(harness),
            "raw_step_p50_ms": p50(raw),
            "harness_vs_raw_ratio": round(statistics.median(harness) / statistics.median(raw), 3),
            "som_label_ms_25": await label_ms(25),
            "som_label_ms_600": await label_ms(600),
            "episodes_per_s": await throughput(web.url, tasks[: args.episodes], cfg, (1, 4, 8, 16)),
        }
    finally:
        await web.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=60, help="pages for the step-latency comparison")
    ap.add_argument("--episodes", type=int, default=32, help="episodes per concurrency level")
    print(json.dumps(asyncio.run(main_async(ap.parse_args()))))


if __name__ == "__main__":
    main()
