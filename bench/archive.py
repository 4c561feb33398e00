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

``--open N`` measures opening instead: it writes an archive of N exchanges (synthesised:
records formatted and gzipped here, with the files' own indexes, as the writer makes
them, at a tenth of the writer's cost), then in fresh processes opens it twice, first
building the directory index from the files' indexes (``cold``), then mapping the saved
one (``warm``), each at another web origin than recorded, and looks up 1,000 random
exchanges, checking each body. Final JSON line:
{"bench": "archive_open", "exchanges", "files", "bytes", "write_s", "cold": {...},
"warm": {...}}, each with ``open_s``, ``rss_growth`` after opening and
``rss_growth_after_lookups`` (``anon_mb``: the process's own memory; ``file_mb``: pages of
the mapped index, page cache the kernel can drop), ``lookup_p50_ms`` and ``lookups_ok``.
Goal: ``open_s`` < 1 and anonymous memory flat in N (no body is loaded).

    python bench/archive.py --open 1000000 [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from rollout.archive.format import request_key, warcinfo
from rollout.archive.index import file_index_entry, file_index_header, file_index_path
from rollout.archive.store import Archive
from rollout.env import browsers_for, net_for
from rollout.eval import run_episode
from rollout.sidecar.procs import web_for
from rollout.tasks.generate import generate
from rollout.tracking.tracker import RECORD_SUFFIX
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


# ----------------------------------------------------------------------------- opening

RECORDED, REPLAYED = "http://127.0.0.1:38931", "http://127.0.0.1:39153"
_FILE_BYTES = 256 << 20  # the writer's default rotation


def _member(head: str, block: bytes) -> bytes:
    record = head.encode() + f"Content-Length: {len(block)}\r\n\r\n".encode() + block + b"\r\n\r\n"
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    return z.compress(record) + z.flush()


def _exchange_members(i: int, episode: str) -> tuple[str, bytes, bytes]:
    """Exchange ``i`` as the writer would store it: (URL, response member, request member)."""
    url, rid = f"{RECORDED}/page/{i}", f"<urn:uuid:{uuid.uuid4()}>"
    body = (f"<p>page {i}</p><a href='{RECORDED}/page/{i + 1}'>next</a>" + "x" * 600).encode()
    common = f"WARC-Target-URI: {url}\r\nWARC-Date: 2025-01-01T00:00:00.000000Z\r\nWARC-Episode: {episode}\r\nWARC-Archive-Kind: page\r\n"  # fmt: skip
    http = f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {len(body)}\r\n\r\n"
    response = _member(
        f"WARC/1.1\r\nWARC-Type: response\r\nWARC-Record-ID: {rid}\r\n{common}"
        "Content-Type: application/http; msgtype=response\r\n",
        http.encode() + body,
    )
    request = _member(
        f"WARC/1.1\r\nWARC-Type: request\r\nWARC-Record-ID: <urn:uuid:{uuid.uuid4()}>\r\n"
        f"{common}WARC-Concurrent-To: {rid}\r\nContent-Type: application/http; msgtype=request\r\n",
        f"GET /page/{i} HTTP/1.1\r\nUser-Agent: bench\r\n\r\n".encode(),
    )
    return url, response, request


def synthesise(directory: Path, n: int) -> None:
    """``n`` exchanges (20 per episode) in files of ``_FILE_BYTES``, each with its index,
    in a new ``directory``."""
    directory.mkdir(parents=True)
    i, seq = 0, 0
    while i < n:
        path = directory / f"archive-1-{seq:05d}.warc.gz"
        info = warcinfo(path.name, RECORDED)
        with path.open("wb") as warc, file_index_path(path).open("wb") as index:
            warc.write(info)
            index.write(file_index_header(RECORDED, info))
            size = len(info)
            while i < n and size < _FILE_BYTES:
                episode = f"ep-{i // 20}"
                url, response, request = _exchange_members(i, episode)
                key = request_key("GET", url, b"", (RECORDED,))
                warc.write(response + request)
                index.write(file_index_entry(key, episode, size, len(response), len(request)))
                size += len(response) + len(request)
                i += 1
        seq += 1


_MEASURE = """
import json, random, statistics, sys, time
def rss():  # (anonymous, file-backed) resident MB: the process's own memory, mapped files
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(status[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile"))
def growth(now, before):
    return {"anon_mb": round(now[0] - before[0], 1), "file_mb": round(now[1] - before[1], 1)}
from rollout.archive.store import Archive
import numpy
before = rss()
t0 = time.perf_counter()
archive = Archive.open(sys.argv[1], origin=sys.argv[2])
open_s = time.perf_counter() - t0
opened = rss()
n = len(archive)
rng, times, ok = random.Random(0), [], 0
for _ in range(1000):
    i = rng.randrange(n)
    t = time.perf_counter()
    ex = archive.lookup("GET", f"{sys.argv[2]}/page/{i}", episode=f"ep-{i // 20}")
    times.append(time.perf_counter() - t)
    ok += ex is not None and ex.response_body.startswith(
        f"<p>page {i}</p><a href='{sys.argv[2]}/page/{i + 1}'>".encode())
print(json.dumps({"open_s": round(open_s, 3), "rss_growth": growth(opened, before),
    "rss_growth_after_lookups": growth(rss(), before), "exchanges": n,
    "lookup_p50_ms": round(statistics.median(times) * 1e3, 3), "lookups_ok": ok}))
"""


def bench_open(n: int, directory: Path) -> dict:
    t0 = time.perf_counter()
    synthesise(directory, n)
    write_s = time.perf_counter() - t0
    repo = Path(__file__).resolve().parents[1]
    runs = {}
    for name in ("cold", "warm"):  # the first opening builds and saves the index
        cmd = [sys.executable, "-c", _MEASURE, str(directory), REPLAYED]
        done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=True)
        runs[name] = json.loads(done.stdout.splitlines()[-1])
        print(f"{name}: {runs[name]}", file=sys.stderr)
    files = sorted(directory.glob("*.warc.gz"))
    return {
        "bench": "archive_open", "exchanges": n, "files": len(files),
        "bytes": sum(p.stat().st_size for p in files), "write_s": round(write_s, 1), **runs,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_config_args(ap)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--modes", default="api,playwright,som")
    ap.add_argument("--open", type=int, metavar="N", help="measure opening N exchanges instead")
    ap.add_argument("--dir", help="where --open writes its archive (default: a temporary one)")
    args = ap.parse_args()
    if args.open:
        with tempfile.TemporaryDirectory() as tmp:
            result = bench_open(args.open, Path(args.dir or tmp) / "archive")
        print(json.dumps(result))
        return
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
