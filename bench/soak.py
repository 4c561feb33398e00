"""Soak: many concurrent som-mode episodes on the local web for minutes, through the pool.

64 episodes at once (``--concurrency``) run the oracle policy in Set-of-Mark mode on
real Chromium (browsers recycled by the pool as configured) for ``--minutes`` (10 by
default). Sampled every 5 s: the resident memory of this process, the browsers'
process groups and the web server's. At the end every process group ever used must
be empty.

    python bench/soak.py [--minutes 10] [--concurrency 64] [--browsers 4]

Final line: {"bench": "soak", "episodes", "infra_errors", "leaked_processes",
"rss_growth_pct", "step_p95_ms_first_min", "step_p95_ms_last_min"}. RSS growth
compares the mean over the last minute with the mean over the minute after the
first (warm-up: browsers starting, caches filling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp

# The repository before bench/ on the path: bench/rollout.py must not shadow the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.env import browsers_for
from rollout.eval import run_episode
from rollout.sidecar.procs import group_pids, web_for
from rollout.tasks.generate import generate
from rollout.web.build import load
from shared.config import EnvConfig, RolloutConfig, RunConfig

SAMPLE_S = 5.0


def rss_bytes(pids: list[int]) -> int:
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            continue
    return total


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1) if xs else 0.0


async def soak(args: argparse.Namespace) -> dict:
    cfg = RunConfig(
        env=EnvConfig(mode="som", max_steps=30, action_timeout_s=10.0),
        rollout=RolloutConfig(
            browsers=args.browsers,
            contexts_per_browser=-(-args.concurrency // args.browsers),
            policy="oracle",
        ),
    )
    web_url, web = await web_for(cfg.web.cache_dir, None)
    groups: set[int] = {web.proc.pid} if web is not None else set()
    tasks = generate(load(cfg.web.cache_dir), "train", 2000, base_url=web_url)
    t0 = time.monotonic()
    stop_at = t0 + args.minutes * 60
    episodes, infra, steps, samples = 0, 0, [], []
    try:
        async with (
            browsers_for("som", web_url, cfg.env, cfg.rollout) as pool,
            aiohttp.ClientSession() as session,
        ):

            async def worker(k: int) -> None:
                nonlocal episodes, infra
                i = k
                while time.monotonic() < stop_at:
                    task = tasks[i % len(tasks)]
                    r = await run_episode(task, "som", web_url, cfg, pool, session, None, i)
                    now = time.monotonic() - t0
                    episodes += 1
                    infra += r["status"] == "infra_error"
                    steps.extend((now, ms) for ms in r["ms"])
                    i += args.concurrency

            async def sampler() -> None:
                while time.monotonic() < stop_at:
                    groups.update(pool.pids)
                    pids = [os.getpid()] + [p for g in groups for p in group_pids(g)]
                    samples.append((time.monotonic() - t0, rss_bytes(pids)))
                    print(
                        f"soak: {time.monotonic() - t0:5.0f} s  {episodes} episodes  "
                        f"{infra} infra errors  rss {samples[-1][1] / 2**20:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                    await asyncio.sleep(SAMPLE_S)

            await asyncio.gather(sampler(), *(worker(k) for k in range(args.concurrency)))
            groups.update(pool.pids)
    finally:
        if web is not None:
            await web.stop()
    await asyncio.sleep(1.0)
    leaked = sum(len(group_pids(g)) for g in groups)
    end = samples[-1][0] if samples else 0.0

    def mean_rss(lo: float, hi: float) -> float:
        xs = [r for t, r in samples if lo <= t < hi]
        return sum(xs) / len(xs) if xs else 0.0

    warm = mean_rss(60.0, 120.0) if end >= 150 else mean_rss(end / 3, 2 * end / 3)
    last = mean_rss(max(end - 60.0, 0.0), end + 1)
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "episodes": episodes,
        "infra_errors": infra,
        "leaked_processes": leaked,
        "rss_growth_pct": round(100 * (last - warm) / warm, 2) if warm else None,
        "rss_last_min_mib": round(last / 2**20, 1),
        "step_p95_ms_first_min": p95([ms for t, ms in steps if t < 60]),
        "step_p95_ms_last_min": p95([ms for t, ms in steps if t >= end - 60]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--browsers", type=int, default=4)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(soak(args))))


if __name__ == "__main__":
    main()
