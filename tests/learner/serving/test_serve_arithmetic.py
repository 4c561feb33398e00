"""The arithmetic model behind ``bench/serve.py --episode``'s ``flops_model``: its
per-token matmul count is the model's own weight count, and the prefix cache's
turns run only their new tokens."""

from __future__ import annotations

import math

import numpy as np
from flax import nnx

from learner.model.params import Model, get_params, tiny_config
from tests.conftest import load_bench


def _bench():
    return load_bench("serve")


def test_a_tokens_matmul_flops_are_twice_the_models_matrix_weights():
    bench = _bench()
    cfg = tiny_config()
    params = get_params(Model(cfg, rngs=nnx.Rngs(0)))
    # every per-layer weight matrix (stacked over layers: 3-D and up, biases aside) is a matmul; the tied embedding is
    # the unembedding's matrix (counted once); norms and biases are not matmuls
    per_layer = [
        v for k, v in params.items() if k.startswith("layers.") and v.ndim >= 3 and "bias" not in k
    ]
    matmul = sum(math.prod(v.shape) for v in per_layer) + math.prod(params["embed_tokens"].shape)
    # position -1: attention over no key
    assert bench.token_flops(cfg, -1) == 2 * matmul
    # one more key adds QK^T and AV over every head of every layer
    step = bench.token_flops(cfg, 1) - bench.token_flops(cfg, 0)
    assert step == 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim


def test_cached_turns_run_only_their_new_tokens():
    bench = _bench()
    cfg = tiny_config()
    turns = [
        {"context": 200, "cached": 0, "output_ids": [0] * 30},
        {"context": 500, "cached": 229, "output_ids": [0] * 30},
    ]
    plain, cached = bench.turn_flops(cfg, turns, False), bench.turn_flops(cfg, turns, True)
    assert plain[0] == cached[0]  # nothing cached on the first turn
    want = sum(bench.token_flops(cfg, p) for p in range(229, 529))
    assert np.isclose(cached[1], want)
    assert np.isclose(plain[1], want + sum(bench.token_flops(cfg, p) for p in range(229)))
    ratios = bench.arithmetic(turns)
    assert ratios["tiny"]["cache_last_over_first"] < ratios["tiny"]["no_cache_last_over_first"]
    assert set(ratios) == {"tiny", "qwen2.5-7b"}
