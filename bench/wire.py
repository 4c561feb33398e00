"""Wire format throughput: encode + decode of realistic GRPO groups vs a plain copy.

A group is G=8 trajectories of 8,192 tokens (tokens, loss mask, logprobs and
per-token policy versions). The sidecar serves many distinct groups, so the
headline figures cycle over a working set of distinct groups larger than the
last-level cache; the same group encoded over and over (cache-hot) is reported
beside it. The baseline is a plain numpy copy of the same payload bytes, timed
the same way in the same run.

Decoding checks structure and sizes; the per-token value check (0/1 loss mask,
finite logprobs: ``shared.wire.check_values``) runs in the learner's batch
packer, not in decode. ``with_value_check_ratio`` times encode + decode +
that check, for the whole cost the learner pays.

    python bench/wire.py [--groups 64] [--rounds 5]

Final line: {"bench": "wire", "encode_decode_gbps", "memcpy_gbps", "ratio", ...}
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from shared.wire import Trajectory, TrajectoryGroup, check_values, decode_group, encode_group


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


def best_seconds_per_item(fns, items, rounds: int) -> list[float]:
    """Best seconds per item of each function, their rounds interleaved so that every
    function sees the same machine state (frequency, neighbours' load)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for x in items:
                fn(x)
            best[k] = min(best[k], (time.perf_counter() - t0) / len(items))
    return best


def roundtrip(g: TrajectoryGroup) -> None:
    out = decode_group(encode_group(g))
    assert len(out) == len(g)


def roundtrip_checked(g: TrajectoryGroup) -> None:
    check_values(decode_group(encode_group(g)))


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

    def copy_of(i: int) -> None:
        np.copy(payloads[i])

    def wire_of(i: int) -> None:
        roundtrip(groups[i])

    def checked_of(i: int) -> None:
        roundtrip_checked(groups[i])

    idx = range(args.groups)
    copy_s, wire_s, checked_s = best_seconds_per_item(
        (copy_of, wire_of, checked_of), idx, args.rounds
    )
    hot_copy_s, hot_wire_s = best_seconds_per_item((copy_of, wire_of), [0] * 200, args.rounds)

    result = {
        "bench": "wire",
        "group_bytes": nbytes,
        "working_set_mib": round(nbytes * args.groups / 2**20, 1),
        "encode_decode_gbps": round(nbytes / wire_s / 1e9, 3),
        "memcpy_gbps": round(nbytes / copy_s / 1e9, 3),
        "ratio": round(copy_s / wire_s, 3),
        "with_value_check_ratio": round(copy_s / checked_s, 3),
        "cache_hot_encode_decode_gbps": round(nbytes / hot_wire_s / 1e9, 3),
        "cache_hot_memcpy_gbps": round(nbytes / hot_copy_s / 1e9, 3),
        "cache_hot_ratio": round(hot_copy_s / hot_wire_s, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
