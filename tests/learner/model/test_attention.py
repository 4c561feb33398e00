"""Attention kernels: blockwise and the dot_product_attention wrapper against the dense reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.model.attention import attention as _attention
from learner.model.attention import resolve

# Jitted once per (impl, block, shapes): eager op-by-op dispatch is several times slower here.
attention = jax.jit(_attention, static_argnames=("impl", "block", "packed"))

# Segment layouts, one string per row: a digit per token, "0" = padding. They cover packed
# trajectories crossing block edges, padding at the row end, and a row that is all padding.
_PACKED_10 = "1112233300"  # segments 1,1,1,2,2,3,3,3 then padding
_MANY_40 = "111223334445566677788899" + "0" * 16  # nine short trajectories, most cross blocks


def _segments(rows: list[str]) -> jax.Array:
    """(B, T) int32 segment ids from per-row digit strings."""
    return jnp.asarray([[int(c) for c in row] for row in rows], jnp.int32)


def _layout(t: int, runs: list[tuple[int, int]]) -> str:
    """A row of length t from (segment, length) runs, padded with zeros."""
    row = "".join(str(s) * n for s, n in runs)
    return row + "0" * (t - len(row))


def _inputs(seed: int, h: int, hkv: int, seg_bt: jax.Array, d: int = 16, dtype=jnp.float32):
    """Random q (B, H, T, D), k, v (B, Hkv, T, D) and a float32 output cotangent (B, H, T, D)."""
    b, t = seg_bt.shape
    rng = np.random.default_rng(seed)
    shapes = [(b, h, t, d), (b, hkv, t, d), (b, hkv, t, d), (b, h, t, d)]
    q, k, v, ct = (rng.standard_normal(s, dtype=np.float32) for s in shapes)
    return (*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(ct))


# (H, Hkv, block, rows)
CONFIGS = [
    pytest.param(4, 2, 16, [_layout(45, [(1, 10), (2, 20), (3, 10)]), "1" * 44 + "0"], id="gqa2"),
    pytest.param(
        4, 1, 32, [_layout(70, [(1, 33), (2, 1), (3, 30)]), "0" * 70, "1" * 70], id="mqa-pad-row"
    ),
    pytest.param(2, 2, 32, [_layout(100, [(1, 31), (2, 40), (3, 20)]), "1" * 100], id="mha"),
    pytest.param(4, 2, 16, [_MANY_40, "1" * 19 + "2" * 21], id="many-short-segments"),
    pytest.param(4, 2, 4, [_PACKED_10, "1111111222"], id="tiny-block"),
]


def _loss(impl: str, seg_bt: jax.Array, ct_bhtd: jax.Array, block: int):
    """sum(out * cotangent) over the valid (non-padding) query positions."""
    valid = (seg_bt != 0)[:, None, :, None]

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, seg_bt, impl=impl, block=block) * ct_bhtd * valid)

    return loss


@pytest.mark.parametrize(("h", "hkv", "block", "rows"), CONFIGS)
def test_blockwise_matches_dense_outputs_and_gradients(h, hkv, block, rows):
    seg = _segments(rows)
    q, k, v, ct = _inputs(0, h, hkv, seg)
    dense = attention(q, k, v, seg, impl="dense")
    blockwise = attention(q, k, v, seg, impl="blockwise", block=block)
    np.testing.assert_allclose(blockwise, dense, rtol=1e-5, atol=1e-5)

    grads = {
        impl: jax.jit(jax.grad(_loss(impl, seg, ct, block), argnums=(0, 1, 2)))(q, k, v)
        for impl in ("dense", "blockwise")
    }
    for name, got, want in zip("qkv", grads["blockwise"], grads["dense"], strict=True):
        assert np.isfinite(got).all(), name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"d{name}")


@pytest.mark.parametrize(("h", "hkv", "block", "rows"), CONFIGS[:3])
def test_dot_product_attention_wrapper_matches_dense(h, hkv, block, rows):
    # impl="xla" is the cudnn wrapper (layout transposes, GQA, mask, zeroing) on XLA's kernel.
    seg = _segments(rows)
    q, k, v, _ = _inputs(1, h, hkv, seg)
    np.testing.assert_allclose(
        attention(q, k, v, seg, impl="xla"), attention(q, k, v, seg, impl="dense"), atol=1e-5
    )


@pytest.mark.parametrize("impl", ["dense", "blockwise", "xla"])
def test_padding_queries_are_exactly_zero(impl):
    seg = _segments([_layout(40, [(1, 12), (2, 20)]), "0" * 40])
    q, k, v, _ = _inputs(2, 4, 2, seg)
    out = np.asarray(attention(q, k, v, seg, impl=impl, block=16))
    assert np.isfinite(out).all()
    assert (out[0, :, 32:] == 0).all() and (out[1] == 0).all()
    assert (np.abs(out[0, :, :32]).sum(-1) > 0).all()


def test_segments_do_not_see_each_other():
    # Changing segment 1's keys and values must not change segment 2's outputs.
    seg = _segments([_layout(48, [(1, 20), (2, 25)])])
    q, k, v, _ = _inputs(3, 2, 2, seg)
    k2, v2 = k.at[:, :, :20].multiply(-3.0), v.at[:, :, :20].add(5.0)
    for impl in ("dense", "blockwise"):
        a = attention(q, k, v, seg, impl=impl, block=16)[:, :, 20:]
        b = attention(q, k2, v2, seg, impl=impl, block=16)[:, :, 20:]
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("impl", ["dense", "blockwise", "xla"])
def test_bfloat16_runs_and_stays_close_to_float32(impl):
    seg = _segments([_layout(70, [(1, 30), (2, 35)]), "1" * 70])
    q, k, v, ct = _inputs(4, 4, 2, seg)
    reference = attention(q, k, v, seg, impl="dense")
    q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
    out = attention(q16, k16, v16, seg, impl=impl, block=32)
    assert out.dtype == jnp.bfloat16
    # bf16 keeps 8 mantissa bits (relative step 2^-8 ~ 4e-3) on inputs and probabilities.
    np.testing.assert_allclose(out.astype(jnp.float32), reference, atol=2e-2, rtol=2e-2)
    grads = jax.jit(jax.grad(_loss(impl, seg, ct, 32), argnums=(0, 1, 2)))(q16, k16, v16)
    assert all(g.dtype == jnp.bfloat16 and np.isfinite(g.astype(jnp.float32)).all() for g in grads)


def test_resolve_picks_by_backend_and_length():
    assert resolve("auto", 8192, 512, backend="gpu") == "cudnn"
    assert resolve("auto", 100, 512, backend="gpu") == "cudnn"
    assert resolve("auto", 8192, 512, backend="cpu") == "blockwise"
    assert resolve("auto", 65, 512, backend="cpu") == "blockwise"
    assert resolve("auto", 64, 512, backend="cpu") == "dense"
    assert resolve("auto", 60, 512, backend="tpu") == "dense"
    assert resolve("blockwise", 10, 512, backend="gpu") == "blockwise"
    assert resolve("dense", 10**6, 512) == "dense"
    with pytest.raises(ValueError, match="auto, dense, blockwise, cudnn"):
        resolve("flash", 10, 512)


def test_the_tile_is_sized_by_the_length_unless_given():
    from learner.model.attention import block_for

    assert [block_for(t) for t in (16, 192, 1024, 4096, 32768)] == [32, 32, 128, 256, 256]
    assert block_for(4096, 100) == 100


def test_shape_errors_are_reported():
    seg = _segments(["1" * 8])
    q, k, v, _ = _inputs(5, 3, 2, seg)
    with pytest.raises(ValueError, match="multiple"):
        attention(q, k, v, seg)
    with pytest.raises(ValueError, match="segment_ids"):
        attention(q[:, :2], k, v, seg[:, :4])
    with pytest.raises(ValueError, match="block"):
        attention(q[:, :2], k, v, seg, impl="blockwise", block=-1)


def _grad_temp_bytes(impl: str, t: int, b: int = 1, h: int = 4, hkv: int = 2, d: int = 64):
    """Scratch bytes XLA plans for jit(grad(loss)) at length t; compiled, never run."""

    def loss(q, k, v, seg):
        return jnp.sum(attention(q, k, v, seg, impl=impl, block=512))

    shapes = [(b, h, t, d), (b, hkv, t, d), (b, hkv, t, d)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    args.append(jax.ShapeDtypeStruct((b, t), jnp.int32))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_gradient_memory_has_no_t_by_t_term():
    t = 8192
    dense, blockwise = _grad_temp_bytes("dense", t), _grad_temp_bytes("blockwise", t)
    one_score_matrix = t * t * 4  # a single (T, T) float32 head: 256 MiB
    assert dense > 4 * one_score_matrix  # the reference really holds per-head T x T scores
    assert blockwise < dense / 4
    assert blockwise < one_score_matrix / 4


def test_unpacked_rows_pass_lengths_not_a_mask():
    """One right-padded segment per row (packed=False): the cuDNN wrapper passes the rows'
    lengths instead of a (T, T) mask and still equals dense; a row of padding gives 0."""
    seg = _segments([_layout(40, [(1, 31)]), _layout(40, [(1, 40)]), "0" * 40])
    q, k, v, _ = _inputs(3, 4, 2, seg)
    want = attention(q, k, v, seg, impl="dense")
    got = attention(q, k, v, seg, impl="xla", packed=False)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_auto_takes_blockwise_for_packed_rows_on_gpu():
    assert resolve("auto", 4096, 512, "gpu", packed=False) == "cudnn"
    assert resolve("auto", 4096, 512, "gpu", packed=True) == "blockwise"
