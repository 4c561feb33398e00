"""The decoder: KV-cache decode against the full forward, RoPE scalings, configs, axes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.model.config import UnsupportedConfig
from learner.model.params import (
    Model,
    ModelConfig,
    RopeScaling,
    apply,
    get_params,
    param_info,
    rope_inv_freq,
    sequence_logprobs,
    tiny_config,
)
from shared.tokenizer import load_tokenizer
from tests.learner.helpers import forward, prefill, small_model


def test_kv_cache_decode_matches_full_forward():
    model = small_model()
    rng = np.random.default_rng(1)
    b, t, p, s = 3, 40, 32, 64
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (b, t)))
    full = np.asarray(forward(model, tokens))  # (B, T, V)
    assert np.abs(full).max() > 1.0  # logits of a realistic scale, so 1e-5 is a real bound
    lengths = jnp.array([5, 17, 32])  # rows at different positions share the batch
    prompt = jnp.where(jnp.arange(p)[None] < lengths[:, None], tokens[:, :p], 0)
    logits, _, cache = prefill(model, prompt, lengths, s)
    rows = np.arange(b)
    np.testing.assert_allclose(logits, full[rows, lengths - 1], atol=1e-5, rtol=0)
    pos = lengths
    decode = jax.jit(lambda tok, pos, cache: model.decode(tok, pos, cache))
    for _ in range(8):
        logits, cache = decode(tokens[rows, pos], pos, cache)
        np.testing.assert_allclose(logits, full[rows, pos], atol=1e-5, rtol=0)
        pos = pos + 1


def test_padding_mask_and_positions_match_unpadded_rows():
    model = small_model()
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 4096, (1, 12)))
    alone = np.asarray(forward(model, tokens))
    # the same row left-padded by 4: mask the padding and shift the positions back
    padded = jnp.concatenate([jnp.zeros((1, 4), tokens.dtype), tokens], axis=1)
    mask = jnp.arange(16)[None] >= 4
    positions = jnp.maximum(jnp.arange(16)[None] - 4, 0)
    out = np.asarray(forward(model, padded, positions, mask))[:, 4:]
    np.testing.assert_allclose(out, alone, atol=1e-5, rtol=0)


def test_sequence_logprobs_are_log_softmax_at_the_next_token():
    model = small_model()
    tokens = jnp.asarray([[5, 9, 11, 7]])
    logp = np.asarray(sequence_logprobs(model, tokens, temperature=2.0))
    logits = np.asarray(forward(model, tokens), np.float64)[0] / 2.0
    shifted = logits - logits.max(-1, keepdims=True)
    ref = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # log_softmax
    expected = [0.0] + [ref[t - 1, tokens[0, t]] for t in range(1, 4)]
    np.testing.assert_allclose(logp[0], expected, atol=1e-5)


def test_rope_linear_and_llama3_frequencies_by_hand():
    # head_dim 4, theta 10000: inv_freq = [10000^0, 10000^-0.5] = [1, 0.01]
    base = tiny_config(head_dim=4, num_heads=2, num_kv_heads=1)
    np.testing.assert_allclose(rope_inv_freq(base), [1.0, 0.01], rtol=1e-6)
    linear = dataclasses.replace(base, rope_scaling=RopeScaling("linear", 4.0))
    np.testing.assert_allclose(rope_inv_freq(linear), [0.25, 0.0025], rtol=1e-6)
    # llama3, factor 8, bands 1 / 4, original context 64: wavelengths 2*pi (short: kept) and
    # 628.3 (> 64: divided by 8) -> [1, 0.00125]
    far = dataclasses.replace(base, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64))
    np.testing.assert_allclose(rope_inv_freq(far), [1.0, 0.00125], rtol=1e-6)
    # original context 1000: 628.3 lies between 1000/4 and 1000/1, so it is blended:
    # s = (1000 / 628.32 - 1) / 3 = 0.19718; (1 - s) * 0.01 / 8 + s * 0.01 = 0.0029753
    mid = dataclasses.replace(base, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 1000))
    np.testing.assert_allclose(rope_inv_freq(mid), [1.0, 0.0029753], rtol=1e-4)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"num_key_value_heads": 3}, "not a multiple"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, message):
    hf = {**tiny_config().to_hf_config(), **change}
    with pytest.raises(UnsupportedConfig, match=message):
        ModelConfig.from_hf_config(hf)


def test_hf_config_round_trip_in_every_rope_spelling():
    cfg = tiny_config(
        model_type="llama",
        qkv_bias=False,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 512),
        bos_token_id=1,
    )
    hf = cfg.to_hf_config()
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["torch_dtype"] == "float32"
    assert ModelConfig.from_hf_config(hf) == cfg
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}  # transformers 4.x
    assert ModelConfig.from_hf_config(legacy) == cfg
    v5 = {k: v for k, v in hf.items() if k not in ("rope_scaling", "rope_theta")}
    assert ModelConfig.from_hf_config(v5) == cfg
    old_key = {**legacy, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert ModelConfig.from_hf_config(old_key).rope_scaling == RopeScaling("linear", 2.0)
    assert ModelConfig.from_hf_config(tiny_config().to_hf_config()) == tiny_config()


def test_tiny_config_fits_its_tokenizer_and_budget():
    cfg = tiny_config()
    assert cfg.vocab_size == load_tokenizer().vocab_size
    model = Model(cfg, rngs=nnx.Rngs(0))
    n = sum(int(np.prod(v.shape)) for v in get_params(model).values())
    assert n == cfg.num_params() and 500_000 <= n <= 2_000_000


def test_every_parameter_has_logical_axes():
    known = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "norm", "layers"}
    infos = param_info(Model(tiny_config(num_layers=3), rngs=nnx.Rngs(0)))
    for p in infos:
        assert len(p.axes) == len(p.shape) and set(p.axes) <= known, p
    by_path = {p.path: p for p in infos}
    assert by_path["embed_tokens"].axes == ("vocab", "embed")
    assert by_path["norm.weight"].axes == ("norm",)
    # the blocks' parameters are stacked along a leading layer axis
    assert by_path["layers.mlp.gate_proj"].axes == ("layers", "embed", "mlp")
    assert by_path["layers.mlp.gate_proj"].shape == (3, 128, 384)
    assert by_path["layers.self_attn.q_proj"].axes == ("layers", "embed", "heads", "head_dim")
    assert all(p.path.startswith("layers.") == (p.axes[0] == "layers") for p in infos)


def test_bfloat16_params_and_compute():
    f32 = small_model()
    bf16 = Model(
        tiny_config(num_layers=2, param_dtype="bfloat16", dtype="bfloat16"), rngs=nnx.Rngs(0)
    )
    from learner.model.params import set_params

    set_params(bf16, get_params(f32))
    assert all(v.dtype == jnp.bfloat16 for v in get_params(bf16).values())
    tokens = jnp.asarray([[3, 14, 15, 92, 65]])
    out, ref = forward(bf16, tokens), forward(f32, tokens)
    assert out.dtype == jnp.float32  # logits always come out in float32
    # bf16 keeps ~3 significant digits; over 2 layers the logits stay within a few percent
    assert float(jnp.abs(out - ref).max()) < 0.05 * float(jnp.abs(ref).max())


def test_apply_is_a_pure_function_of_the_flat_params():
    model = small_model()
    params = get_params(model)
    tokens = jnp.asarray([[3, 14, 15, 92, 65, 35]])

    def loss(p):  # mean next-token negative log-likelihood
        logp = jax.nn.log_softmax(apply(model, p, tokens)[:, :-1], axis=-1)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert grads.keys() == params.keys() and float(jnp.abs(grads["embed_tokens"]).sum()) > 0
    np.testing.assert_allclose(apply(model, params, tokens), forward(model, tokens), atol=1e-5)
    doubled = {k: v * 2 for k, v in params.items()}
    assert float(jnp.abs(apply(model, doubled, tokens) - forward(model, tokens)).max()) > 0.1
    assert all(np.array_equal(v, params[k]) for k, v in get_params(model).items())  # untouched
    assert np.isfinite(float(value))
