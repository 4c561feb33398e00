"""Sampling: greedy, temperature, top-k, top-p, SGLang's logprobs, batch independence."""

import jax
import jax.numpy as jnp
import numpy as np

from learner.serving.sampling import row_keys, sample

sample_jit = jax.jit(sample)

# probabilities 0.5, 0.3, 0.15, 0.05 as logits
LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))


def _draw(logits, temperature=1.0, top_p=1.0, top_k=-1, seeds=range(2000)):
    """One row per seed, all with the same logits and parameters."""
    n = len(seeds)
    tokens, logps = sample_jit(
        jnp.tile(jnp.asarray(logits), (n, 1)),
        jnp.full((n,), temperature, jnp.float32),
        jnp.full((n,), top_p, jnp.float32),
        jnp.full((n,), top_k, jnp.int32),
        row_keys(jnp.asarray(list(seeds), jnp.uint32), 0),
    )
    return np.asarray(tokens), np.asarray(logps)


def test_greedy_takes_the_argmax_with_unscaled_logprobs():
    tokens, logps = _draw(LOGITS, temperature=0.0, top_k=3, seeds=range(5))
    assert (tokens == 0).all()
    np.testing.assert_allclose(logps, np.log(0.5), rtol=1e-6)


def test_temperature_one_follows_the_distribution():
    tokens, logps = _draw(LOGITS)
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    # 2000 draws: the standard error of p = 0.5 is 0.011; 4 sigma is 0.045
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.045)
    np.testing.assert_allclose(logps, np.log([0.5, 0.3, 0.15, 0.05])[tokens], rtol=1e-5)


def test_logprobs_are_at_the_temperature_before_filtering():
    # T = 2: p ~ sqrt([0.5, 0.3, 0.15, 0.05]) = [.7071, .5477, .3873, .2236] / 1.8657
    tokens, logps = _draw(LOGITS, temperature=2.0, top_k=2)
    assert set(np.unique(tokens)) == {0, 1}  # top-k 2 keeps the two most likely tokens
    scaled = np.sqrt([0.5, 0.3, 0.15, 0.05])
    expected = np.log(scaled / scaled.sum())  # log_softmax(logits / 2), not renormalised to k
    np.testing.assert_allclose(logps, expected[tokens], rtol=1e-5)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    # mass ahead of each token: 0, 0.5, 0.8, 0.95. top_p = 0.7 keeps tokens with mass
    # ahead <= 0.7: {0, 1}, sampled as 0.5 : 0.3 -> 0.625 / 0.375.
    tokens, _ = _draw(LOGITS, top_p=0.7)
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    assert freq[2] == freq[3] == 0
    np.testing.assert_allclose(freq[:2], [0.625, 0.375], atol=0.045)
    tokens, _ = _draw(LOGITS, top_p=0.4)  # mass ahead of token 1 is 0.5 > 0.4: only token 0
    assert (tokens == 0).all()


def test_a_rows_draw_does_not_depend_on_its_batch():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)).astype(np.float32) * 3
    temp = jnp.asarray([1.0, 0.7, 1.0, 0.0, 1.3, 1.0], jnp.float32)
    top_p = jnp.asarray([1.0, 0.9, 1.0, 1.0, 0.5, 1.0], jnp.float32)
    top_k = jnp.asarray([-1, -1, 5, -1, -1, -1], jnp.int32)
    seeds = jnp.arange(6, dtype=jnp.uint32) + 100
    together, _ = sample_jit(jnp.asarray(logits), temp, top_p, top_k, row_keys(seeds, 7))
    for i in range(6):  # each row alone, so no other row switches filtering on or off
        s = slice(i, i + 1)
        alone, _ = sample_jit(
            jnp.asarray(logits[s]), temp[s], top_p[s], top_k[s], row_keys(seeds[s], 7)
        )
        assert int(alone[0]) == int(together[i])
