"""Batched generation with a KV cache: the compute behind ``learner.serve``.

A batch of requests is padded to a few fixed shapes (batch sizes and sequence
lengths from short bucket lists) so jit compiles a bounded number of programs:
one prefill per (batch, prompt length, cache length) and one decode chunk per
(batch, cache length). Prefill samples each row's first token; then a jitted
chunk of ``decode_chunk`` steps (a ``lax.scan``) runs between host checks for
stop tokens, length limits, aborts and pauses. Rows keep their own positions, so
prompts of different lengths share a batch without left padding.

With ``prefix_cache_tokens`` > 0 the KV of every finished sequence (prompt and
output) is kept in a device pool of that many token slots (``PrefixCache`` says
which tokens sit where). A request whose ``input_ids`` share a prefix with a kept
sequence (the next turn of an episode, a GRPO sibling) copies that prefix's KV from
the pool and runs only the rest through the model: a jitted extend program per
(batch, new-token length, cache length) bucket. ``Request.cached_tokens`` is the
hit length. Any change of weights drops the kept KV. Requests that score their
prompt (``logprob_start_len``) always prefill in full.

What a turn costs follows the context in use, not the cache bucket: extend and decode
attend through :func:`learner.serving.extend.attend_cache` (key tiles up to the furthest
query position, a dynamic trip count), only the new tokens' KV is written back to the
pool (:func:`learner.serving.extend.store`), and prefill uses the memory-efficient attention
(``auto``: blockwise on CPU), so a long prompt never holds P x P scores.

:meth:`Engine.generate` is synchronous and not thread-safe: the server calls it
from one worker thread, which also serialises weight updates with generation.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model import decoder
from learner.model.params import Model, get_params, set_params
from learner.serving import extend
from learner.serving.prefix_cache import NO_SLOTS, PrefixCache
from learner.serving.sampling import row_keys, sample


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
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # (old weight version, output tokens generated under it) for each weight update that
    # reached this request mid-generation: the reply's ``weight_versions`` spans
    version_changes: list[tuple[str, int]] = field(default_factory=list)


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
        prefix_cache_tokens: int = 0,
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
        # the same program for wide batches, without XLA:CPU's YNNPACK fusions (below)
        wide = cpu_compiler_options(NO_YNN_FUSIONS)
        self._decode_wide = (
            self._decode
            if wide is None
            else jax.jit(
                partial(_decode, self.graphdef),
                static_argnums=(9,),
                donate_argnums=(1,),
                compiler_options=wide,
            )
        )
        self._extend = jax.jit(partial(_extend, self.graphdef))
        self._store = jax.jit(extend.store, donate_argnums=(0,))
        self.prefix_cache_tokens = prefix_cache_tokens
        self.prefix: PrefixCache | None = None  # None: disabled
        self._pool: tuple[jax.Array, jax.Array] | None = None  # (k, v), each (L, Hkv, P, D)
        self.flush_cache()

    # ------------------------------------------------------------------------- weights

    def set_model(self, model: Model) -> None:
        """Serve ``model``'s weights from the next batch on (same architecture)."""
        graphdef, state = nnx.split(model)
        if graphdef != self.graphdef:
            raise ValueError("the new model's architecture differs from the served one")
        self.state = _committed(state)
        self.flush_cache()

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
        self.flush_cache()

    def flush_cache(self) -> None:
        """Forget every kept prefix (their KV no longer matches the weights, or was asked
        to go). A batch running meanwhile keeps what it pinned, and keeps nothing new."""
        if self.prefix_cache_tokens > 0:
            self.prefix = PrefixCache(self.prefix_cache_tokens)

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
        prefix = self.prefix
        pins = [NO_SLOTS] * len(reqs)
        if prefix is not None and not want_prompt:  # the last prompt token is always run
            pins = [prefix.acquire(r.input_ids[:-1]) for r in reqs]
        for r, slots in zip(reqs, pins, strict=True):
            r.cached_tokens = len(slots)
        try:
            if any(len(p) for p in pins):
                tok, lp, cache = self._extend_from(reqs, pins, lengths, cache_len, samp)
            else:
                tok, lp, cache, prompt_lp = self._prefill(
                    self.state, jnp.asarray(tokens), jnp.asarray(lengths), cache_len, *samp,
                    want_prompt,
                )  # fmt: skip
                self._record_prompt_logprobs(reqs, np.asarray(prompt_lp) if want_prompt else None)
            cache = self._decode_all(reqs, tok, lp, cache, lengths, samp)
            if prefix is not None and prefix is self.prefix:  # not flushed meanwhile
                self._keep(prefix, reqs, cache)
        finally:
            if prefix is not None:
                for slots in pins:
                    prefix.release(slots)

    def _decode_all(self, reqs, tok, lp, cache, lengths, samp):
        """Record the first tokens and decode until every row is finished; the final cache."""
        for r in reqs:
            if r.params.max_new_tokens <= 0:  # scoring the prompt only
                r.finish_reason = {"type": "length", "length": 0}
        self._record(reqs, np.asarray(tok)[None], np.asarray(lp)[None])
        # placed as the decode program's outputs are (committed to tok's device): an
        # uncommitted first ``pos`` made the first chunk compile a program of its own
        pos, t = jax.device_put(np.asarray(lengths, np.int32), tok.sharding), 1
        decode = self._decode_wide if tok.shape[0] >= DECODE_WIDE_ROWS else self._decode
        while any(r.finish_reason is None for r in reqs):
            self._wait_if_paused(reqs)
            if all(r.finish_reason is not None for r in reqs):
                break
            toks, lps, cache, tok, pos = decode(
                self.state, cache, tok, pos, jnp.int32(t), *samp, self.decode_chunk
            )
            self._record(reqs, np.asarray(toks), np.asarray(lps))
            t += self.decode_chunk
        return cache

    def _extend_from(self, reqs, pins, lengths, cache_len, samp):
        """First tokens and the batch cache, running only what follows each cached prefix."""
        rows = len(lengths)
        starts = np.zeros(rows, np.int32)
        slots = np.zeros((rows, cache_len), np.int32)  # past a row's prefix: overwritten or hidden
        for i, p in enumerate(pins):
            starts[i] = len(p)
            slots[i, : len(p)] = p
        new = lengths - starts
        tokens = np.zeros((rows, bucket(int(new.max()), self.len_buckets)), np.int32)
        for i, r in enumerate(reqs):
            tokens[i, : new[i]] = r.input_ids[starts[i] :]
        return self._extend(
            self.state, self._pool, jnp.asarray(slots), jnp.asarray(starts),
            jnp.asarray(tokens), jnp.asarray(new), *samp,
        )  # fmt: skip

    def _keep(self, prefix: PrefixCache, reqs: list[Request], cache) -> None:
        """Keep each finished row's KV: its prompt and output, less the last token (never
        fed back, so it has none)."""
        if self._pool is None:
            shape = (self.cfg.num_layers, self.cfg.num_kv_heads, prefix.capacity, self.cfg.head_dim)
            zeros = (jnp.zeros(shape, cache[0].dtype), jnp.zeros(shape, cache[1].dtype))
            self._pool = _committed(zeros)  # as the store's outputs are: one compile, not two
        cache_len = cache[0].shape[3]
        rows, pos, dst = [], [], []  # only the entries not in the pool yet (this turn's)
        for i, r in enumerate(reqs):
            if r.finish_reason is None or r.finish_reason["type"] == "abort":
                continue
            seq = r.input_ids + r.output_ids[:-1]
            placed = prefix.insert(seq[:cache_len])
            if placed is not None:
                start, slots = placed
                rows.append(np.full(len(slots), i, np.int32))
                pos.append(np.arange(start, start + len(slots), dtype=np.int32))
                dst.append(slots)
        if dst:
            n = sum(len(x) for x in dst)
            size = bucket(n, _pow2_buckets(64, max(64, 1 << (n - 1).bit_length())))
            pad = size - n  # padding entries go to slot `capacity`: dropped
            rows_a = np.concatenate([*rows, np.zeros(pad, np.int32)])
            pos_a = np.concatenate([*pos, np.zeros(pad, np.int32)])
            dst_a = np.concatenate([*dst, np.full(pad, prefix.capacity, np.int32)])
            self._pool = self._store(
                self._pool, cache, jnp.asarray(rows_a), jnp.asarray(pos_a), jnp.asarray(dst_a)
            )
        for slots in dst:
            prefix.release(slots)

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


