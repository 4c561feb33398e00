"""The decoder's architecture as a frozen config, read from and written to HF ``config.json``.

Hugging Face ships Llama, Qwen2 and Qwen3 configs in several spellings across
``transformers`` versions (``rope_theta`` + ``rope_scaling`` with ``type`` or
``rope_type``; since v5 one ``rope_parameters`` table); :meth:`ModelConfig.from_hf_config`
reads all of them and refuses what the model does not implement (other
activations, sliding windows, MLP biases, unknown RoPE scalings) with a message
naming the key, rather than loading a model that computes something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SUPPORTED_ROPE = ("linear", "llama3")
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class UnsupportedConfig(ValueError):
    """A ``config.json`` this model cannot reproduce faithfully."""


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency scaling (HF ``rope_scaling``); ``llama3`` uses every field."""

    rope_type: Literal["linear", "llama3"] = field(metadata={"doc": "linear or llama3"})
    factor: float = field(metadata={"doc": "How much longer than trained the context gets."})
    low_freq_factor: float = field(default=1.0, metadata={"doc": "llama3: low band edge."})
    high_freq_factor: float = field(default=4.0, metadata={"doc": "llama3: high band edge."})
    original_max_position_embeddings: int = field(
        default=8192, metadata={"doc": "llama3: the context length of pre-training."}
    )

    @classmethod
    def from_hf(cls, raw: dict[str, Any] | None) -> RopeScaling | None:
        if not raw:
            return None
        kind = raw.get("rope_type", raw.get("type", "default"))
        if kind == "default":
            return None
        if kind not in SUPPORTED_ROPE:
            raise UnsupportedConfig(
                f"rope_scaling type {kind!r} is not supported; supported: "
                f"{', '.join(SUPPORTED_ROPE)} (or none)"
            )
        if kind == "linear":
            return cls("linear", float(raw["factor"]))
        return cls(
            "llama3",
            float(raw["factor"]),
            float(raw.get("low_freq_factor", 1.0)),
            float(raw.get("high_freq_factor", 4.0)),
            int(raw.get("original_max_position_embeddings", 8192)),
        )

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.rope_type, "factor": self.factor}
        if self.rope_type == "llama3":
            out.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return out


