"""Child processes of the checkpoint tests: save then wait to be killed, or restore on a mesh.

    python -m tests.learner.checkpoint_child save DIR STEP OUT.npz
    python -m tests.learner.checkpoint_child save-and-die DIR
    python -m tests.learner.checkpoint_child restore DIR OUT.npz   (run with 8 CPU devices)

Values are written to ``.npz`` files so the parent compares them bit for bit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from learner.model.params import Model, get_params, tiny_config
from learner.training.checkpoint import Checkpointer
from learner.training.sharding import make_mesh, param_shardings
from shared.config import MeshConfig, RunConfig, load
from shared.tokenizer import TINY_TOKENIZER_DIR
from tests.learner.helpers import randomized

CONFIG = tiny_config(num_layers=2)
TX = optax.adamw(1e-3)


def _state(seed: int = 0):
    """Parameters after one AdamW step (so the moments are not zero), and that step's state."""
    params = get_params(randomized(Model(CONFIG, rngs=nnx.Rngs(seed)), seed=seed))
    opt_state = TX.init(params)
    grads = jax.tree.map(lambda p: jnp.sin(p * 3.0), params)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _flat(tree) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def save(directory: str, step: int, out: str) -> None:
    params, opt_state = _state()
    config = load(None, ["learner.learning_rate=3e-4"])
    ck = Checkpointer(directory, max_to_keep=2)
    ck.save(
        step,
        params=params,
        opt_state=opt_state,
        rng=jax.random.key(42),
        data_cursor={"groups_seen": 96},
        metrics={"loss": 0.25},
        config=config,
        model_config=CONFIG,
        tokenizer_dir=TINY_TOKENIZER_DIR,
    )
    ck.wait()
    np.savez(
        out,
        **{f"p{k}": v for k, v in _flat(params).items()},
        **{f"o{k}": v for k, v in _flat(opt_state).items()},
    )
    print(f"committed {step}", flush=True)
    time.sleep(600)  # the parent kills us here


def save_and_die(directory: str) -> None:
    """Commit step 1, then start a large step 2 and die by SIGKILL while it is written."""
    params, _ = _state()
    ck = Checkpointer(directory)
    ck.save(1, params=params, model_config=CONFIG)
    ck.wait()
    big = {**params, "ballast": jnp.ones((8192, 4096), jnp.float32)}  # 128 MiB
    ck.save(2, params=big, model_config=CONFIG)  # returns; the write goes on in the background
    deadline = time.monotonic() + 30
    while not any(p.name.startswith("2.") for p in Path(directory).iterdir()):
        if time.monotonic() > deadline:
            raise SystemExit("step 2 never started writing")
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)  # its temporary directory exists: mid-save


def restore(directory: str, out: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    model = Model(CONFIG, rngs=nnx.Rngs(0))
    shardings = param_shardings(model, mesh)
    abstract = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
        for k, v in get_params(model).items()
    }
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    opt_target = _with_param_shardings(jax.eval_shape(TX.init, abstract), shardings, replicated)
    ck = Checkpointer(directory, read_only=True)
    r = ck.restore(shardings=shardings, opt_state_target=opt_target)
    for name, arr in r.params.items():
        assert arr.sharding == shardings[name], (name, arr.sharding)
        assert len(arr.sharding.device_set) == 8
    split = [k for k, v in r.params.items() if any(v.sharding.spec)]
    assert r.params["embed_tokens"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert "layers.mlp.up_proj" in split
    assert r.data_cursor == {"groups_seen": 96} and r.metrics == {"loss": 0.25}
    assert r.run_config() == load(None, ["learner.learning_rate=3e-4"]) != RunConfig()
    assert r.model_config == CONFIG
    assert sorted(r.tokenizer_files) == ["tokenizer.json", "tokenizer_config.json"]
    assert jax.random.key_data(r.rng).tolist() == jax.random.key_data(jax.random.key(42)).tolist()
    assert jax.tree.structure(r.opt_state) == jax.tree.structure(jax.eval_shape(TX.init, abstract))
    np.savez(
        out,
        **{f"p{k}": v for k, v in _flat(r.params).items()},
        **{f"o{k}": v for k, v in _flat(r.opt_state).items()},
    )
    print(f"restored {r.step} onto {mesh.shape}", flush=True)


def _with_param_shardings(target, shardings, replicated):
    """The Adam moments (keyed by parameter path) sharded like their parameters."""

    def one(path, leaf):
        key = getattr(path[-1], "key", None) if path else None
        sharding = shardings.get(key, replicated) if isinstance(key, str) else replicated
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(one, target)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "save":
        save(rest[0], int(rest[1]), rest[2])
    elif cmd == "save-and-die":
        save_and_die(rest[0])
    else:
        restore(rest[0], rest[1])