PREFILL_OPTIONS = decoder.Options(attention="auto", packed=False)


def _prefill(graphdef, state, tokens, lengths, cache_len, temp, top_p, top_k, seeds, want_prompt):
    """Fill the cache from the prompts and sample each row's first token."""
    model = nnx.merge(graphdef, state)
    # the memory-efficient attention (``auto``: blockwise on CPU, cuDNN on GPU): no P x P scores
    logits, hidden, cache = decoder.prefill(
        model.cfg, get_params(model), tokens, lengths, cache_len, PREFILL_OPTIONS
    )
    tok, lp = sample(logits, temp, top_p, top_k, row_keys(seeds, 0))
    prompt_lp = None
    if want_prompt:  # log p(prompt[t] | prompt[:t]) at the request's temperature
        t = jnp.where(temp < 1e-5, 1.0, temp)[:, None, None]
        logp = jax.nn.log_softmax(model.unembed(hidden[:, :-1]) / t, axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        prompt_lp = jnp.pad(picked, ((0, 0), (1, 0)))
    return tok, lp, cache, prompt_lp


def _extend(graphdef, state, pool, slots, starts, tokens, lengths, temp, top_p, top_k, seeds):
    """Gather each row's cached prefix from the pool, run the new tokens, sample."""
    model = nnx.merge(graphdef, state)
    cache = extend.gather(pool, slots)
    logits, cache = extend.extend(model.cfg, get_params(model), tokens, starts, lengths, cache)
    tok, lp = sample(logits, temp, top_p, top_k, row_keys(seeds, 0))
    return tok, lp, cache


# XLA:CPU hands small matrix products and the decode attention's products summed over
# the keys (learner.serving.extend._scores) to YNNPACK fusions by default, and a YNNPACK fusion
# cannot read a key tile inside the stacked cache, so each tile is copied out first;
# without them XLA's own loops read the cache in place. Which is faster depends on the
# batch's width: bench/decode.py (64 + 128 tokens, 2 cores, medians side by side), the
# Tunix comparison's Qwen2 shape: 128 rows 1.43-1.46 -> 1.07-1.13 s, 32 rows 0.41-0.44 ->
# 0.355-0.36 s, 8 and 1 rows 3-11% faster; the project's tiny model (vocab 4096): 128 rows
# 1.82 -> 1.61 s, 64 rows 0.995 -> 0.92 s, 32 rows 7% faster, but 16 rows 14-17% and 8
# rows 24% slower (as bench/serve.py's 8 concurrent sequences over HTTP, ~20%). So a
# decode chunk of at least DECODE_WIDE_ROWS rows compiles without them, where both models
# gain. (The GRPO step measured the same either way.)
NO_YNN_FUSIONS = (("xla_cpu_experimental_ynn_fusion_type", ""),)
DECODE_WIDE_ROWS = 32


@functools.cache
def cpu_compiler_options(options: tuple[tuple[str, str], ...]) -> dict[str, str] | None:
    """``options`` ((name, value) pairs) as ``jax.jit``'s ``compiler_options`` when the
    default backend is the CPU and this jaxlib takes them (a trivial program compiles with
    them), else None."""
    options = dict(options)
    if jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
    except Exception:  # an XLA without these options: the defaults
        return None
    return options


def _decode(graphdef, state, cache, tok, pos, t0, temp, top_p, top_k, seeds, steps):
    """``steps`` decode steps: feed each row's last token, sample the next."""
    model = nnx.merge(graphdef, state)

    def step(carry, i):
        cache, tok, pos = carry
        logits, cache = extend.decode(model.cfg, get_params(model), tok, pos, cache)
        nxt, lp = sample(logits, temp, top_p, top_k, row_keys(seeds, t0 + i))
        return (cache, nxt, pos + 1), (nxt, lp)

    (cache, tok, pos), (toks, lps) = jax.lax.scan(step, (cache, tok, pos), jnp.arange(steps))
    return toks, lps, cache, tok, pos
