"""A Llama / Qwen2-family decoder in Flax NNX, with a KV-cache decode path.

RMSNorm, rotary position embeddings (``rope_theta`` and the ``linear`` and
``llama3`` scalings), grouped-query attention, a SwiGLU MLP, optional q/k/v (and
o) biases and tied or untied embeddings: the architecture of Hugging Face's
``LlamaForCausalLM`` and ``Qwen2ForCausalLM``, built from their ``config.json``
(:meth:`ModelConfig.from_hf_config`) so ``learner.hf`` can load and export their
safetensors. Every parameter carries logical axis names (``out_sharding``
metadata, e.g. ``("embed", "mlp")``) that ``learner.sharding`` maps to the mesh.

Numerics follow ``transformers``: norms and softmax in float32, parameters cast
to the compute dtype at use, logits in float32. The KV cache is laid out
``[batch, kv_heads, length, head_dim]`` (4.4x faster decode than length-major on
CPU) and has static shapes: :meth:`Model.prefill` fills it from padded prompts,
:meth:`Model.decode` appends one token per row at that row's position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.modelconfig import ModelConfig, RopeScaling, tiny_config

__all__ = [
    "KVCache",
    "Model",
    "ModelConfig",
    "ParamInfo",
    "RopeScaling",
    "apply",
    "get_params",
    "init_cache",
    "param_info",
    "rope_inv_freq",
    "sequence_logprobs",
    "set_params",
    "tiny_config",
]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
KVCache = list[tuple[jax.Array, jax.Array]]  # per layer (k, v), each (B, Hkv, S, D)
_NEG = float(np.finfo(np.float32).min)


def _param(
    rngs: nnx.Rngs,
    shape: tuple[int, ...],
    axes: tuple[str, ...],
    cfg: ModelConfig,
    init: Literal["normal", "zeros", "ones"] = "normal",
) -> nnx.Param:
    """A parameter with logical axis names; no eager placement (``learner.sharding`` places)."""
    dtype = DTYPES[cfg.param_dtype]
    if init == "normal":
        value = cfg.initializer_range * _normal(rngs.params(), shape)
    else:
        value = (jnp.zeros if init == "zeros" else jnp.ones)(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), out_sharding=axes, eager_sharding=False)


def _normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Standard normal values drawn from ``key``.

    Outside a trace, numpy draws them from the key's bits: eager ``jax.random``
    compiles one program per shape, seconds of start-up for every process. Under
    ``jit``/``eval_shape`` (sharded or abstract init) it is ``jax.random.normal``.
    """
    if isinstance(key, jax.core.Tracer):
        return jax.random.normal(key, shape, jnp.float32)
    bits = np.asarray(jax.random.key_data(key)).ravel().tolist()
    return jnp.asarray(np.random.default_rng(bits).standard_normal(shape, dtype=np.float32))


