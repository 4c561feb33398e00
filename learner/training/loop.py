"""The training loop: pull groups, pack, step, and the hooks around the step.

The jitted step (``learner.training.step``) does the math; this loop does the IO around
it: pulling from the sidecars, metrics JSONL and the progress bar, Orbax
checkpoints every ``checkpoint.every_steps`` (the data cursor is every consumed
group id, so a resumed run never trains twice on a group), HF exports for
SGLang, ``POST /weights`` to the sidecars, and exact resumption from the latest
committed checkpoint.

With several learner processes (``jax.distributed``) process 0 alone talks to the
sidecars (pulls, acknowledgements, weight pushes) and writes the metrics; it sends
each step's groups and its policy version to the others, so every process packs the
same batch; all of them take part in the step and in every checkpoint save.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from learner.errors import CheckpointSaveError
from learner.model.params import Model, get_params, set_params, tiny_config
from learner.training.batching import pack
from learner.training.checkpoint import Checkpointer
from learner.training.grpo import ADV_DDOF
from learner.training.reference import ArrivalReference
from learner.training.sharding import make_mesh, shard
from learner.training.source import GroupSource
from learner.training.step import (
    TrainState,
    abstract_state,
    compile_reference,
    compile_step,
    new_state,
    place_batch,
    rows_multiple,
    state_shardings,
)
from learner.training.trackers import Trackers, open_trackers
from shared.config import RunConfig
from shared.progress import Progress
from shared.tokenizer import TINY_TOKENIZER_DIR
from shared.wire import decode_groups, encode_groups

log = logging.getLogger("learner.train")


def build_model(cfg: RunConfig) -> tuple[Model, Path]:
    """The policy at initialisation and its tokenizer directory."""
    lc = cfg.learner
    if lc.model == "tiny":
        mc = tiny_config(param_dtype=lc.param_dtype, dtype=lc.compute_dtype)
        return Model(mc, rngs=nnx.Rngs(lc.seed)), TINY_TOKENIZER_DIR
    from learner.model.hf import load_hf

    model = load_hf(lc.model, param_dtype=lc.param_dtype, dtype=lc.compute_dtype, seed=lc.seed)
    return model, Path(lc.model)


class Trainer:
    """The state, its step and checkpoints; :meth:`run` trains to ``learner.steps``."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # metrics.jsonl, TensorBoard, W&B, MLflow (logging.trackers), process 0's only; first,
        # so that a tracker which cannot start fails before the model is built
        primary = jax.process_index() == 0
        self.trackers = open_trackers(cfg, self.run_dir) if primary else Trackers((), cfg.logging)
        self.model, self.tokenizer_dir = build_model(cfg)
        self.mesh = make_mesh(cfg.mesh)
        log.info("mesh %s on %d device(s)", dict(self.mesh.shape), self.mesh.size)
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
        self.ref_fn = None  # the reference's logprobs as a program of its own, if so set
        self.arrival = None  # ... run on the groups as they arrive (learner.training.reference)
        where = cfg.learner.reference_forward
        if self.shardings.ref_params is not None and where in ("separate", "on_arrival"):
            self.ref_fn = compile_reference(self.model, self.mesh, cfg.learner, self.shardings)
        if self.ref_fn is not None and where == "on_arrival":
            lc = cfg.learner
            self.arrival = ArrivalReference(
                self.ref_fn,
                self.mesh,
                chunk_rows=_round_up(lc.reference_chunk_rows or cfg.rollout.group_size, multiple),
                buckets=lc.length_buckets,
                pad_id=self.model.cfg.pad_token_id or 0,
                scale_rewards=lc.scale_rewards,
                adv_ddof=ADV_DDOF[lc.adv_std],
            )
        self.consumed: list[str] = []
        self.state = self._restore_or_init()
        self.version = int(self.state.step)
        self.evaluator = None  # (cfg, step) -> dev-split results, run after weight pushes
        self.save_failed = False
        self.primary = jax.process_index() == 0  # talks to the sidecars, writes the metrics

    # -------------------------------------------------------------- state

    def _pack(self, groups: list, ref_logprobs: dict | None = None) -> Any:
        """One step's batch: packed into ``packed_rows`` rows when packing is on (into one
        row per sequence when they do not fit there), else one trajectory per row; with
        the reference's logprobs when they were computed as the groups arrived."""
        lc = self.cfg.learner
        kw = dict(
            ref_logprobs=ref_logprobs,
            buckets=lc.length_buckets,
            scale_rewards=lc.scale_rewards,
            adv_ddof=ADV_DDOF[lc.adv_std],
            policy_version=self.version,
            max_staleness=lc.max_staleness,
            pad_id=self.model.cfg.pad_token_id or 0,
        )
        if not lc.packing:
            return pack(groups, rows=self.rows, **kw)
        try:
            return pack(groups, rows=self.packed_rows, packing=True, slots=self.rows, **kw)
        except ValueError as e:
            # Per-turn groups have more sequences than the step has episode rows. Twice,
            # four times ... packed_rows, up to one row per sequence (which always fits):
            # few compiled shapes, and rows that are mostly filled (one per sequence of
            # every group, kept or not, was mostly padding and a new shape per count).
            every = _round_up(max(self.rows, sum(len(g) for g in groups)), self.multiple)
            rows = self.packed_rows
            while True:
                rows = min(rows * 2, every)
                try:
                    packed = pack(groups, rows=rows, packing=True, slots=self.rows, **kw)
                    break
                except ValueError:
                    if rows == every:
                        raise
            log.warning("packing into %d rows: %s; using %d rows", self.packed_rows, e, rows)
            return packed

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
        from learner.model.hf import export_hf
        from learner.serving.engines import served_dtype, untied_export

        out = self.ckpt_root / "hf" / str(step)
        if jax.process_count() > 1:  # every process takes part in the gather; 0 writes
            from jax.experimental.multihost_utils import process_allgather

            params = {k: process_allgather(v, tiled=True) for k, v in self.state.params.items()}
            if not self.primary:
                return out
        else:
            params = self.state.params
        set_params(self.model, {k: np.asarray(v) for k, v in params.items()})
        dtype = served_dtype(self.cfg.inference, self.model.cfg.param_dtype)
        untie = untied_export(self.cfg.inference.backend)
        export_hf(self.model, out, tokenizer_dir=self.tokenizer_dir, dtype=dtype, untie=untie)
        prune_exports(out.parent, keep=HF_EXPORTS_KEPT)
        return out

    def wants_hf(self) -> bool:
        mode = self.cfg.checkpoint.export_hf
        engine = self.cfg.inference.backend in ("sglang", "vllm")
        return mode == "always" or (mode == "auto" and engine)

    # -------------------------------------------------------------- loop

    def run(self, source: GroupSource) -> TrainState:
        lc = self.cfg.learner
        if not self.primary:
            source = _NoSource()
        source.committed(self.consumed)  # a restart may not have acknowledged them yet
        progress = _Progress(
            lc.steps, int(self.state.step), self.cfg.logging.progress, active=self.primary
        )
        consumed = set(self.consumed)
        pending: list[tuple[int, list[str]]] = []
        try:
            while int(self.state.step) < lc.steps:
                t0 = time.perf_counter()
                groups = self._take(source, lc.groups_per_step, consumed)
                t_wait = time.perf_counter() - t0
                refs = None
                if self.arrival is not None:  # the last chunk, and every chunk read back
                    refs = self.arrival.finish(self.state.ref_params)
                packed = self._pack(groups, refs)
                batch = place_batch(packed.arrays, self.mesh)
                if self.ref_fn is not None and self.arrival is None:
                    batch["ref_logp_bt"] = self.ref_fn(self.state.ref_params, batch)
                self.state, m = self.step_fn(self.state, batch)
                m = {k: _finite(v) for k, v in jax.device_get(m).items()}
                dt = time.perf_counter() - t0
                self.consumed.extend(packed.group_ids)
                consumed.update(packed.group_ids)
                step = int(self.state.step)
                tokens = float(np.asarray(packed.arrays["attn_bt"]).sum())
                record = {
                    "step": step, **packed.stats, **m,
                    **(self.arrival.last if self.arrival is not None else {}),
                    "tokens_per_s": tokens / max(dt - t_wait, 1e-9),
                    "wait_s": t_wait, "step_s": dt, "time": time.time(),
                }  # fmt: skip
                if step % self.cfg.logging.every_steps == 0 or step == lc.steps:
                    self.trackers.log(step, record)
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
                    self.trackers.log(step, {"step": step, "eval": result})
                pending = self._ack_committed(source, pending)
        finally:
            progress.close()
            if not self.save_failed:
                self.ckpt.wait()
        self._ack_committed(source, pending)
        source.flush_acks()
        return self.state

    def _take(self, source: GroupSource, n: int, consumed: set[str]) -> list:
        """This step's groups: pulled by process 0 and sent to the others with its policy
        version (the packing depends on both), so every process packs the same batch. With
        the reference run on arrival, each pull's groups are queued for it as they come
        (with several processes, once all are in: every process runs the program)."""
        if jax.process_count() == 1:
            if self.arrival is None:
                return source.take(n, consumed)
            return source.take(n, consumed, on_arrival=self._arrived)
        from jax.experimental.multihost_utils import broadcast_one_to_all

        body = encode_groups(source.take(n, consumed)) if self.primary else b""
        head = broadcast_one_to_all(np.array([len(body), self.version], np.int64))
        size, self.version = int(head[0]), int(head[1])
        data = np.frombuffer(body, np.uint8) if self.primary else np.zeros(size, np.uint8)
        groups = decode_groups(np.asarray(broadcast_one_to_all(data)).tobytes())
        if self.arrival is not None:
            self._arrived(groups)
        return groups

    def _arrived(self, groups: list) -> None:
        self.arrival.add(groups, self.state.ref_params)

    def _eval_due(self, step: int) -> bool:
        """After a weight push, every ``learner.eval_every`` steps (the servers hold them)."""
        every = self.cfg.learner.eval_every
        return (
            self.primary
            and self.evaluator is not None
            and every > 0
            and step % every == 0
            and self.version == step
        )

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
        self.trackers.close()


