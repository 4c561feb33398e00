"""The training loop: pull groups, pack, step, and the hooks around the step.

The jitted step (``learner.step``) does the math; this loop does the IO around
it: pulling from the sidecars, metrics JSONL and the progress bar, Orbax
checkpoints every ``checkpoint.every_steps`` (the data cursor is every consumed
group id, so a resumed run never trains twice on a group), HF exports for
SGLang, ``POST /weights`` to the sidecars, and exact resumption from the latest
committed checkpoint.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from learner.batching import pack
from learner.checkpoint import Checkpointer
from learner.errors import CheckpointSaveError
from learner.model import Model, get_params, set_params, tiny_config
from learner.sharding import make_mesh, shard
from learner.source import GroupSource
from learner.step import (
    TrainState,
    abstract_state,
    compile_step,
    new_state,
    place_batch,
    rows_multiple,
    state_shardings,
)
from shared.config import RunConfig
from shared.tokenizer import TINY_TOKENIZER_DIR

log = logging.getLogger("learner.train")


def build_model(cfg: RunConfig) -> tuple[Model, Path]:
    """The policy at initialisation and its tokenizer directory."""
    lc = cfg.learner
    if lc.model == "tiny":
        mc = tiny_config(param_dtype=lc.param_dtype, dtype=lc.compute_dtype)
        return Model(mc, rngs=nnx.Rngs(lc.seed)), TINY_TOKENIZER_DIR
    from learner.hf import load_hf

    model = load_hf(lc.model, param_dtype=lc.param_dtype, dtype=lc.compute_dtype, seed=lc.seed)
    return model, Path(lc.model)


class Trainer:
    """The state, its step and checkpoints; :meth:`run` trains to ``learner.steps``."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.model, self.tokenizer_dir = build_model(cfg)
        self.mesh = make_mesh(cfg.mesh)
        multiple = rows_multiple(self.mesh) * cfg.learner.micro_batches
        self.multiple = multiple
        self.rows = _round_up(cfg.learner.groups_per_step * cfg.rollout.group_size, multiple)
        self.packed_rows = (
            _round_up(cfg.learner.packed_rows, multiple) if cfg.learner.packed_rows else self.rows
        )
        self.ckpt_root = (self.run_dir / cfg.checkpoint.dir).absolute()
        self.ckpt = Checkpointer(self.ckpt_root, max_to_keep=cfg.checkpoint.max_to_keep)
        self.shardings = state_shardings(self.model, self.mesh, cfg.learner)
        self.step_fn = compile_step(self.model, self.mesh, cfg.learner, self.shardings)
        self.consumed: list[str] = []
        self.state = self._restore_or_init()
        self.version = int(self.state.step)
        self.evaluator = None  # (cfg, step) -> dev-split results, run after weight pushes
        self.save_failed = False
        self.tensorboard = _tensorboard(self.run_dir)

    # -------------------------------------------------------------- state

    def _pack(self, groups: list) -> Any:
        """One step's batch: packed into ``packed_rows`` rows when packing is on (into one
        row per sequence when they do not fit there), else one trajectory per row."""
        lc = self.cfg.learner
        kw = dict(
            buckets=lc.length_buckets,
            scale_rewards=lc.scale_rewards,
            adv_ddof=1 if lc.adv_std == "sample" else 0,
            policy_version=self.version,
            max_staleness=lc.max_staleness,
            pad_id=self.model.cfg.pad_token_id or 0,
        )
        if not lc.packing:
            return pack(groups, rows=self.rows, **kw)
        try:
            return pack(groups, rows=self.packed_rows, packing=True, slots=self.rows, **kw)
        except ValueError as e:
            # one row per sequence always fits; per-turn groups have more sequences than
            # the step has episode rows (another compiled shape per distinct count)
            rows = _round_up(max(self.rows, sum(len(g) for g in groups)), self.multiple)
            log.warning("packing into %d rows: %s; using %d rows", self.packed_rows, e, rows)
            return pack(groups, rows=rows, packing=True, slots=self.rows, **kw)

    def _restore_or_init(self) -> TrainState:
        step = self.ckpt.latest_step()
        init = self.cfg.learner.init_checkpoint
        # A warm start's parameters: the initial policy, and on a resume the KL reference
        # (not read on a resume without one: the checkpoint's parameters replace them).
        if init and (step is None or self.shardings.ref_params is not None):
            with Checkpointer(Path(init), read_only=True) as src:
                r = src.restore(with_opt_state=False)
            set_params(self.model, {k: np.asarray(v) for k, v in r.params.items()})
            if step is None:
                log.info("starting from %s (step %d)", init, r.step)
        if step is None:  # a fresh optimiser and step 0
            state, _ = new_state(self.model, self.mesh, self.cfg.learner)
            self.save(state, wait=True)  # step 0: what the inference servers start from
            return state
        abstract = abstract_state(self.model, self.cfg.learner)
        opt_target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract.opt_state,
            self.shardings.opt_state,
        )
        r = self.ckpt.restore(step, shardings=self.shardings.params, opt_state_target=opt_target)
        self.consumed = list(r.data_cursor.get("group_ids", []))
        ref = None
        if self.shardings.ref_params is not None:  # the reference: the initial policy
            # (the model holds it: the warm start's parameters, or its initialisation)
            ref = shard(get_params(self.model), self.shardings.ref_params)
        rng = jax.device_put(r.rng, self.shardings.rng)
        step_arr = jax.device_put(np.int32(r.step), self.shardings.step)
        log.info("resumed from step %d (%d groups consumed)", r.step, len(self.consumed))
        return TrainState(step_arr, r.params, r.opt_state, rng, ref)

    def save(self, state: TrainState, metrics: dict[str, Any] | None = None, wait=False) -> int:
        step = int(state.step)
        self.ckpt.save(
            step,
            params=state.params,
            opt_state=state.opt_state,
            rng=state.rng,
            data_cursor={"groups": len(self.consumed), "group_ids": list(self.consumed)},
            metrics=metrics,
            config=self.cfg,
            model_config=self.model.cfg,
            tokenizer_dir=self.tokenizer_dir,
        )
        if wait:
            self.ckpt.wait()
        return step

    def export_hf(self, step: int) -> Path:
        from learner.hf import export_hf

        set_params(self.model, {k: np.asarray(v) for k, v in self.state.params.items()})
        return export_hf(
            self.model, self.ckpt_root / "hf" / str(step), tokenizer_dir=self.tokenizer_dir
        )

    def wants_hf(self) -> bool:
        mode = self.cfg.checkpoint.export_hf
        return mode == "always" or (mode == "auto" and self.cfg.inference.backend == "sglang")

    # -------------------------------------------------------------- loop

    def run(self, source: GroupSource) -> TrainState:
        lc = self.cfg.learner
        source.committed(self.consumed)  # a restart may not have acknowledged them yet
        metrics_file = (self.run_dir / "metrics.jsonl").open("a")
        progress = _Progress(lc.steps, int(self.state.step), self.cfg.logging.progress)
        consumed = set(self.consumed)
        pending: list[tuple[int, list[str]]] = []
        try:
            while int(self.state.step) < lc.steps:
                t0 = time.perf_counter()
                groups = source.take(lc.groups_per_step, consumed)
                t_wait = time.perf_counter() - t0
                packed = self._pack(groups)
                batch = place_batch(packed.arrays, self.mesh)
                self.state, m = self.step_fn(self.state, batch)
                m = {k: _finite(v) for k, v in jax.device_get(m).items()}
                dt = time.perf_counter() - t0
                self.consumed.extend(packed.group_ids)
                consumed.update(packed.group_ids)
                step = int(self.state.step)
                tokens = float(np.asarray(packed.arrays["attn_bt"]).sum())
                record = {
                    "step": step, **packed.stats, **m,
                    "tokens_per_s": tokens / max(dt - t_wait, 1e-9),
                    "wait_s": t_wait, "step_s": dt, "time": time.time(),
                }  # fmt: skip
                if step % self.cfg.logging.every_steps == 0 or step == lc.steps:
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                    self._tensorboard_write(step, record)
                progress.update(record)
                if step % self.cfg.checkpoint.every_steps == 0 or step == lc.steps:
                    try:
                        self.save(self.state, {"loss": m["loss"], "reward": packed.stats["reward"]})
                        self.ckpt.wait()
                    except Exception as e:  # a full or unwritable disk: stop, lose nothing
                        self.save_failed = True
                        last = self.ckpt.latest_step()
                        raise CheckpointSaveError(
                            f"saving the checkpoint of step {step} failed ({type(e).__name__}: "
                            f"{e}); the last committed checkpoint, step {last}, is intact and "
                            f"a restart resumes from it"
                        ) from e
                    pending.append((step, list(self.consumed)))
                    self._publish(source, step)
                if self._eval_due(step):
                    result = self.evaluator(self.cfg, step)
                    metrics_file.write(json.dumps({"step": step, "eval": result}) + "\n")
                    metrics_file.flush()
                    self._tensorboard_write(step, {f"dev/{k}": v for k, v in result.items()})
                pending = self._ack_committed(source, pending)
        finally:
            progress.close()
            metrics_file.close()
            if not self.save_failed:
                self.ckpt.wait()
        self._ack_committed(source, pending)
        source.flush_acks()
        return self.state

    def _eval_due(self, step: int) -> bool:
        """After a weight push, every ``learner.eval_every`` steps (the servers hold them)."""
        every = self.cfg.learner.eval_every
        return (
            self.evaluator is not None and every > 0 and step % every == 0 and self.version == step
        )

    def _tensorboard_write(self, step: int, record: dict) -> None:
        if self.tensorboard is None:
            return
        for k, v in record.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
                self.tensorboard.add_scalar(k, v, step)
        self.tensorboard.flush()

    def _ack_committed(self, source: GroupSource, pending: list) -> list:
        latest = self.ckpt.latest_step() or 0
        done = [p for p in pending if p[0] <= latest]
        for _step, ids in done:
            source.committed(ids)
        return [p for p in pending if p[0] > latest]

    def _publish(self, source: GroupSource, step: int) -> None:
        """New weights for the inference servers, through every sidecar."""
        path = str(step)
        if self.wants_hf():
            path = str(self.export_hf(step).relative_to(self.ckpt_root))
        failed = source.push_weights(step, path)
        if failed:
            log.warning("weights %d not loaded by: %s", step, "; ".join(failed))
        else:
            self.version = step

    def close(self) -> None:
        try:
            self.ckpt.close()
        except Exception:
            if not self.save_failed:
                raise  # after a failed save, the save's error has been reported already
        if self.tensorboard is not None:
            self.tensorboard.close()


def _tensorboard(run_dir: Path):
    """A TensorBoard writer into ``run_dir/tensorboard`` when tensorboardX is installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _finite(v: Any) -> float | None:
    """A metric as a JSON number; None where it is undefined (e.g. a ratio max over no token)."""
    x = float(v)
    return x if np.isfinite(x) else None


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class _Progress:
    """A rich progress bar on a terminal; nothing otherwise."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.bar = None
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("train", total=total, completed=done, info="")

    def update(self, r: dict[str, Any]) -> None:
        if self.bar is None:
            return
        info = (
            f"reward {r['reward']:.3f}  success {r['success']:.2f}  KL {r['approx_kl'] or 0:.4f}  "
            f"clip {r['clip_fraction'] or 0:.3f}  {r['tokens_per_s']:.0f} tok/s"
        )
        self.bar.update(self.task, completed=r["step"], info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
