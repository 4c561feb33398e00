"""The environment's overhead over plain Playwright, the Set-of-Mark labeller, and throughput.

In one run, against the local web (a child process):

- ``harness_step_p50_ms``: a playwright-mode step ``goto(url)`` through the whole
  harness (parser, egress proxy, settle, text extraction, episode record) on the
  evidence pages of test tasks;
- ``raw_step_p50_ms``: plain Playwright doing the same navigation and text
  extraction (``goto`` + ``document.body.innerText``) on the same pages, in a
  browser of the same kind without the harness; ``harness_vs_raw_ratio``;
- the labeller, this branch's against main's, on pages of 25 and 600 interactive
  elements (``controls_page``: links in sentences, buttons, labelled inputs, selects,
  checkboxes, textareas, table rows, lists; headings and text between), each variant on
  its own page of the same HTML, the calls interleaved, p50 of 30 after 5 warm-up, each
  a whole ``page.evaluate`` round trip (Playwright's return of the result included):
  ``som_label_ms_25`` / ``_600``: this branch's labeller as its ``SomBackend`` calls it
  at the top of a page (``run_labeller`` with ``{marks: true, fromViewport: false,
  maxChars: EnvConfig().observation_chars, maxLabels: 0}``, the context carrying
  ``LISTENER_INIT_JS`` and ``LABELLER_INIT_JS``, the result returned as JSON); ``som_label_main_ms_25`` / ``_600``: main's labeller (as of
  7a1cf35, kept verbatim in ``bench/baselines/som_label_main.js``) as main's
  ``SomBackend`` called it (``{marks: true, fromViewport: true, maxLabels: 1000}``);
  ``som_label_vs_main_25`` / ``_600``: new over old; ``som_label_unbudgeted_ms_600``
  (and ``som_label_unbudgeted_vs_main_600``): this branch's with no budget (``maxChars``
  and ``maxLabels`` 0), numbering all 600 as main's does; ``som_label_marked_600``: how
  many the budgeted pass numbered;
- a som step with marked screenshots on the 600-control page, through the real harness:
  ``som_shot_step_ms_600``: ``observe()`` by a som environment (``make_env``, the
  pool's browser) with ``EnvConfig.screenshots`` on, whose ``SomBackend`` labels, draws
  the marks (``OVERLAY_JS`` with no list), screenshots and removes them;
  ``plain_shot_plus_label_ms_600``: ``observe()`` with screenshots off plus a plain
  ``page.screenshot()``; ``som_shot_vs_plain_ratio`` (target <= 1.5). The same without
  the harness, the backend's JS calls on its page (``run_labeller`` + ``OVERLAY_JS`` +
  ``screenshot`` + ``REMOVE_OVERLAY_JS`` against ``run_labeller`` + ``screenshot``):
  ``som_shot_js_ms_600``, ``plain_shot_plus_label_js_ms_600``,
  ``som_shot_vs_plain_js_ratio``;
- ``episodes_per_s``: oracle episodes (playwright mode) finished per second at
  1, 4, 8 and 16 episodes at once.

    python bench/env.py [--pages 60] [--episodes 32]

Final line: {"bench": "env", "harness_step_p50_ms", "raw_step_p50_ms",
"harness_vs_raw_ratio", "som_label_ms_25", "som_label_ms_600", "som_label_main_ms_25",
"som_label_main_ms_600", "som_label_vs_main_25", "som_label_vs_main_600",
"som_label_unbudgeted_ms_600", "som_label_unbudgeted_vs_main_600", "som_label_marked_600",
"som_shot_step_ms_600", "plain_shot_plus_label_ms_600", "som_shot_vs_plain_ratio",
"som_shot_js_ms_600", "plain_shot_plus_label_js_ms_600", "som_shot_vs_plain_js_ratio",
"episodes_per_s": {"1", "4", "8", "16"}}
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

from rollout.env import browser_pool, make_env  # noqa: E402
from rollout.env.browser import run_labeller  # noqa: E402
from rollout.env.pool import DEFAULT_ARGS  # noqa: E402
from rollout.env.som_js import (  # noqa: E402
    LABELLER_INIT_JS,
    LISTENER_INIT_JS,
    OVERLAY_JS,
    REMOVE_OVERLAY_JS,
)
from rollout.eval import run_all  # noqa: E402
from rollout.sidecar.procs import start_child  # noqa: E402
from rollout.tasks.generate import generate  # noqa: E402
from rollout.web.build import load  # noqa: E402
from shared.config import EnvConfig, RolloutConfig, RunConfig  # noqa: E402

CHROMIUM = "/usr/bin/chromium-headless-shell"
# main's labeller (7a1cf35), verbatim after the file's one comment line
MAIN_LABEL_JS = (REPO / "bench/baselines/som_label_main.js").read_text().split("\n", 1)[1]


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def ratio(a: float, b: float) -> float:
    return round(a / b, 3)


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


def controls_page(n: int) -> str:
    """A page with ``n`` interactive elements, the way pages mix them: links inside
    sentences, buttons, labelled inputs, selects, checkboxes, textareas, table rows and
    lists, in sections with headings and text between."""
    kinds = (
        lambda i: (
            f"<p>Paragraph {i} says a few plain words about topic {i}, then an "
            f'<a href="/doc/{i}">inline link to document {i}</a> and more text after it.</p>'
        ),
        lambda i: f'<p><button type="button">Action {i}</button> acts on item {i}.</p>',
        lambda i: (
            f'<p><label for="f{i}">Field {i}</label> '
            f'<input id="f{i}" name="f{i}" placeholder="value {i}"></p>'
        ),
        lambda i: (
            f'<p>Choose: <select name="s{i}"><option>first {i}</option>'
            f"<option selected>second {i}</option></select></p>"
        ),
        lambda i: f'<p><label><input type="checkbox" name="c{i}"> remember option {i}</label></p>',
        lambda i: (
            f"<table><tr><td>Row {i}</td><td>{i * 7} units</td>"
            f'<td><a href="/row/{i}">details</a></td></tr></table>'
        ),
        lambda i: f'<ul><li><a href="/list/{i}">listed item {i}</a>, with a note</li></ul>',
        lambda i: f'<p><textarea name="t{i}" rows="2">notes on {i}</textarea></p>',
    )
    parts = []
    for i in range(n):
        if i % len(kinds) == 0:
            if i:
                parts.append("</section>")
            parts.append(
                f"<section><h2>Section {i // len(kinds)}</h2><p>Some text that introduces "
                f"section {i // len(kinds)}, long enough to wrap on a narrow screen.</p>"
            )
        parts.append(kinds[i % len(kinds)](i))
    parts.append("</section>")
    return (
        "<html><head><title>Controls</title></head><body><main><h1>Page</h1>"
        + "".join(parts)
        + "<footer><p>The end.</p></footer></main></body></html>"
    )


async def label_ms(n: int, reps: int = 30, warmup: int = 5) -> dict:
    """The labellers on one page of ``n`` controls, each on its own page (new contexts
    like the pool's), their calls interleaved: main's as main's ``SomBackend`` called it,
    this branch's as its ``SomBackend`` does at the top of a page (budgeted), and this
    branch's without a budget."""
    html = controls_page(n)
    budget = EnvConfig().observation_chars
    variants = {
        "main": (MAIN_LABEL_JS, {"marks": True, "fromViewport": True, "maxLabels": 1000}, False),
        "new": (None, {"marks": True, "fromViewport": False, "maxChars": budget,
                           "maxLabels": 0}, True),
        "unbudgeted": (None, {"marks": True, "fromViewport": False, "maxChars": 0,
                                  "maxLabels": 0}, True),
    }  # fmt: skip
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=list(DEFAULT_ARGS[1:-1]))
        pages = {}
        for name, (_, _, listener) in variants.items():
            ctx = await browser.new_context()
            if listener:  # the branch's backend adds both to every context
                await ctx.add_init_script(script=LISTENER_INIT_JS)
                await ctx.add_init_script(script=LABELLER_INIT_JS)
            pages[name] = await ctx.new_page()
            await pages[name].set_content(html)
        times: dict[str, list[float]] = {name: [] for name in variants}
        views = {}
        for rep in range(warmup + reps):
            for name, (js, opts, _) in variants.items():
                t0 = time.perf_counter()
                if js is None:  # this branch's, called as its backend calls it
                    views[name] = await run_labeller(pages[name], opts)
                else:
                    views[name] = await pages[name].evaluate(js, opts)
                if rep >= warmup:
                    times[name].append((time.perf_counter() - t0) * 1e3)
        await browser.close()
    for name in ("main", "unbudgeted"):  # both number every control
        assert len(views[name]["elements"]) == n, (name, len(views[name]["elements"]))
    out = {name: p50(ts) for name, ts in times.items()}
    out["marked"] = len(views["new"]["elements"])
    return out


