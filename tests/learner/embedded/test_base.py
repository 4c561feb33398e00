"""The tiny base model: `python -m learner.base` and the copy of it shipped in shared/assets."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.embedded.base import DEFAULT_OUT, build_base
from learner.embedded.sft import COPY_LEN, copy_batch
from learner.model.loading import is_hf_dir, load_weights_into
from learner.model.params import get_params
from learner.training.loop import build_model
from shared.config import from_dict


def _copy_loss(model, rows: int = 4, seed: int = 7) -> float:
    b = copy_batch(np.random.default_rng(seed), rows, COPY_LEN, model.cfg.vocab_size)
    logits = model(jnp.asarray(b["tokens_bt"]))
    logp = jax.nn.log_softmax(logits, -1)
    lp = jnp.take_along_axis(logp, jnp.asarray(b["targets_bt"])[..., None], -1)[..., 0]
    c = jnp.asarray(b["copy_bt"])
    return float(-(lp * c).sum() / c.sum())


def test_build_base_writes_a_loadable_hf_dir_and_refuses_without_the_drop(tmp_path):
    cfg = from_dict({})
    # 3 steps are still at chance (ln 4096 = 8.3): under a target of 9 it stops and writes.
    info = build_base(cfg, tmp_path / "base", max_steps=3, target_loss=9.0, seed=1)
    assert info["steps"] == 3 and 7.0 < info["copy_loss"] < 9.0
    assert is_hf_dir(tmp_path / "base")
    assert json.loads((tmp_path / "base" / "base.json").read_text())["exercise"] == "copy"
    model, _ = build_model(cfg)
    load_weights_into(model, tmp_path / "base")
    # A target it cannot reach in 3 steps: an error, and nothing written.
    with pytest.raises(RuntimeError, match="drop has not come"):
        build_base(cfg, tmp_path / "none", max_steps=3, target_loss=0.1)
    assert not (tmp_path / "none").exists()


def test_the_shipped_base_copies_and_differs_from_a_fresh_model():
    assert is_hf_dir(DEFAULT_OUT), "shared/assets/tiny_base is missing: run `make base`"
    info = json.loads((DEFAULT_OUT / "base.json").read_text())
    assert info["exercise"] == "copy" and info["copy_loss"] < 0.3
    cfg = from_dict({})
    fresh, _ = build_model(cfg)
    base, _ = build_model(cfg)
    load_weights_into(base, DEFAULT_OUT)
    assert _copy_loss(fresh) > 7.0  # chance
    assert _copy_loss(base) < 0.5  # it continues a span it has seen, on rows it never saw
    a, b = get_params(fresh), get_params(base)
    assert any(not np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
