"""What archiving costs: step latency live vs replay, record-mode overhead, bytes per episode.

For each mode (api, playwright, som), N test tasks run as oracle episodes through the
whole harness against the local web (a child process on loopback), one at a time, in
four passes over the same tasks: archive off, record (into a fresh directory), replay
(from it), and off again. Step latencies are the environment's own (``step_ms``);
``off`` pools both off passes so a drift over the run does not count as overhead.
Prints a table and a final JSON line:
{"bench": "archive", "n", "results": [{"mode", "off_p50_ms", "record_p50_ms",
"replay_p50_ms", "record_overhead", "replay_vs_live", "bytes_per_episode",
"exchanges_per_episode", "replay_identical"}]}; ``record_overhead`` is
record_p50 / off_p50 - 1 (goal: < 0.10), ``replay_identical`` whether every replayed
episode's observations equal the recorded ones.

    python bench/archive.py [--n 30] [--modes api,playwright,som]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from rollout.archive import Archive
from rollout.env import browsers_for, net_for
from rollout.eval import run_episode
from rollout.procs import web_for
from rollout.tasks.generate import generate
from rollout.tracker import RECORD_SUFFIX
from rollout.web.build import load
from shared.config import add_config_args, config_from_args


async def run_pass(cfg, mode: str, tasks: list[dict], web_url: str, out: Path) -> list[float]:
    """Every task's episode, one at a time; the step latencies (ms) of all of them."""
    out.mkdir(parents=True)
    async with (
        browsers_for(mode, web_url, cfg.env, cfg.rollout) as pool,
        aiohttp.ClientSession() as session,
    ):
        steps = []
        for i, task in enumerate(tasks):
            r = await run_episode(task, mode, web_url, cfg, pool, session, out, i)
            assert r["status"] != "infra_error", r
            steps += r["ms"]
    await net_for(web_url, cfg.env).close()  # the archive being written, closed
    return steps


def observations(out: Path) -> dict[str, list[str]]:
    return {
        p.name: [
            e["observation"]
            for e in map(json.loads, p.read_text().splitlines())
            if e.get("event") == "step"
        ]
        for p in sorted(out.glob(f"*{RECORD_SUFFIX}"))
    }


async def bench_mode(cfg, mode: str, tasks: list[dict], web_url: str, tmp: Path) -> dict:
    archive_dir = tmp / mode / "archive"

    def with_archive(archive: str):
        env = dataclasses.replace(cfg.env, archive=archive, archive_dir=str(archive_dir))
        return dataclasses.replace(cfg, env=env)

    ms = {}
    for name, archive in (("off1", "off"), ("record", "record"), ("replay", "replay"),
                          ("off2", "off")):  # fmt: skip
        ms[name] = await run_pass(with_archive(archive), mode, tasks, web_url, tmp / mode / name)
    p50 = {k: statistics.median(v) for k, v in ms.items()}
    off = statistics.median(ms["off1"] + ms["off2"])
    archive = Archive.open(archive_dir)
    size = sum(f.stat().st_size for f in archive_dir.glob("*.warc*"))
    return {
        "mode": mode,
        "off_p50_ms": round(off, 2),
        "record_p50_ms": round(p50["record"], 2),
        "replay_p50_ms": round(p50["replay"], 2),
        "record_overhead": round(p50["record"] / off - 1, 3),
        "replay_vs_live": round(p50["replay"] / off, 3),
        "bytes_per_episode": round(size / len(tasks)),
        "exchanges_per_episode": round(len(archive) / len(tasks), 1),
        "replay_identical": observations(tmp / mode / "record")
        == observations(tmp / mode / "replay"),
    }


async def main_async(args) -> dict:
    cfg = config_from_args(args)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, policy="oracle"))
    web_url, web = await web_for(cfg.web.cache_dir, cfg.web.url)
    try:
        tasks = generate(load(cfg.web.cache_dir), "test", args.n, base_url=web_url)
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            for mode in args.modes.split(","):
                r = await bench_mode(cfg, mode, tasks, web_url, Path(tmp))
                results.append(r)
                print(
                    f"{mode:10s} step p50: off {r['off_p50_ms']} ms, record {r['record_p50_ms']}"
                    f" ms ({r['record_overhead']:+.1%}), replay {r['replay_p50_ms']} ms"
                    f" ({r['replay_vs_live']:.2f}x live); {r['bytes_per_episode']} bytes and "
                    f"{r['exchanges_per_episode']} exchanges per episode; replay identical: "
                    f"{r['replay_identical']}",
                    file=sys.stderr,
                )
    finally:
        if web is not None:
            await web.stop()
    return {"bench": "archive", "n": args.n, "results": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_config_args(ap)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--modes", default="api,playwright,som")
    print(json.dumps(asyncio.run(main_async(ap.parse_args()))))


if __name__ == "__main__":
    main()