async def shot_steps(
    web_url: str, cfg: RunConfig, n: int = 600, reps: int = 30, warmup: int = 5
) -> dict:
    """A som step that reads a page of ``n`` controls again (``observe()``) through the
    whole harness, with marked screenshots (the backend labels, draws the overlay,
    screenshots, removes it) and without them plus a plain ``page.screenshot()``; and the
    same JS calls on their own, on the backend's page."""
    url = web_url + "/bench/controls"
    html = controls_page(n)
    out: dict[str, list[float]] = {"shot": [], "plain": [], "js_shot": [], "js_plain": []}
    envs = {}
    env_cfg = dataclasses.replace(cfg.env, max_steps=reps + warmup + 10)
    task = {"id": "test-qa-0", "question": "?", "answer": "x", "type": "qa", "start_url": url,
            "evidence": [], "aliases": [], "hops": 1}  # fmt: skip
    pool_cm = browser_pool(web_url, env_cfg, RolloutConfig(browsers=1))
    async with pool_cm as pool, pool.context() as shot_lease, pool.context() as plain_lease:
        for name, lease, shots in (("shot", shot_lease, True), ("plain", plain_lease, False)):
            await lease.context.route(
                url, lambda route: route.fulfill(body=html, content_type="text/html")
            )
            envs[name] = make_env(
                "som", web_url, dataclasses.replace(env_cfg, screenshots=shots), lease=lease
            )
            first = await envs[name].reset(task)
            assert not first.observation.error, first.observation.error
        opts = {"marks": True, "fromViewport": False, "maxChars": env_cfg.observation_chars,
                "maxLabels": 0}  # fmt: skip
        for rep in range(warmup + reps):
            t0 = time.perf_counter()
            r = await envs["shot"].step("observe()")
            t1 = time.perf_counter()
            assert r.observation.screenshot, r.observation.error
            r = await envs["plain"].step("observe()")
            await envs["plain"].backend.page.screenshot(type="png")
            t2 = time.perf_counter()
            assert not r.observation.error, r.observation.error
            page = envs["shot"].backend.page
            await run_labeller(page, opts)
            await page.evaluate(OVERLAY_JS)
            await page.screenshot(type="png")
            await page.evaluate(REMOVE_OVERLAY_JS)
            t3 = time.perf_counter()
            page = envs["plain"].backend.page
            await run_labeller(page, opts)
            await page.screenshot(type="png")
            t4 = time.perf_counter()
            if rep >= warmup:
                for key, a, b in (("shot", t0, t1), ("plain", t1, t2), ("js_shot", t2, t3),
                                  ("js_plain", t3, t4)):  # fmt: skip
                    out[key].append((b - a) * 1e3)
        for env in envs.values():
            await env.close()
    return {key: p50(ts) for key, ts in out.items()}


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
        label = {n: await label_ms(n) for n in (25, 600)}
        shots = await shot_steps(web.url, cfg)
        return {
            "bench": "env",
            "harness_step_p50_ms": p50(harness),
            "raw_step_p50_ms": p50(raw),
            "harness_vs_raw_ratio": round(statistics.median(harness) / statistics.median(raw), 3),
            "som_label_ms_25": label[25]["new"],
            "som_label_ms_600": label[600]["new"],
            "som_label_main_ms_25": label[25]["main"],
            "som_label_main_ms_600": label[600]["main"],
            "som_label_vs_main_25": ratio(label[25]["new"], label[25]["main"]),
            "som_label_vs_main_600": ratio(label[600]["new"], label[600]["main"]),
            "som_label_unbudgeted_ms_600": label[600]["unbudgeted"],
            "som_label_unbudgeted_vs_main_600": ratio(label[600]["unbudgeted"], label[600]["main"]),
            "som_label_marked_600": label[600]["marked"],
            "som_shot_step_ms_600": shots["shot"],
            "plain_shot_plus_label_ms_600": shots["plain"],
            "som_shot_vs_plain_ratio": ratio(shots["shot"], shots["plain"]),
            "som_shot_js_ms_600": shots["js_shot"],
            "plain_shot_plus_label_js_ms_600": shots["js_plain"],
            "som_shot_vs_plain_js_ratio": ratio(shots["js_shot"], shots["js_plain"]),
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