# ----------------------------------------------------------------------------- rotary


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies of the rotary embedding, scaled as ``rope_scaling`` says. (D/2,)"""
    dim = cfg.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    inv = (1.0 / (np.float32(cfg.rope_theta) ** exponents)).astype(np.float32)
    s = cfg.rope_scaling
    if s is None:
        return inv
    if s.rope_type == "linear":
        return (inv / np.float32(s.factor)).astype(np.float32)
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(inv_freq: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin for ``positions`` (B, T): each (B, 1, T, D), halves repeated as in HF."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, D/2)
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None]
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x`` (B, H, T, D) by the tables; the rotate-half convention of HF Llama."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(x.dtype)


# ----------------------------------------------------------------------------- layers


class RMSNorm(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.weight = _param(rngs, (cfg.hidden_size,), ("norm",), cfg, "ones")
        self.eps = cfg.rms_norm_eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention; q/k/v kernels are (embed, heads, head_dim)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        e, h, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = _param(rngs, (e, h, d), ("embed", "heads", "head_dim"), cfg)
        self.k_proj = _param(rngs, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        self.v_proj = _param(rngs, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        self.o_proj = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), cfg)
        if cfg.qkv_bias:
            self.q_bias = _param(rngs, (h, d), ("heads", "head_dim"), cfg, "zeros")
            self.k_bias = _param(rngs, (kv, d), ("kv_heads", "head_dim"), cfg, "zeros")
            self.v_bias = _param(rngs, (kv, d), ("kv_heads", "head_dim"), cfg, "zeros")
        if cfg.o_bias:
            self.o_bias = _param(rngs, (e,), ("embed",), cfg, "zeros")

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        """x (B, T, E) -> (B, H, T, D) with the bias, if any."""
        dt = x.dtype
        y = jnp.einsum("bte,ehd->bhtd", x, getattr(self, f"{name}_proj")[...].astype(dt))
        if self.cfg.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)[None, :, None, :]
        return y

    def qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, ...]:
        q = apply_rope(self._project(x, "q"), cos, sin)
        k = apply_rope(self._project(x, "k"), cos, sin)
        return q, k, self._project(x, "v")

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """q (B, H, T, D) over k, v (B, Hkv, S, D); mask (B, T, S) True = visible -> (B, T, E)."""
        b, h, t, d = q.shape
        kvh = k.shape[1]
        qg = q.reshape(b, kvh, h // kvh, t, d)
        scores = jnp.einsum("bkgtd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(d)
        scores = jnp.where(mask[:, None, None], scores, _NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bksd->bkgtd", probs, v).reshape(b, h, t, d)
        y = jnp.einsum("bhtd,hde->bte", out, self.o_proj[...].astype(out.dtype))
        if self.cfg.o_bias:
            y = y + self.o_bias[...].astype(y.dtype)
        return y


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        e, m = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(rngs, (e, m), ("embed", "mlp"), cfg)
        self.up_proj = _param(rngs, (e, m), ("embed", "mlp"), cfg)
        self.down_proj = _param(rngs, (m, e), ("mlp", "embed"), cfg)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        gate = jax.nn.silu(x @ self.gate_proj[...].astype(dt))
        return (gate * (x @ self.up_proj[...].astype(dt))) @ self.down_proj[...].astype(dt)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg, rngs)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, cos, sin, mask, cache=None, write_pos=None):
        """One layer. Full-sequence when ``cache`` is None (returns the new k, v); else one
        token per row appended to ``cache`` at ``write_pos`` (B,) (returns the updated cache)."""
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        if cache is not None:
            k, v = _cache_write(cache[0], k, write_pos), _cache_write(cache[1], v, write_pos)
        x = x + self.self_attn.attend(q, k, v, mask)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, (k, v)


def _cache_write(cache: jax.Array, new: jax.Array, pos: jax.Array) -> jax.Array:
    """cache (B, H, S, D) with new (B, H, 1, D) written at pos (B,)."""
    rows = jnp.arange(cache.shape[0])
    return cache.at[rows, :, pos].set(new[:, :, 0].astype(cache.dtype), mode="drop")


# ----------------------------------------------------------------------------- the model


class Model(nnx.Module):
    """The decoder. ``model(tokens)`` -> float32 logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg)
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg)
        self.inv_freq = nnx.Variable(jnp.asarray(rope_inv_freq(cfg)))  # not a Param: not trained

    @property
    def dtype(self) -> Any:
        return DTYPES[self.cfg.dtype]

    def embed(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embed_tokens[...], tokens, axis=0).astype(self.dtype)

    def unembed(self, h: jax.Array) -> jax.Array:
        """Final hidden states (..., E) -> float32 logits (..., V)."""
        h = self.norm(h)
        if self.cfg.tie_word_embeddings:
            w = self.embed_tokens[...].astype(h.dtype)
            return jnp.einsum("...e,ve->...v", h, w, preferred_element_type=jnp.float32)
        w = self.lm_head[...].astype(h.dtype)
        return jnp.einsum("...e,ev->...v", h, w, preferred_element_type=jnp.float32)

    def hidden(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Causal pass over tokens (B, T): pre-norm hidden states (B, T, E) and each layer's k, v.

        ``attention_mask`` (B, T), 1 = real token, hides padding keys; ``positions``
        default to 0..T-1 (pass them for left-padded rows).
        """
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        mask = jnp.tril(jnp.ones((t, t), bool))[None]
        if attention_mask is not None:
            mask = mask & attention_mask.astype(bool)[:, None, :]
        mask = jnp.broadcast_to(mask, (b, t, t))
        cos, sin = rope_tables(self.inv_freq[...], positions)
        x, kvs = self.embed(tokens), []
        for layer in self.layers:
            x, kv = layer(x, cos.astype(x.dtype), sin.astype(x.dtype), mask)
            kvs.append(kv)
        return x, kvs

    def __call__(self, tokens, positions=None, attention_mask=None) -> jax.Array:
        return self.unembed(self.hidden(tokens, positions, attention_mask)[0])

    def prefill(
        self, tokens: jax.Array, lengths: jax.Array, cache_len: int
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """Right-padded prompts (B, P) of ``lengths`` (B,) -> (logits at each row's last prompt
        token (B, V), final hidden states (B, P, E), a cache of length ``cache_len`` >= P)."""
        p = tokens.shape[1]
        valid = jnp.arange(p)[None] < lengths[:, None]
        h, kvs = self.hidden(tokens, attention_mask=valid)
        last = jnp.take_along_axis(h, (lengths - 1)[:, None, None], axis=1)[:, 0]
        pad = ((0, 0), (0, 0), (0, cache_len - p), (0, 0))
        cache = [(jnp.pad(k, pad), jnp.pad(v, pad)) for k, v in kvs]
        return self.unembed(last), h, cache

    def decode(
        self, tokens: jax.Array, positions: jax.Array, cache: KVCache
    ) -> tuple[jax.Array, KVCache]:
        """One token per row: tokens (B,) at positions (B,) -> logits (B, V), updated cache.

        Each row attends to its cache entries at positions <= its own; entries past it
        (prompt padding, stale tokens) are hidden, so rows may be at different positions.
        """
        s = cache[0][0].shape[2]
        cos, sin = rope_tables(self.inv_freq[...], positions[:, None])
        mask = (jnp.arange(s)[None] <= positions[:, None])[:, None, :]  # (B, 1, S)
        x = self.embed(tokens[:, None])
        new_cache = []
        for layer, kv in zip(self.layers, cache, strict=True):
            x, kv = layer(x, cos.astype(x.dtype), sin.astype(x.dtype), mask, kv, positions)
            new_cache.append(kv)
        return self.unembed(x[:, 0]), new_cache


def init_cache(cfg: ModelConfig, batch: int, length: int) -> KVCache:
    """An empty cache: per layer (k, v), each (batch, kv_heads, length, head_dim)."""
    shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    dt = DTYPES[cfg.dtype]
    return [(jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(cfg.num_layers)]


def sequence_logprobs(
    model: Model,
    tokens: jax.Array,
    attention_mask: jax.Array | None = None,
    temperature: float = 1.0,
) -> jax.Array:
    """Teacher-forced log p(tokens[t] | tokens[:t]) (B, T); column 0 (no context) is 0.

    ``log_softmax(logits / temperature)`` gathered at the next token: what the
    inference server reports for the tokens it sampled.
    """
    logits = model(tokens, attention_mask=attention_mask)[:, :-1] / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


@dataclass(frozen=True)
class ParamInfo:
    """One parameter: its path in the state, shape, dtype and logical axes."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[str, ...]


def param_info(model: Model) -> list[ParamInfo]:
    """Every trainable parameter with its logical axes, in path order."""
    out = []
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            name = ".".join(str(p) for p in path)
            axes = tuple(var.get_metadata().get("out_sharding") or ())
            out.append(ParamInfo(name, tuple(var.shape), str(var.dtype), axes))
    return sorted(out, key=lambda p: p.path)


def get_params(model: Model) -> dict[str, jax.Array]:
    """The trainable parameters by dotted path (``layers.0.mlp.up_proj``)."""
    return {
        ".".join(str(p) for p in path): var.get_value()
        for path, var in nnx.iter_graph(model)
        if isinstance(var, nnx.Param)
    }


def set_params(model: Model, params: dict[str, Any], *, strict: bool = True) -> None:
    """Replace parameters by dotted path, cast to the model's parameter dtype.

    With ``strict``, every parameter must be given and no unknown name may be; a
    shape mismatch always fails, naming the parameter.
    """
    variables = {
        ".".join(str(p) for p in path): var
        for path, var in nnx.iter_graph(model)
        if isinstance(var, nnx.Param)
    }
    unknown = sorted(set(params) - set(variables))
    missing = sorted(set(variables) - set(params))
    if unknown or (strict and missing):
        raise KeyError(f"parameters do not match the model: unknown {unknown}, missing {missing}")
    for name, value in params.items():
        var = variables[name]
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{name}: shape {tuple(value.shape)}, model expects {var.shape}")
        var.set_value(jnp.asarray(value, dtype=var.dtype))


def apply(
    model: Model,
    params: dict[str, Any],
    tokens: jax.Array,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
) -> jax.Array:
    """Logits (B, T, V) of ``model``'s architecture run with ``params`` (by path) as weights.

    A pure function of ``params`` for ``jax.grad`` and ``jax.jit`` over the flat
    parameter dict that checkpoints and optimisers hold; ``model`` only supplies
    the structure and is left untouched.
    """
    graphdef, state = nnx.split(model)
    twin = nnx.merge(graphdef, state, copy=True)
    set_params(twin, params)
    return twin(tokens, positions, attention_mask)
