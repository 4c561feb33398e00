"""Hugging Face checkpoints: logits parity with transformers, export/import round trips.

torch and transformers come from the test-only ``hftest`` extra; without them the
parity tests are skipped (the round trips run regardless).
"""

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from learner.model import safetensors_io
from learner.model.hf import export_hf, load_hf, load_params
from learner.model.params import get_params
from shared.tokenizer import TINY_TOKENIZER_DIR, load_tokenizer
from tests.learner.helpers import forward, small_model

VOCAB = 128


def _hf_model(kind: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
    )
    if kind.startswith("qwen3"):  # per-head q/k norms, no biases, an explicit head_dim
        cfg = transformers.Qwen3Config(
            **common,
            num_key_value_heads=2,
            head_dim=24,  # != hidden / heads = 16
            rope_theta=1_000_000.0,
            tie_word_embeddings=kind == "qwen3_tied",
        )
        cls = transformers.Qwen3ForCausalLM
    elif kind == "qwen2":  # GQA, q/k/v bias, tied embeddings
        cfg = transformers.Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "llama3":  # untied, llama3 RoPE scaling over a short original context
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        cfg = transformers.LlamaConfig(
            **common,
            num_key_value_heads=2,
            rope_theta=500000.0,
            rope_scaling=scaling,
            tie_word_embeddings=False,
        )
        cls = transformers.LlamaForCausalLM
    else:  # linear RoPE scaling, attention_bias (q/k/v and o), one KV head
        cfg = transformers.LlamaConfig(
            **common,
            num_key_value_heads=1,
            attention_bias=True,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
        )
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight random (norms and biases included)
            p.normal_(0.0, 0.2)
    return torch, model


@pytest.mark.parametrize("kind", ["qwen2", "llama3", "llama_linear_bias", "qwen3", "qwen3_tied"])
def test_logits_match_transformers(tmp_path, kind):
    torch, ref_model = _hf_model(kind)
    ref_model.save_pretrained(tmp_path)
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 96))
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(ids)).logits.numpy()
    ours = load_hf(tmp_path)
    out = np.asarray(forward(ours, jnp.asarray(ids)))
    assert np.abs(ref).max() > 0.5  # logits of a realistic scale: 1e-4 is a real bound
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    if kind == "llama3":  # the scaling is exercised: dropping it changes the logits
        import dataclasses

        from flax import nnx

        from learner.model.params import Model, set_params

        plain = Model(dataclasses.replace(ours.cfg, rope_scaling=None), rngs=nnx.Rngs(0))
        set_params(plain, get_params(ours))
        assert np.abs(np.asarray(forward(plain, jnp.asarray(ids))) - ref).max() > 1e-3


def test_sharded_checkpoint_with_index_loads(tmp_path):
    torch, ref_model = _hf_model("qwen2")
    ref_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ids = np.arange(20)[None] % VOCAB
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(forward(load_hf(tmp_path), jnp.asarray(ids)), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "arch",
    [
        dict(model_type="llama", tie_word_embeddings=False, qkv_bias=True, o_bias=True),
        dict(model_type="qwen3", tie_word_embeddings=False, qkv_bias=False, qk_norm=True),
    ],
    ids=["llama", "qwen3"],
)
def test_export_import_is_bit_exact_in_float32(tmp_path, arch):
    model = small_model(**arch)
    export_hf(
        model,
        tmp_path / "out",
        tokenizer_dir=TINY_TOKENIZER_DIR,
        dtype="float32",
        max_shard_bytes=1 << 20,
    )
    out = tmp_path / "out"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards)
    config = json.loads((out / "config.json").read_text())
    arch_name = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch["model_type"]]
    assert config["torch_dtype"] == "float32" and config["architectures"] == [arch_name]
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    loaded = load_hf(out)
    assert loaded.cfg == model.cfg
    a, b = get_params(model), get_params(loaded)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def test_bfloat16_export_loads_the_rounded_weights(tmp_path):
    model = small_model()
    export_hf(model, tmp_path / "bf16", dtype="bfloat16")
    config = json.loads((tmp_path / "bf16/config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    (shard,) = (tmp_path / "bf16").glob("*.safetensors")
    header, _ = safetensors_io.read_header(shard)
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    loaded = get_params(load_hf(tmp_path / "bf16"))
    for k, v in get_params(model).items():
        rounded = np.asarray(v).astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(np.asarray(loaded[k]), rounded), k
    assert any(not np.array_equal(np.asarray(v), loaded[k]) for k, v in get_params(model).items())


def test_export_replaces_an_existing_directory_whole(tmp_path):
    out = tmp_path / "exp"
    export_hf(small_model(seed=1), out, dtype="float32")
    (out / "stale.txt").write_text("from the old export")
    model = small_model(seed=2)
    export_hf(model, out, dtype="float32")
    assert not (out / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    params = load_params(out, model.cfg)
    assert np.array_equal(params["norm.weight"], np.asarray(get_params(model)["norm.weight"]))


def test_transformers_loads_our_export_and_tokenizer(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = small_model()
    export_hf(model, tmp_path, tokenizer_dir=TINY_TOKENIZER_DIR, dtype="float32")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = np.random.default_rng(3).integers(0, 4096, (1, 30))
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(forward(model, jnp.asarray(ids)), ref, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "Find it."}, {"role": "user", "content": "Où? 42"}]
    text = ours.apply_chat_template(messages)
    assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert hf_tok.eos_token_id == ours.eos_id and hf_tok.pad_token_id == ours.pad_id
