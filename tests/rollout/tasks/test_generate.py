"""The task generator: schema, splits, evidence on its pages, followable gold paths."""

import asyncio
import hashlib
import json
import random
import subprocess
import sys
from collections import Counter
from urllib.parse import urldefrag, urljoin

import aiohttp
import pytest

from rollout.tasks.generate import TYPES, all_candidates, generate, split_of
from rollout.web.text import normalize_space, visible_text
from tests.conftest import REPO, WEB_CACHE

pytestmark = pytest.mark.multiprocess
BASE = "http://127.0.0.1:8900"


@pytest.fixture(scope="module")
def splits(local_web, web_url):
    return {
        "train": generate(local_web, "train", 10_000, seed=0, base_url=web_url),
        "dev": generate(local_web, "dev", 1_000, seed=0, base_url=web_url),
        "test": generate(local_web, "test", 1_000, seed=0, base_url=web_url),
    }


def test_schema_counts_and_ids(splits):
    for name, tasks in splits.items():
        assert len(tasks) == {"train": 10_000, "dev": 1_000, "test": 1_000}[name]
        assert len({t["id"] for t in tasks}) == len(tasks)
        for t in tasks:
            assert t["id"].split("-")[:2] == [name, t["type"]]
            assert t["type"] in TYPES and 1 <= t["hops"] <= 4
            assert t["question"].endswith(("?", "found the answer."))
            assert t["answer"] and isinstance(t["aliases"], list)
            assert len(t["evidence"]) >= t["hops"]
            actions = [s["action"] for s in t["gold_path"]]
            assert actions[0] == "search" and actions[1:] == ["visit"] * t["hops"]
            assert ("key_facts" in t) == (t["type"] == "multi_doc")
        types = Counter(t["type"] for t in tasks)
        assert set(types) == set(TYPES), types
        assert Counter(t["hops"] for t in tasks).keys() == {1, 2, 3, 4}


def test_splits_are_disjoint_by_subject(local_web, splits):
    subjects = {name: {t["subject"] for t in tasks} for name, tasks in splits.items()}
    assert not subjects["train"] & subjects["test"]
    assert not subjects["train"] & subjects["dev"]
    assert not subjects["dev"] & subjects["test"]
    for cands in all_candidates(local_web).values():  # and over every candidate
        for c in cands[:200]:
            assert split_of(c.subject) in ("train", "dev", "test")
    for name, tasks in splits.items():
        assert all(split_of(t["subject"]) == name for t in tasks)


def test_answers_are_unique_per_question(local_web):
    answers = {}
    for cands in all_candidates(local_web).values():
        for c in cands:
            assert answers.setdefault(c.question, c.answer.lower()) == c.answer.lower()


def test_no_two_templates_share_a_question(local_web):
    """What lets a draw build only its own templates: a template's ambiguity filter (one
    question, two answers) would not change if the others were built too."""
    owner: dict[str, str] = {}
    for name, cands in all_candidates(local_web).items():
        for c in cands:
            assert owner.setdefault(c.question, name) == name, (c.question, owner[c.question])


def test_a_narrow_draw_builds_only_its_templates(local_web, monkeypatch):
    from rollout.tasks import generate as gen

    full = generate(local_web, "test", 200, types=["qa", "citation"], templates=["city_timezone"])
    monkeypatch.setattr(gen, "_CACHE", {})  # a fresh process's
    built = []
    for name, make in list(gen.TEMPLATES.items()):
        monkeypatch.setitem(
            gen.TEMPLATES, name, lambda lw, n=name, m=make: built.append(n) or m(lw)
        )
    narrow = generate(local_web, "test", 200, types=["qa", "citation"], templates=["city_timezone"])
    assert built == ["city_timezone"] and narrow == full
    assert {k[1] for k in gen._CACHE} == {"city_timezone", "city_timezone+citation"}
    generate(local_web, "test", 5, types=["qa"])  # no template named: every short one
    from rollout.tasks.long_horizon import LONG_TEMPLATES

    assert set(built) == set(gen.TEMPLATES) - LONG_TEMPLATES


def test_generation_is_deterministic_and_seeded(local_web):
    a = generate(local_web, "dev", 300, seed=5)
    assert a == generate(local_web, "dev", 300, seed=5)
    b = generate(local_web, "dev", 300, seed=6)
    assert {t["id"] for t in a} != {t["id"] for t in b}
    with pytest.raises(ValueError, match=r"only \d+ dev tasks"):
        generate(local_web, "dev", 10**7)
    with pytest.raises(ValueError, match="unknown task types"):
        generate(local_web, "dev", 5, types=["trivia"])


def test_templates_narrow_the_draw(local_web):
    tasks = generate(local_web, "test", 300, templates=["airport_city", "city_timezone"])
    assert {t["template"] for t in tasks} == {"airport_city", "city_timezone"}
    assert len(tasks) == 300 and len({t["id"] for t in tasks}) == 300
    with pytest.raises(ValueError, match=r"unknown task templates \['nope'\].*airport_city"):
        generate(local_web, "dev", 5, templates=["nope"])
    with pytest.raises(ValueError, match=r"only \d+ dev tasks .*templates \['geo_capital'\]"):
        generate(local_web, "dev", 500, templates=["geo_capital"])


async def _fetch_all(urls: list[str]) -> dict[str, str]:
    sem = asyncio.Semaphore(16)
    out: dict[str, str] = {}
    async with aiohttp.ClientSession() as s:

        async def one(url: str) -> None:
            async with sem, s.get(url) as r:
                assert r.status == 200, url
                out[url] = await r.text()

        await asyncio.gather(*(one(u) for u in dict.fromkeys(urls)))
    return out


