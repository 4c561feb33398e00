"""Causal self-attention over packed, padded rows: a dense reference, a blockwise kernel, cuDNN.

Every implementation computes the same function (:func:`attention`): causal attention
restricted to each token's own segment (trajectory), grouped-query heads, scores and
softmax in float32 whatever the input dtype (as ``transformers`` does), and 0 for a query
that sees no key (a padding position). They differ only in cost:

* ``dense``: materialises (B, Hkv, G, T, T) float32 scores; the reference, and the fastest
  choice for short rows.
* ``blockwise``: FlashAttention-2 in plain JAX (online softmax over ``block``-token key
  blocks, a ``jax.custom_vjp`` whose backward recomputes the probabilities block by block).
  Runs on every backend; saves only q, k, v, the segment ids, the output and the per-row
  log-sum-exp, so memory is O(T * D + block^2) per (batch, head), never T x T. Key blocks
  wholly in a query block's future are skipped.
* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` on NVIDIA GPUs
  (float16 / bfloat16 inputs only). Rows of one right-padded segment (``packed=False``)
  pass their lengths (no mask); packed rows pass the segment mask, which becomes a
  (B, 1, T, T) bias: T x T memory, so ``auto`` takes ``blockwise`` for packed rows.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["IMPLS", "attend_masked", "attention", "block_for", "resolve"]

IMPLS = ("auto", "dense", "blockwise", "cudnn")
# Masked scores. Finite so that no max/subtract ever meets inf - inf; exp(_MASKED - x)
# underflows to exactly 0 for any real score x.
_MASKED = -1e30
_F32 = jnp.float32


DENSE_UP_TO = 64  # auto: rows this short take the dense kernel


def block_for(length: int, block: int = 0) -> int:
    """The blockwise tile for rows of ``length`` tokens: ``block`` when given (> 0), else
    sized by the length, a power of two near length / 6 within [32, 256]. Measured on
    CPU (fwd + bwd, 2 cores): at 192 tokens a tile of 32 takes 75 ms, 64: 114, 128: 224,
    dense 163; at 4,096 tokens 256 takes 830 ms, 128: 1,053, 512: 1,561, dense 3,395."""
    if block > 0:
        return block
    target = max(length // 6, 1)
    return int(min(256, max(32, 1 << (target.bit_length() - 1))))


def resolve(
    impl: str, length: int, block: int = 0, backend: str | None = None, *, packed: bool = False
) -> str:
    """The implementation ``impl`` names for rows of ``length`` tokens.

    ``auto`` picks ``cudnn`` on a GPU backend (``jax.default_backend()`` unless ``backend``
    is given) for unpacked rows, else ``blockwise`` above :data:`DENSE_UP_TO` tokens (it
    is faster than dense from there on CPU, and never holds the T x T scores), else
    ``dense``. Other names come back unchanged once known to be valid.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; allowed: {', '.join(IMPLS)}")
    if impl != "auto":
        return impl
    if (jax.default_backend() if backend is None else backend) == "gpu" and not packed:
        return "cudnn"
    return "blockwise" if length > DENSE_UP_TO else "dense"


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array,
    *,
    impl: str = "dense",
    block: int = 0,
    packed: bool = True,
) -> jax.Array:
    """Causal, segment-restricted, grouped-query self-attention.

    q (B, H, T, D); k, v (B, Hkv, T, D) with H a multiple of Hkv: query head h reads kv
    head h // (H // Hkv). ``segment_ids`` (B, T) int: 0 = padding, 1, 2, ... = the
    trajectory a token belongs to (several may be packed in a row, each contiguous). Key j
    is visible to query i iff j <= i and segment_ids[i] == segment_ids[j] != 0.

    Returns (B, H, T, D) in q.dtype; a query with no visible key gets 0. ``impl`` is one of
    :data:`IMPLS` (see :func:`resolve`) or ``xla``: the ``cudnn`` wrapper with XLA's
    reference kernel, so the wrapper can be tested off-GPU. ``block`` is the blockwise tile
    (query and key) in tokens, capped at T; the ``auto`` threshold too. ``packed=False``
    promises one segment per row, starting at column 0 (right padding only): the cuDNN
    path then passes the rows' lengths instead of a T x T mask.
    """
    _check_shapes(q, k, v, segment_ids, block)
    name = "xla" if impl == "xla" else resolve(impl, q.shape[2], block, packed=packed)
    if name == "dense":
        return _dense(q, k, v, segment_ids)
    if name == "blockwise":
        return _blockwise(q, k, v, segment_ids, block_for(q.shape[2], block))
    return _dot_product(q, k, v, segment_ids, name, packed)


