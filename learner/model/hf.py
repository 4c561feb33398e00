"""Hugging Face checkpoints: load Llama / Qwen2 safetensors into the model, export back.

An HF directory holds ``config.json``, the weights as ``model.safetensors`` or
shards listed in ``model.safetensors.index.json``, and the tokenizer files. The
weight names are the usual ones (``model.layers.N.self_attn.q_proj.weight``...,
``lm_head.weight`` unless tied); torch ``Linear`` weights are (out, in) and the
model keeps (in, heads, head_dim) kernels, so loading transposes and reshapes
and exporting undoes it exactly.

:func:`export_hf` writes the directory SGLang's ``update_weights_from_disk``
loads: bf16 (or f32) shards of at most ``max_shard_bytes``, the index,
``config.json`` with ``torch_dtype``, ``generation_config.json`` and the
tokenizer files. It writes into a temporary sibling and renames it into place,
so a reader never sees a half-written export.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from flax import nnx

from learner.model import safetensors_io
from learner.model.config import ModelConfig
from learner.model.params import Model, get_params, set_params
from shared.tokenizer import copy_tokenizer_files

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@dataclass(frozen=True)
class WeightMap:
    """One parameter: its path in the model, its HF name, and how the layouts relate."""

    path: str
    hf_name: str
    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray], np.ndarray]
    layer: int | None = None  # a decoder block's: its index along the stacked ``layers`` axis


def _same(x: np.ndarray) -> np.ndarray:
    return x


def weight_maps(cfg: ModelConfig) -> list[WeightMap]:
    """Every parameter of the architecture with its HF name and layout conversions."""
    e, h, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out = [WeightMap("embed_tokens", "model.embed_tokens.weight", _same, _same)]
    out.append(WeightMap("norm.weight", "model.norm.weight", _same, _same))
    if not cfg.tie_word_embeddings:
        out.append(WeightMap("lm_head", "lm_head.weight", np.transpose, np.transpose))
    for i in range(cfg.num_layers):

        def add(ours: str, hf: str, to_hf=_same, from_hf=_same, i=i) -> None:
            out.append(WeightMap(f"layers.{ours}", f"model.layers.{i}.{hf}", to_hf, from_hf, i))

        for norm in ("input_layernorm", "post_attention_layernorm"):
            add(f"{norm}.weight", f"{norm}.weight")
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            add(
                f"self_attn.{name}_proj",
                f"self_attn.{name}_proj.weight",
                lambda x: x.reshape(e, -1).T,
                lambda x, n=heads: x.T.reshape(e, n, d),
            )
            if cfg.qkv_bias:
                add(
                    f"self_attn.{name}_bias",
                    f"self_attn.{name}_proj.bias",
                    lambda x: x.reshape(-1),
                    lambda x, n=heads: x.reshape(n, d),
                )
        if cfg.qk_norm:
            for name in ("q", "k"):
                add(f"self_attn.{name}_norm.weight", f"self_attn.{name}_norm.weight")
        add(
            "self_attn.o_proj",
            "self_attn.o_proj.weight",
            lambda x: x.reshape(h * d, e).T,
            lambda x: x.T.reshape(h, d, e),
        )
        if cfg.o_bias:
            add("self_attn.o_bias", "self_attn.o_proj.bias")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            add(f"mlp.{proj}", f"mlp.{proj}.weight", np.transpose, np.transpose)
    return out


# ----------------------------------------------------------------------------- loading


def load_config(path: str | Path, **dtypes: str) -> ModelConfig:
    """The :class:`ModelConfig` of an HF directory (``param_dtype``/``dtype`` as keywords)."""
    return ModelConfig.from_hf_config(
        json.loads((Path(path) / "config.json").read_text()), **dtypes
    )


def iter_tensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) of every tensor in an HF directory, shard by shard."""
    path = Path(path)
    if (path / INDEX).is_file():
        index = json.loads((path / INDEX).read_text())
        files = sorted(set(index["weight_map"].values()))
    elif (path / SINGLE).is_file():
        files = [SINGLE]
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors weights")
    for name in files:
        yield from safetensors_io.load_file(path / name).items()


