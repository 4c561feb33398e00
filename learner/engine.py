"""Batched generation with a KV cache: the compute behind ``learner.serve``.

A batch of requests is padded to a few fixed shapes (batch sizes and sequence
lengths from short bucket lists) so jit compiles a bounded number of programs:
one prefill per (batch, prompt length, cache length) and one decode chunk per
(batch, cache length). Prefill samples each row's first token; then a jitted
chunk of ``decode_chunk`` steps (a ``lax.scan``) runs between host checks for
stop tokens, length limits, aborts and pauses. Rows keep their own positions, so
prompts of different lengths share a batch without left padding.

:meth:`Engine.generate` is synchronous and not thread-safe: the server calls it
from one worker thread, which also serialises weight updates with generation.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model import Model, get_params, set_params
from learner.sampling import row_keys, sample


@dataclass
class SamplingParams:
    """Per-request sampling, as SGLang's ``sampling_params`` names it."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None


@dataclass
class Request:
    """One sequence to generate, and what has been generated for it so far."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    logprob_start_len: int = -1  # >= 0: also score the prompt from this position
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    finish_reason: dict[str, Any] | None = None
    aborted: bool = False  # set from another thread; read between decode chunks


def bucket(n: int, sizes: Sequence[int]) -> int:
    """The smallest size >= n."""
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes):
        raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")
    return sizes[i]


def _pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    out, n = [], lo
    while n < hi:
        out.append(n)
        n *= 2
    return (*out, hi)


class Engine:
    """Holds the model's weights and the compiled prefill and decode programs."""

    def __init__(
        self,
        model: Model,
        *,
        eos_ids: Sequence[int] = (),
        max_batch: int = 64,
        max_len: int | None = None,
        decode_chunk: int = 8,
        seed: int = 0,
    ) -> None:
        self.cfg = model.cfg
        self.graphdef, state = nnx.split(model)
        self.state = _committed(state)
        self.eos_ids = tuple(eos_ids)
        self.max_len = min(max_len or model.cfg.max_position_embeddings, 1 << 20)
        self.batch_buckets = _pow2_buckets(1, max_batch)
        self.len_buckets = _pow2_buckets(min(64, self.max_len), self.max_len)
        self.decode_chunk = decode_chunk
        self.resume = threading.Event()  # cleared: decoding waits between chunks (in-place pause)
        self.resume.set()
        self._rng = np.random.default_rng(seed)
        self._prefill = jax.jit(partial(_prefill, self.graphdef), static_argnums=(3, 8))
        self._decode = jax.jit(
            partial(_decode, self.graphdef), static_argnums=(9,), donate_argnums=(1,)
        )

    # ------------------------------------------------------------------------- weights

    def set_model(self, model: Model) -> None:
        """Serve ``model``'s weights from the next batch on (same architecture)."""
        graphdef, state = nnx.split(model)
        if graphdef != self.graphdef:
            raise ValueError("the new model's architecture differs from the served one")
        self.state = _committed(state)

    def set_params(self, params: Mapping[str, Any]) -> None:
        """Serve these weights (by parameter path, e.g. a train state's ``params``) from the
        next batch on. Each is copied onto the placement and dtype of the weight it
        replaces, so the compiled programs are reused (a train state's arrays, placed on
        the learner's mesh, would otherwise compile them again) and a later donation of
        the train state cannot delete what is served."""
        model = nnx.merge(self.graphdef, self.state)
        current = get_params(model)
        placed = {}
        for name, value in params.items():
            old = current.get(name)
            if old is not None and tuple(value.shape) == tuple(old.shape):
                value = jax.device_put(np.asarray(value).astype(old.dtype), old.sharding)
            placed[name] = value  # a name or shape that does not match: set_params refuses it
        set_params(model, placed)
        self.state = nnx.split(model)[1]

    # ------------------------------------------------------------------------- generation

    def check(self, req: Request) -> str | None:
        """Why a request cannot be served, or None."""
        n = len(req.input_ids)
        if n == 0:
            return "input_ids is empty"
        if n >= self.max_len:
            return f"the prompt has {n} tokens; the context holds {self.max_len}"
        if any(not 0 <= t < self.cfg.vocab_size for t in req.input_ids):
            return f"input_ids must lie in [0, {self.cfg.vocab_size})"
        return None

    def _layout(self, reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, int]:
        """Prompts right-padded to a bucket: tokens (B, P), lengths (B,), and the cache length.

        Padding rows (up to the batch bucket) hold one token and are never read.
        """
        for r in reqs:  # a request never runs past the context
            r.params.max_new_tokens = min(r.params.max_new_tokens, self.max_len - len(r.input_ids))
        rows = bucket(len(reqs), self.batch_buckets)
        lengths = np.array([len(r.input_ids) for r in reqs] + [1] * (rows - len(reqs)), np.int32)
        plen = bucket(int(lengths.max()), self.len_buckets)
        need = max(len(r.input_ids) + r.params.max_new_tokens for r in reqs)
        tokens = np.zeros((rows, plen), np.int32)
        for i, r in enumerate(reqs):
            tokens[i, : len(r.input_ids)] = r.input_ids
        return tokens, lengths, max(bucket(need, self.len_buckets), plen)

    def generate(self, reqs: list[Request]) -> None:
        """Generate for every request in place (``output_ids``, logprobs, ``finish_reason``)."""
        if not reqs:
            return
        tokens, lengths, cache_len = self._layout(reqs)
        samp = self._sampling_arrays(reqs, len(lengths))
        # a start at the prompt's end (how clients ask for output logprobs only) scores nothing
        want_prompt = any(0 <= r.logprob_start_len < len(r.input_ids) for r in reqs)
        tok, lp, cache, prompt_lp = self._prefill(
            self.state, jnp.asarray(tokens), jnp.asarray(lengths), cache_len, *samp, want_prompt
        )
        self._record_prompt_logprobs(reqs, np.asarray(prompt_lp) if want_prompt else None)
        for r in reqs:
            if r.params.max_new_tokens <= 0:  # scoring the prompt only
                r.finish_reason = {"type": "length", "length": 0}
        self._record(reqs, np.asarray(tok)[None], np.asarray(lp)[None])
        pos, t = jnp.asarray(lengths, jnp.int32), 1
        while any(r.finish_reason is None for r in reqs):
            self._wait_if_paused(reqs)
            if all(r.finish_reason is not None for r in reqs):
                break
            toks, lps, cache, tok, pos = self._decode(
                self.state, cache, tok, pos, jnp.int32(t), *samp, self.decode_chunk
            )
            self._record(reqs, np.asarray(toks), np.asarray(lps))
            t += self.decode_chunk

    def _sampling_arrays(self, reqs: list[Request], rows: int) -> tuple[jax.Array, ...]:
        pad = rows - len(reqs)
        seeds = [
            r.params.seed if r.params.seed is not None else int(self._rng.integers(2**31))
            for r in reqs
        ]
        return (
            jnp.asarray([r.params.temperature for r in reqs] + [0.0] * pad, jnp.float32),
            jnp.asarray([r.params.top_p for r in reqs] + [1.0] * pad, jnp.float32),
            jnp.asarray([r.params.top_k for r in reqs] + [-1] * pad, jnp.int32),
            jnp.asarray([s % 2**32 for s in seeds] + [0] * pad, jnp.uint32),
        )

    def _wait_if_paused(self, reqs: list[Request]) -> None:
        """Hold between chunks while paused in place; an abort ends the wait."""
        while not self.resume.wait(0.05):
            if all(r.aborted or r.finish_reason is not None for r in reqs):
                break
        for r in reqs:
            if r.aborted and r.finish_reason is None:
                r.finish_reason = {"type": "abort", "message": "aborted"}

    def _record(self, reqs: list[Request], toks: np.ndarray, lps: np.ndarray) -> None:
        """Append steps (K, B) to the unfinished rows, stopping each where it ends."""
        for i, r in enumerate(reqs):
            for k in range(toks.shape[0]):
                if r.finish_reason is not None:
                    break
                if r.aborted:
                    r.finish_reason = {"type": "abort", "message": "aborted"}
                    break
                tid = int(toks[k, i])
                r.output_ids.append(tid)
                r.output_logprobs.append(float(lps[k, i]))
                stops = r.params.stop_token_ids + (() if r.params.ignore_eos else self.eos_ids)
                if tid in stops:
                    r.finish_reason = {"type": "stop", "matched": tid}
                elif len(r.output_ids) >= r.params.max_new_tokens:
                    r.finish_reason = {"type": "length", "length": len(r.output_ids)}

    def _record_prompt_logprobs(self, reqs: list[Request], prompt_lp: np.ndarray | None) -> None:
        for i, r in enumerate(reqs):
            n = len(r.input_ids)
            if r.logprob_start_len < 0:
                continue
            if r.logprob_start_len >= n or prompt_lp is None:
                r.input_logprobs = []
                continue
            lp = [None] + [float(x) for x in prompt_lp[i, 1:n]]
            r.input_logprobs = lp[r.logprob_start_len :]


