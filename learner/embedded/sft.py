"""`python -m learner.sft --data sft.jsonl --out DIR [--config PATH] [--set k=v ...]`.

Supervised fine-tuning on chats in the ``messages`` format (``python -m
rollout.sft_export`` writes them): each chat is laid out exactly as an episode
(``shared.chat.render_chat``: the prompt, then the assistant's ids and the
observations cut to ``inference.observation_tokens``), and the loss is the
weighted mean negative log-likelihood: weight 1 on the assistant tokens,
``sft.context_weight`` on the prompt and observations. Batches have one fixed
shape (``sft.batch_size`` rows of the largest ``learner.length_buckets``), so the
step compiles once; rows are split over the mesh like GRPO's. AdamW with warm-up
and cosine decay (``sft.*``). It starts from ``sft.init_checkpoint`` or a fresh
initialisation. A policy trained from scratch does not learn to copy from its
context from the demonstrations alone: ``sft.copy_steps`` runs a synthetic copy
exercise first (``copy_metrics.jsonl``) and ``sft.copy_rows`` mixes it into every
step. The embedded default starts instead from a base model pretrained on that
exercise once (``python -m learner.base``, ``shared/assets/tiny_base``). The result
is an Orbax checkpoint under ``DIR/checkpoints`` (``learner.init_checkpoint`` starts
GRPO from it) and ``DIR/sft_metrics.jsonl`` (every 10 steps); progress is a bar on a
terminal and a ``[progress]`` line on stderr every 15 s elsewhere (``shared.progress``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shared.chat import ChatError, render_chat
from shared.config import RunConfig, add_config_args, config_from_args, setup_logging
from shared.progress import Progress
from shared.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("learner.sft")
METRICS_EVERY = 10  # steps between sft_metrics.jsonl lines
COPY_ROWS, COPY_LEN = 32, 256  # the copy exercise's steps: 32 rows of 256 tokens
COPY_DECAY = 5  # its cosine schedule spans 5x its steps: the rate stays near the peak


def load_examples(path: str | Path, tok: Tokenizer, cfg: RunConfig) -> list[tuple[list, list]]:
    """(ids, mask) per chat of the JSONL file; chats with no assistant token are skipped."""
    out, bad = [], 0
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                messages = json.loads(line)["messages"]
                ids, mask = render_chat(
                    tok,
                    messages,
                    observation_tokens=cfg.inference.observation_tokens,
                    max_context_tokens=cfg.inference.max_context_tokens,
                )
            except (ValueError, KeyError, TypeError, ChatError) as e:
                bad += 1
                log.warning("%s:%d: skipped: %s", path, n, e)
                continue
            if any(mask[1:]):
                out.append((ids, mask))
    if bad:
        log.warning("%s: %d malformed lines skipped", path, bad)
    return out


def make_batch(
    examples: list[tuple[list, list]], rows: int, t: int, pad: int, context_weight: float = 0.0
) -> dict:
    """Next-token rows as ``learner.training.batching`` lays them out (mask/targets shifted by one).

    ``weight_bt`` weighs each target's loss: 1 on assistant tokens, ``context_weight``
    on the rest (prompt and observations), 0 on padding."""
    a = {
        "tokens_bt": np.full((rows, t), pad, np.int32),
        "targets_bt": np.full((rows, t), pad, np.int32),
        "positions_bt": np.broadcast_to(np.arange(t, dtype=np.int32), (rows, t)).copy(),
        "attn_bt": np.zeros((rows, t), np.int32),
        "mask_bt": np.zeros((rows, t), np.float32),
    }
    for r, (ids, mask) in enumerate(examples):
        m = min(len(ids) - 1, t)
        a["tokens_bt"][r, :m] = ids[:m]
        a["targets_bt"][r, :m] = ids[1 : m + 1]
        a["attn_bt"][r, :m] = 1
        a["mask_bt"][r, :m] = mask[1 : m + 1]
    a["weight_bt"] = a["mask_bt"] + context_weight * (a["attn_bt"] - a["mask_bt"])
    return a


def copy_batch(rng: np.random.Generator, rows: int, t: int, vocab: int, first_id: int = 3) -> dict:
    """Rows of the synthetic copy exercise, laid out like :func:`make_batch`'s.

    Each row is a run of segments ``span gap span``: a span of 8-40 random token ids
    (from ``first_id`` up, so no special token), a random gap of up to as many tokens,
    and the span again. The loss (``weight_bt`` and ``copy_bt``) is on the repeat's
    tokens after its first: the ones a model can only get right by finding the earlier
    occurrence and copying what followed it. ``mask_bt`` stays 0 (no assistant token)."""
    seqs, copy = [], []
    for _ in range(rows):
        ids: list[int] = []
        target: list[float] = []
        while len(ids) < t + 1:
            n = int(rng.integers(8, 41))
            span = rng.integers(first_id, vocab, n).tolist()
            gap = rng.integers(first_id, vocab, int(rng.integers(0, n + 1))).tolist()
            ids += span + gap + span
            target += [0.0] * (n + len(gap) + 1) + [1.0] * (n - 1)
        seqs.append(ids[: t + 1])
        copy.append(target[: t + 1])
    # make_batch's layout, with the copy targets where it puts the assistant's
    a = make_batch(list(zip(seqs, copy, strict=True)), rows, t, pad=0)
    a["copy_bt"], a["mask_bt"] = a["mask_bt"], np.zeros_like(a["mask_bt"])
    a["weight_bt"] = a["copy_bt"].copy()
    return a


def join_batches(a: dict, b: dict) -> dict:
    """``a``'s rows then ``b``'s (``copy_bt`` zero where a batch has none)."""
    out = {}
    for k in a.keys() | b.keys():
        x = a.get(k, np.zeros_like(a["mask_bt"]))
        y = b.get(k, np.zeros_like(b["mask_bt"]))
        out[k] = np.concatenate([x, y.astype(x.dtype)])
    return out


def sft_step(state, batch: Mapping[str, jax.Array], *, model, cfg):
    """One AdamW step on the masked mean NLL of the assistant tokens."""
    from learner.training.step import TrainState, lr_schedule, optimizer, token_logprobs

    mask, weight = batch["mask_bt"], batch["weight_bt"]

    def loss_fn(params):
        logp_bt, _ = token_logprobs(model, params, batch, cfg, temperature=1.0)
        loss = -(logp_bt * weight).sum() / jnp.maximum(weight.sum(), 1e-6)
        action_loss = -(logp_bt * mask).sum() / jnp.maximum(mask.sum(), 1.0)
        return loss, (action_loss, logp_bt)

    (loss, (action_loss, logp_bt)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer(cfg).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    m = {
        "loss": loss,
        "action_loss": action_loss,
        "grad_norm": optax.global_norm(grads),
        "learning_rate": lr_schedule(cfg)(state.step),
    }
    if "copy_bt" in batch:  # the synthetic copy exercise's loss, on its own
        c = batch["copy_bt"]
        m["copy_loss"] = -(jax.lax.stop_gradient(logp_bt) * c).sum() / jnp.maximum(c.sum(), 1.0)
    return TrainState(state.step + 1, params, opt_state, state.rng, None), m


def sft_learner_config(cfg: RunConfig):
    """The learner section with the SFT schedule (what ``learner.training.step.optimizer`` reads)."""
    s = cfg.sft
    return dataclasses.replace(
        cfg.learner,
        steps=s.steps,
        learning_rate=s.learning_rate,
        warmup_steps=min(s.warmup_steps, max(s.steps - 1, 0)),
        kl_coef=0.0,
    )


def _compiled(model, mesh, lc):
    """A fresh train state from ``model``'s current weights and the jitted SFT step."""
    from learner.training.step import compile_step, new_state

    state, shardings = new_state(model, mesh, lc)
    return state, compile_step(model, mesh, lc, shardings, step_fn=sft_step)


