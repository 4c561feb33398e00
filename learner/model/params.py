"""A Llama / Qwen2 / Qwen3-family decoder's parameters in Flax NNX.

RMSNorm, rotary position embeddings (``rope_theta`` and the ``linear`` and
``llama3`` scalings), grouped-query attention, a SwiGLU MLP, optional q/k/v (and
o) biases, optional per-head q/k norms (Qwen3) and tied or untied embeddings:
the architecture of Hugging Face's ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM``, built from their ``config.json``
(:meth:`ModelConfig.from_hf_config`) so ``learner.model.hf`` can load and export their
safetensors. Every parameter carries logical axis names (``out_sharding``
metadata, e.g. ``("layers", "embed", "mlp")``) that ``learner.training.sharding`` maps to
the mesh. The decoder blocks' parameters are stacked along a leading ``layers``
axis (``layers.mlp.up_proj`` is (L, E, M)) so the blocks run under one scan.

The computation lives in :mod:`learner.model.decoder` (pure functions of the flat
parameter dict); :class:`Model`'s methods call it with the model's own
parameters. Numerics follow ``transformers``: norms and softmax in float32,
parameters cast to the compute dtype at use, logits in float32. The KV cache is
``(k, v)``, each laid out ``[layers, batch, kv_heads, length, head_dim]`` (4.4x
faster decode than length-major on CPU) with static shapes:
:meth:`Model.prefill` fills it from padded prompts, :meth:`Model.decode` appends
one token per row at that row's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model import decoder
from learner.model.config import ModelConfig, RopeScaling, tiny_config
from learner.model.decoder import DEFAULT_OPTIONS, Options

__all__ = [
    "KVCache",
    "Model",
    "ModelConfig",
    "Options",
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

DTYPES = decoder.DTYPES
KVCache = decoder.KVCache  # (k, v), each (L, B, Hkv, S, D)
rope_inv_freq = decoder.rope_inv_freq


def _param(
    rngs: nnx.Rngs,
    shape: tuple[int, ...],
    axes: tuple[str, ...],
    cfg: ModelConfig,
    init: Literal["normal", "zeros", "ones"] = "normal",
    *,
    stacked: bool = True,
) -> nnx.Param:
    """A parameter with logical axis names; no eager placement (``learner.training.sharding`` places).
    A block's parameter (``stacked``) gets a leading ``layers`` axis of num_layers."""
    if stacked:
        shape, axes = (cfg.num_layers, *shape), ("layers", *axes)
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


# ----------------------------------------------------------------------------- parameters


class RMSNorm(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, *, width: int | None = None, stacked=True):
        axes = ("head_dim",) if width is not None else ("norm",)
        width = width if width is not None else cfg.hidden_size
        self.weight = _param(rngs, (width,), axes, cfg, "ones", stacked=stacked)


class Attention(nnx.Module):
    """Grouped-query attention's weights; q/k/v kernels are (layers, embed, heads, head_dim)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        e, h, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
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
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's q and k
            self.q_norm = RMSNorm(cfg, rngs, width=d)
            self.k_norm = RMSNorm(cfg, rngs, width=d)


class MLP(nnx.Module):
    """SwiGLU's weights: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        e, m = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(rngs, (e, m), ("embed", "mlp"), cfg)
        self.up_proj = _param(rngs, (e, m), ("embed", "mlp"), cfg)
        self.down_proj = _param(rngs, (m, e), ("mlp", "embed"), cfg)


class Blocks(nnx.Module):
    """Every decoder block's weights, stacked along a leading layer axis."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg, rngs)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)


# ----------------------------------------------------------------------------- the model


class Model(nnx.Module):
    """The decoder's parameters; ``model(tokens)`` -> float32 logits (B, T, V).

    The computation is :mod:`learner.model.decoder`'s, over :func:`get_params`.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = _param(
            rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg, stacked=False
        )
        self.layers = Blocks(cfg, rngs)
        self.norm = RMSNorm(cfg, rngs, stacked=False)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(
                rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg, stacked=False
            )

    @property
    def dtype(self) -> Any:
        return DTYPES[self.cfg.dtype]

    def embed(self, tokens: jax.Array) -> jax.Array:
        return decoder.embed(self.cfg, get_params(self), tokens)

    def unembed(self, h: jax.Array) -> jax.Array:
        """Final hidden states (..., E) -> float32 logits (..., V)."""
        return decoder.unembed(self.cfg, get_params(self), h)

    def hidden(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        opts: Options = DEFAULT_OPTIONS,
    ) -> tuple[jax.Array, KVCache | None]:
        """Causal pass over tokens (B, T): pre-norm hidden states (B, T, E) and every
        layer's k, v. ``attention_mask`` (B, T), 1 = real token (or segment ids)."""
        return decoder.hidden(
            self.cfg, get_params(self), tokens, positions, attention_mask, opts, return_kv=True
        )

    def __call__(self, tokens, positions=None, attention_mask=None) -> jax.Array:
        return apply(self, get_params(self), tokens, positions, attention_mask)

    def prefill(
        self, tokens: jax.Array, lengths: jax.Array, cache_len: int
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """Right-padded prompts (B, P) of ``lengths`` (B,) -> (logits at each row's last prompt
        token (B, V), final hidden states (B, P, E), a cache of length ``cache_len`` >= P)."""
        return decoder.prefill(self.cfg, get_params(self), tokens, lengths, cache_len)

    def decode(
        self, tokens: jax.Array, positions: jax.Array, cache: KVCache
    ) -> tuple[jax.Array, KVCache]:
        """One token per row: tokens (B,) at positions (B,) -> logits (B, V), updated cache."""
        return decoder.decode(self.cfg, get_params(self), tokens, positions, cache)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> KVCache:
    """An empty cache: (k, v), each (layers, batch, kv_heads, length, head_dim)."""
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    dt = DTYPES[cfg.dtype]
    return jnp.zeros(shape, dt), jnp.zeros(shape, dt)


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
    opts: Options = DEFAULT_OPTIONS,
) -> jax.Array:
    """Logits (B, T, V) of ``model``'s architecture run with ``params`` (by path) as weights.

    A pure function of ``params`` for ``jax.grad`` and ``jax.jit`` over the flat
    parameter dict that checkpoints and optimisers hold; ``model`` only supplies
    the architecture. ``attention_mask`` (B, T): 1 = real token, or segment ids.
    """
    h, _ = decoder.hidden(model.cfg, params, tokens, positions, attention_mask, opts)
    return decoder.unembed(model.cfg, params, h)
