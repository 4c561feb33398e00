"""Prefill on top of a cached prefix: only each row's new tokens go through the model.

Pure functions of the flat parameter dict (:mod:`learner.model.decoder`'s pieces), for the
engine's jitted "extend" program. Row i's cache already holds the keys and values
of its first ``starts[i]`` tokens; its ``lengths[i]`` new tokens (right-padded to a
bucket) sit at positions ``starts[i]..``, write their keys and values into the cache
there, and attend to every cache entry at or before their own position. Padding
tokens write past the row's end (hidden from every later query until a decode step
overwrites them) or past the cache (dropped).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from learner.model import decoder
from learner.model.config import ModelConfig
from learner.model.decoder import DEFAULT_OPTIONS, KVCache, Params


def gather(pool: KVCache, slots_bc: jax.Array) -> KVCache:
    """A batch cache (L, B, Hkv, C, D) from pool slots (B, C) of a pool (L, Hkv, P, D)."""
    return tuple(p[:, :, slots_bc].transpose(0, 2, 1, 3, 4) for p in pool)


def store(pool: KVCache, cache: KVCache, rows: jax.Array, pos: jax.Array, slots: jax.Array):
    """Write only the listed cache entries into the pool: entry n is row ``rows[n]``,
    position ``pos[n]`` of the batch cache, going to pool slot ``slots[n]`` (>= P: skipped,
    how padding entries are written). Cost in the entries written, not the cache length."""
    out = []
    for p, c in zip(pool, cache, strict=True):
        vals = c[:, rows, :, jnp.minimum(pos, c.shape[3] - 1)]  # (N, L, Hkv, D)
        out.append(p.at[:, :, slots].set(vals.transpose(1, 2, 0, 3).astype(p.dtype), mode="drop"))
    return tuple(out)


_MASKED = -1e30


def key_block(length: int, cap: int) -> int:
    """The key tile of the blocked attention over a cache of ``length``: the largest power
    of two <= ``cap`` dividing it (cache buckets are powers of two, but a ``max_len`` that
    is not one makes the top bucket's tiles small: correct, slower)."""
    return min(cap, length & -length)


def _scores(q_bkgsd: jax.Array, k_bkcd: jax.Array) -> jax.Array:
    """Float32 scores (B, Hkv, G, S, c) of the queries against a key tile.

    One query per row (S = 1, a decode step) takes products summed over D instead of the
    einsum: there the einsum is a batch of matrix-vector products (B x Hkv of them, G rows
    each) that XLA:CPU ran at ~2 GB/s of cache read (4 ms a layer at 128 rows and a
    256-entry cache). Measured on the peer comparison's generation (128 rows, 64 + 128
    tokens, 2 cores, the two engines interleaved in one process, median of 5): 5.05 s with
    the einsums, 4.58 s. (The key tile is still copied out of the stacked cache.)"""
    if q_bkgsd.shape[3] == 1:
        f32 = jnp.float32
        return (q_bkgsd.astype(f32)[:, :, :, :, None] * k_bkcd.astype(f32)[:, :, None, None]).sum(
            -1
        )
    return jnp.einsum("bkgqd,bkcd->bkgqc", q_bkgsd, k_bkcd, preferred_element_type=jnp.float32)


def _weighted(p_bkgsc: jax.Array, v_bkcd: jax.Array) -> jax.Array:
    """Float32 weighted values (B, Hkv, G, S, D); S = 1 as products summed over the keys
    (see :func:`_scores`). The weights are rounded to the values' dtype either way."""
    p = p_bkgsc.astype(v_bkcd.dtype)
    if p.shape[3] == 1:
        f32 = jnp.float32
        return (p.astype(f32)[..., None] * v_bkcd.astype(f32)[:, :, None, None]).sum(-2)
    return jnp.einsum("bkgqc,bkcd->bkgqd", p, v_bkcd, preferred_element_type=jnp.float32)


def attend_cache(
    q_bhsd: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: jax.Array,
    q_pos_bs: jax.Array,
    block: int,
) -> jax.Array:
    """q (B, H, S, D) at positions (B, S) over layer ``layer`` of a stacked cache
    (L, B, Hkv, C, D): key c is visible to a query at position p iff c <= p.

    Online softmax (float32) over ``block``-key tiles, looping only over the tiles up to
    the furthest query position (a dynamic trip count): the cost follows the context in
    use, not the cache's length. The same function as ``attend_masked`` over the cache,
    up to float rounding. A query seeing no key gets 0."""
    b, h, s, d = q_bhsd.shape
    hkv, c = k_cache.shape[2], k_cache.shape[3]
    q = q_bhsd.reshape(b, hkv, h // hkv, s, d)
    n_keys = jnp.minimum(jnp.max(q_pos_bs) + 1, c)
    n_blocks = (n_keys + block - 1) // block
    sqrt_d = math.sqrt(d)

    def tile(x, j):
        start = (layer, 0, 0, j * block, 0)
        return lax.dynamic_slice(x, start, (1, b, hkv, block, d))[0]

    def step(j, carry):
        m, denom, acc = carry
        k, v = tile(k_cache, j), tile(v_cache, j)
        sc = _scores(q, k)
        vis = (j * block + jnp.arange(block))[None, None] <= q_pos_bs[:, :, None]  # (B, S, c)
        vis = vis[:, None, None]
        sc = jnp.where(vis, sc / sqrt_d, _MASKED)
        m_new = jnp.maximum(m, sc.max(-1))
        p = jnp.where(vis, jnp.exp(sc - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = _weighted(p, v)
        return m_new, alpha * denom + p.sum(-1), alpha[..., None] * acc + pv

    g = h // hkv
    init = (
        jnp.full((b, hkv, g, s), _MASKED, jnp.float32),
        jnp.zeros((b, hkv, g, s), jnp.float32),
        jnp.zeros((b, hkv, g, s, d), jnp.float32),
    )
    _, denom, acc = lax.fori_loop(0, n_blocks, step, init)
    seen = denom > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, denom, 1.0)[..., None], 0.0)
    return out.reshape(b, h, s, d).astype(q_bhsd.dtype)


def decode(
    cfg: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array, cache: KVCache
) -> tuple[jax.Array, KVCache]:
    """``learner.model.decoder.decode`` (one token per row at its own position) with the
    blocked attention: :func:`extend` of one new token per row, with decode's key tile."""
    ones = jnp.ones_like(positions)
    block = decode_block(cache[0].shape[3])
    return extend(cfg, params, tokens[:, None], positions, ones, cache, block)


def decode_block(cache_len: int) -> int:
    """The key tile cap of a decode step: a quarter of the cache, within [64, 1024].

    One query per row reads its whole tile, so the tile loop's trip count (up to the
    furthest position in use) is what saves reading the cache's unused end; a quarter
    lets a batch whose contexts fill part of their cache bucket skip the rest. Measured on
    the peer comparison's generation (128 rows, 64 prompt + 128 new tokens, cache 256,
    2 cores): a tile of 256 (the cap of 1024 before) 1.70-1.74 s, 128: 1.50-1.52 s,
    64: 1.43-1.44 s; with 1,500-token prompts (cache 2048, 16 rows, prefill included)
    tiles of 1024 down to 64 all took 1.85-1.97 s."""
    return max(DECODE_BLOCK_MIN, min(DECODE_BLOCK, cache_len // 4))


DECODE_BLOCK = 1024  # largest key tile of a decode step (one query per row: few trips)
DECODE_BLOCK_MIN = 64
EXTEND_BLOCK = 256  # key tile of the extend pass (S queries x tile scores per trip)


def extend(
    cfg: ModelConfig,
    params: Params,
    tokens: jax.Array,
    starts: jax.Array,
    lengths: jax.Array,
    cache: KVCache,
    block_cap: int = EXTEND_BLOCK,
) -> tuple[jax.Array, KVCache]:
    """New tokens (B, S) after ``starts`` (B,) cached ones -> (logits at each row's last
    new token (B, V), the cache with the new tokens' keys and values)."""
    b, s = tokens.shape
    block = key_block(cache[0].shape[3], block_cap)
    pos_bs = starts[:, None] + jnp.arange(s)[None]
    cos, sin = decoder.rope_tables(jnp.asarray(decoder.rope_inv_freq(cfg)), pos_bs)
    x = decoder.embed(cfg, params, tokens)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    rows = jnp.arange(b)[:, None]

    def body(carry, layer):
        x, k_cache, v_cache = carry
        p, i = layer
        q, k, v = decoder.qkv(cfg, p, x, cos, sin)  # k, v: (B, Hkv, S, D)
        k_cache = k_cache.at[i, rows, :, pos_bs].set(
            k.transpose(0, 2, 1, 3).astype(k_cache.dtype), mode="drop"
        )
        v_cache = v_cache.at[i, rows, :, pos_bs].set(
            v.transpose(0, 2, 1, 3).astype(v_cache.dtype), mode="drop"
        )
        heads = attend_cache(q, k_cache, v_cache, i, pos_bs, block)
        return (decoder.finish_block(cfg, p, x, heads), k_cache, v_cache), None

    layers = (decoder.layer_params(params), jnp.arange(cfg.num_layers))
    (x, *new_cache), _ = decoder.run_layers(body, (x, *cache), layers, DEFAULT_OPTIONS)
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]
    return decoder.unembed(cfg, params, last), tuple(new_cache)
