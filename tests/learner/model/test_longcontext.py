"""The long-context paths of the train step compute what the dense path computes.

Every option of :class:`learner.model.decoder.Options` (each remat policy, the layer scan
or the unrolled loop, each attention kernel) and the chunked logprobs give the same
logits, GRPO loss and gradients as the plain dense path, within 1e-5 in float32,
on small random configs with grouped-query attention, padding and several
trajectories packed in one row.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.model import decoder
from learner.model.decoder import Options
from learner.model.params import apply, get_params
from learner.training.grpo import grpo_loss
from learner.training.step import token_logprobs
from shared.config import LearnerConfig
from tests.learner.helpers import small_model

T = 48
VOCAB = 4096


def _batch(seed: int = 0) -> dict[str, jnp.ndarray]:
    """Two rows: one trajectory then padding; three packed trajectories then padding."""
    rng = np.random.default_rng(seed)
    lengths = [[40], [13, 20, 9]]
    b = len(lengths)
    a = {
        "tokens_bt": np.zeros((b, T), np.int32),
        "targets_bt": np.zeros((b, T), np.int32),
        "positions_bt": np.zeros((b, T), np.int32),
        "segment_bt": np.zeros((b, T), np.int32),
        "mask_bt": np.zeros((b, T), np.float32),
        "rollout_logp_bt": np.zeros((b, T), np.float32),
    }
    for r, row in enumerate(lengths):
        col = 0
        for s, n in enumerate(row, start=1):
            span = slice(col, col + n)
            a["tokens_bt"][r, span] = rng.integers(0, VOCAB, n)
            a["targets_bt"][r, span] = rng.integers(0, VOCAB, n)
            a["positions_bt"][r, span] = np.arange(n)
            a["segment_bt"][r, span] = s
            a["mask_bt"][r, span] = rng.random(n) < 0.7
            a["rollout_logp_bt"][r, span] = -rng.random(n)
            col += n
    a["attn_bt"] = (a["segment_bt"] > 0).astype(np.int32)
    a["adv_b"] = np.array([0.7, -1.3], np.float32)
    return {k: jnp.asarray(v) for k, v in a.items()}


MODELS = {
    "gqa": dict(num_heads=4, num_kv_heads=2),
    "mqa_untied": dict(num_heads=4, num_kv_heads=1, tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", qkv_bias=False, qk_norm=True, head_dim=24),
}
OPTIONS = {
    "scan": dict(scan_layers=True),
    "unrolled": dict(scan_layers=False),
    "auto": dict(scan_layers="auto"),
    "remat_full": dict(remat="full"),
    "remat_dots": dict(remat="dots_no_batch"),
    "remat_full_unrolled": dict(remat="full", scan_layers=False),
    "blockwise": dict(attention="blockwise", attention_block=16),
    "blockwise_remat": dict(attention="blockwise", attention_block=16, remat="full"),
}
DENSE = LearnerConfig(attention="dense", logprob_chunk=0)


def _loss(model, cfg: LearnerConfig):
    def f(params, batch):
        logp_bt, ent_bt = token_logprobs(model, params, batch, cfg, with_entropy=True)
        loss, _ = grpo_loss(
            logp_bt,
            batch["rollout_logp_bt"],
            batch["adv_b"],
            batch["mask_bt"],
            rollout_logp_bt=batch["rollout_logp_bt"],
            tis_cap=2.0,
            agg="constant",  # the summed token losses: gradients of a scale 1e-5 can test
            constant=1.0,
        )
        return loss, (logp_bt, ent_bt)

    return jax.jit(jax.value_and_grad(f, has_aux=True))


def _close(a, b, what):
    for k in a:
        np.testing.assert_allclose(
            np.asarray(a[k]), np.asarray(b[k]), atol=1e-5, rtol=0, err_msg=f"{what}: {k}"
        )


@functools.cache
def _dense_reference(arch: str):
    """The dense path's logits, loss, logprobs, entropy and gradients (once per model)."""
    model = small_model(seed=3, **MODELS[arch])
    params = get_params(model)
    batch = _batch()
    logits = apply(model, params, batch["tokens_bt"], batch["positions_bt"], batch["segment_bt"])
    return model, params, batch, logits, *_loss(model, DENSE)(params, batch)


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("opt", list(OPTIONS))
def test_every_path_gives_the_dense_logits_loss_and_gradients(arch, opt):
    model, params, batch, dense, (l0, (lp0, e0)), g0 = _dense_reference(arch)
    seg = batch["segment_bt"]
    real = np.asarray(seg) > 0
    kw = OPTIONS[opt]
    other = apply(model, params, batch["tokens_bt"], batch["positions_bt"], seg, Options(**kw))
    np.testing.assert_allclose(np.asarray(other)[real], np.asarray(dense)[real], atol=1e-5, rtol=0)
    cfg = dataclasses.replace(DENSE, logprob_chunk=16, **kw)
    (l1, (lp1, e1)), g1 = _loss(model, cfg)(params, batch)
    assert abs(float(l0)) > 1e-3  # a real loss, not zero by construction
    np.testing.assert_allclose(float(l1), float(l0), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(lp1)[real], np.asarray(lp0)[real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(e1)[real], np.asarray(e0)[real], atol=1e-5, rtol=0)
    assert float(jnp.abs(g0["layers.mlp.up_proj"]).max()) > 1e-3
    _close(g1, g0, opt)


def test_packed_trajectories_equal_each_one_alone():
    """A trajectory packed after others (positions restarting, its own segment) gets the
    logits it gets alone in a row: nothing leaks across segments."""
    model = small_model(seed=1)
    params = get_params(model)
    batch = _batch(seed=2)
    packed = apply(
        model, params, batch["tokens_bt"], batch["positions_bt"], batch["segment_bt"],
        Options(attention="blockwise", attention_block=16),
    )  # fmt: skip
    seg = np.asarray(batch["segment_bt"])[1]
    for s in (1, 2, 3):
        cols = np.nonzero(seg == s)[0]
        alone = apply(model, params, batch["tokens_bt"][1:2, cols])
        np.testing.assert_allclose(
            np.asarray(packed)[1, cols], np.asarray(alone)[0], atol=1e-5, rtol=0
        )


def test_scan_and_unrolled_compile_one_block_vs_all():
    """Under the scan the program holds one block however deep the model; unrolled, each
    layer is its own copy (the compile-time difference the 7B dry run prints)."""
    model = small_model(num_layers=6)
    params = get_params(model)
    tokens = jnp.zeros((1, 16), jnp.int32)

    def hlo(scan):
        f = jax.jit(
            lambda p: decoder.hidden(model.cfg, p, tokens, opts=Options(scan_layers=scan))[0]
        )
        return f.lower(params).as_text()

    def dots(text):
        return text.count("dot_general")

    assert dots(hlo(False)) >= 5 * dots(hlo(True))


def test_auto_unrolls_shallow_models_without_remat_and_scans_the_rest():
    """``scan_layers = "auto"`` (the default): unrolled up to AUTO_UNROLL_LAYERS blocks when
    nothing is rematerialised, the scan otherwise; the program shows which ran."""
    tokens = jnp.zeros((1, 16), jnp.int32)

    def dots(layers, **opts):
        model = small_model(num_layers=layers)
        f = jax.jit(lambda p: decoder.hidden(model.cfg, p, tokens, opts=Options(**opts))[0])
        return f.lower(get_params(model)).as_text().count("dot_general")

    n = decoder.AUTO_UNROLL_LAYERS
    assert Options().scan_layers == "auto" and LearnerConfig().scan_layers == "auto"
    assert dots(n) == dots(n, scan_layers=False) > dots(n, scan_layers=True)
    assert dots(n + 1) == dots(n + 1, scan_layers=True) < dots(n + 1, scan_layers=False)
    assert dots(2, remat="full") == dots(2, remat="full", scan_layers=True)
    assert decoder.scans(Options(scan_layers=True), 1) and not decoder.scans(
        Options(scan_layers=False), 99
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_swiglu_and_its_backward_are_those_of_the_formula(dtype):
    """The MLP activation's own backward pass gives autodiff's gradients of silu(g) * u."""
    rng = np.random.default_rng(0)
    g, u, dy = (jnp.asarray(rng.normal(0, 3, (64, 48)), dtype) for _ in range(3))

    def formula(g, u):
        g32, u32 = g.astype(jnp.float32), u.astype(jnp.float32)
        return (jax.nn.silu(g32) * u32).astype(u.dtype)

    y, vjp = jax.vjp(decoder.swiglu, g, u)
    y_ref, vjp_ref = jax.vjp(formula, g, u)
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    for got, want in zip(vjp(dy), vjp_ref(dy), strict=True):
        assert got.dtype == dtype
        scale = float(jnp.abs(want.astype(jnp.float32)).max())
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol * scale, rtol=tol
        )


def _groups(seed: int = 0, n_groups: int = 3, g: int = 4):
    from shared.wire import Trajectory, TrajectoryGroup

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_groups):
        trajs = []
        for i in range(g):
            n = int(rng.integers(6, 30))
            trajs.append(
                Trajectory(
                    f"t{k}", f"g{k}", i,
                    rng.integers(3, VOCAB, n).astype(np.int32),
                    (rng.random(n) < 0.6).astype(np.uint8),
                    -rng.random(n).astype(np.float32),
                    np.zeros(n, np.int32),
                    reward=float(rng.integers(0, 3)),
                )
            )  # fmt: skip
        out.append(TrajectoryGroup(f"g{k}", f"t{k}", trajs))
    return out


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "constant"])
def test_a_packed_step_is_the_unpacked_step(agg):
    """The whole train step (blockwise attention, chunked logprobs, remat) on trajectories
    packed several per row gives the unpacked step's loss, metrics and new parameters."""
    from learner.training.batching import pack
    from learner.training.step import init_state, train_step

    model = small_model(seed=4)
    groups = _groups()
    cfg = LearnerConfig(
        loss_agg=agg, attention="blockwise", attention_block=16, logprob_chunk=16,
        remat="full", warmup_steps=0, learning_rate=1e-3, kl_coef=0.1,
    )  # fmt: skip
    unpacked = pack(groups, rows=12, buckets=(32, 64))
    packed = pack(groups, rows=5, buckets=(32, 64), packing=True, slots=12)
    assert packed.shape[0] == 5 and packed.stats["packing_efficiency"] > 0.6
    assert packed.stats["packing_efficiency"] > unpacked.stats["packing_efficiency"]
    step = jax.jit(lambda s, b: train_step(s, b, model=model, cfg=cfg))
    params = get_params(model)
    s0, m0 = step(init_state(params, cfg), {k: jnp.asarray(v) for k, v in unpacked.arrays.items()})
    s1, m1 = step(init_state(params, cfg), {k: jnp.asarray(v) for k, v in packed.arrays.items()})
    assert float(m0["grad_norm"]) > 1e-3  # on-policy the loss is ~0; its gradient is not
    for k in ("loss", "entropy", "kl_ref", "clip_fraction", "tokens", "grad_norm"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), atol=1e-5, rtol=1e-5, err_msg=k)
    _close(s1.params, s0.params, "params after the update")