def _doc(text: str, default: Any = dataclass) -> Any:
    if default is dataclass:
        return field(metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class ModelConfig:
    """A Llama / Qwen2 / Qwen3 decoder's shape and numerics."""

    vocab_size: int = _doc("Tokens in the vocabulary (rows of the embedding).")
    hidden_size: int = _doc("Width of the residual stream (d_model).")
    intermediate_size: int = _doc("Width of the SwiGLU MLP.")
    num_layers: int = _doc("Decoder blocks.")
    num_heads: int = _doc("Query heads.")
    num_kv_heads: int = _doc("Key/value heads (grouped-query attention; divides num_heads).")
    head_dim: int = _doc("Width of one head.")
    model_type: Literal["llama", "qwen2", "qwen3"] = _doc(
        "HF model_type written on export.", "qwen2"
    )
    max_position_embeddings: int = _doc("Longest sequence the model is meant for.", 1024)
    rms_norm_eps: float = _doc("RMSNorm epsilon.", 1e-6)
    rope_theta: float = _doc("RoPE base.", 10000.0)
    rope_scaling: RopeScaling | None = field(
        default=None, metadata={"doc": "RoPE frequency scaling; None for plain RoPE."}
    )
    qkv_bias: bool = _doc("Biases on the q, k, v projections (Qwen2).", False)
    o_bias: bool = _doc("Bias on the output projection (Llama attention_bias).", False)
    qk_norm: bool = _doc("RMSNorm over each head's queries and keys before RoPE (Qwen3).", False)
    tie_word_embeddings: bool = _doc("The LM head reuses the embedding matrix.", False)
    bos_token_id: int | None = _doc("Begin-of-sequence token, if the model has one.", None)
    eos_token_ids: tuple[int, ...] = _doc("Tokens that end generation.", ())
    pad_token_id: int | None = _doc("Padding token.", None)
    initializer_range: float = _doc("Std of the normal initialiser of weight matrices.", 0.02)
    param_dtype: Literal["float32", "bfloat16"] = _doc("Dtype parameters are stored in.", "float32")
    dtype: Literal["float32", "bfloat16"] = _doc("Dtype activations are computed in.", "float32")

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedConfig(
                f"num_attention_heads = {self.num_heads} is not a multiple of "
                f"num_key_value_heads = {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedConfig(f"head_dim = {self.head_dim}: RoPE needs an even head_dim")
        # what config.json can express: Qwen2 always has q/k/v biases and no o bias; Llama's
        # attention_bias switches all four together
        if self.model_type == "qwen2" and (not self.qkv_bias or self.o_bias):
            raise UnsupportedConfig("qwen2 has q/k/v biases and no o_proj bias")
        if self.model_type in ("llama", "qwen3") and self.qkv_bias != self.o_bias:
            raise UnsupportedConfig(
                f"{self.model_type}'s attention_bias sets q/k/v and o_proj biases together"
            )
        if self.qk_norm != (self.model_type == "qwen3"):
            raise UnsupportedConfig("q/k norms are qwen3's, and qwen3 always has them")

    @classmethod
    def from_hf_config(
        cls, d: dict[str, Any], *, param_dtype: str = "float32", dtype: str = "float32"
    ) -> ModelConfig:
        """Read a HF ``config.json`` dict of a Llama, Qwen2 or Qwen3 model."""
        model_type = d.get("model_type")
        if model_type not in ARCHITECTURES:
            raise UnsupportedConfig(
                f"model_type {model_type!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        _refuse_unsupported(d)
        heads = int(d["num_attention_heads"])
        rope = d.get("rope_parameters") or {}
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = RopeScaling.from_hf(d.get("rope_scaling") or rope)
        attention_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
            model_type=model_type,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            pad_token_id=d.get("pad_token_id"),
            initializer_range=float(d.get("initializer_range", 0.02)),
            param_dtype=param_dtype,  # type: ignore[arg-type]
            dtype=dtype,  # type: ignore[arg-type]
        )

    def to_hf_config(self, torch_dtype: str | None = None) -> dict[str, Any]:
        """A ``config.json`` dict that transformers and SGLang load as this architecture."""
        eos = list(self.eos_token_ids)
        rope_parameters = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope_parameters.update(self.rope_scaling.to_hf())
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
            "torch_dtype": torch_dtype or self.param_dtype,
            "use_cache": True,
        }
        if self.model_type == "qwen2":
            out.update(use_sliding_window=False, sliding_window=None, attention_dropout=0.0)
        elif self.model_type == "qwen3":
            out.update(
                attention_bias=self.qkv_bias,
                use_sliding_window=False,
                sliding_window=None,
                max_window_layers=self.num_layers,
                layer_types=["full_attention"] * self.num_layers,
                attention_dropout=0.0,
            )
        else:
            out.update(attention_bias=self.qkv_bias, mlp_bias=False, attention_dropout=0.0)
        return out

    def num_params(self) -> int:
        """Trainable parameters (the embedding counted once when tied)."""
        e, m, d = self.hidden_size, self.intermediate_size, self.head_dim
        h, kv = self.num_heads, self.num_kv_heads
        attn = e * h * d * 2 + e * kv * d * 2
        attn += (h + 2 * kv) * d if self.qkv_bias else 0
        attn += e if self.o_bias else 0
        attn += 2 * d if self.qk_norm else 0
        per_layer = attn + 3 * e * m + 2 * e
        head = 0 if self.tie_word_embeddings else e * self.vocab_size
        return self.vocab_size * e + self.num_layers * per_layer + e + head


def _refuse_unsupported(d: dict[str, Any]) -> None:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedConfig(f"hidden_act {act!r} is not supported; expected 'silu'")
    if d.get("mlp_bias"):
        raise UnsupportedConfig("mlp_bias = true is not supported")
    if d.get("use_sliding_window"):
        raise UnsupportedConfig("use_sliding_window = true is not supported")
    kinds = set(d.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise UnsupportedConfig(f"layer_types {sorted(kinds)}: only full_attention is supported")
    rope = d.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedConfig(f"partial_rotary_factor = {partial} is not supported")


# The embedded default's tokenizer: shared/assets/tiny_tokenizer (ids of <|endoftext|>,
# <|im_start|>, <|im_end|> are 0, 1, 2).
TINY_VOCAB = 4096
TINY_EOS = (2, 0)  # <|im_end|> ends a turn; <|endoftext|> ends a document
TINY_PAD = 0


def tiny_config(**overrides: Any) -> ModelConfig:
    """The embedded default: 4 layers, d_model 128, 4 heads over 2 KV heads, ~1.3 M parameters."""
    base = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_layers": 4,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 32,
        "model_type": "qwen2",
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "qkv_bias": True,
        "tie_word_embeddings": True,
        "eos_token_ids": TINY_EOS,
        "pad_token_id": TINY_PAD,
    }
    base.update(overrides)
    return ModelConfig(**base)
