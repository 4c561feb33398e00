"""The oracle on the long-horizon task families, in every mode, through the whole harness.

For each family of ``rollout.tasks.long_horizon.FAMILIES`` (aggregation, constraint,
join, walk), N test tasks (fewer when the split has fewer: most families' subjects are
countries; ``--split all`` draws from every split) run as oracle episodes in api,
playwright and som mode (real Chromium, the local web as a child process on
loopback), ``--parallel`` at a time, with ``env.max_steps`` raised to fit the
longest gold path. Prints a table: per family and mode, the tasks run, the
success rate, the median and max gold-path length
(actions, the answer not counted), the median and max steps the episodes took, and
the median episode wall time; then a final JSON line:
{"bench": "long_horizon", "n_requested", "results": [{"family", "mode", "n",
"success_rate", "gold_steps_median", "gold_steps_max", "episode_steps_median",
"episode_wall_s_median", "infra_errors"}], "min_success_rate"}; exit 1 when a row is below
``--min-success`` (0.98) or had an infrastructure error.

    python bench/long_horizon.py [--n 100] [--split test|all] [--modes api,playwright,som]
        [--parallel 4]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from rollout.env import browsers_for
from rollout.eval import run_episode
from rollout.sidecar.procs import web_for
from rollout.tasks.generate import SPLITS, generate
from rollout.tasks.long_horizon import FAMILIES, MAX_STEPS
from rollout.web.build import load
from shared.config import add_config_args, config_from_args


def tasks_of(lw, family: str, split: str, n: int, web_url: str) -> list[dict]:
    """``n`` tasks of the family (fewer when there are fewer), spread evenly over its
    templates; ``split="all"`` draws from every split (the oracle is not trained, so a
    task's split does not matter to it, and the test split alone holds fewer than 100
    tasks of a family: its subjects are countries, 10% of them)."""

    def draw(s: str, cap: int) -> list[dict]:
        return generate(lw, s, cap, base_url=web_url, templates=[family], up_to=True)

    if split != "all":
        return draw(split, n)
    by_template: dict[str, list[dict]] = {}
    for s in SPLITS:
        for task in draw(s, sys.maxsize):  # every task of the split
            by_template.setdefault(task["template"], []).append(task)
    rng = random.Random(f"long_horizon|{split}")
    for ts in by_template.values():
        rng.shuffle(ts)
    out: list[dict] = []
    for depth in range(max((len(ts) for ts in by_template.values()), default=0)):
        out += [ts[depth] for _, ts in sorted(by_template.items()) if depth < len(ts)]
    return out[:n]


async def run_mode(cfg, mode: str, tasks: list[dict], web_url: str, parallel: int) -> list[dict]:
    sem = asyncio.Semaphore(parallel)
    pools = browsers_for(mode, web_url, cfg.env, cfg.rollout)
    async with pools as pool, aiohttp.ClientSession() as session:

        async def one(i: int, task: dict) -> dict:
            async with sem:
                t0 = time.monotonic()
                r = await run_episode(task, mode, web_url, cfg, pool, session, None, i)
                return {**r, "wall_s": time.monotonic() - t0, "task": task}

        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))


def summary(family: str, mode: str, results: list[dict]) -> dict:
    ok = [r for r in results if r["status"] != "infra_error"]
    gold = [len(r["task"]["gold_path"]) for r in results]
    return {
        "family": family,
        "mode": mode,
        "n": len(results),
        "success_rate": round(sum(r["reward"] >= 1.0 for r in ok) / max(1, len(ok)), 4),
        "gold_steps_median": statistics.median_low(gold) if gold else 0,
        "gold_steps_max": max(gold, default=0),
        "episode_steps_median": statistics.median_low(r["steps"] for r in ok) if ok else 0,
        "episode_steps_max": max((r["steps"] for r in ok), default=0),
        "episode_wall_s_median": round(statistics.median(r["wall_s"] for r in ok), 2) if ok else 0,
        "infra_errors": len(results) - len(ok),
    }


async def main_async(args, cfg) -> dict:
    web_url, web = await web_for(cfg.web.cache_dir, cfg.web.url)
    try:
        lw = load(cfg.web.cache_dir)
        families = [f for f in args.families.split(",") if f]
        tasks = {f: tasks_of(lw, f, args.split, args.n, web_url) for f in families}
        rows = []
        for mode in [m for m in args.modes.split(",") if m]:
            everything = [t for f in families for t in tasks[f]]
            t0 = time.monotonic()
            results = await run_mode(cfg, mode, everything, web_url, args.parallel)
            print(f"[bench] {mode}: {len(results)} episodes in {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
            for f in families:
                mine = [r for r in results if r["task"]["template"] in FAMILIES[f]]
                rows.append(summary(f, mode, mine))
    finally:
        if web is not None:
            await web.stop()
    return {
        "bench": "long_horizon",
        "split": args.split,
        "n_requested": args.n,
        "results": rows,
        "min_success_rate": min((r["success_rate"] for r in rows), default=0.0),
    }


def table(out: dict) -> str:
    head = ("family", "mode", "n", "success", "gold med/max", "steps med/max", "wall med s")
    lines = ["{:<12} {:<11} {:>4} {:>8} {:>13} {:>14} {:>11}".format(*head)]
    for r in out["results"]:
        lines.append(
            f"{r['family']:<12} {r['mode']:<11} {r['n']:>4} {r['success_rate']:>8.1%} "
            f"{r['gold_steps_median']:>6}/{r['gold_steps_max']:<6} "
            f"{r['episode_steps_median']:>7}/{r['episode_steps_max']:<6} "
            f"{r['episode_wall_s_median']:>11.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_config_args(p)
    p.add_argument("--n", type=int, default=100, help="test tasks per family (at most)")
    p.add_argument(
        "--split", default="test", choices=("train", "dev", "test", "all"),
        help="the split the tasks come from; all: every split",
    )  # fmt: skip
    p.add_argument("--modes", default="api,playwright,som")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--parallel", type=int, default=4, help="episodes at once")
    p.add_argument(
        "--min-success", type=float, default=0.98,
        help="exit 1 when a family in a mode succeeds on fewer (the oracle's target)",
    )  # fmt: skip
    args = p.parse_args(argv)
    cfg = config_from_args(args)
    if cfg.env.max_steps < 2 * MAX_STEPS:  # the gold path, the answer, som's scrolls
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, max_steps=2 * MAX_STEPS))
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, policy="oracle"))
    out = asyncio.run(main_async(args, cfg))
    print(table(out))
    print(json.dumps(out))
    low = [r for r in out["results"] if r["success_rate"] < args.min_success or r["infra_errors"]]
    for r in low:
        print(f"[bench] below target: {r['family']} in {r['mode']}: {r['success_rate']:.1%} "
              f"({r['infra_errors']} infra errors)", file=sys.stderr)  # fmt: skip
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