def _check_shapes(
    q_bhtd: jax.Array, k_bktd: jax.Array, v_bktd: jax.Array, seg_bt: jax.Array, block: int
) -> None:
    """Raise ValueError on inconsistent shapes or a non-positive block."""
    b, h, t, d = q_bhtd.shape
    if k_bktd.ndim != 4 or k_bktd.shape != v_bktd.shape:
        raise ValueError(f"k {k_bktd.shape} and v {v_bktd.shape} must be equal (B, Hkv, T, D)")
    if (k_bktd.shape[0], k_bktd.shape[2], k_bktd.shape[3]) != (b, t, d):
        raise ValueError(f"k/v {k_bktd.shape} do not match q {q_bhtd.shape}")
    if h % k_bktd.shape[1]:
        raise ValueError(f"{h} query heads are not a multiple of {k_bktd.shape[1]} kv heads")
    if seg_bt.shape != (b, t):
        raise ValueError(f"segment_ids {seg_bt.shape} must be (B, T) = {(b, t)}")
    if block < 0:
        raise ValueError(f"block must be positive (or 0: sized by the length), got {block}")


def _visible(seg_q_bq: jax.Array, seg_k_bc: jax.Array, pos_q: jax.Array, pos_k: jax.Array):
    """(B, Tq, Tk) bool: key c visible to query q (causal, same non-zero segment)."""
    same = (seg_q_bq[:, :, None] == seg_k_bc[:, None, :]) & (seg_q_bq[:, :, None] != 0)
    return same & (pos_k[None, None, :] <= pos_q[None, :, None])


def _zero_padding(o_bhtd: jax.Array, seg_bt: jax.Array) -> jax.Array:
    """Zero the padding queries: exactly those with no visible key (others see themselves)."""
    return jnp.where((seg_bt != 0)[:, None, :, None], o_bhtd, 0)


def _mm(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """einsum in the inputs' dtype, accumulated in float32."""
    return jnp.einsum(spec, x, y, preferred_element_type=_F32)


# ----------------------------------------------------------------------------- dense


def attend_masked(
    q_bhtd: jax.Array, k_bkcd: jax.Array, v_bkcd: jax.Array, vis_bqc: jax.Array
) -> jax.Array:
    """q (B, H, T, D) over the keys and values (B, Hkv, S, D) that ``vis_bqc`` (B, T, S)
    marks visible: full float32 scores and a masked softmax -> (B, H, T, D) in q's dtype.
    Also the KV-cache decode step's attention (``learner.model.decoder.decode``)."""
    b, h, t, d = q_bhtd.shape
    q_bkgtd = q_bhtd.reshape(b, k_bkcd.shape[1], -1, t, d)
    s_bkgqc = _mm("bkgqd,bkcd->bkgqc", q_bkgtd, k_bkcd)
    s_bkgqc = jnp.where(vis_bqc[:, None, None], s_bkgqc / math.sqrt(d), _MASKED)
    p_bkgqc = jax.nn.softmax(s_bkgqc, axis=-1)
    o_bkgqd = _mm("bkgqc,bkcd->bkgqd", p_bkgqc.astype(v_bkcd.dtype), v_bkcd)
    return o_bkgqd.reshape(b, h, t, d).astype(q_bhtd.dtype)


def _dense(q_bhtd: jax.Array, k_bktd: jax.Array, v_bktd: jax.Array, seg_bt: jax.Array):
    """The reference: full float32 scores, masked softmax, padding rows zeroed."""
    pos = jnp.arange(q_bhtd.shape[2])
    out = attend_masked(q_bhtd, k_bktd, v_bktd, _visible(seg_bt, seg_bt, pos, pos))
    return _zero_padding(out, seg_bt)


# ----------------------------------------------------------------------------- cuDNN / XLA


def _dot_product(
    q_bhtd: jax.Array,
    k_bktd: jax.Array,
    v_bktd: jax.Array,
    seg_bt: jax.Array,
    name: str,
    packed: bool = True,
):
    """``jax.nn.dot_product_attention`` in its (B, T, N, D) layout; GQA is handled there.
    Unpacked rows pass their lengths; packed ones a (B, 1, T, T) segment mask."""
    kw = {}
    if packed:
        same = (seg_bt[:, :, None] == seg_bt[:, None, :]) & (seg_bt[:, :, None] != 0)
        kw["mask"] = same[:, None]
    else:
        lengths_b = (seg_bt != 0).sum(axis=1).astype(jnp.int32)
        kw.update(query_seq_lengths=lengths_b, key_value_seq_lengths=lengths_b)
    o_bthd = jax.nn.dot_product_attention(
        q_bhtd.transpose(0, 2, 1, 3),
        k_bktd.transpose(0, 2, 1, 3),
        v_bktd.transpose(0, 2, 1, 3),
        is_causal=True,
        implementation="cudnn" if name == "cudnn" else "xla",
        **kw,
    )
    return _zero_padding(o_bthd.transpose(0, 2, 1, 3), seg_bt).astype(q_bhtd.dtype)


# ----------------------------------------------------------------------------- blockwise


def _blockwise(
    q_bhtd: jax.Array, k_bktd: jax.Array, v_bktd: jax.Array, seg_bt: jax.Array, block: int
):
    """Pad T up to a multiple of the block (segment 0), run the kernel, cut the padding off."""
    b, h, t, d = q_bhtd.shape
    block = min(block, t)
    pad = -t % block
    q_bkgtd = jnp.pad(
        q_bhtd.reshape(b, k_bktd.shape[1], -1, t, d), [(0, 0)] * 3 + [(0, pad)] + [(0, 0)]
    )
    k_bktd, v_bktd = (jnp.pad(x, [(0, 0), (0, 0), (0, pad), (0, 0)]) for x in (k_bktd, v_bktd))
    seg_bt = jnp.pad(seg_bt, [(0, 0), (0, pad)])
    o_bkgtd = _flash(q_bkgtd, k_bktd, v_bktd, seg_bt, block)
    return o_bkgtd[:, :, :, :t].reshape(b, h, t, d)


def _tile(x: jax.Array, i: jax.Array, block: int, axis: int) -> jax.Array:
    """Block ``i`` (``block`` tokens) of ``x`` along its time ``axis``."""
    return lax.dynamic_slice_in_dim(x, i * block, block, axis=axis)


def _tile_scores(q_bkgqd, k_bkcd, seg_bt, i, j, block):
    """Scaled float32 scores of query block i against key block j, masked; and the mask."""
    s_bkgqc = _mm("bkgqd,bkcd->bkgqc", q_bkgqd, k_bkcd)
    pos = jnp.arange(block)
    seg_q, seg_k = _tile(seg_bt, i, block, 1), _tile(seg_bt, j, block, 1)
    vis_b11qc = _visible(seg_q, seg_k, i * block + pos, j * block + pos)[:, None, None]
    scale = 1.0 / math.sqrt(q_bkgqd.shape[-1])
    return jnp.where(vis_b11qc, s_bkgqc * scale, _MASKED), vis_b11qc


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q_bkgtd, k_bktd, v_bktd, seg_bt, block: int) -> jax.Array:
    """Blockwise attention on padded inputs (T a multiple of block); (B, Hkv, G, T, D)."""
    return _flash_forward(q_bkgtd, k_bktd, v_bktd, seg_bt, block)[0]


