"""Next-token sampling for a batch of rows, each with its own parameters and seed.

Temperature, top-k and top-p are per row (arrays), so one compiled function
serves any mix of requests. A row draws by inverting the cumulative
distribution of its allowed tokens (vocabulary order) with one uniform number
from its key (``fold_in(key(seed), t)`` for the t-th generated token): the draw
depends only on the row's logits, parameters and key, not on which other rows
share the batch, so a seeded request is reproducible however it was batched.

Log-probabilities follow SGLang: ``log_softmax(logits / temperature)`` of the
chosen token, before top-k/top-p filtering; temperature 0 means greedy, with the
log-probabilities of ``log_softmax(logits)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

GREEDY_BELOW = 1e-5  # temperatures below this are greedy


def row_keys(seeds: jax.Array, t: jax.Array | int) -> jax.Array:
    """One key per row for its t-th generated token: fold_in(key(seed), t)."""
    return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), t))(seeds)


def _thresholds(
    scaled: jax.Array, logp: jax.Array, top_p: jax.Array, top_k: jax.Array
) -> jax.Array:
    """The smallest scaled logit each row keeps under its top-k and top-p. (B,)"""
    vocab = scaled.shape[-1]
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    probs = jnp.exp(jnp.take_along_axis(logp, order, axis=-1))
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly ahead of each token
    n_p = jnp.where(top_p < 1.0, jnp.sum(before <= top_p[:, None], axis=-1), vocab)
    n_k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    n = jnp.clip(jnp.minimum(n_p, n_k), 1, vocab)
    return jnp.take_along_axis(sorted_logits, (n - 1)[:, None], axis=-1)[:, 0]


def _inverse_cdf(weights: jax.Array, keys: jax.Array) -> jax.Array:
    """One draw per row from unnormalised ``weights`` (B, V), with one uniform per row.

    (A Gumbel-max draw needs V random numbers per row per step; on CPU that was a
    third of a decode step.)
    """
    cdf = jnp.cumsum(weights, axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k))(keys) * cdf[:, -1]
    drawn = jnp.sum(cdf <= u[:, None], axis=-1)  # the first token whose cdf exceeds u
    last = weights.shape[-1] - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=-1)
    return jnp.minimum(drawn, last)  # u rounding up to the total never picks a dropped token


def sample(
    logits: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    keys: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """logits (B, V) float32 -> (tokens (B,) int32, their log-probabilities (B,))."""
    greedy = temperature < GREEDY_BELOW
    t = jnp.where(greedy, 1.0, temperature)
    scaled = logits / t[:, None]
    logp = jax.nn.log_softmax(scaled, axis=-1)
    filtering = ((top_k > 0) | (top_p < 1.0)) & ~greedy
    threshold = jax.lax.cond(
        jnp.any(filtering),
        lambda: jnp.where(filtering, _thresholds(scaled, logp, top_p, top_k), -jnp.inf),
        lambda: jnp.full(logits.shape[:1], -jnp.inf),
    )
    weights = jnp.where(scaled >= threshold[:, None], jnp.exp(logp), 0.0)
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), _inverse_cdf(weights, keys))
    tokens = tokens.astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
