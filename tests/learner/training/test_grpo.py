"""GRPO math with hand-derived numbers (the arithmetic in the comments)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.training.grpo import agg_denominator, aggregate, group_advantages, grpo_loss


def test_group_advantages_normalise_within_each_group():
    # group 1: [1, 0, 1, 0]: mean 0.5, population std 0.5 -> (+-0.5)/0.5 = +-1
    # group 2: [2, 2, 2, 2]: no variance -> dropped (advantage 0, keep 0)
    adv, keep = group_advantages(jnp.array([1.0, 0, 1, 0, 2, 2, 2, 2]), 4, eps=0.0, ddof=0)
    np.testing.assert_allclose(adv, [1, -1, 1, -1, 0, 0, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(keep, [1, 1, 1, 1, 0, 0, 0, 0])


def test_sample_std_advantages_match_verl_and_trl():
    # [1, 0, 1, 0]: sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.86603
    # [1, 0]: sample std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711 (1.41x smaller than ddof 0)
    adv, keep = group_advantages(jnp.array([1.0, 0, 1, 0, 2, 2, 2, 2]), 4, eps=0.0, ddof=1)
    np.testing.assert_allclose(adv, [0.86603, -0.86603, 0.86603, -0.86603, 0, 0, 0, 0], atol=1e-5)
    np.testing.assert_array_equal(keep, [1, 1, 1, 1, 0, 0, 0, 0])
    adv, _ = group_advantages(jnp.array([1.0, 0.0]), 2, eps=0.0, ddof=1)
    np.testing.assert_allclose(adv, [0.70711, -0.70711], atol=1e-5)
    adv, keep = group_advantages(jnp.array([1.0]), 1, ddof=1)  # one sample: no variance
    np.testing.assert_array_equal(keep, [0])


def test_the_config_chooses_the_std_the_batch_divides_by():
    from learner.training.batching import pack
    from shared.wire import Trajectory, TrajectoryGroup

    def traj(i: int) -> Trajectory:
        tokens, mask = np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], np.uint8)
        zeros_f, zeros_i = np.zeros(4, np.float32), np.zeros(4, np.int32)
        return Trajectory("t", "g", i, tokens, mask, zeros_f, zeros_i, reward=float(i % 2))

    def group() -> TrajectoryGroup:
        return TrajectoryGroup("g", "t", [traj(i) for i in range(4)])

    adv = {
        ddof: np.asarray(pack([group()], rows=4, buckets=(4,), adv_ddof=ddof).arrays["adv_b"])
        for ddof in (0, 1)
    }
    np.testing.assert_allclose(adv[0], [-1, 1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(adv[1], adv[0] * np.sqrt(3 / 4), atol=1e-5)


def test_dr_grpo_advantages_are_only_centred():
    # [3, 1]: mean 2 -> [1, -1] whatever the std (here 1)
    adv, _ = group_advantages(jnp.array([3.0, 1.0]), 2, scale=False)
    np.testing.assert_allclose(adv, [1, -1])


def test_eps_guards_the_division():
    # [1, 0]: std 0.5, eps 0.5 -> 0.5 / (0.5 + 0.5) = 0.5
    adv, _ = group_advantages(jnp.array([1.0, 0.0]), 2, eps=0.5, ddof=0)
    np.testing.assert_allclose(adv, [0.5, -0.5])


def _ones(b, t):
    return jnp.ones((b, t))


def test_unclipped_loss_is_minus_ratio_times_advantage():
    # logp - old = log(1.1) -> ratio 1.1 inside [0.8, 1.2]; A = 2: per token -2.2
    logp = jnp.log(jnp.full((1, 3), 1.1))
    loss, m = grpo_loss(logp, jnp.zeros((1, 3)), jnp.array([2.0]), _ones(1, 3))
    np.testing.assert_allclose(loss, -2.2, rtol=1e-6)
    assert float(m["clip_fraction"]) == 0.0
    np.testing.assert_allclose(m["ratio_mean"], 1.1, rtol=1e-6)


def test_clip_higher_uses_separate_bounds():
    # ratio 1.5, A = +1: min(1.5, clip(1.5, 0.8, 1.28)) = 1.28 -> loss -1.28
    # ratio 0.5, A = -1: min(-0.5, -clip(0.5, 0.8, 1.28)) = min(-0.5, -0.8) = -0.8 -> loss 0.8
    logp = jnp.log(jnp.array([[1.5], [0.5]]))
    loss, m = grpo_loss(
        logp, jnp.zeros((2, 1)), jnp.array([1.0, -1.0]), _ones(2, 1),
        clip_low=0.2, clip_high=0.28, agg="seq_mean_token_mean",
    )  # fmt: skip
    # per sequence: -1.28 and 0.8 -> mean (-1.28 + 0.8) / 2 = -0.24
    np.testing.assert_allclose(loss, -0.24, rtol=1e-6)
    assert float(m["clip_fraction"]) == 1.0


def test_masked_tokens_do_not_count_and_aggregations_differ():
    # seq 1 has 1 live token (loss -1), seq 2 has 3 live tokens (loss -1 each), A = 1, ratio 1.
    # token_mean: -4 / 4 = -1; seq_mean_token_mean: (-1 + -1) / 2 = -1;
    # with seq 2's tokens at loss -3 instead (A = 3): token_mean (-1 - 9) / 4 = -2.5,
    # seq_mean (-1 + -3) / 2 = -2.0, constant 8: -10 / 8 = -1.25
    mask = jnp.array([[1, 0, 0], [1, 1, 1]])
    z = jnp.zeros((2, 3))
    adv = jnp.array([1.0, 3.0])
    expected = {"token_mean": -2.5, "seq_mean_token_mean": -2.0}
    for agg, want in expected.items():
        loss, _ = grpo_loss(z, z, adv, mask, agg=agg)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
    loss, _ = grpo_loss(z, z, adv, mask, agg="constant", constant=8.0)
    np.testing.assert_allclose(loss, -1.25, rtol=1e-6)


def test_truncated_importance_sampling_caps_the_weight():
    # old - rollout = log 3 -> weight min(3, cap 2) = 2; ratio 1, A = 1 -> per token -2
    old = jnp.log(jnp.full((1, 2), 3.0))
    loss, _ = grpo_loss(
        old, old, jnp.array([1.0]), _ones(1, 2), rollout_logp_bt=jnp.zeros((1, 2)), tis_cap=2.0
    )
    np.testing.assert_allclose(loss, -2.0, rtol=1e-6)
    # cap 0 disables it: -1
    loss, _ = grpo_loss(
        old, old, jnp.array([1.0]), _ones(1, 2), rollout_logp_bt=jnp.zeros((1, 2)), tis_cap=0.0
    )
    np.testing.assert_allclose(loss, -1.0, rtol=1e-6)


def test_k3_kl_to_the_reference():
    # ref - logp = d = log 2: k3 = e^d - d - 1 = 2 - 0.6931 - 1 = 0.3069; A = 0 -> loss = 0.5 * 0.3069
    logp = jnp.zeros((1, 1))
    ref = jnp.log(jnp.full((1, 1), 2.0))
    loss, m = grpo_loss(logp, logp, jnp.array([0.0]), _ones(1, 1), ref_logp_bt=ref, kl_coef=0.5)
    np.testing.assert_allclose(loss, 0.5 * (2 - np.log(2) - 1), rtol=1e-5)
    np.testing.assert_allclose(m["kl_ref"], 2 - np.log(2) - 1, rtol=1e-5)
    # kl_coef 0: no reference term at all
    loss, _ = grpo_loss(logp, logp, jnp.array([0.0]), _ones(1, 1), ref_logp_bt=ref, kl_coef=0.0)
    assert float(loss) == 0.0


def test_approx_kl_and_ratio_extremes():
    # log ratios [log 2, 0] live: approx kl = mean((r - 1) - log r) = ((1 - 0.6931) + 0) / 2
    logp = jnp.log(jnp.array([[2.0, 1.0, 9.0]]))
    _, m = grpo_loss(logp, jnp.zeros((1, 3)), jnp.array([0.0]), jnp.array([[1, 1, 0]]))
    np.testing.assert_allclose(m["approx_kl"], (1 - np.log(2)) / 2, rtol=1e-5)
    assert float(m["ratio_max"]) == pytest.approx(2.0) and float(m["ratio_min"]) == pytest.approx(
        1.0
    )
    assert float(m["tokens"]) == 2


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(jnp.zeros((1, 1)), jnp.ones((1, 1)), "median")


# ----------------------------------------------------------------------------- packed rows
# Segment ids (B, T): 0 is padding, 1, 2, ... the trajectories of a row; advantages per token.


def test_packed_row_aggregates_per_trajectory():
    # The two sequences of test_masked_tokens_do_not_count_and_aggregations_differ in one row:
    # segment 1 = 1 token (A = 1, loss -1), segment 2 = 3 tokens (A = 3, loss -3 each).
    # token_mean: (-1 - 9) / 4 = -2.5; seq_mean_token_mean: (-1 + -9 / 3) / 2 = -2.0, as
    # unpacked; the row taken as one sequence would instead give -10 / 4 = -2.5.
    # constant 8: -10 / 8 = -1.25
    z = jnp.zeros((1, 4))
    mask, seg = jnp.ones((1, 4)), jnp.array([[1, 2, 2, 2]])
    adv = jnp.array([[1.0, 3.0, 3.0, 3.0]])
    for agg, want in {"token_mean": -2.5, "seq_mean_token_mean": -2.0}.items():
        loss, _ = grpo_loss(z, z, adv, mask, agg=agg, segment_bt=seg)
        np.testing.assert_allclose(loss, want, rtol=1e-6)
    loss, _ = grpo_loss(z, z, adv, mask, agg="seq_mean_token_mean")  # no segment ids
    np.testing.assert_allclose(loss, -2.5, rtol=1e-6)
    loss, _ = grpo_loss(z, z, adv, mask, agg="constant", constant=8.0, segment_bt=seg)
    np.testing.assert_allclose(loss, -1.25, rtol=1e-6)


def test_segments_without_trained_tokens_and_padding_do_not_count():
    # row 0: segment 1 (A = 5) all masked, segment 2 two tokens of A = 1 (-1 each), padding;
    # row 1: segment 1, three tokens of A = 2 (-2 each), two padding columns.
    # seq_mean_token_mean: segments with tokens: (-1) and (-2) -> (-1 + -2) / 2 = -1.5
    # (counting row 0's segment 1 would give -3 / 3 = -1.0); token_mean: (-2 - 6) / 5 = -1.6
    seg = jnp.array([[1, 1, 2, 2, 0], [1, 1, 1, 0, 0]])
    mask = jnp.array([[0, 0, 1, 1, 0], [1, 1, 1, 0, 0]])
    adv = jnp.array([[5.0, 5, 1, 1, 0], [2, 2, 2, 0, 0]])
    z = jnp.zeros((2, 5))
    loss, _ = grpo_loss(z, z, adv, mask, agg="seq_mean_token_mean", segment_bt=seg)
    np.testing.assert_allclose(loss, -1.5, rtol=1e-6)
    np.testing.assert_allclose(agg_denominator(mask, "seq_mean_token_mean", segment_bt=seg), 2.0)
    loss, _ = grpo_loss(z, z, adv, mask, agg="token_mean", segment_bt=seg)
    np.testing.assert_allclose(loss, -1.6, rtol=1e-6)


def test_packed_gradient_is_per_trajectory_under_jit():
    # ratio 1.1 (inside [0.8, 1.2]): per token -1.1 A, d/dlogp = -1.1 A (d ratio/d logp = ratio).
    # seq_mean over 2 segments: segment 1 (1 token, A = 1): -1.1 * 1 / (1 * 2) = -0.55;
    # segment 2 (2 tokens, A = 3): -1.1 * 3 / (2 * 2) = -0.825 each;
    # loss (-1.1 + (-3.3 - 3.3) / 2) / 2 = -2.2
    seg, mask = jnp.array([[1, 2, 2]]), jnp.ones((1, 3))
    adv = jnp.array([[1.0, 3.0, 3.0]])

    @jax.jit
    def f(logp):
        return grpo_loss(logp, jnp.zeros((1, 3)), adv, mask, agg="seq_mean_token_mean",
                         segment_bt=seg)[0]  # fmt: skip

    loss, grad = jax.value_and_grad(f)(jnp.full((1, 3), np.log(1.1), jnp.float32))
    np.testing.assert_allclose(loss, -2.2, rtol=1e-6)
    np.testing.assert_allclose(grad, [[-0.55, -0.825, -0.825]], rtol=1e-5)


def test_row_advantages_broadcast_like_per_token_ones():
    # adv (B,) = [1, 3] is adv (B, T) = [[1, 1, 1], [3, 3, 3]]: the masked example's -2.5 / -2.0
    mask = jnp.array([[1, 0, 0], [1, 1, 1]])
    z = jnp.zeros((2, 3))
    adv_bt = jnp.array([[1.0, 1, 1], [3, 3, 3]])
    for agg, want in {"token_mean": -2.5, "seq_mean_token_mean": -2.0}.items():
        np.testing.assert_allclose(grpo_loss(z, z, adv_bt, mask, agg=agg)[0], want, rtol=1e-6)


def test_constant_with_segment_ids_must_be_given():
    # a packed batch's rows x T is not the unpacked one's: no silent default
    seg = jnp.array([[1, 2]])
    with pytest.raises(ValueError, match="explicit constant"):
        agg_denominator(jnp.ones((1, 2)), "constant", segment_bt=seg)
    # a traced/array constant works (learner.training.batching's loss_constant_b): -2 tokens x 1 / 8
    loss, _ = grpo_loss(
        jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.ones((1, 2)),
        agg="constant", constant=jnp.float32(8.0), segment_bt=seg,
    )  # fmt: skip
    np.testing.assert_allclose(loss, -0.25, rtol=1e-6)
    # unpacked (no segment ids) the default stays the batch's size, 1 x 2: -2 / 2
    loss, _ = grpo_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), jnp.ones((1, 2)),
                        agg="constant")  # fmt: skip
    np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
