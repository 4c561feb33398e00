"""GRPO, as pure functions over arrays (jit- and grad-safe; no Python branching on values).

Shapes: B sequences (= groups x G samples, group-major), T tokens.

- :func:`group_advantages`: A_i = (r_i - mean_group) / (std_group + eps), or without
  the std division (Dr. GRPO); groups whose rewards all agree carry no signal
  and are dropped (their weight is 0).
- :func:`grpo_loss`: PPO-clip with separate low/high clip (clip-higher), token
  masking, truncated importance sampling between the rollout engine's logprobs
  and the learner's, optional k3 KL to a frozen reference, and three loss
  aggregations: ``token_mean`` (over all unmasked tokens of the batch),
  ``seq_mean_token_mean`` (per sequence, then over sequences) and ``constant``
  (summed tokens over a fixed normaliser, as Dr. GRPO).

Packed batches (several trajectories per row, ``learner.training.batching``) pass
``segment_bt`` (B, T) int32: 0 on padding, 1, 2, ... for the trajectories of a row,
each contiguous; a sequence is then a (row, segment), so every aggregation is the
unpacked one (``constant`` given explicitly: a packed batch's rows x T is not the
unpacked one's, :func:`agg_denominator`). The advantage is per row (B,) or per
token (B, T).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from shared.config import LearnerConfig

Aggregation = Literal["token_mean", "seq_mean_token_mean", "constant"]

# The keyword defaults here and in learner.training.batching are the run config's (stated once,
# in shared/config.py), so the step used as a library computes what a run computes.
RUN = LearnerConfig()
ADV_DDOF = {"population": 0, "sample": 1}  # learner.adv_std -> the std's ddof


def group_advantages(
    rewards_b: jax.Array,
    group_size: int,
    *,
    scale: bool = RUN.scale_rewards,
    eps: float = 1e-6,
    ddof: int = ADV_DDOF[RUN.adv_std],
) -> tuple[jax.Array, jax.Array]:
    """(advantages (B,), keep (B,)): group-normalised rewards, and 0/1 for groups with
    reward variance. std is over the group with ``ddof``: 0 the population std, 1 the
    sample std (verl's and TRL's; sqrt(G / (G - 1)) larger, so advantages that much
    smaller). A group of one has no variance either way."""
    r = rewards_b.reshape(-1, group_size).astype(jnp.float32)  # (groups, G)
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, keepdims=True, ddof=ddof if group_size > 1 else 0)
    centred = r - mean
    has_signal = std > 0
    adv = centred / jnp.where(has_signal, std + eps, 1.0) if scale else centred
    keep = jnp.broadcast_to(has_signal, r.shape)
    return jnp.where(keep, adv, 0.0).reshape(-1), keep.astype(jnp.float32).reshape(-1)


def grpo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    adv_b: jax.Array,
    mask_bt: jax.Array,
    *,
    clip_low: float = RUN.clip_eps_low,
    clip_high: float = RUN.clip_eps_high,
    agg: Aggregation = RUN.loss_agg,
    constant: float | None = None,
    ref_logp_bt: jax.Array | None = None,
    kl_coef: float = RUN.kl_coef,
    rollout_logp_bt: jax.Array | None = None,
    tis_cap: float = RUN.tis_cap,
    denominator: jax.Array | None = None,
    segment_bt: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The scalar loss to minimise and its metrics.

    ``old_logp_bt`` are the behaviour policy's logprobs the ratio is taken against
    (the rollout's, or the learner's recomputed ones); with ``rollout_logp_bt`` and
    ``tis_cap > 0``, each token is also weighted by min(exp(old - rollout), cap),
    correcting for the mismatch between inference and learner numerics. With
    ``denominator`` (that of the whole batch, :func:`agg_denominator`), the token losses
    are summed and divided by it: a micro-batch's share of the whole batch's loss.
    ``adv_b`` is (B,) (one advantage per row) or (B, T) (per token: packed rows);
    ``segment_bt`` makes the sequences of :func:`aggregate` the rows' segments.
    """
    mask = mask_bt.astype(jnp.float32)
    adv = adv_b[:, None] if adv_b.ndim == 1 else adv_b  # (B, 1) or (B, T)
    log_ratio = (logp_bt - old_logp_bt) * mask
    ratio = jnp.exp(log_ratio)  # (B, T)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -jnp.minimum(ratio * adv, clipped * adv)
    if rollout_logp_bt is not None and tis_cap > 0:
        w = jnp.minimum(jnp.exp((old_logp_bt - rollout_logp_bt) * mask), tis_cap)
        per_token = per_token * jax.lax.stop_gradient(w)
    kl = jnp.zeros_like(per_token)
    if ref_logp_bt is not None and kl_coef > 0:
        d = (ref_logp_bt - logp_bt) * mask
        kl = jnp.exp(d) - d - 1.0  # k3: unbiased, non-negative
        per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, agg, constant, denominator, segment_bt)
    n = jnp.maximum(mask.sum(), 1.0)
    clip_frac = (((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)) * mask).sum() / n
    metrics = {
        "clip_fraction": clip_frac,
        "approx_kl": (((ratio - 1.0) - log_ratio) * mask).sum() / n,
        "ratio_mean": (ratio * mask).sum() / n,
        "ratio_max": jnp.where(mask > 0, ratio, -jnp.inf).max(),
        "ratio_min": jnp.where(mask > 0, ratio, jnp.inf).min(),
        "kl_ref": (kl * mask).sum() / n,
        "tokens": mask.sum(),
    }
    return loss, metrics


