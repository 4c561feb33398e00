"""Token logprobs and entropy from final hidden states, chunked along the sequence.

The dense computation (logits (B, T, V) -> log_softmax -> gather) holds several
float32 (B, T, V) arrays for the backward pass: at a 152k vocabulary and 32k
tokens, tens of GB per sequence. :func:`chunked_token_logprobs` instead scans
over chunks of ``c`` positions; each chunk's body (unembedding, logsumexp, target
logit, entropy) is ``jax.checkpoint``-ed, so the scan saves only the chunk's
hidden states and the backward pass recomputes its logits. At most a few
(B, c, V) arrays are live at a time; gradients are exact (the same math, only
recomputed). This is Levanter's blockwise cross-entropy / MaxText's vocab tiling
applied to GRPO's per-token logprobs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

Unembed = Callable[[jax.Array], jax.Array]  # (B, c, E) -> float32 logits (B, c, V)


def _chunk_stats(
    h_bce: jax.Array,
    targets_bc: jax.Array,
    *,
    unembed: Unembed,
    temperature: float,
    with_entropy: bool,
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) (B, c), entropy (B, c), zeros when not wanted) for one chunk."""
    logits_bcv = unembed(h_bce).astype(jnp.float32)
    if temperature != 1.0:
        logits_bcv = logits_bcv / temperature
    lse_bc = jax.nn.logsumexp(logits_bcv, axis=-1)
    target_bc = jnp.take_along_axis(logits_bcv, targets_bc[..., None], axis=-1)[..., 0]
    logp_bc = target_bc - lse_bc
    if not with_entropy:
        return logp_bc, jnp.zeros_like(logp_bc)
    # H = -sum p log p = lse - sum(p * logits); a metric, so no gradient flows through it.
    logits_bcv = jax.lax.stop_gradient(logits_bcv)
    lse_bc = jax.lax.stop_gradient(lse_bc)
    p_bcv = jnp.exp(logits_bcv - lse_bc[..., None])
    ent_bc = lse_bc - (p_bcv * logits_bcv).sum(-1)
    return logp_bc, ent_bc


def chunked_token_logprobs(
    h_bte: jax.Array,
    unembed: Unembed,
    targets_bt: jax.Array,
    *,
    chunk: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """(log p(target_t) (B, T) float32, entropy (B, T) float32 or None).

    ``logp = log_softmax(logits / temperature)[target]``; the entropy is that of
    the same distribution, returned under ``stop_gradient`` (a metric). ``unembed``
    maps hidden states (B, c, E) to float32 logits (B, c, V) and closes over its
    weights; gradients flow into them and into ``h_bte``.

    Never holds a (B, T, V) array: the sequence is cut into ``ceil(T / chunk)``
    equal chunks of ``c <= chunk`` positions (the last padded, the padding cut from
    the result), and each chunk's logits live only inside a ``jax.checkpoint``-ed
    ``lax.scan`` body, recomputed chunk by chunk in the backward pass. ``chunk=0``
    (or ``chunk >= T``) computes all positions at once, without checkpointing.
    """
    if isinstance(temperature, int | float) and temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    b, t, e = h_bte.shape
    body = functools.partial(
        _chunk_stats, unembed=unembed, temperature=temperature, with_entropy=with_entropy
    )
    if chunk == 0 or chunk >= t:
        logp_bt, ent_bt = body(h_bte, targets_bt)
    else:
        n = -(-t // chunk)  # number of chunks
        c = -(-t // n)  # balanced chunk length <= chunk: padding < n positions
        pad = n * c - t
        h_nbce = jnp.pad(h_bte, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, e).swapaxes(0, 1)
        tg_nbc = jnp.pad(targets_bt, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)
        # Inside scan: scan already keeps iterations apart, so CSE prevention is not needed.
        step = jax.checkpoint(body, prevent_cse=False)
        _, (logp_nbc, ent_nbc) = jax.lax.scan(lambda _, x: (None, step(*x)), None, (h_nbce, tg_nbc))
        logp_bt = logp_nbc.swapaxes(0, 1).reshape(b, n * c)[:, :t]
        ent_bt = ent_nbc.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    if not with_entropy:
        return logp_bt, None
    return logp_bt, jax.lax.stop_gradient(ent_bt)