HF_EXPORTS_KEPT = 2  # the newest (being loaded) and the one before (what servers may hold)


def prune_exports(hf_root: Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` step exports under ``hf_root`` (a 7B export is
    ~15 GB); the steps deleted."""
    steps = sorted(int(p.name) for p in hf_root.iterdir() if p.name.isdigit())
    gone = steps[:-keep] if keep > 0 else steps
    for step in gone:
        shutil.rmtree(hf_root / str(step), ignore_errors=True)
    return gone


class _NoSource:
    """What the processes other than 0 talk to instead of the sidecars: nothing."""

    def committed(self, group_ids: object) -> None:
        pass

    def flush_acks(self) -> None:
        pass

    def push_weights(self, version: int, path: str) -> list[str]:
        return []


def _finite(v: Any) -> float | None:
    """A metric as a JSON number; None where it is undefined (e.g. a ratio max over no token)."""
    x = float(v)
    return x if np.isfinite(x) else None


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class _Progress:
    """GRPO's progress: a line per step in every log (the terminal's included), and a bar
    on a terminal (``logging.progress``); nothing from processes other than 0."""

    def __init__(self, total: int, done: int, enabled: bool, active: bool = True) -> None:
        self.total = total
        self.p = (
            Progress("GRPO", total, "steps", done=done, enabled=enabled, every_s=float("inf"))
            if active
            else None
        )

    def update(self, r: dict[str, Any]) -> None:
        if self.p is None:
            return
        self.p.line(grpo_line(r, self.total))
        self.p.update(r["step"], f"reward {r['reward']:.3f}  success {r['success']:.2f}")

    def close(self) -> None:
        if self.p is not None:
            self.p.close()


def grpo_line(r: dict[str, Any], total: int) -> str:
    """``grpo step 12/200  reward 0.412  success 0.375  KL 0.0375  entropy 1.83
    1234 tok/s  step 2.31 s (wait 0.40 s)  lag 0.6  actions 12.4 (12.4 turns)  budget 0.06``,
    one line whatever the episodes' length: their mean actions (and training sequences per
    episode when they are trained turn by turn), the fraction that ran out of budget (and
    of infrastructure errors, when any). KL is the policy's to the frozen
    reference (``kl_ref``) when a KL term is on, else to the policy that sampled the
    batch (``approx_kl``: 0 on the first update of a batch)."""

    def num(key: str, fmt: str) -> str:
        v = r.get(key)
        return "n/a" if v is None else format(v, fmt)

    kl = "kl_ref" if r.get("kl_ref") is not None else "approx_kl"
    line = (
        f"grpo step {r['step']}/{total}  reward {r['reward']:.3f}  success {r['success']:.3f}  "
        f"KL {num(kl, '.4f')}  entropy {num('entropy', '.3f')}  "
        f"{r['tokens_per_s']:.0f} tok/s  step {r['step_s']:.2f} s (wait {r['wait_s']:.2f} s)  "
        f"lag {num('policy_lag', '.1f')}"
    )
    if r.get("episode_actions") is not None:  # the episodes: length, turns, where they ended
        line += f"  actions {r['episode_actions']:.1f}"
        if r.get("turns_per_episode", 1.0) > 1.0:
            line += f" ({r['turns_per_episode']:.1f} turns)"
        line += f"  budget {r.get('ended_budget', 0.0):.2f}"
        if r.get("ended_error"):
            line += f"  errors {r['ended_error']:.2f}"
    return line
