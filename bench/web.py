"""The local web: start-up, memory, search latency and page latency under load.

Starts ``python -m rollout.web`` twice on free loopback ports: once building
everything from scratch (``startup_s``), once from the cache that build wrote
(``startup_cached_s``); ``rss_mib`` is the larger resident size of the two. Then
times the JSON search API (the api mode's search) on the gold queries of 500
test tasks, one at a time, and page fetches of task evidence pages with 16
concurrent clients.

    python bench/web.py

Final line: {"bench": "web", "startup_s", "rss_mib", "search_p50_ms",
"search_p95_ms", "page_p50_ms_c16", "pages", ...}
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rollout.tasks.generate import generate  # noqa: E402
from rollout.web.build import load  # noqa: E402


def start(cache_dir: str | None) -> tuple[subprocess.Popen, str, float]:
    cmd = [sys.executable, "-m", "rollout.web", "--port", "0"]
    cmd += ["--no-cache"] if cache_dir is None else ["--set", f"web.cache_dir={cache_dir}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    url: list[str] = []
    reader = threading.Thread(target=lambda: url.append(proc.stdout.readline().split()[-1]))
    reader.start()
    reader.join(300)
    if not url:
        proc.kill()
        raise SystemExit("the web server did not start")
    return proc, url[0], time.monotonic() - t0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(url: str, queries: list[str], pages: list[str]) -> dict[str, float]:
    async with aiohttp.ClientSession() as s:
        for q in queries[:20]:  # warm-up
            async with s.get(f"{url}/api/search", params={"q": q, "k": "10"}) as r:
                await r.read()
        search = []
        for q in queries:
            t0 = time.perf_counter()
            async with s.get(f"{url}/api/search", params={"q": q, "k": "10"}) as r:
                await r.read()
            search.append((time.perf_counter() - t0) * 1e3)
        page_lat: list[float] = []
        todo = list(pages)

        async def client() -> None:
            while todo:
                p = todo.pop()
                t0 = time.perf_counter()
                async with s.get(p) as r:
                    await r.read()
                page_lat.append((time.perf_counter() - t0) * 1e3)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(16)))
        wall = time.perf_counter() - t0
    return {
        "search_p50_ms": round(pct(search, 0.5), 2),
        "search_p95_ms": round(pct(search, 0.95), 2),
        "page_p50_ms_c16": round(pct(page_lat, 0.5), 2),
        "page_p95_ms_c16": round(pct(page_lat, 0.95), 2),
        "pages_per_s_c16": round(len(page_lat) / wall, 1),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        # The cold start builds everything and writes the cache the second start reads.
        proc, url, startup_s = start(cache)
        rss_cold = rss_mib(proc.pid)
        proc.terminate()
        proc.wait()
        proc, url, cached_s = start(cache)
        try:
            rss = max(rss_cold, rss_mib(proc.pid))
            lw = load(cache)
            tasks = generate(lw, "test", 500, seed=1, base_url=url)
            queries = [t["gold_path"][0]["args"]["query"] for t in tasks]
            pages = [e["url"] for t in tasks for e in t["evidence"]][:2000]
            result = asyncio.run(measure(url, queries, pages))
            rss_after = rss_mib(proc.pid)
            n_pages = len(lw.site.pages) + len(lw.docs)
        finally:
            proc.terminate()
            proc.wait()
    print(
        json.dumps(
            {
                "bench": "web",
                "startup_s": round(startup_s, 2),
                "startup_cached_s": round(cached_s, 2),
                "rss_mib": round(max(rss, rss_after), 1),
                **result,
                "pages": n_pages,
            }
        )
    )


if __name__ == "__main__":
    main()
