"""Rollout throughput of the oracle policy through the sidecar's engine, in api and som modes.

For each mode, GRPO groups (G=4) of oracle episodes run through the rollout
engine (environment, tokenization, trajectories) at 1, 4, 8, 16 and 32
concurrent episodes. Measured in the same run: episodes per second at each
level, CPU seconds per episode (this process plus every descendant: browsers,
the local web) and peak resident memory of the whole process tree. From those
the script projects episodes per second on a 64-core rollout node, printing its
assumptions.

    python bench/rollout.py [--episodes 32]

One JSON line per mode; the last is som: {"bench": "rollout", "mode",
"episodes_per_s": {"1", "4", "8", "16", "32"}, "cpu_s_per_episode", "peak_rss_mib",
"projected_episodes_per_s_64_cores"}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rollout.buffer import TrajectoryBuffer  # noqa: E402
from rollout.engine import RolloutEngine  # noqa: E402
from rollout.env import browser_pool  # noqa: E402
from rollout.procs import start_child  # noqa: E402
from rollout.tasks.generate import generate  # noqa: E402
from rollout.web.build import load  # noqa: E402
from shared.config import RunConfig  # noqa: E402
from shared.config import load as load_config  # noqa: E402
from shared.tokenizer import load_tokenizer  # noqa: E402

LEVELS = (1, 4, 8, 16, 32)
G = 4
CORES_TARGET = 64
EFFICIENCY = 0.8  # fraction of ideal CPU scaling assumed on the bigger node
RAM_TARGET_GIB = 256


def tree_cpu_s(proc: psutil.Process) -> float:
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def tree_rss_mib(proc: psutil.Process) -> float:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


class PeakRss:
    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mib(self._proc))
            self._stop.wait(0.2)

    def __enter__(self) -> PeakRss:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


async def measure_mode(mode: str, web_url: str, tasks: list[dict], episodes: int) -> dict:
    cfg = load_config(None, [f"env.mode={mode}", "rollout.policy=oracle", f"rollout.group_size={G}",
                             "rollout.max_concurrent_episodes=32", "rollout.browsers=2",
                             "rollout.contexts_per_browser=16"])  # fmt: skip
    tok = load_tokenizer()
    me = psutil.Process()
    rates: dict[str, float] = {}
    cpu_used = eps_done = 0.0
    pool_cm = (
        browser_pool(web_url, cfg.env, cfg.rollout) if mode != "api" else contextlib.nullcontext()
    )
    with tempfile.TemporaryDirectory() as tmp, PeakRss() as peak:
        async with aiohttp.ClientSession() as session, pool_cm as pool:
            it = iter(tasks * 100)
            for level in LEVELS:
                level_cfg = load_config(None, [f"env.mode={mode}", "rollout.policy=oracle",
                                               f"rollout.group_size={G}",
                                               f"rollout.max_concurrent_episodes={level}"])  # fmt: skip
                buffer = TrajectoryBuffer(Path(tmp) / f"buf{level}", max_pending=10_000)
                engine = RolloutEngine(level_cfg, web_url, it, tok, buffer, session, pool=pool)
                n_groups = max(episodes, 2 * level) // G
                c0, t0 = tree_cpu_s(me), time.monotonic()
                sem = asyncio.Semaphore(max(1, -(-level // G)))  # groups in flight

                async def one(k: int, engine=engine, sem=sem, level=level) -> None:
                    async with sem:
                        await engine.run_group(next(it), f"bench.{level}.{k}")

                await asyncio.gather(*(one(k) for k in range(n_groups)))
                wall = time.monotonic() - t0
                cpu_used += tree_cpu_s(me) - c0
                eps_done += engine.stats.episodes
                rates[str(level)] = round(engine.stats.episodes / wall, 2)
                buffer.close()
    cpu_per_ep = cpu_used / max(1.0, eps_done)
    cpu_bound = CORES_TARGET * EFFICIENCY / cpu_per_ep
    return {
        "bench": "rollout",
        "mode": mode,
        "episodes_per_s": rates,
        "cpu_s_per_episode": round(cpu_per_ep, 4),
        "peak_rss_mib": round(peak.peak, 1),
        "projected_episodes_per_s_64_cores": round(cpu_bound, 1),
    }


async def main_async(args: argparse.Namespace) -> list[dict]:
    cfg = RunConfig()
    web = await start_child(["rollout.web", "--port", "0"], "web")
    try:
        tasks = generate(
            load(cfg.web.cache_dir), "test", 200, types=["qa"], seed=5, base_url=web.url
        )
        return [await measure_mode(m, web.url, tasks, args.episodes) for m in ("api", "som")]
    finally:
        await web.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per concurrency level")
    results = asyncio.run(main_async(ap.parse_args()))
    print(
        f"# projection: {CORES_TARGET} cores x {EFFICIENCY} scaling efficiency / measured CPU s "
        f"per episode (browsers, web server and harness included); memory is not the limit "
        f"while peak RSS x {CORES_TARGET}/2 stays under {RAM_TARGET_GIB} GiB",
        file=sys.stderr,
    )
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