def copy_exercise(
    cfg: RunConfig, model, mesh, out_dir: Path, *, stop_below: float | None = None
) -> tuple[float, int]:
    """``sft.copy_steps`` steps of the synthetic copy exercise alone (``COPY_ROWS`` rows of
    ``COPY_LEN`` tokens, warm-up then a nearly constant learning rate); ``model`` keeps the
    result. With ``stop_below`` it stops early at the first logged copy loss under it.
    Returns the last logged copy loss and the steps run.

    A policy trained from scratch learns to copy from its context (an induction
    mechanism) here in a sudden drop of the loss, from chance (ln V) to near 0: measured
    on the tiny model, 32 x 256 tokens per step at 2e-3, between steps 450 and 525."""
    from learner.model.params import set_params
    from learner.training.step import place_batch

    n = cfg.sft.copy_steps
    lc = dataclasses.replace(sft_learner_config(cfg), steps=COPY_DECAY * n)
    state, step_fn = _compiled(model, mesh, lc)
    rng = np.random.default_rng(cfg.sft.seed + 1)
    loss, step, t0 = float("nan"), 0, time.perf_counter()
    progress = Progress("copy exercise", n, "steps", enabled=cfg.logging.progress)
    with (out_dir / "copy_metrics.jsonl").open("w") as metrics, progress:
        for step in range(1, n + 1):
            batch = copy_batch(rng, COPY_ROWS, COPY_LEN, model.cfg.vocab_size)
            state, m = step_fn(state, place_batch(batch, mesh))
            if step % 25 == 0 or step == n:
                loss = float(jax.device_get(m["copy_loss"]))
                rec = {"step": step, "copy_loss": loss, "elapsed_s": time.perf_counter() - t0}
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
                progress.update(step, f"copy loss {loss:.4f}")
                if stop_below is not None and loss < stop_below:
                    break
            else:
                progress.update(step)
    set_params(model, {k: np.asarray(v) for k, v in jax.device_get(state.params).items()})
    return loss, step