def _flash_forward(q_bkgtd, k_bktd, v_bktd, seg_bt, block: int):
    """(output (B, Hkv, G, T, D) in q's dtype, log-sum-exp (B, Hkv, G, T) float32)."""
    b, hkv, g, t, d = q_bkgtd.shape

    def query_block(i):
        q_bkgqd = _tile(q_bkgtd, i, block, 3)

        def key_step(j, carry):  # online softmax: running max, normaliser, weighted sum
            m_bkgq, l_bkgq, acc_bkgqd = carry  # (B, Hkv, G, bq), (B, Hkv, G, bq), (.., D)
            s_bkgqc, vis = _tile_scores(q_bkgqd, _tile(k_bktd, j, block, 2), seg_bt, i, j, block)
            m_new = jnp.maximum(m_bkgq, s_bkgqc.max(-1))
            p_bkgqc = jnp.where(vis, jnp.exp(s_bkgqc - m_new[..., None]), 0.0)
            alpha = jnp.exp(m_bkgq - m_new)
            pv = _mm("bkgqc,bkcd->bkgqd", p_bkgqc.astype(v_bktd.dtype), _tile(v_bktd, j, block, 2))
            return m_new, alpha * l_bkgq + p_bkgqc.sum(-1), alpha[..., None] * acc_bkgqd + pv

        init = (
            jnp.full((b, hkv, g, block), _MASKED, _F32),
            jnp.zeros((b, hkv, g, block), _F32),
            jnp.zeros((b, hkv, g, block, d), _F32),
        )
        # Key blocks after i lie wholly in the future of query block i: never visited.
        m_bkgq, l_bkgq, acc_bkgqd = lax.fori_loop(0, i + 1, key_step, init)
        seen = l_bkgq > 0  # False exactly for queries with no visible key
        l_safe = jnp.where(seen, l_bkgq, 1.0)
        o_bkgqd = jnp.where(seen[..., None], acc_bkgqd / l_safe[..., None], 0.0)
        return o_bkgqd.astype(q_bkgtd.dtype), jnp.where(seen, m_bkgq + jnp.log(l_safe), 0.0)

    o_nbkgqd, lse_nbkgq = lax.map(query_block, jnp.arange(t // block))
    o_bkgtd = jnp.moveaxis(o_nbkgqd, 0, 3).reshape(b, hkv, g, t, d)
    return o_bkgtd, jnp.moveaxis(lse_nbkgq, 0, 3).reshape(b, hkv, g, t)


def _flash_fwd(q_bkgtd, k_bktd, v_bktd, seg_bt, block: int):
    """Forward that keeps O(T * D) residuals: inputs, output and log-sum-exp."""
    o_bkgtd, lse_bkgt = _flash_forward(q_bkgtd, k_bktd, v_bktd, seg_bt, block)
    return o_bkgtd, (q_bkgtd, k_bktd, v_bktd, seg_bt, o_bkgtd, lse_bkgt)


def _flash_bwd(block: int, residuals, do_bkgtd):
    """FlashAttention-2 backward: per key block, recompute p over the query blocks at or after it.

    dK, dV accumulate in the loop carry for one key block; dQ accumulates in a
    (B, Hkv, G, T, D) float32 buffer updated in place. O(T * D + block^2) memory.
    """
    q_bkgtd, k_bktd, v_bktd, seg_bt, o_bkgtd, lse_bkgt = residuals
    b, hkv, _, t, d = q_bkgtd.shape
    delta_bkgt = jnp.sum(do_bkgtd.astype(_F32) * o_bkgtd.astype(_F32), axis=-1)

    def key_block(dq_bkgtd, j):
        k_bkcd, v_bkcd = _tile(k_bktd, j, block, 2), _tile(v_bktd, j, block, 2)

        def query_step(i, carry):
            dq_bkgtd, dk_bkcd, dv_bkcd = carry
            tiles = (q_bkgtd, do_bkgtd, lse_bkgt, delta_bkgt)
            dq_bkgqd, dk, dv = _backward_tile(
                *(_tile(x, i, block, 3) for x in tiles), k_bkcd, v_bkcd, seg_bt, i, j, block
            )
            dq_bkgqd += _tile(dq_bkgtd, i, block, 3)
            dq_bkgtd = lax.dynamic_update_slice_in_dim(dq_bkgtd, dq_bkgqd, i * block, axis=3)
            return dq_bkgtd, dk_bkcd + dk, dv_bkcd + dv

        zeros_bkcd = jnp.zeros((b, hkv, block, d), _F32)
        # Query blocks before j see none of key block j (all of it is in their future).
        dq_bkgtd, dk_bkcd, dv_bkcd = lax.fori_loop(
            j, t // block, query_step, (dq_bkgtd, zeros_bkcd, zeros_bkcd)
        )
        return dq_bkgtd, (dk_bkcd, dv_bkcd)

    dq_bkgtd, dkv = lax.scan(key_block, jnp.zeros(q_bkgtd.shape, _F32), jnp.arange(t // block))
    dk_bktd, dv_bktd = (jnp.moveaxis(x, 0, 2).reshape(b, hkv, t, d) for x in dkv)
    grads = zip((dq_bkgtd, dk_bktd, dv_bktd), (q_bkgtd, k_bktd, v_bktd), strict=True)
    return (*(g.astype(x.dtype) for g, x in grads), None)  # None: segment ids are integers


def _backward_tile(q_bkgqd, do_bkgqd, lse_bkgq, delta_bkgq, k_bkcd, v_bkcd, seg_bt, i, j, block):
    """Float32 (dQ, dK, dV) contributions of query block i x key block j.

    p = exp(s - lse); dV = p^T dO; dS = p * (dO V^T - rowsum(dO * O)); dQ = dS K / sqrt(D);
    dK = dS^T Q / sqrt(D). The einsums over the group axis g sum dK, dV over the query
    heads that share a kv head.
    """
    s_bkgqc, vis = _tile_scores(q_bkgqd, k_bkcd, seg_bt, i, j, block)
    p_bkgqc = jnp.where(vis, jnp.exp(s_bkgqc - lse_bkgq[..., None]), 0.0)
    dv_bkcd = _mm("bkgqc,bkgqd->bkcd", p_bkgqc.astype(do_bkgqd.dtype), do_bkgqd)
    dp_bkgqc = _mm("bkgqd,bkcd->bkgqc", do_bkgqd, v_bkcd)
    ds_bkgqc = p_bkgqc * (dp_bkgqc - delta_bkgq[..., None]) / math.sqrt(q_bkgqd.shape[-1])
    dq_bkgqd = _mm("bkgqc,bkcd->bkgqd", ds_bkgqc.astype(k_bkcd.dtype), k_bkcd)
    dk_bkcd = _mm("bkgqc,bkgqd->bkcd", ds_bkgqc.astype(q_bkgqd.dtype), q_bkgqd)
    return dq_bkgqd, dk_bkcd, dv_bkcd


_flash.defvjp(_flash_fwd, _flash_bwd)
