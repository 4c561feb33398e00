"""Sequence packing: the share of a batch's cells that hold real tokens, unpacked vs packed.

The episode lengths (tokens per trajectory, as the learner receives them) come from
the embedded run itself: a local web and a rollout sidecar with the noisy-oracle
policy (as the embedded default's demonstrations, ``configs/tiny.toml`` unless
``--config``) run ``--episodes`` episodes through the real harness and tokenizer,
and the learner pulls their groups over the wire. ``--lengths FILE`` (one length a
line, in groups of ``rollout.group_size``) measures given lengths instead; ``--save
FILE`` writes the collected ones in that form.

The lengths are cut into steps of ``learner.groups_per_step`` groups and each step
is laid out by ``learner.training.batching.pack``, for the config's length buckets, the
default ones and any ``--buckets``:

- unpacked: one trajectory per row, rows = groups_per_step x group_size (today's);
- packed: first-fit-decreasing into a fixed number of rows, the fewest that hold
  every step (the step compiles for one shape);
- packed, tight: each step in just the rows it needs (an upper bound).

The efficiency is real prediction positions / (rows x bucket), over all steps.

    python bench/packing.py [--episodes 1024] [--config configs/tiny.toml] [--lengths FILE]
        [--save FILE] [--buckets 1024,2048 ...]

Final line: {"bench": "packing", "source", "episodes", "steps", "length_mean",
"length_p50", "length_p95", "length_max", "buckets", "rows_unpacked", "rows_packed",
"unpacked_efficiency", "packed_efficiency", "packed_tight_efficiency",
"efficiency_ratio" (packed / unpacked), "cells_per_step_unpacked",
"cells_per_step_packed", "by_buckets": [the same per bucket set]} (the top level: the
config's buckets).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from learner.embedded.children import Children  # noqa: E402
from learner.train import DEFAULT_CONFIG  # noqa: E402
from learner.training.batching import pack  # noqa: E402
from learner.training.source import GroupSource  # noqa: E402
from shared.config import LearnerConfig, RunConfig, load  # noqa: E402
from shared.wire import Trajectory, TrajectoryGroup  # noqa: E402


def collect(cfg_args: list[str], cfg: RunConfig, episodes: int) -> list[list[int]]:
    """Per group, its trajectories' token lengths: noisy-oracle episodes via a sidecar."""
    g = cfg.rollout.group_size
    want = -(-episodes // g)
    out: list[list[int]] = []
    with tempfile.TemporaryDirectory() as tmp, Children(Path(tmp) / "logs") as children:
        web = children.start("web", ["rollout.web", "--port", "0", *cfg_args])
        sidecar = children.start(
            "sidecar",
            [
                "rollout.serve", *cfg_args, "--run-dir", str(Path(tmp) / "sidecar"),
                "--set", "rollout.port=0", "--set", f"web.url={web}",
                "--set", "rollout.policy=noisy_oracle", "--set", "inference.urls=[]",
            ],
        )  # fmt: skip
        source = GroupSource([sidecar], auth_token=cfg.rollout.auth_token)
        got: set[str] = set()
        t0 = time.monotonic()
        while len(out) < want:
            for grp in source.take(min(8, want - len(out)), got):
                got.add(grp.group_id)
                out.append([int(n) for n in grp.lengths if n > 0])
            source.committed(sorted(got))
            print(f"episodes: {len(out) * g}/{want * g} ({time.monotonic() - t0:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
        source.flush_acks()
    return out


def read_lengths(path: str, g: int) -> list[list[int]]:
    lines = [ln.split("#")[0].strip() for ln in Path(path).read_text().splitlines()]
    lengths = [int(x) for x in lines if x]
    return [lengths[i : i + g] for i in range(0, len(lengths) - g + 1, g)]


def groups_of(lengths: list[list[int]]) -> list[TrajectoryGroup]:
    """Groups of the given lengths, every one with reward variance (none is dropped)."""
    out = []
    for k, ls in enumerate(lengths):
        trajs = [
            Trajectory(
                f"t{k}",
                f"g{k}",
                i,
                np.arange(n, dtype=np.int32) % 97,
                np.ones(n, np.uint8),
                np.zeros(n, np.float32),
                np.zeros(n, np.int32),
                reward=float(i % 2),
            )
            for i, n in enumerate(ls)
        ]
        out.append(TrajectoryGroup(f"g{k}", f"t{k}", trajs))
    return out


def measure(steps: list[list[TrajectoryGroup]], slots: int, buckets: tuple[int, ...]) -> dict:
    """The three layouts' efficiencies over all steps (real positions / cells)."""
    real = cells_unpacked = cells_tight = 0
    used = []
    for groups in steps:
        u = pack(groups, rows=slots, buckets=buckets)
        p = pack(groups, rows=slots, buckets=buckets, packing=True)
        real += int(u.arrays["attn_bt"].sum())
        cells_unpacked += u.arrays["attn_bt"].size
        used.append(int(p.stats["rows_used"]))
        cells_tight += used[-1] * p.shape[1]
    rows = max(used)
    cells_packed = 0
    for groups in steps:
        p = pack(groups, rows=rows, buckets=buckets, packing=True)
        cells_packed += p.arrays["attn_bt"].size
    return {
        "buckets": list(buckets),
        "rows_unpacked": slots,
        "rows_packed": rows,
        "unpacked_efficiency": round(real / cells_unpacked, 4),
        "packed_efficiency": round(real / cells_packed, 4),
        "packed_tight_efficiency": round(real / cells_tight, 4),
        "efficiency_ratio": round(cells_unpacked / cells_packed, 3),
        "cells_per_step_unpacked": cells_unpacked // len(steps),
        "cells_per_step_packed": cells_packed // len(steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="run config (TOML)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--episodes", type=int, default=1024, help="episodes to collect")
    ap.add_argument("--lengths", help="a file of episode lengths (one a line) to measure")
    ap.add_argument("--save", help="write the collected lengths here (--lengths format)")
    ap.add_argument("--buckets", action="append", default=[], metavar="256,512",
                    help="another set of length buckets to measure (repeatable)")  # fmt: skip
    args = ap.parse_args()
    cfg = load(args.config, args.set)
    g = cfg.rollout.group_size
    if args.lengths:
        lengths, source = read_lengths(args.lengths, g), args.lengths
    else:
        cfg_args = ["--config", args.config] + [x for s in args.set for x in ("--set", s)]
        lengths = collect(cfg_args, cfg, args.episodes)
        source = f"noisy_oracle episodes via the sidecar ({Path(args.config).name})"
        if args.save:
            Path(args.save).write_text("".join(f"{n}\n" for ls in lengths for n in ls))
    per_step = cfg.learner.groups_per_step
    groups = groups_of([ls for ls in lengths if len(ls) >= 2])
    steps = [groups[i : i + per_step] for i in range(0, len(groups) - per_step + 1, per_step)]
    if not steps:
        raise SystemExit(f"fewer than {per_step} groups of lengths: no full step to measure")
    slots = per_step * g
    bucket_sets = [tuple(cfg.learner.length_buckets)]
    if tuple(LearnerConfig().length_buckets) not in bucket_sets:
        bucket_sets.append(tuple(LearnerConfig().length_buckets))
    bucket_sets += [tuple(int(x) for x in b.split(",")) for b in args.buckets]
    results = [measure(steps, slots, b) for b in bucket_sets]
    flat = np.array([int(n) for step in steps for grp in step for n in grp.lengths])
    print(f"{len(flat)} episodes in {len(steps)} steps of {slots} trajectories; tokens "
          f"mean {flat.mean():.0f}, p50 {np.median(flat):.0f}, p95 "
          f"{np.percentile(flat, 95):.0f}, max {flat.max()}")  # fmt: skip
    print(f"{'buckets':<18} {'layout':<14} {'rows':>5} {'cells/step':>10} {'efficiency':>10}")
    for r in results:
        b = ",".join(map(str, r["buckets"]))
        for name, rows, cells, eff in (
            (
                "unpacked",
                r["rows_unpacked"],
                r["cells_per_step_unpacked"],
                r["unpacked_efficiency"],
            ),
            ("packed", r["rows_packed"], r["cells_per_step_packed"], r["packed_efficiency"]),
            ("packed, tight", "var", "", r["packed_tight_efficiency"]),
        ):
            print(f"{b:<18} {name:<14} {rows:>5} {cells:>10} {eff:>10.3f}")
    print(json.dumps({
        "bench": "packing", "source": source, "episodes": int(flat.size), "steps": len(steps),
        "length_mean": round(float(flat.mean()), 1), "length_p50": float(np.median(flat)),
        "length_p95": float(np.percentile(flat, 95)), "length_max": int(flat.max()),
        **results[0], "by_buckets": results,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