def aggregate(
    per_token_bt: jax.Array,
    mask_bt: jax.Array,
    agg: Aggregation,
    constant: float | jax.Array | None = None,
    denominator: jax.Array | None = None,
    segment_bt: jax.Array | None = None,
) -> jax.Array:
    """The token losses aggregated: a sum over what ``agg`` averages, divided by
    :func:`agg_denominator` of these rows, or by ``denominator`` when given. With
    ``segment_bt``, a sequence is a (row, segment) rather than a row."""
    mask = mask_bt.astype(jnp.float32)
    if agg == "seq_mean_token_mean":
        if segment_bt is None:
            per_seq = (per_token_bt * mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)
        else:
            sums = segment_sums(per_token_bt * mask, segment_bt)  # (B * (T + 1),)
            per_seq = sums / jnp.maximum(segment_sums(mask, segment_bt), 1.0)
        total = per_seq.sum()  # sequences without tokens add 0
    elif agg in ("token_mean", "constant"):
        total = (per_token_bt * mask).sum()
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}")
    if denominator is None:
        denominator = agg_denominator(mask_bt, agg, constant, segment_bt)
    return total / denominator


def agg_denominator(
    mask_bt: jax.Array,
    agg: Aggregation,
    constant: float | jax.Array | None = None,
    segment_bt: jax.Array | None = None,
):
    """What ``agg`` divides the summed token losses of these rows by: the tokens trained
    on (``token_mean``), the sequences with any (``seq_mean_token_mean``; with
    ``segment_bt`` a sequence is a (row, segment)), or the constant (default: the
    batch's size, rows x T); at least 1.

    The default constant is that of an unpacked batch: a packed one (``segment_bt``
    given) has fewer rows than trajectories, so ``constant`` must then be passed
    (``learner.training.batching`` gives the unpacked layout's in ``loss_constant_b``); without
    it this raises rather than silently change the loss's scale."""
    mask = mask_bt.astype(jnp.float32)
    if agg == "token_mean":
        return jnp.maximum(mask.sum(), 1.0)
    if agg == "seq_mean_token_mean":
        if segment_bt is None:
            return jnp.maximum((mask.sum(axis=1) > 0).sum().astype(jnp.float32), 1.0)
        live = segment_sums(mask, segment_bt) > 0
        return jnp.maximum(live.sum().astype(jnp.float32), 1.0)
    if agg == "constant":
        if constant is None and segment_bt is not None:
            raise ValueError(
                "agg='constant' with segment ids needs an explicit constant (the unpacked "
                "layout's rows x T: learner.training.batching's loss_constant_b)"
            )
        return jnp.asarray(constant if constant is not None else mask.size, jnp.float32)
    raise ValueError(f"unknown loss aggregation {agg!r}")


def segment_sums(values_bt: jax.Array, segment_bt: jax.Array) -> jax.Array:
    """(B * (T + 1),): the sum of ``values_bt`` over each (row, segment id in [0, T])."""
    b, t = segment_bt.shape
    ids = jnp.arange(b, dtype=jnp.int32)[:, None] * (t + 1) + segment_bt.astype(jnp.int32)
    return jax.ops.segment_sum(values_bt.reshape(-1), ids.reshape(-1), num_segments=b * (t + 1))