async def test_every_dev_and_test_evidence_quote_is_on_its_page_over_http(splits):
    tasks = splits["dev"] + splits["test"]
    pages = await _fetch_all([e["url"] for t in tasks for e in t["evidence"]])
    texts = {u: normalize_space(visible_text(html)[0]) for u, html in pages.items()}
    missing = [
        (t["id"], e["url"], e["quote"])
        for t in tasks
        for e in t["evidence"]
        if normalize_space(e["quote"]) not in texts[e["url"]]
    ]
    assert not missing, missing[:5]


@pytest.mark.browser
async def test_evidence_is_in_the_browsers_text_too(splits, browser):
    tasks = random.Random(0).sample(splits["test"], 25)
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        for t in tasks:
            for e in t["evidence"]:
                await page.goto(e["url"])
                text = normalize_space(await page.evaluate("document.body.innerText"))
                assert normalize_space(e["quote"]) in text, (t["id"], e)
    finally:
        await ctx.close()


async def test_gold_paths_reach_the_evidence_through_the_api_and_http(splits, web_url):
    tasks = splits["dev"] + splits["test"]
    sem = asyncio.Semaphore(16)
    failures = []
    async with aiohttp.ClientSession() as s:

        async def follow(t: dict) -> None:
            async with sem:
                reachable: set[str] = set()
                text = ""
                for step in t["gold_path"]:
                    if step["action"] == "search":
                        params = {"q": step["args"]["query"], "k": "10"}
                        async with s.get(f"{web_url}/api/search", params=params) as r:
                            results = (await r.json())["results"]
                        reachable |= {urljoin(web_url, x["url"]) for x in results}
                        continue
                    url = urldefrag(step["args"]["url"]).url
                    if url not in reachable and step is not t["gold_path"][1]:
                        failures.append((t["id"], "not linked", url))
                    async with s.get(url) as r:
                        html = await r.text()
                    reachable |= {urljoin(url, h) for h in _hrefs(html)}
                    text += "\n" + normalize_space(visible_text(html)[0])
                for e in t["evidence"]:
                    if normalize_space(e["quote"]) not in text:
                        failures.append((t["id"], "evidence not reached", e["quote"]))

        await asyncio.gather(*(follow(t) for t in tasks))
    assert not failures, failures[:5]


def _hrefs(html: str) -> list[str]:
    import re

    return re.findall(r'href="([^"#]+)', html)


async def test_search_quality_first_hop_in_top_10(local_web, web_url):
    tasks = generate(local_web, "test", 500, seed=1, base_url=web_url)
    hits = 0
    async with aiohttp.ClientSession() as s:
        for t in tasks:
            params = {"q": t["gold_path"][0]["args"]["query"], "k": "10"}
            async with s.get(f"{web_url}/api/search", params=params) as r:
                urls = [urljoin(web_url, x["url"]) for x in (await r.json())["results"]]
            hits += t["evidence"][0]["url"] in urls
    assert hits / len(tasks) >= 0.90, f"{hits}/{len(tasks)}"


def _digest_script() -> str:
    return (
        "import hashlib, json, sys\n"
        "from rollout.web.build import build, load\n"
        "from rollout.tasks.generate import generate\n"
        "lw = build() if sys.argv[1] == 'fresh' else load(sys.argv[2])\n"
        "h = hashlib.sha256()\n"
        "for path in sorted(lw.site.pages): h.update(path.encode() + lw.site.pages[path].html.encode())\n"
        "for path in sorted(lw.docs): h.update(path.encode() + lw.docs[path].text.encode())\n"
        "for q in ['France capital', 'CDG airport', 'os.fspath', 'Curie discovered 1898']:\n"
        "    h.update(json.dumps([r.as_json() for r in lw.index.search(q, 20)]).encode())\n"
        "h.update(json.dumps(generate(lw, 'test', 300, seed=2)).encode())\n"
        "print(len(lw.site.pages), h.hexdigest())\n"
    )


@pytest.mark.slow
def test_two_startups_build_identical_pages_search_and_tasks(web_url):
    """A fresh build in a new process equals the cached build another process made."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", _digest_script(), mode, str(WEB_CACHE)],
            cwd=REPO, capture_output=True, text=True, check=True, timeout=300,
        ).stdout.split()
        for mode in ("fresh", "cached")
    ]  # fmt: skip
    assert runs[0] == runs[1] and int(runs[0][0]) > 40_000


def test_cli_prints_jsonl_deterministically(web_url):
    cmd = [sys.executable, "-m", "rollout.tasks", "--split", "dev", "--n", "25", "--seed", "3"]
    cmd += ["--set", f"web.cache_dir={WEB_CACHE}", "--types", "qa,multi_doc"]
    out = [subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True) for _ in "ab"]
    assert out[0].stdout == out[1].stdout
    tasks = [json.loads(line) for line in out[0].stdout.splitlines()]
    assert len(tasks) == 25 and {t["type"] for t in tasks} == {"qa", "multi_doc"}
    assert all(t["start_url"].startswith(BASE) for t in tasks)
    assert "25 dev tasks" in out[0].stderr
    bad = subprocess.run([*cmd[:-2], "--types", "trivia"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown task types ['trivia']" in bad.stderr
    assert hashlib.sha256(out[0].stdout.encode()).hexdigest()  # stable bytes
