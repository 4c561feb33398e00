"""Wire format throughput: encode + decode of realistic GRPO groups vs a plain copy.

A group is G=8 trajectories of 8,192 tokens (tokens, loss mask, logprobs and
per-token policy versions). The sidecar serves many distinct groups, so the
headline figures cycle over a working set of distinct groups larger than the
last-level cache; the same group encoded over and over (cache-hot) is reported
beside it. The baseline is a plain numpy copy of the same payload bytes, timed
the same way in the same run.

    python bench/wire.py [--groups 64] [--rounds 5]

Final line: {"bench": "wire", "encode_decode_gbps", "memcpy_gbps", "ratio", ...}
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from shared.wire import Trajectory, TrajectoryGroup, decode_group, encode_group


def make_group(rng: np.random.Generator, g: int, G: int = 8, T: int = 8192) -> TrajectoryGroup:
    trajs = []
    for i in range(G):
        mask = (rng.random(T) < 0.3).astype(np.uint8)
        trajs.append(
            Trajectory(
                task_id=f"task-{g}",
                group_id=f"group-{g}",
                sample_index=i,
                tokens=rng.integers(0, 32000, T, dtype=np.int32),
                loss_mask=mask,
                logprobs=np.where(mask, -rng.random(T), 0).astype(np.float32),
                versions=np.where(mask, 7, -1).astype(np.int32),
                reward=float(rng.random()),
                reward_parts={"correct": 1.0, "format": 0.1},
                status="ok",
                num_steps=12,
                timings={"wall_s": 3.2, "env_s": 1.1, "gen_s": 2.0},
            )
        )
    return TrajectoryGroup(f"group-{g}", f"task-{g}", trajs)


def best_seconds_per_item(fn, items, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best


def roundtrip(g: TrajectoryGroup) -> None:
    out = decode_group(encode_group(g))
    assert len(out) == len(g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64, help="distinct groups in the working set")
    ap.add_argument("--rounds", type=int, default=9, help="timing rounds (best is kept)")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    groups = [make_group(rng, g) for g in range(args.groups)]
    payloads = [np.concatenate([c.view(np.uint8) for c in g.columns.values()]) for g in groups]
    nbytes = payloads[0].nbytes
    assert decode_group(encode_group(groups[0])) == groups[0]

    copy_s = best_seconds_per_item(np.copy, payloads, args.rounds)
    wire_s = best_seconds_per_item(roundtrip, groups, args.rounds)
    hot_copy_s = best_seconds_per_item(np.copy, payloads[:1] * 200, args.rounds)
    hot_wire_s = best_seconds_per_item(roundtrip, groups[:1] * 200, args.rounds)

    result = {
        "bench": "wire",
        "group_bytes": nbytes,
        "working_set_mib": round(nbytes * args.groups / 2**20, 1),
        "encode_decode_gbps": round(nbytes / wire_s / 1e9, 3),
        "memcpy_gbps": round(nbytes / copy_s / 1e9, 3),
        "ratio": round(copy_s / wire_s, 3),
        "cache_hot_encode_decode_gbps": round(nbytes / hot_wire_s / 1e9, 3),
        "cache_hot_memcpy_gbps": round(nbytes / hot_copy_s / 1e9, 3),
        "cache_hot_ratio": round(hot_copy_s / hot_wire_s, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
