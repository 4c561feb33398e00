"""`learner.train --dry-run`: the per-device memory budget of a run, computed without devices.

The state's shapes come from ``jax.eval_shape`` (nothing is allocated); each
array's per-device size follows from its partition spec under the mesh rules on
a mesh of ``mesh.num_devices`` (default: the devices present). Activations are
an estimate for the step as written (no rematerialisation, dense attention):
per layer and sequence, ~34 x T x hidden saved 2-byte values plus 5 x heads x T²
for the attention scores (Korthikanti et al. 2022), scaled to the compute dtype,
and three float32 (T, vocab) arrays for the logits, their log-softmax and its
gradient, split over the tensor axis, for the rows of one micro-batch
(``learner.micro_batches``; with more than one, the gradients are held twice:
the micro-batch's and their running sum).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model import Model, param_info
from learner.modelconfig import ModelConfig, tiny_config
from learner.sharding import MESH_AXES, spec_for
from learner.step import optimizer
from shared.config import RunConfig

GIB = 1024**3
# Architectures the dry run knows by name, for planning a run on a machine without the weights.
PRESETS = {
    "qwen2.5-7b": dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, model_type="qwen2",
        max_position_embeddings=32768, rope_theta=1_000_000.0, qkv_bias=True,
        tie_word_embeddings=False, eos_token_ids=(151645, 151643), pad_token_id=151643,
    ),
}  # fmt: skip


def model_config(cfg: RunConfig) -> ModelConfig:
    lc = cfg.learner
    dtypes = {"param_dtype": lc.param_dtype, "dtype": lc.compute_dtype}
    if lc.model == "tiny":
        return tiny_config(**dtypes)
    if (Path(lc.model) / "config.json").is_file():
        from learner.hf import load_config

        return load_config(lc.model, **dtypes)
    for name, arch in PRESETS.items():
        if name in Path(lc.model).name.lower():
            return ModelConfig(**arch, **dtypes)
    raise SystemExit(f"learner.model = {lc.model!r}: no config.json there and no known preset")


def mesh_shape(cfg: RunConfig) -> dict[str, int]:
    n = cfg.mesh.num_devices or jax.device_count()
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise SystemExit(f"mesh {sizes} does not cover {n} devices")
    return dict(zip(MESH_AXES, sizes, strict=True))


def budget(cfg: RunConfig) -> dict[str, float]:
    """Per-device bytes of params, gradients, optimiser state, reference and activations."""
    mc = model_config(cfg)
    model = nnx.eval_shape(lambda: Model(mc, rngs=nnx.Rngs(0)))
    mesh = SimpleNamespace(shape=mesh_shape(cfg))  # spec_for only reads the axis sizes
    infos = {p.path: p for p in param_info(model)}

    def per_device(path: str | None, shape, dtype) -> float:
        size = float(np.prod(shape)) * jnp.dtype(dtype).itemsize
        if path in infos and tuple(shape) == infos[path].shape:
            spec = spec_for(infos[path].axes, shape, mesh)
            for axis in spec:
                for name in (axis,) if isinstance(axis, str) else axis or ():
                    size /= mesh.shape[name]
        return size

    abstract = {k: jax.ShapeDtypeStruct(p.shape, jnp.dtype(p.dtype)) for k, p in infos.items()}
    params = sum(per_device(k, a.shape, a.dtype) for k, a in abstract.items())
    opt = jax.eval_shape(optimizer(cfg.learner).init, abstract)
    opt_bytes = 0.0
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt)[0]:
        key = getattr(path[-1], "key", None)
        opt_bytes += per_device(key if isinstance(key, str) else None, leaf.shape, leaf.dtype)
    micro = cfg.learner.micro_batches
    rows = cfg.learner.groups_per_step * cfg.rollout.group_size
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    b = -(-rows // (ways * micro))  # rows per device in one micro-batch
    t = max(cfg.learner.length_buckets)
    scale = jnp.dtype(mc.dtype).itemsize / 2
    tp = mesh.shape["tensor"]
    per_layer = (34 * t * b * mc.hidden_size / tp + 5 * mc.num_heads * t * t * b / tp) * scale
    logits = 3 * b * t * mc.vocab_size * 4 / tp
    return {
        "params": params,
        "grads": params * (2 if micro > 1 else 1),  # + the accumulator
        "optimizer": opt_bytes,
        "reference": params if cfg.learner.kl_coef > 0 else 0.0,
        "activations": per_layer * mc.num_layers + logits,
        "_params_total": float(sum(np.prod(p.shape) for p in infos.values())),
        "_rows_per_device": float(b),
        "_length": float(t),
    }


def main(cfg: RunConfig) -> int:
    parts = budget(cfg)
    shown = {k: v for k, v in parts.items() if not k.startswith("_")}
    total = sum(shown.values())
    limit = cfg.mesh.device_memory_gib
    shape = mesh_shape(cfg)
    print(
        f"model {cfg.learner.model}: {parts['_params_total'] / 1e9:.2f} B parameters; mesh "
        f"{shape}; {int(parts['_rows_per_device'])} rows x {int(parts['_length'])} tokens "
        f"per device{' per micro-batch' if cfg.learner.micro_batches > 1 else ''}"
    )
    for name, v in shown.items():
        print(f"  {name:<12} {v / GIB:8.2f} GiB per device")
    print(f"  {'total':<12} {total / GIB:8.2f} GiB per device (device: {limit:.0f} GiB)")
    if total > limit * GIB:
        print("does not fit: lower the batch or the length, or add devices")
    report = {k: round(v / GIB, 3) for k, v in shown.items()}
    print(json.dumps({"dry_run": {**report, "total_gib": round(total / GIB, 3),
                                  "device_memory_gib": limit, "fits": total <= limit * GIB}}))  # fmt: skip
    return 1 if total > limit * GIB else 0
