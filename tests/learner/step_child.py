"""Child of the train-step tests: one GRPO step on several meshes of 8 simulated CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.learner.step_child OUT_DIR

Writes ``OUT_DIR/<mesh>.npz`` (the loss, the metrics and every updated parameter)
for each mesh (and with gradient accumulation), so the parent compares them.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from learner.model.params import Model, tiny_config
from learner.training.batching import pack
from learner.training.sharding import make_mesh
from learner.training.step import compile_step, new_state, rows_multiple
from shared.config import LearnerConfig, MeshConfig
from shared.wire import Trajectory, TrajectoryGroup
from tests.learner.helpers import randomized

MESHES = {  # name: (mesh, devices, micro-batches)
    "single": (MeshConfig(data=1), 1, 1),
    "data8": (MeshConfig(data=8), 8, 1),
    "fsdp8": (MeshConfig(data=1, fsdp=8), 8, 1),
    "d2f2t2": (MeshConfig(data=2, fsdp=2, tensor=2), 8, 1),
    "single_micro4": (MeshConfig(data=1), 1, 4),  # gradient accumulation: the same step
    "data4_micro4": (MeshConfig(data=4), 4, 4),
}
# Adam's first update is lr * g / (|g| + eps): its slope in g is up to lr / eps, so on
# coordinates whose gradient is ~eps it amplifies the meshes' different reduction orders
# (f32 rounding of the gradient) by lr / eps. lr 1e-3 over eps 1e-6 keeps that gain at
# 1e3 (1e4 at the default eps 1e-8 shows 1e-5 differences on one of 16k coordinates).
CFG = LearnerConfig(
    learning_rate=1e-3,
    adam_eps=1e-6,
    warmup_steps=0,
    steps=10,
    length_buckets=(16, 32),
    kl_coef=0.1,
)


def groups(seed: int = 0, n: int = 4, g: int = 4) -> list[TrajectoryGroup]:
    """``n`` groups of ``g`` random trajectories (10-30 tokens, half of them trained on)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        trajs = []
        for i in range(g):
            length = int(rng.integers(10, 30))
            trajs.append(
                Trajectory(
                    task_id=f"task{k}",
                    group_id=f"group{seed}-{k}",
                    sample_index=i,
                    tokens=rng.integers(0, 200, length).astype(np.int32),
                    loss_mask=(rng.random(length) < 0.5).astype(np.uint8),
                    logprobs=-rng.random(length).astype(np.float32) * 5,
                    versions=np.zeros(length, np.int32),
                    reward=float(rng.integers(0, 2)),
                )
            )
        out.append(TrajectoryGroup(f"group{seed}-{k}", f"task{k}", trajs))
    return out


def run(name: str, out_dir: Path) -> None:
    mesh_cfg, n, micro = MESHES[name]
    mesh = make_mesh(mesh_cfg, jax.devices()[:n])
    model = randomized(Model(tiny_config(num_layers=2), rngs=nnx.Rngs(0)))
    cfg = replace(CFG, micro_batches=micro)
    state, shardings = new_state(model, mesh, cfg)
    step = compile_step(model, mesh, cfg, shardings)
    packed = pack(groups(), rows=16, buckets=CFG.length_buckets)
    assert packed.shape[0] % rows_multiple(mesh) == 0
    state, metrics = step(state, packed.arrays)
    emb = state.params["embed_tokens"]
    assert len(emb.sharding.device_set) == n, emb.sharding
    np.savez(
        out_dir / f"{name}.npz",
        **{f"m.{k}": np.asarray(v) for k, v in metrics.items()},
        **{f"p.{k}": np.asarray(v) for k, v in state.params.items()},
    )
    print(name, float(metrics["loss"]), flush=True)


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    for mesh_name in MESHES:
        run(mesh_name, Path(sys.argv[1]))
