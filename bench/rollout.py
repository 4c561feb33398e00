"""Rollout throughput of the oracle policy through the sidecar's engine, in api and som modes.

For each mode, GRPO groups (G=4) of oracle episodes run through the rollout
engine (environment, tokenization, trajectories) at 1, 4, 8, 16 and 32
concurrent episodes. Measured in the same run: episodes per second at each
level, and, from a sampler polling /proc every 0.1 s (``rollout.sidecar.proc_stats``),
the CPU seconds per episode and per step of each kind of process of the tree:

- ``sidecar``: this process, which plays the sidecar's Python process: the
  engine, tokenization, Playwright's client and the egress proxy (an aiohttp
  app on the same event loop: it is not a separate process);
- ``playwright_driver``: Playwright's Node.js driver (one per browser pool);
- ``browser``: each Chromium's main process, its zygotes and the sh wrapper;
- ``renderer``: Chromium's renderers (one per page, living one episode);
- ``gpu_utility``: Chromium's GPU and utility (network, storage) processes;
- ``web``: the local web server, a child process.

Also the peak resident memory of the whole tree, and a projection to a 64-core
node with S sidecars (``launch/rollout.sh`` with ``SIDECARS=S``), under these
assumptions (also printed in each JSON line, key "assumptions"):

1. The CPU bound: 64 cores x 0.8 scaling efficiency / total CPU s per episode.
2. One process runs on at most one core (every process here is one event loop
   or one renderer; their helper threads are ignored), so a process that spends
   c CPU s per episode caps what it serves at 1/c episodes/s. One sidecar's cap
   is the smallest such cap over the processes it has one of: its Python
   process, Playwright's driver and its web child. Browser main and
   GPU/utility processes cap one browser (the pool spreads episodes evenly over
   its 2 browsers here), which more browsers per sidecar lift:
   ``browsers_per_sidecar_needed``. Renderers, one per page, cap nothing.
3. S sidecars, each with its own browsers, driver and web child, cap the node
   at S times one sidecar's cap (they share nothing but the cores).
4. projected(S) = min(CPU bound, S x one sidecar's cap); ``sidecars_needed`` is
   the smallest S whose cap is not below the CPU bound.
5. Memory: each sidecar needs about the peak RSS measured here; the node has
   256 GiB.

Then the same in som mode on the long-horizon families (``aggregation``,
``constraint``, ``join``: gold paths of 10-50 actions, ``env.max_steps`` 100,
test tasks) at ``--long-levels``: its line has ``"tasks": "long_horizon"`` (the
others ``"qa"``), and its CPU s per step is the figure to compare.

    python bench/rollout.py [--episodes 32] [--levels 1,4,8,16,32] [--modes api,som]
        [--long-episodes 16] [--long-levels 1,8] [--set KEY=VALUE ...]

One JSON line per mode (and one for the long-horizon families): {"bench": "rollout", "mode", "tasks",
"episodes_per_s": {"1", "4", "8", "16", "32"}, "cores_busy": {level: CPU s / wall s},
"cpu_s_per_episode", "cpu_s_per_step", "cpu_s_per_episode_by_kind",
"cpu_s_per_step_by_kind", "busiest_process_cpu_s_per_episode" (by kind),
"processes" (by kind), "peak_rss_mib", "projection": {"cpu_bound",
"caps_per_sidecar", "one_sidecar_cap", "bottleneck", "sidecars_needed",
"per_browser_cap", "browsers_per_sidecar_needed", "by_sidecars", ...},
"projected_episodes_per_s_64_cores" (with sidecars_needed sidecars),
"projected_episodes_per_s_64_cores_1_sidecar", "assumptions"}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rollout.env import browser_pool  # noqa: E402
from rollout.sidecar.buffer import TrajectoryBuffer  # noqa: E402
from rollout.sidecar.engine import RolloutEngine  # noqa: E402
from rollout.sidecar.proc_stats import TreeSampler  # noqa: E402
from rollout.sidecar.procs import start_child  # noqa: E402
from rollout.tasks.generate import generate  # noqa: E402
from rollout.web.build import load  # noqa: E402
from shared.config import RunConfig  # noqa: E402
from shared.config import load as load_config  # noqa: E402
from shared.tokenizer import load_tokenizer  # noqa: E402

LEVELS = (1, 4, 8, 16, 32)
G = 4
BROWSERS = 2  # per sidecar, as measured
CORES_TARGET = 64
EFFICIENCY = 0.8  # fraction of ideal CPU scaling assumed on the bigger node
RAM_TARGET_GIB = 256
SIDECAR_CHOICES = (1, 2, 4, 8, 16)
# One process of each per sidecar: the busiest caps its sidecar.
SIDECAR_KINDS = ("sidecar", "playwright_driver", "web")
# A few processes per browser: they cap one browser; rollout.browsers lifts that cap.
BROWSER_KINDS = ("browser", "gpu_utility")
ASSUMPTIONS = [
    f"CPU bound = {CORES_TARGET} cores x {EFFICIENCY} efficiency / total CPU s per episode "
    "(all processes of the tree: sidecar, Playwright driver, browsers, renderers, web)",
    "one process uses at most one core: a process spending c CPU s per episode caps its "
    "sidecar at 1/c episodes/s",
    f"one sidecar's cap = min over its {', '.join(SIDECAR_KINDS)} processes (one of each "
    "per sidecar) of 1 / (its CPU s per episode)",
    f"browser main and GPU/utility processes (a few per browser; {BROWSERS} browsers per "
    "sidecar measured, episodes spread evenly) cap one browser, not the sidecar: "
    "browsers_per_sidecar_needed is how many keep each below one core; renderers (one per "
    "page, one episode each) cap nothing",
    "the egress proxy runs on the sidecar's event loop: its CPU is the sidecar's",
    "S sidecars on a node (launch/rollout.sh SIDECARS=S), each with its own browsers, "
    "driver and web child, cap the node at S x one sidecar's cap",
    "projected(S) = min(CPU bound, S x one sidecar's cap); sidecars_needed = the smallest S "
    "whose cap reaches the CPU bound",
    f"memory: each sidecar needs about the peak RSS measured here; the node has "
    f"{RAM_TARGET_GIB} GiB",
    "this process stands in for the sidecar's Python process (no HTTP serving of /batch)",
]


def _steps(group) -> tuple[int, int]:
    """(agent steps, episodes) of a finished group (per-turn rows counted once per episode);
    a dropped group (an episode failed on infrastructure) counts nothing."""
    if group is None:
        return 0, 0
    first = group.turns <= 0
    return int(group.ints[first, 2].sum()), int(first.sum())


def projection(cpu_per_ep: float, busiest_per_ep: dict[str, float], peak_rss_mib: float) -> dict:
    cpu_bound = CORES_TARGET * EFFICIENCY / cpu_per_ep
    caps = {k: 1.0 / busiest_per_ep[k] for k in SIDECAR_KINDS if busiest_per_ep.get(k, 0) > 0}
    bottleneck = min(caps, key=caps.get)
    one = caps[bottleneck]
    needed = max(1, math.ceil(cpu_bound / one))
    # one browser's busiest process per episode it hosts (the pool spreads them evenly)
    per_browser = {k: busiest_per_ep[k] * BROWSERS for k in BROWSER_KINDS if k in busiest_per_ep}
    return {
        "cpu_bound": round(cpu_bound, 1),
        "caps_per_sidecar": {k: round(v, 1) for k, v in caps.items()},
        "one_sidecar_cap": round(one, 1),
        "bottleneck": bottleneck,
        "sidecars_needed": needed,
        "per_browser_cap": {k: round(1 / v, 1) for k, v in per_browser.items() if v > 0},
        "browsers_per_sidecar_needed": max(
            [1] + [math.ceil(min(one, cpu_bound / needed) * v) for v in per_browser.values()]
        ),
        "ram_gib_at_sidecars_needed": round(needed * peak_rss_mib / 1024, 1),
        "by_sidecars": {str(s): round(min(cpu_bound, s * one), 1) for s in SIDECAR_CHOICES},
        "projected": round(min(cpu_bound, needed * one), 1),
        "projected_1_sidecar": round(min(cpu_bound, one), 1),
    }


CONTEXT = 8192  # tokens of an episode: the default 1024 cut the qa episodes before their answer
LONG_FAMILIES = ("aggregation", "constraint", "join")  # rollout.tasks.long_horizon
LONG_MAX_STEPS = 100  # their gold paths run to 50 actions
LONG_CONTEXT = 32768  # tokens: a 50-step episode as one sequence


async def measure_mode(
    mode: str, web_url: str, tasks: list[dict], episodes: int, sampler: TreeSampler,
    levels: tuple[int, ...] = LEVELS, sets: tuple[str, ...] = (), label: str = "qa",
) -> dict:  # fmt: skip
    sets = (f"inference.max_context_tokens={CONTEXT}", *sets)  # whole episodes, not cut
    cfg = load_config(None, [f"env.mode={mode}", "rollout.policy=oracle", f"rollout.group_size={G}",
                             "rollout.max_concurrent_episodes=32", f"rollout.browsers={BROWSERS}",
                             "rollout.contexts_per_browser=16", *sets])  # fmt: skip
    tok = load_tokenizer()
    rates: dict[str, float] = {}
    busy: dict[str, float] = {}
    cpu: Counter[str] = Counter()
    per_pid: Counter[tuple[int, str]] = Counter()
    procs: dict[str, int] = {}
    eps_done = steps_done = steps_eps = infra = successes = 0
    unsampled = peak = 0.0
    pool_cm = (
        browser_pool(web_url, cfg.env, cfg.rollout) if mode != "api" else contextlib.nullcontext()
    )
    with tempfile.TemporaryDirectory() as tmp:
        sampler.mark()  # peak RSS from here
        async with aiohttp.ClientSession() as session, pool_cm as pool:
            it = iter(tasks * 100)
            for level in levels:
                level_cfg = load_config(None, [f"env.mode={mode}", "rollout.policy=oracle",
                                               f"rollout.group_size={G}",
                                               f"rollout.max_concurrent_episodes={level}",
                                               *sets])  # fmt: skip
                buffer = TrajectoryBuffer(Path(tmp) / f"buf{level}", max_pending=10_000)
                engine = RolloutEngine(level_cfg, web_url, it, tok, buffer, session, pool=pool)
                n_groups = max(episodes, 2 * level) // G
                sem = asyncio.Semaphore(max(1, -(-level // G)))  # groups in flight
                steps = [0, 0]  # steps and episodes of the groups that finished

                async def one(k: int, engine=engine, sem=sem, level=level, steps=steps) -> None:
                    async with sem:
                        n, e = _steps(await engine.run_group(next(it), f"bench.{level}.{k}"))
                        steps[0] += n
                        steps[1] += e

                mark, t0 = sampler.mark(), time.monotonic()
                await asyncio.gather(*(one(k) for k in range(n_groups)))
                wall = time.monotonic() - t0
                w = sampler.window(mark)
                cpu.update(w.cpu_s)
                for pid, kind, s in w.per_process:
                    per_pid[(pid, kind)] += s
                for k, n in w.processes.items():
                    procs[k] = max(procs.get(k, 0), n)
                unsampled += w.unsampled_s
                peak = max(peak, w.peak_rss_bytes / 2**20)
                eps_done += engine.stats.episodes
                steps_done += steps[0]
                steps_eps += steps[1]
                infra += engine.stats.infra_errors
                successes += engine.stats.successes
                rates[str(level)] = round(engine.stats.episodes / wall, 2)
                busy[str(level)] = round(w.total_s / wall, 2)
                buffer.close()
    eps = max(1, eps_done)
    steps_per_ep = steps_done / max(1, steps_eps)
    n_steps = max(1e-9, eps * steps_per_ep)
    total = sum(cpu.values())
    busiest: dict[str, float] = {}
    for (_, kind), s in per_pid.items():
        busiest[kind] = max(busiest.get(kind, 0.0), s)
    busiest_per_ep = {k: v / eps for k, v in busiest.items()}
    proj = projection(total / eps, busiest_per_ep, peak)
    return {
        "bench": "rollout",
        "mode": mode,
        "tasks": label,
        "config_overrides": list(sets),
        "episodes_per_s": rates,
        "cores_busy": busy,
        "episodes": eps_done,
        "infra_errors": infra,
        "success_rate": round(successes / max(1, eps_done), 3),
        "steps_per_episode": round(steps_per_ep, 2),
        "cpu_s_per_episode": round(total / eps, 4),
        "cpu_s_per_step": round(total / n_steps, 4),
        "cpu_s_per_episode_by_kind": {k: round(v / eps, 4) for k, v in sorted(cpu.items())},
        "cpu_s_per_step_by_kind": {k: round(v / n_steps, 5) for k, v in sorted(cpu.items())},
        "busiest_process_cpu_s_per_episode": {
            k: round(v, 4) for k, v in sorted(busiest_per_ep.items())
        },
        "processes": dict(sorted(procs.items())),
        "unsampled_cpu_s_per_episode": round(unsampled / eps, 4),
        "peak_rss_mib": round(peak, 1),
        "projection": proj,
        "projected_episodes_per_s_64_cores": proj["projected"],
        "projected_episodes_per_s_64_cores_1_sidecar": proj["projected_1_sidecar"],
        "assumptions": ASSUMPTIONS,
    }


async def main_async(args: argparse.Namespace) -> list[dict]:
    cfg = RunConfig()
    levels = tuple(int(x) for x in args.levels.split(","))
    with TreeSampler(interval_s=0.1) as sampler:
        web = await start_child(["rollout.web", "--port", "0"], "web")
        try:
            tasks = generate(
                load(cfg.web.cache_dir), "test", 200, types=["qa"], seed=5, base_url=web.url
            )
            sets = tuple(args.set)
            out = [
                await measure_mode(m, web.url, tasks, args.episodes, sampler, levels, sets)
                for m in args.modes.split(",")
            ]
            if args.long_episodes > 0:  # the long-horizon families, som mode
                long_tasks = generate(
                    load(cfg.web.cache_dir), "test", 85, seed=5, base_url=web.url,
                    templates=LONG_FAMILIES,
                )  # fmt: skip
                long_levels = tuple(int(x) for x in args.long_levels.split(","))
                out.append(
                    await measure_mode(
                        "som", web.url, long_tasks, args.long_episodes, sampler, long_levels,
                        sets=(f"env.max_steps={LONG_MAX_STEPS}",
                              f"inference.max_context_tokens={LONG_CONTEXT}", *sets),
                        label="long_horizon",
                    )
                )  # fmt: skip
            return out
        finally:
            await web.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per concurrency level")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels")
    ap.add_argument("--modes", default="api,som", help="env modes, in order")
    ap.add_argument(
        "--long-episodes",
        type=int,
        default=16,
        help="episodes per level of the long-horizon families in som mode (0: none)",
    )
    ap.add_argument("--long-levels", default="1,8", help="their concurrency levels")  # fmt: skip
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration override for every run (env.frame_clock=chromium, say); repeatable",
    )
    results = asyncio.run(main_async(ap.parse_args()))
    print("# projection assumptions:", *ASSUMPTIONS, sep="\n#   ", file=sys.stderr)
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