def _committed(state: Any) -> Any:
    """The weights committed to the devices they are on: jit keys its programs on
    commitment too, so weights placed later (:meth:`Engine.set_params`) match them."""
    return jax.tree.map(lambda a: jax.device_put(a, a.sharding), state)


# ----------------------------------------------------------------------------- jitted


def _prefill(graphdef, state, tokens, lengths, cache_len, temp, top_p, top_k, seeds, want_prompt):
    """Fill the cache from the prompts and sample each row's first token."""
    model = nnx.merge(graphdef, state)
    logits, hidden, cache = model.prefill(tokens, lengths, cache_len)
    tok, lp = sample(logits, temp, top_p, top_k, row_keys(seeds, 0))
    prompt_lp = None
    if want_prompt:  # log p(prompt[t] | prompt[:t]) at the request's temperature
        t = jnp.where(temp < 1e-5, 1.0, temp)[:, None, None]
        logp = jax.nn.log_softmax(model.unembed(hidden[:, :-1]) / t, axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        prompt_lp = jnp.pad(picked, ((0, 0), (1, 0)))
    return tok, lp, cache, prompt_lp


def _decode(graphdef, state, cache, tok, pos, t0, temp, top_p, top_k, seeds, steps):
    """``steps`` decode steps: feed each row's last token, sample the next."""
    model = nnx.merge(graphdef, state)

    def step(carry, i):
        cache, tok, pos = carry
        logits, cache = model.decode(tok, pos, cache)
        nxt, lp = sample(logits, temp, top_p, top_k, row_keys(seeds, t0 + i))
        return (cache, nxt, pos + 1), (nxt, lp)

    (cache, tok, pos), (toks, lps) = jax.lax.scan(step, (cache, tok, pos), jnp.arange(steps))
    return toks, lps, cache, tok, pos
