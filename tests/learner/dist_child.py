"""Child of the multi-process test: one process of a 2 x 4-device ``jax.distributed`` job.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python -m tests.learner.dist_child COORDINATOR PROCESS_ID OUT_DIR

Both processes run the same GRPO step on one (data=2, fsdp=2, tensor=2) mesh over
the 8 devices of the job; process 0 writes the loss and the updated parameters
(gathered from both processes) to ``OUT_DIR/dist.npz``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from learner.model.params import Model, tiny_config
from learner.training.batching import pack
from learner.training.distributed import initialize
from learner.training.sharding import make_mesh
from learner.training.step import compile_step, new_state, place_batch
from shared.config import MeshConfig
from tests.learner.helpers import randomized
from tests.learner.step_child import CFG, groups


def main(coordinator: str, process_id: int, out_dir: Path) -> None:
    cfg = MeshConfig(
        data=2, fsdp=2, tensor=2, coordinator_address=coordinator, num_processes=2,
        process_id=process_id,
    )  # fmt: skip
    assert initialize(cfg)
    assert jax.process_count() == 2 and jax.device_count() == 8
    mesh = make_mesh(cfg, jax.devices())
    model = randomized(Model(tiny_config(num_layers=2), rngs=nnx.Rngs(0)))
    state, shardings = new_state(model, mesh, CFG)
    step = compile_step(model, mesh, CFG, shardings)
    packed = pack(groups(), rows=16, buckets=CFG.length_buckets)
    state, metrics = step(state, place_batch(packed.arrays, mesh))
    params = {k: multihost_utils.process_allgather(v, tiled=True) for k, v in state.params.items()}
    metrics = {k: multihost_utils.process_allgather(v, tiled=True) for k, v in metrics.items()}
    if process_id == 0:
        np.savez(
            out_dir / "dist.npz",
            **{f"m.{k}": np.asarray(v) for k, v in metrics.items()},
            **{f"p.{k}": np.asarray(v) for k, v in params.items()},
        )
    print("process", process_id, "loss", float(np.asarray(metrics["loss"])), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