def load_params(path: str | Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The model's parameters by path, read from an HF directory's safetensors."""
    by_name = {m.hf_name: m for m in weight_maps(cfg)}
    params: dict[str, np.ndarray] = {}
    layers: dict[str, list[np.ndarray | None]] = {}
    seen = set()
    for name, array in iter_tensors(path):
        m = by_name.get(name)
        if m is None:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer older checkpoints saved; recomputed from the config
            raise KeyError(f"{path}: unexpected tensor {name}")
        seen.add(name)
        value = np.asarray(m.from_hf(array))
        if m.layer is None:
            params[m.path] = value
        else:
            layers.setdefault(m.path, [None] * cfg.num_layers)[m.layer] = value
    missing = sorted(set(by_name) - seen)
    if missing:
        raise KeyError(f"{path}: missing tensors {missing[:5]}{'...' if len(missing) > 5 else ''}")
    for name, per_layer in layers.items():  # the blocks' weights, stacked along the layer axis
        params[name] = np.stack(per_layer)
    return params


def load_hf(
    path: str | Path, *, param_dtype: str = "float32", dtype: str = "float32", seed: int = 0
) -> Model:
    """A model built from an HF directory's ``config.json`` with its weights."""
    cfg = load_config(path, param_dtype=param_dtype, dtype=dtype)
    model = Model(cfg, rngs=nnx.Rngs(seed))
    set_params(model, load_params(path, cfg))
    return model


# ----------------------------------------------------------------------------- export


def hf_tensors(model: Model, dtype: str = "bfloat16", untie: bool = False) -> dict[str, np.ndarray]:
    """The model's weights under HF names and layouts, cast to ``dtype``; with ``untie``, a
    tied model's embedding is written a second time as ``lm_head.weight``."""
    params = {k: np.asarray(v) for k, v in get_params(model).items()}
    out = {}
    for m in weight_maps(model.cfg):
        value = params[m.path] if m.layer is None else params[m.path][m.layer]
        out[m.hf_name] = np.ascontiguousarray(m.to_hf(value)).astype(NP_DTYPES[dtype])
    if untie and model.cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _shards(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    """Tensors grouped in name order into shards of at most ``max_bytes`` (one tensor may exceed)."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        n = tensors[name].nbytes
        if shards[-1] and size + n > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += n
    return shards


def export_hf(
    model: Model,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    dtype: str = "bfloat16",
    max_shard_bytes: int = 2 << 30,
    untie: bool = False,
) -> Path:
    """Write ``model`` as an HF checkpoint directory (atomically: replaced only when complete).

    ``untie`` writes a tied model as an untied one with the same matrix twice (the
    embedding, and ``lm_head.weight``): the same function, for an engine that cannot
    reload a tied head in place (vLLM's in-place reload leaves a tied head on the old
    weights)."""
    if dtype not in NP_DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(NP_DTYPES)}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_weights(hf_tensors(model, dtype, untie), tmp, max_shard_bytes)
        cfg = model.cfg.to_hf_config(torch_dtype=dtype)
        if untie:
            cfg["tie_word_embeddings"] = False
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        generation = {"eos_token_id": list(model.cfg.eos_token_ids) or None}
        if model.cfg.bos_token_id is not None:
            generation["bos_token_id"] = model.cfg.bos_token_id
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_weights(tensors: dict[str, np.ndarray], out: Path, max_shard_bytes: int) -> None:
    shards = _shards(tensors, max_shard_bytes)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += safetensors_io.save_file(shard, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _replace_dir(src: Path, dst: Path) -> None:
    """Move a finished directory to ``dst``; an old ``dst`` is swapped out, then deleted."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.rename(dst, old)
    os.rename(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
