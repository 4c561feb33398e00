"""The decoder's forward pass as pure functions of the flat parameter dict.

Parameters are those of :class:`learner.model.params.Model` by dotted path; every decoder
block's parameters are stacked along a leading layer axis (``layers.mlp.up_proj``
is (L, E, M)), so the blocks run under one ``lax.scan`` (``scan_layers``: the
program holds one block however deep the model, and compiles in the same time)
or unrolled over slices of the same arrays (the same numbers).

:class:`Options` says how the step runs, not what it computes:

- ``remat``: ``none`` keeps every activation of every block for the backward
  pass; ``full`` wraps each block in ``jax.checkpoint`` with nothing saved (only
  the block's input is kept, the block is recomputed); ``dots_no_batch`` saves
  the outputs of matmuls without batch dimensions (the projections by the
  weights) and recomputes the rest (MaxText's ``minimal`` policy).
- ``attention``: the kernel of the full-sequence path (:mod:`learner.model.attention`);
  the KV-cache decode path always attends densely over its cache.

Segment ids (B, T) say which tokens may see each other: 0 is padding, and a key
is visible to a query when it is not later and has the query's segment (several
trajectories packed in one row never attend across).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from learner.model.attention import attend_masked, attention, resolve
from learner.model.config import ModelConfig

Params = Mapping[str, jax.Array]
KVCache = tuple[jax.Array, jax.Array]  # (k, v), each (L, B, Hkv, S, D)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT = ("none", "full", "dots_no_batch")
LAYERS = "layers."


@dataclass(frozen=True)
class Options:
    """How the forward pass runs (the numbers are the same whichever is chosen)."""

    attention: str = "dense"  # dense | blockwise | cudnn | auto (learner.model.attention.resolve)
    attention_block: int = 0  # 0: sized by the row length (learner.model.attention.block_for)
    remat: Literal["none", "full", "dots_no_batch"] = "none"
    scan_layers: bool | Literal["auto"] = "auto"  # auto: see scans()
    packed: bool = True  # rows may hold several segments (False: one, right-padded)

    def __post_init__(self) -> None:
        if self.remat not in REMAT:
            raise ValueError(f"remat {self.remat!r}: expected one of {', '.join(REMAT)}")

    @classmethod
    def of(cls, learner_cfg: Any) -> Options:
        """The options a ``LearnerConfig`` asks for."""
        return cls(
            attention=learner_cfg.attention,
            attention_block=learner_cfg.attention_block,
            remat=learner_cfg.remat,
            scan_layers=learner_cfg.scan_layers,
            packed=learner_cfg.packing,
        )


DEFAULT_OPTIONS = Options()

# The sharding of the rows of activations (B, ...) while a train step is traced: without
# it XLA may split the residual stream along its width and give every device every row.
_ROWS: contextvars.ContextVar[jax.sharding.Sharding | None] = contextvars.ContextVar(
    "rows_sharding", default=None
)


@contextlib.contextmanager
def rows_sharded(sharding: jax.sharding.Sharding | None) -> Iterator[None]:
    """Within: activations keep their rows split as ``sharding`` says (the batch's)."""
    token = _ROWS.set(sharding)
    try:
        yield
    finally:
        _ROWS.reset(token)


def constrain_rows(x: jax.Array) -> jax.Array:
    sharding = _ROWS.get()
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


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


# ----------------------------------------------------------------------------- one block


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32, scaled by ``weight`` in ``x``'s dtype (as HF)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (..., K) by w (K, ...) -> (..., *w.shape[1:]) as one 2-D matmul over every row.

    XLA:CPU lays the gradient of the 3-D form (``bte,em->btm``) out transposed and fuses
    the elementwise ops before it into that strided copy: a SwiGLU MLP's backward ran
    2.2x slower than with the rows flattened (measured: 267 vs 119 ms at 128 x 192 rows).
    """
    k = x.shape[-1]
    y = x.reshape(-1, k) @ w.reshape(k, -1)
    return y.reshape(*x.shape[:-1], *w.shape[1:])


def _project(cfg: ModelConfig, p: Params, x: jax.Array, name: str) -> jax.Array:
    """x (B, T, E) -> (B, H, T, D) with the bias and the per-head norm, if any."""
    dt = x.dtype
    y = matmul(x, p[f"self_attn.{name}_proj"].astype(dt))  # (B, T, H, D)
    if cfg.qkv_bias:
        y = y + p[f"self_attn.{name}_bias"].astype(dt)
    if cfg.qk_norm and name in ("q", "k"):
        y = rms_norm(y, p[f"self_attn.{name}_norm.weight"], cfg.rms_norm_eps)
    return y.transpose(0, 2, 1, 3)


def qkv(cfg: ModelConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """The block's queries (B, H, T, D), keys and values (B, Hkv, T, D), rotated."""
    h = rms_norm(x, p["input_layernorm.weight"], cfg.rms_norm_eps)
    q = apply_rope(_project(cfg, p, h, "q"), cos, sin)
    k = apply_rope(_project(cfg, p, h, "k"), cos, sin)
    return q, k, _project(cfg, p, h, "v")


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """silu(gate) * up: the MLP's activation, in float32, the result in ``up``'s dtype.

    Written with its own backward pass so that XLA runs each direction as one loop over
    the (rows, M) inputs: autodiff of ``jax.nn.silu(gate) * up`` kept the sigmoid and
    the product as extra residuals and ran the backward as several passes over them.
    """
    g, u = gate.astype(jnp.float32), up.astype(jnp.float32)
    return (g * jax.nn.sigmoid(g) * u).astype(up.dtype)


def _swiglu_fwd(gate: jax.Array, up: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(res: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    gate, up = res
    g, u, dy32 = gate.astype(jnp.float32), up.astype(jnp.float32), dy.astype(jnp.float32)
    s = jax.nn.sigmoid(g)
    d_gate = dy32 * u * s * (1.0 + g * (1.0 - s))  # d silu(g) / dg = s (1 + g (1 - s))
    d_up = dy32 * g * s
    return d_gate.astype(gate.dtype), d_up.astype(up.dtype)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def finish_block(cfg: ModelConfig, p: Params, x: jax.Array, heads: jax.Array) -> jax.Array:
    """The residual stream after the block, from the attention's heads (B, H, T, D)."""
    b, nh, t, d = heads.shape
    flat = heads.transpose(0, 2, 1, 3).reshape(b, t, nh * d)
    y = matmul(flat, p["self_attn.o_proj"].astype(heads.dtype).reshape(nh * d, -1))
    if cfg.o_bias:
        y = y + p["self_attn.o_bias"].astype(y.dtype)
    x = x + y.astype(x.dtype)
    h = rms_norm(x, p["post_attention_layernorm.weight"], cfg.rms_norm_eps)
    dt = h.dtype
    gate = matmul(h, p["mlp.gate_proj"].astype(dt))
    up = matmul(h, p["mlp.up_proj"].astype(dt))
    return x + matmul(swiglu(gate, up), p["mlp.down_proj"].astype(dt))


# ----------------------------------------------------------------------------- the stack


def layer_params(params: Params) -> dict[str, jax.Array]:
    """The stacked block parameters, named without the ``layers.`` prefix: (L, ...) each."""
    return {k[len(LAYERS) :]: v for k, v in params.items() if k.startswith(LAYERS)}


def _policy(remat: str) -> Any:
    if remat == "full":
        return jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable


AUTO_UNROLL_LAYERS = 8


def scans(opts: Options, num_layers: int) -> bool:
    """Whether the blocks run under ``lax.scan``: as ``opts.scan_layers`` says, and for
    ``auto`` unrolled when the model has at most :data:`AUTO_UNROLL_LAYERS` blocks and
    nothing is rematerialised. At that depth the unrolled program compiles in seconds
    and runs faster on XLA:CPU (no stacking of each block's saved activations; the
    GRPO step on Tunix's 4-block example shape 2.40 -> 2.13 s, README "Benchmarks");
    deeper, the scan keeps compile time flat, and with remat XLA:CPU's schedule of the
    unrolled blocks loses remat's saving (README, "Training")."""
    if opts.scan_layers == "auto":
        return num_layers > AUTO_UNROLL_LAYERS or opts.remat != "none"
    return bool(opts.scan_layers)


def run_layers(
    body: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any, opts: Options
) -> tuple[Any, Any]:
    """``lax.scan(body, carry, xs)`` over the layer axis, or the same loop unrolled;
    ``body`` under ``jax.checkpoint`` when ``opts.remat`` asks for it."""
    n = jax.tree.leaves(xs)[0].shape[0]
    scan = scans(opts, n)
    if opts.remat != "none":
        body = jax.checkpoint(body, policy=_policy(opts.remat), prevent_cse=not scan)
    if scan:
        return jax.lax.scan(body, carry, xs)
    ys = []
    for i in range(n):
        carry, y = body(carry, jax.tree.map(lambda a, i=i: a[i], xs))
        ys.append(y)
    return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys) if ys[0] is not None else None


def embed(cfg: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    return jnp.take(params["embed_tokens"], tokens, axis=0).astype(DTYPES[cfg.dtype])


def unembed(cfg: ModelConfig, params: Params, h: jax.Array) -> jax.Array:
    """Final hidden states (..., E) -> float32 logits (..., V)."""
    h = rms_norm(h, params["norm.weight"], cfg.rms_norm_eps)
    if cfg.tie_word_embeddings:
        w = params["embed_tokens"].astype(h.dtype)
        y = jnp.einsum(
            "te,ve->tv", h.reshape(-1, h.shape[-1]), w, preferred_element_type=jnp.float32
        )
    else:
        w = params["lm_head"].astype(h.dtype)
        y = jnp.einsum(
            "te,ev->tv", h.reshape(-1, h.shape[-1]), w, preferred_element_type=jnp.float32
        )
    return y.reshape(*h.shape[:-1], w.shape[0] if cfg.tie_word_embeddings else w.shape[1])


def hidden(
    cfg: ModelConfig,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    opts: Options = DEFAULT_OPTIONS,
    *,
    return_kv: bool = False,
) -> tuple[jax.Array, KVCache | None]:
    """Causal pass over tokens (B, T): pre-norm hidden states (B, T, E), and with
    ``return_kv`` every layer's keys and values (L, B, Hkv, T, D).

    ``segment_ids`` (B, T): 0 = padding, tokens see earlier tokens of their own
    segment only (default: one segment, no padding); ``positions`` default to 0..T-1.
    """
    b, t = tokens.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
    segment_ids = segment_ids.astype(jnp.int32)
    x = constrain_rows(embed(cfg, params, tokens))
    impl = resolve(opts.attention, t, opts.attention_block, packed=opts.packed)
    if impl == "cudnn" and opts.attention == "auto" and x.dtype == jnp.float32:
        impl = "blockwise"  # cuDNN's kernel takes 16-bit inputs only
    cos, sin = rope_tables(jnp.asarray(rope_inv_freq(cfg)), positions)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)

    def body(x, p):
        x = constrain_rows(x)
        q, k, v = qkv(cfg, p, x, cos, sin)
        heads = attention(
            q, k, v, segment_ids, impl=impl, block=opts.attention_block, packed=opts.packed
        )
        return constrain_rows(finish_block(cfg, p, x, heads)), ((k, v) if return_kv else None)

    x, kv = run_layers(body, x, layer_params(params), opts)
    return constrain_rows(x), kv


def prefill(
    cfg: ModelConfig,
    params: Params,
    tokens: jax.Array,
    lengths: jax.Array,
    cache_len: int,
    opts: Options = DEFAULT_OPTIONS,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Right-padded prompts (B, P) of ``lengths`` (B,) -> (logits at each row's last prompt
    token (B, V), final hidden states (B, P, E), a cache of length ``cache_len`` >= P)."""
    p = tokens.shape[1]
    valid = (jnp.arange(p)[None] < lengths[:, None]).astype(jnp.int32)
    h, (k, v) = hidden(cfg, params, tokens, segment_ids=valid, opts=opts, return_kv=True)
    last = jnp.take_along_axis(h, (lengths - 1)[:, None, None], axis=1)[:, 0]
    pad = ((0, 0), (0, 0), (0, 0), (0, cache_len - p), (0, 0))
    return unembed(cfg, params, last), h, (jnp.pad(k, pad), jnp.pad(v, pad))


def decode(
    cfg: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array, cache: KVCache
) -> tuple[jax.Array, KVCache]:
    """One token per row: tokens (B,) at positions (B,) -> logits (B, V), updated cache.

    Each row attends to its cache entries at positions <= its own; entries past it
    (prompt padding, stale tokens) are hidden, so rows may be at different positions.
    The whole cache rides in the scan's carry and each layer writes its new key and
    value into it in place (a cache per layer as the scan's output would be copied
    whole at every token).
    """
    s = cache[0].shape[3]
    cos, sin = rope_tables(jnp.asarray(rope_inv_freq(cfg)), positions[:, None])
    mask = (jnp.arange(s)[None] <= positions[:, None])[:, None, :]  # (B, 1, S): visible
    x = embed(cfg, params, tokens[:, None])
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    rows = jnp.arange(tokens.shape[0])

    def body(carry, layer):
        x, k_cache, v_cache = carry
        p, i = layer
        q, k, v = qkv(cfg, p, x, cos, sin)
        k_cache = k_cache.at[i, rows, :, positions].set(
            k[:, :, 0].astype(k_cache.dtype), mode="drop"
        )
        v_cache = v_cache.at[i, rows, :, positions].set(
            v[:, :, 0].astype(v_cache.dtype), mode="drop"
        )
        heads = attend_masked(q, k_cache[i], v_cache[i], mask)
        return (finish_block(cfg, p, x, heads), k_cache, v_cache), None

    layers = (layer_params(params), jnp.arange(cfg.num_layers))
    (x, *new_cache), _ = run_layers(body, (x, *cache), layers, DEFAULT_OPTIONS)
    return unembed(cfg, params, x[:, 0]), tuple(new_cache)
