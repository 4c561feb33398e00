"""Chunked token logprobs: equal to the dense computation, values and gradients, in far less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.model.logprobs import chunked_token_logprobs

B, E, V = 2, 16, 50
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _linear(w):
    """The unembedding closure the model passes: float32 logits, gradients into ``w``."""
    return lambda x: jnp.einsum("bce,ev->bcv", x, w, preferred_element_type=jnp.float32)


def _dense(h, w, targets, temperature):
    """The reference: full (B, T, V) logits -> log_softmax -> gather; entropy from them."""
    logp_btv = jax.nn.log_softmax(_linear(w)(h) / temperature, axis=-1)
    logp_bt = jnp.take_along_axis(logp_btv, targets[..., None], axis=-1)[..., 0]
    return logp_bt, -(jnp.exp(logp_btv) * logp_btv).sum(-1)


def _inputs(t, seed=0):
    kh, kw, kt, kc = jax.random.split(jax.random.key(seed), 4)
    h = jax.random.normal(kh, (B, t, E))
    w = jax.random.normal(kw, (E, V)) * 0.5  # logits of a few nats: a peaked, non-trivial softmax
    targets = jax.random.randint(kt, (B, t), 0, V)
    weight_bt = jax.random.normal(kc, (B, t)) * (jnp.arange(t) % 3 != 0)  # masked random cotangent
    return h, w, targets, weight_bt


# (T, chunk): a multiple; 37 = 5 chunks of 8, 3 padded; 37 = 3 balanced chunks of 13, 2 padded;
# 36 = 3 chunks of 12 (balanced from 16, no padding); chunk 0 and chunk >= T: no chunking.
CASES = [(32, 8), (37, 8), (37, 16), (36, 16), (20, 0), (20, 64)]


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize(("t", "chunk"), CASES)
def test_values_equal_the_dense_computation(t, chunk, temperature):
    h, w, targets, _ = _inputs(t)
    logp, ent = jax.jit(
        lambda h, w: chunked_token_logprobs(
            h, _linear(w), targets, chunk=chunk, temperature=temperature
        )
    )(h, w)
    ref_logp, ref_ent = _dense(h, w, targets, temperature)
    assert logp.shape == ent.shape == (B, t)
    assert logp.dtype == ent.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, **TOL)
    np.testing.assert_allclose(ent, ref_ent, **TOL)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize(("t", "chunk"), CASES)
def test_gradients_into_h_and_the_weights_equal_the_dense_ones(t, chunk, temperature):
    h, w, targets, weight_bt = _inputs(t, seed=1)

    def chunked(h, w):
        logp, _ = chunked_token_logprobs(
            h, _linear(w), targets, chunk=chunk, temperature=temperature
        )
        return (logp * weight_bt).sum()

    def dense(h, w):
        return (_dense(h, w, targets, temperature)[0] * weight_bt).sum()

    gh, gw = jax.jit(jax.grad(chunked, argnums=(0, 1)))(h, w)
    ref_gh, ref_gw = jax.grad(dense, argnums=(0, 1))(h, w)
    assert float(jnp.abs(ref_gw).max()) > 0.1  # the comparison is not between zeros
    np.testing.assert_allclose(gh, ref_gh, **TOL)
    np.testing.assert_allclose(gw, ref_gw, **TOL)


def test_entropy_is_a_metric_without_gradient():
    h, w, targets, _ = _inputs(37)

    def ent_sum(h, w):
        return chunked_token_logprobs(h, _linear(w), targets, chunk=8)[1].sum()

    gh, gw = jax.grad(ent_sum, argnums=(0, 1))(h, w)
    assert not np.any(gh) and not np.any(gw)


def test_without_entropy_returns_none_and_the_same_logprobs():
    h, w, targets, _ = _inputs(37)
    logp, ent = chunked_token_logprobs(h, _linear(w), targets, chunk=8, with_entropy=False)
    assert ent is None
    np.testing.assert_allclose(logp, _dense(h, w, targets, 1.0)[0], **TOL)


def test_bfloat16_hidden_states_give_float32_logprobs():
    h, w, targets, _ = _inputs(37)
    h16, w16 = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    logp, ent = chunked_token_logprobs(h16, _linear(w16), targets, chunk=8)
    ref_logp, ref_ent = _dense(h16, w16, targets, 1.0)  # same bf16 inputs, float32 logits
    assert logp.dtype == ent.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, **TOL)
    np.testing.assert_allclose(ent, ref_ent, **TOL)


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"chunk": -1}, "chunk"), ({"temperature": 0.0}, "temperature")]
)
def test_rejects_bad_arguments(kwargs, match):
    h, w, targets, _ = _inputs(8)
    with pytest.raises(ValueError, match=match):
        chunked_token_logprobs(h, _linear(w), targets, **kwargs)


def _grad_temp_bytes(t, e, v, chunk):
    """XLA's scratch memory for value, entropy and gradients (h and w) of a weighted logp sum."""

    def f(h, w, targets, weight_bt):
        logp, ent = chunked_token_logprobs(h, _linear(w), targets, chunk=chunk)
        return (logp * weight_bt).sum(), ent.mean()

    grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
    args = (
        jax.ShapeDtypeStruct((1, t, e), jnp.float32),
        jax.ShapeDtypeStruct((e, v), jnp.float32),
        jax.ShapeDtypeStruct((1, t), jnp.int32),
        jax.ShapeDtypeStruct((1, t), jnp.float32),
    )
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_chunking_bounds_the_backward_memory():
    t, e, v, c = 8192, 256, 32000, 512
    dense = _grad_temp_bytes(t, e, v, chunk=0)
    chunked = _grad_temp_bytes(t, e, v, chunk=c)
    # Dense holds (T, V) float32 logits and their cotangent: 2 x 8192 x 32000 x 4 B = 2000 MiB.
    assert dense >= t * v * 4
    # Chunked: one chunk's recomputed logits and their cotangent (2 x (c, V)), one spare (c, V)
    # for XLA's scheduling; the (E, V) weight gradient the scan accumulates; the hidden states
    # regrouped into chunks and their gradient, a few (T, E). 3 x 62.5 + 31.25 + 4 x 8 = 250 MiB
    # (about 165 MiB measured with jax 0.10 on CPU), an eighth of dense.
    bound = 3 * c * v * 4 + e * v * 4 + 4 * t * e * 4
    assert chunked < bound
    assert chunked < dense / 4


def test_entropy_of_a_uniform_policy_is_log_v():
    # uniform over 4 tokens: entropy log 4 = 1.3863, and log p of any target log(1/4)
    logp, ent = chunked_token_logprobs(
        jnp.zeros((2, 3, 1)),
        lambda h: jnp.zeros((*h.shape[:2], 4), jnp.float32),
        jnp.zeros((2, 3), jnp.int32),
        chunk=2,
    )
    np.testing.assert_allclose(ent, np.full((2, 3), np.log(4)), rtol=1e-6)
    np.testing.assert_allclose(logp, np.full((2, 3), -np.log(4)), rtol=1e-6)
