"""Small builders the learner tests share."""

from __future__ import annotations

import numpy as np
from flax import nnx

from learner.model.params import Model, get_params, set_params, tiny_config
from shared.wire import Trajectory


def trajectory(gid: str, i: int, tokens, mask, logp, reward: float, versions=None) -> Trajectory:
    """Sample ``i`` of group ``gid``: the given tokens, loss mask and logprobs (versions 0)."""
    n = len(tokens)
    return Trajectory(
        task_id="t",
        group_id=gid,
        sample_index=i,
        tokens=np.asarray(tokens, np.int32),
        loss_mask=np.asarray(mask, np.uint8),
        logprobs=np.asarray(logp, np.float32),
        versions=np.asarray(versions if versions is not None else [0] * n, np.int32),
        reward=reward,
    )


def randomized(model: Model, scale: float = 0.1, seed: int = 0) -> Model:
    """Every parameter (norms and biases too) moved by N(0, scale): no symmetric zeros or ones."""
    rng = np.random.default_rng(seed)
    params = {
        k: np.asarray(v) + scale * rng.standard_normal(v.shape).astype(np.float32)
        for k, v in get_params(model).items()
    }
    set_params(model, params)
    return model


def small_model(seed: int = 0, **overrides) -> Model:
    """A 2-layer tiny-vocabulary model with random weights of a realistic scale."""
    cfg = tiny_config(**{"num_layers": 2, **overrides})
    return randomized(Model(cfg, rngs=nnx.Rngs(seed)), seed=seed)


@nnx.jit
def forward(model: Model, tokens, positions=None, attention_mask=None):
    """The model's logits, compiled (eager dispatch of every op is slow on CPU)."""
    return model(tokens, positions=positions, attention_mask=attention_mask)


@nnx.jit(static_argnums=(3,))
def prefill(model: Model, tokens, lengths, cache_len: int):
    return model.prefill(tokens, lengths, cache_len)


@nnx.jit(static_argnums=(2,))
def _logprobs(model: Model, tokens, temperature: float):
    from learner.model.params import sequence_logprobs

    return sequence_logprobs(model, tokens, temperature=temperature)


def teacher_forced_logprobs(
    model: Model, seq: list[int], temperature: float = 1.0, pad_to: int = 128
):
    """log p(seq[t] | seq[:t]) for t >= 1 (index 0 is 0), through one compiled shape.

    Padding after the sequence changes nothing before it (attention is causal).
    """
    padded = np.zeros((1, max(pad_to, len(seq))), np.int32)
    padded[0, : len(seq)] = seq
    return np.asarray(_logprobs(model, padded, temperature))[0, : len(seq)]


def greedy_reference(model: Model, prompt: list[int], n: int, pad_to: int = 128) -> list[int]:
    """Argmax decoding with the full forward, one token at a time (no cache)."""
    seq = list(prompt)
    for _ in range(n):
        padded = np.zeros((1, pad_to), np.int32)
        padded[0, : len(seq)] = seq
        seq.append(int(np.argmax(forward(model, padded)[0, len(seq) - 1])))
    return seq[len(prompt) :]


def step_logprobs(model: Model, seq: list[int], cfg=None, pad_to: int = 256) -> np.ndarray:
    """The train step's logprobs of ``seq`` (:func:`learner.training.step.row_logprobs`)."""
    from learner.training.step import row_logprobs

    return row_logprobs(model, seq, cfg, pad_to)


class ListSource:
    """A group source over a fixed list: every group once, in order; weights always load."""

    def __init__(self, groups, per_pull: int | None = None):
        self.groups = groups
        self.per_pull = per_pull  # groups per pull passed to ``on_arrival`` (None: all at once)
        self.pulls: list[list[str]] = []

    def take(self, n, consumed, on_arrival=None):
        out = [g for g in self.groups if g.group_id not in consumed][:n]
        if on_arrival is not None:
            k = self.per_pull or n
            for i in range(0, len(out), k):
                self.pulls.append([g.group_id for g in out[i : i + k]])
                on_arrival(out[i : i + k])
        return out

    def committed(self, group_ids):
        pass

    def flush_acks(self):
        pass

    def push_weights(self, version, path):
        return []
