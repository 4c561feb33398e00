"""Learner throughput: GRPO train steps per second on CPU, against the matmul peak.

For each model config (the tiny default, and a ~50M-parameter one), one jitted
GRPO train step (forward, loss, backward, AdamW) runs on a packed batch of
synthetic groups; tokens per second are timed after compilation, and achieved
GFLOP/s = 6 x parameters x tokens / time (forward + backward, attention left
out). The matmul peak is a jitted 2048 x 2048 f32 matmul timed in the same run.

    python bench/learner.py [--steps 5]

Final line: {"bench": "learner", "configs": [{"name", "params", "tokens_per_s",
"achieved_gflops", "matmul_peak_gflops", "fraction_of_peak"}]}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from learner.batching import pack  # noqa: E402
from learner.model import Model, param_info  # noqa: E402
from learner.modelconfig import tiny_config  # noqa: E402
from learner.sharding import make_mesh  # noqa: E402
from learner.step import compile_step, new_state, place_batch  # noqa: E402
from shared.config import LearnerConfig, MeshConfig  # noqa: E402
from shared.wire import Trajectory, TrajectoryGroup  # noqa: E402

CONFIGS = {
    "tiny": {},
    "50m": {
        "hidden_size": 640,
        "intermediate_size": 1728,
        "num_layers": 10,
        "num_heads": 10,
        "num_kv_heads": 5,
        "head_dim": 64,
    },
}


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def groups(n: int, g: int, length: int, vocab: int) -> list[TrajectoryGroup]:
    rng = np.random.default_rng(1)
    out = []
    for k in range(n):
        trajs = [
            Trajectory(
                f"t{k}",
                f"g{k}",
                i,
                rng.integers(3, vocab, length).astype(np.int32),
                (np.arange(length) >= length // 4).astype(np.uint8),
                -rng.random(length).astype(np.float32),
                np.zeros(length, np.int32),
                reward=float((i + k) % 2),
            )
            for i in range(g)
        ]
        out.append(TrajectoryGroup(f"g{k}", f"t{k}", trajs))
    return out


def measure(name: str, overrides: dict, steps: int, peak: float) -> dict:
    cfg_model = tiny_config(**overrides)
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    n_params = sum(int(np.prod(p.shape)) for p in param_info(model))
    cfg = LearnerConfig(length_buckets=(256,), warmup_steps=0, steps=100)
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    state, shardings = new_state(model, mesh, cfg)
    step = compile_step(model, mesh, cfg, shardings)
    rows = 16
    packed = pack(groups(rows // 4, 4, 256, cfg_model.vocab_size), rows=rows, buckets=(256,))
    batch = place_batch(packed.arrays, mesh)
    tokens = float(np.asarray(packed.arrays["attn_bt"]).sum())
    state, m = step(state, batch)  # compile
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, batch)
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t0) / steps
    gflops = 6 * n_params * tokens / dt / 1e9
    return {
        "name": name,
        "params": n_params,
        "tokens_per_s": round(tokens / dt, 1),
        "achieved_gflops": round(gflops, 2),
        "matmul_peak_gflops": round(peak, 2),
        "fraction_of_peak": round(gflops / peak, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per config")
    args = ap.parse_args()
    peak = matmul_peak_gflops()
    configs = [measure(name, o, args.steps, peak) for name, o in CONFIGS.items()]
    print(json.dumps({"bench": "learner", "configs": configs}))


if __name__ == "__main__":
    main()
