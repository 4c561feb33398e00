"""The train state and the one GRPO train step, jitted once with its shardings.

:class:`TrainState` is one pytree: step, parameters (flat dict by dotted path),
optimiser state, PRNG key, and the frozen reference parameters when a KL term is
on. :func:`train_step` is pure: the policy's token logprobs (:func:`token_logprobs`:
``learner.model.decoder`` with the configured remat, layer scan and attention kernel,
then ``learner.model.logprobs`` chunk by chunk, so no (B, T, vocab) array is held), the
GRPO loss, its gradient, one AdamW update (warm-up then cosine or constant,
global-norm clipping), and metrics (loss terms, entropy, gradient norm, learning
rate). A batch may carry the reference's logprobs (``ref_logp_bt``); only without
them does the step run the reference's forward pass itself. :func:`compile_step`
jits it once with the mesh's shardings (the state donated, the batch split over
``("data", "fsdp")``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.model import decoder
from learner.model.decoder import Options
from learner.model.logprobs import chunked_token_logprobs
from learner.model.params import Model, get_params
from learner.training.grpo import agg_denominator, grpo_loss
from learner.training.sharding import param_shardings
from shared.config import LearnerConfig

BATCH_AXES = ("data", "fsdp")
LR_FLOOR = 0.1  # the cosine decays to this fraction of the peak learning rate


class TrainState(NamedTuple):
    step: jax.Array  # () int32
    params: dict[str, jax.Array]
    opt_state: Any
    rng: jax.Array  # a typed PRNG key
    ref_params: dict[str, jax.Array] | None = None


def lr_schedule(cfg: LearnerConfig) -> optax.Schedule:
    """Linear warm-up to the peak, then cosine decay to ``LR_FLOOR`` x peak at ``cfg.steps``
    (or the peak held, ``lr_schedule = "constant"``)."""
    if cfg.lr_schedule == "constant":
        if cfg.warmup_steps == 0:
            return optax.constant_schedule(cfg.learning_rate)
        return optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    decay = max(cfg.steps, cfg.warmup_steps + 1)
    return optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, cfg.warmup_steps, decay, end_value=LR_FLOOR * cfg.learning_rate
    )


def optimizer(cfg: LearnerConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(lr_schedule(cfg), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if cfg.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)
    return adamw


def init_state(
    params: Mapping[str, jax.Array], cfg: LearnerConfig, *, with_ref: bool | None = None
) -> TrainState:
    """A fresh state (step 0) around ``params``; the reference is a copy when KL is on."""
    params = dict(params)
    with_ref = cfg.kl_coef > 0 if with_ref is None else with_ref
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer(cfg).init(params),
        rng=jax.random.key(cfg.seed),
        ref_params=jax.tree.map(jnp.copy, params) if with_ref else None,
    )


def row_logprobs(
    model: Model, seq: Sequence[int], cfg: LearnerConfig | None = None, pad_to: int = 256
) -> np.ndarray:
    """log p(seq[t] | seq[:t]) for t = 1 .. len(seq) - 1 (index t - 1), by
    :func:`token_logprobs` on one row padded to ``pad_to`` tokens (or the sequence's
    length): what the learner computes for a sequence an inference engine sampled."""
    t = max(pad_to, len(seq))
    tokens = np.zeros((1, t), np.int32)
    targets = np.zeros((1, t), np.int32)
    tokens[0, : len(seq) - 1] = seq[:-1]
    targets[0, : len(seq) - 1] = seq[1:]
    batch = {
        "tokens_bt": jnp.asarray(tokens),
        "targets_bt": jnp.asarray(targets),
        "positions_bt": jnp.arange(t)[None],
        "attn_bt": jnp.asarray((np.arange(t) < len(seq) - 1).astype(np.int32)[None]),
    }
    logp, _ = token_logprobs(model, get_params(model), batch, cfg)
    return np.asarray(logp)[0, : len(seq) - 1]


def token_logprobs(
    model: Model,
    params: Mapping[str, jax.Array],
    batch: Mapping[str, jax.Array],
    cfg: LearnerConfig | None = None,
    *,
    with_entropy: bool = False,
    temperature: float | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """(log p(target_t | inputs_<=t) (B, T), the policy's entropy there (B, T) or None)
    under ``params``, run as ``cfg`` says (remat, attention kernel, layer scan, logprob
    chunk, ``learner.temperature``; default: dense, unchunked, 1). Tokens see earlier
    tokens of their own segment (``segment_bt``, else ``attn_bt``: 0 = padding).
    ``temperature`` overrides the config's (SFT trains at 1)."""
    if temperature is None:
        temperature = (cfg.temperature if cfg is not None else None) or 1.0
    opts = Options.of(cfg) if cfg is not None else Options()
    segments = batch.get("segment_bt", batch["attn_bt"])
    h_bte, _ = decoder.hidden(
        model.cfg, params, batch["tokens_bt"], batch["positions_bt"], segments, opts
    )
    return chunked_token_logprobs(
        h_bte,
        functools.partial(decoder.unembed, model.cfg, params),
        batch["targets_bt"],
        chunk=cfg.logprob_chunk if cfg is not None else 0,
        temperature=temperature,
        with_entropy=with_entropy,
    )


# Metrics that are means over the tokens trained on: micro-batches' values are weighted
# by their token counts; the others combine as named.
_TOKEN_MEANS = ("clip_fraction", "approx_kl", "ratio_mean", "kl_ref", "entropy", "rollout_kl")
_COMBINE = {"ratio_max": jnp.maximum, "ratio_min": jnp.minimum}  # the rest add up
_IDENTITY = {"ratio_max": -jnp.inf, "ratio_min": jnp.inf}


def micro_batches(batch: Mapping[str, jax.Array], n: int) -> dict[str, jax.Array]:
    """Each (B, ...) array as (n, B/n, ...): micro-batch ``m`` takes rows m, m+n, m+2n, ...
    so that, with rows split over devices in contiguous blocks (B/n a multiple of the
    ways), every micro-batch is spread over all the devices and none is moved."""

    def split(x):
        rows = x.shape[0]
        if rows % n:
            raise ValueError(f"{rows} rows do not split into {n} micro-batches")
        return jnp.swapaxes(x.reshape(rows // n, n, *x.shape[1:]), 0, 1)

    return {k: split(v) for k, v in batch.items()}


def _micro_step(params, ref_params, mb, denominator, *, model: Model, cfg: LearnerConfig):
    """One micro-batch: (its share of the loss, metrics as sums, gradients)."""
    mask_bt = mb["mask_bt"]
    ref_logp_bt = mb.get("ref_logp_bt")  # given with the batch: no reference forward here
    if ref_logp_bt is None and ref_params is not None and cfg.kl_coef > 0:
        ref_logp_bt = jax.lax.stop_gradient(token_logprobs(model, ref_params, mb, cfg)[0])

    def loss_fn(params):
        logp_bt, ent_bt = token_logprobs(model, params, mb, cfg, with_entropy=True)
        old = mb.get("old_logp_bt")
        old_logp_bt = jax.lax.stop_gradient(logp_bt) if old is None else old
        loss, m = grpo_loss(
            logp_bt,
            old_logp_bt,
            mb["adv_bt"] if "adv_bt" in mb else mb["adv_b"],  # packed rows: per token
            mask_bt,
            clip_low=cfg.clip_eps_low,
            clip_high=cfg.clip_eps_high,
            agg=cfg.loss_agg,
            ref_logp_bt=ref_logp_bt,
            kl_coef=cfg.kl_coef,
            rollout_logp_bt=mb["rollout_logp_bt"],
            tis_cap=cfg.tis_cap,
            denominator=denominator,
            segment_bt=mb.get("segment_bt"),
        )
        n = jnp.maximum(mask_bt.sum(), 1.0)
        m["entropy"] = (ent_bt * mask_bt).sum() / n
        m["rollout_kl"] = ((mb["rollout_logp_bt"] - logp_bt) * mask_bt).sum() / n
        for k in _TOKEN_MEANS:  # means over this micro-batch's tokens -> sums
            m[k] = m[k] * m["tokens"]
        return loss, m

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, metrics, grads


def reference_logprobs(
    ref_params: Mapping[str, jax.Array],
    batch: Mapping[str, jax.Array],
    *,
    model: Model,
    cfg: LearnerConfig,
) -> jax.Array:
    """The frozen reference's token logprobs of ``batch`` (B, T), run micro-batch by
    micro-batch as the step runs its own (the same peak of activations): what
    :func:`compile_reference` jits, so that the step is given them (``ref_logp_bt``)."""
    keys = ("tokens_bt", "positions_bt", "targets_bt", "attn_bt", "segment_bt")
    batch = {k: batch[k] for k in keys if k in batch}

    def forward(mb):
        return token_logprobs(model, ref_params, mb, cfg)[0]

    n = cfg.micro_batches
    if n <= 1:
        return forward(batch)
    out = jax.lax.map(forward, micro_batches(batch, n))  # (n, B/n, T): rows m, m+n, ...
    return jnp.swapaxes(out, 0, 1).reshape(-1, out.shape[-1])


def train_step(
    state: TrainState, batch: Mapping[str, jax.Array], *, model: Model, cfg: LearnerConfig
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One GRPO update. ``batch``: see ``learner.training.batching`` (``old_logp_bt`` optional:
    without it the ratio is against the learner's own logprobs, i.e. on-policy, and
    truncated importance sampling corrects for the rollout engine's numerics).

    With ``cfg.micro_batches`` > 1 the rows are split (:func:`micro_batches`) and a
    ``lax.scan`` sums the micro-batches' gradients, each loss divided by the whole
    batch's denominator: the update of the whole batch at a fraction of the memory."""
    constant = batch["loss_constant_b"][0] if "loss_constant_b" in batch else None
    denominator = agg_denominator(batch["mask_bt"], cfg.loss_agg, constant, batch.get("segment_bt"))
    micro = functools.partial(_micro_step, model=model, cfg=cfg)
    if cfg.micro_batches <= 1:
        loss, metrics, grads = micro(state.params, state.ref_params, batch, denominator)
    else:

        def body(carry, mb):
            loss_c, m_c, g_c = carry
            loss, m, g = micro(state.params, state.ref_params, mb, denominator)
            m_c = {k: _COMBINE.get(k, jnp.add)(v, m[k]) for k, v in m_c.items()}
            return (loss_c + loss, m_c, jax.tree.map(jnp.add, g_c, g)), None

        mbs = micro_batches(batch, cfg.micro_batches)
        first = jax.tree.map(lambda x: x[0], mbs)
        shapes = jax.eval_shape(micro, state.params, state.ref_params, first, denominator)
        zero_m = {
            k: jnp.full(v.shape, _IDENTITY.get(k, 0.0), v.dtype) for k, v in shapes[1].items()
        }
        zero_g = jax.tree.map(jnp.zeros_like, state.params)
        init = (jnp.zeros((), jnp.float32), zero_m, zero_g)
        (loss, metrics, grads), _ = jax.lax.scan(body, init, mbs)
    n = jnp.maximum(metrics["tokens"], 1.0)
    metrics = {k: v / n if k in _TOKEN_MEANS else v for k, v in metrics.items()}
    tx = optimizer(cfg)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics = {
        **metrics,
        "loss": loss,
        "grad_norm": optax.global_norm(grads),
        "update_norm": optax.global_norm(updates),
        "learning_rate": lr_schedule(cfg)(state.step),
    }
    new = TrainState(state.step + 1, params, opt_state, rng, state.ref_params)
    return new, metrics


# ----------------------------------------------------------------------------- shardings


def state_shardings(model: Model, mesh: Mesh, cfg: LearnerConfig, abstract: Any = None) -> Any:
    """The sharding of every leaf of the state: parameters (and their Adam moments, and
    the reference) by the mesh rules; counters and the key replicated."""
    p_sh = param_shardings(model, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    if abstract is None:
        abstract = abstract_state(model, cfg)

    def opt_leaf(path, _leaf):
        key = getattr(path[-1], "key", None) if path else None
        return p_sh.get(key, replicated) if isinstance(key, str) else replicated

    return TrainState(
        step=replicated,
        params=p_sh,
        opt_state=jax.tree_util.tree_map_with_path(opt_leaf, abstract.opt_state),
        rng=replicated,
        ref_params=p_sh if abstract.ref_params is not None else None,
    )


def abstract_state(model: Model, cfg: LearnerConfig) -> TrainState:
    """Shapes and dtypes of the state, computed without allocating it."""
    from learner.model.params import param_info

    params = {p.path: jax.ShapeDtypeStruct(p.shape, jnp.dtype(p.dtype)) for p in param_info(model)}
    return jax.eval_shape(functools.partial(init_state, cfg=cfg), params)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over the data and fsdp axes; the length axis whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def rows_multiple(mesh: Mesh) -> int:
    """Batch rows must be a multiple of this (the data x fsdp ways)."""
    return int(mesh.shape["data"] * mesh.shape["fsdp"])


def one_device_mesh() -> Mesh:
    """The mesh of this process's first device (a step used directly, without a config)."""
    from learner.training.sharding import make_mesh

    return make_mesh(devices=jax.local_devices()[:1])


def compile_step(
    model: Model,
    mesh: Mesh | None,
    cfg: LearnerConfig,
    state_sh: Any = None,
    step_fn: Any = None,
):
    """``step_fn`` (default :func:`train_step`; ``learner.sft`` passes its own) jitted once:
    state donated, shardings from the mesh rules (no mesh: one device), the activations'
    rows kept split as the batch's."""
    mesh = mesh if mesh is not None else one_device_mesh()
    state_sh = state_sh if state_sh is not None else state_shardings(model, mesh, cfg)
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = batch_sharding(mesh)
    step_fn = train_step if step_fn is None else step_fn

    def step(state: TrainState, batch: Mapping[str, jax.Array]):
        with decoder.rows_sharded(rows):
            return step_fn(state, batch, model=model, cfg=cfg)

    return jax.jit(
        step,
        in_shardings=(state_sh, rows),
        out_shardings=(state_sh, replicated),
        donate_argnums=(0,),
    )


def compile_reference(model: Model, mesh: Mesh | None, cfg: LearnerConfig, state_sh: Any = None):
    """:func:`reference_logprobs` jitted once: ``(ref_params, batch) -> ref_logp_bt``, the
    reference's parameters sharded as the state holds them, the rows split as the
    batch's. The learner runs it before the step when ``learner.reference_forward`` is
    ``separate``."""
    mesh = mesh if mesh is not None else one_device_mesh()
    state_sh = state_sh if state_sh is not None else state_shardings(model, mesh, cfg)
    if state_sh.ref_params is None:
        raise ValueError("no reference to run: learner.kl_coef is 0")
    rows = batch_sharding(mesh)

    def forward(ref_params: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
        with decoder.rows_sharded(rows):
            return reference_logprobs(ref_params, batch, model=model, cfg=cfg)

    return jax.jit(forward, in_shardings=(state_sh.ref_params, rows), out_shardings=rows)


def place(x: Any, sharding: NamedSharding) -> jax.Array:
    """A global array from a value every process holds in full (each process places
    only its own shards, so this works across hosts as well as on one)."""
    if jax.process_count() == 1:  # a buffer of its own: a donated state never frees x
        return jax.device_put(x, sharding, may_alias=False)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # place the key's raw data, re-wrap it
        data = place(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place_state(state: TrainState, shardings: Any) -> TrainState:
    return jax.tree.map(place, state, shardings)


def place_batch(arrays: Mapping[str, Any], mesh: Mesh | None) -> dict[str, jax.Array]:
    """The packed batch as global arrays, rows split over the data and fsdp axes."""
    mesh = mesh if mesh is not None else one_device_mesh()
    sh = batch_sharding(mesh)
    return {k: place(v, sh) for k, v in arrays.items()}


def new_state(model: Model, mesh: Mesh | None, cfg: LearnerConfig) -> tuple[TrainState, Any]:
    """A fresh state from a copy of ``model``'s parameters (the model keeps its own, even
    after the state is donated to a step), placed on ``mesh`` (none: one device);
    (state, shardings)."""
    mesh = mesh if mesh is not None else one_device_mesh()
    sh = state_shardings(model, mesh, cfg)
    return place_state(init_state(get_params(model), cfg), sh), sh