def train_sft(cfg: RunConfig, data: str | Path, out_dir: str | Path) -> Path:
    """Fine-tune the configured model on ``data``; returns the checkpoint directory."""
    from learner.training.checkpoint import Checkpointer
    from learner.training.loop import build_model
    from learner.training.sharding import make_mesh
    from learner.training.step import place_batch, rows_multiple

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer_dir = build_model(cfg)
    if cfg.sft.init_checkpoint:
        from learner.model.loading import load_weights_into

        log.info("SFT starts from %s", load_weights_into(model, cfg.sft.init_checkpoint))
    tok = load_tokenizer(tokenizer_dir)
    examples = load_examples(data, tok, cfg)
    if not examples:
        raise ValueError(f"{data}: no chat with an assistant turn to train on")
    lc = sft_learner_config(cfg)
    mesh = make_mesh(cfg.mesh)
    k = rows_multiple(mesh)
    copies = cfg.sft.copy_rows
    rows = -(-(cfg.sft.batch_size + copies) // k) * k - copies  # the step's rows: k's multiple
    t = int(cfg.learner.length_buckets[-1])
    if cfg.sft.copy_steps:
        copy_exercise(cfg, model, mesh, out_dir)
    state, step_fn = _compiled(model, mesh, lc)
    tokens = sum(len(ids) for ids, _ in examples)
    targets = sum(sum(mask) for _, mask in examples)
    log.info(
        "SFT: %d chats, %d tokens (%d trained on), %d steps of %d x %d (+%d copy rows) "
        "on %d device(s)",
        len(examples), tokens, targets, cfg.sft.steps, rows, t, copies, mesh.size,
    )  # fmt: skip
    rng = np.random.default_rng(cfg.sft.seed)
    order: list[int] = []
    pad = model.cfg.pad_token_id or 0
    m: dict = {}
    t0 = time.perf_counter()
    progress = Progress("SFT", cfg.sft.steps, "steps", enabled=cfg.logging.progress)
    with (out_dir / "sft_metrics.jsonl").open("w") as metrics, progress:
        for step in range(1, cfg.sft.steps + 1):
            while len(order) < rows:  # epochs, each in a fresh order
                order += rng.permutation(len(examples)).tolist()
            take, order = order[:rows], order[rows:]
            rows_np = make_batch([examples[i] for i in take], rows, t, pad, cfg.sft.context_weight)
            if copies:
                rows_np = join_batches(rows_np, copy_batch(rng, copies, t, model.cfg.vocab_size))
            batch = place_batch(rows_np, mesh)
            state, m = step_fn(state, batch)
            if step % METRICS_EVERY == 0 or step == cfg.sft.steps:
                m = {k: float(v) for k, v in jax.device_get(m).items()}
                rec = {"step": step, **m, "elapsed_s": time.perf_counter() - t0}
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
                copy = f"  copy loss {m['copy_loss']:.4f}" if "copy_loss" in m else ""
                info = (
                    f"loss {m['loss']:.4f}  action loss {m['action_loss']:.4f}{copy}  "
                    f"lr {m['learning_rate']:.2e}"
                )
                progress.update(step, info)
            else:
                progress.update(step)
    root = out_dir / "checkpoints"
    with Checkpointer(root, max_to_keep=1) as ckpt:
        ckpt.save(
            cfg.sft.steps,
            params=state.params,
            config=cfg,
            model_config=model.cfg,
            tokenizer_dir=tokenizer_dir,
            metrics={"loss": float(m["loss"]) if m else None, "chats": len(examples)},
            force=True,
        )
        ckpt.wait()
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.sft", description=__doc__)
    add_config_args(parser)
    parser.add_argument("--data", required=True, help="SFT chats (JSONL, `messages` format)")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    setup_logging(cfg)
    from learner.training.sharding import split_cpu

    split_cpu(cfg.mesh.cpu_devices)  # before anything starts JAX's backend
    if not Path(args.data).is_file():
        print(f"learner.sft: {args.data}: no such file", file=sys.stderr)
        return 1
    try:
        root = train_sft(cfg, args.data, args.out)
    except ValueError as e:
        print(f"learner.sft: {e}", file=sys.stderr)
        return 1
    print(f"sft checkpoint: {root}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
