"""Orbax checkpoints of a training run: save asynchronously, commit atomically, restore anywhere.

One checkpoint (a step directory under the checkpoint root) holds:

- ``params``: the model parameters by dotted path (``learner.model.params.get_params``);
- ``opt_state``: the optimiser state, any pytree (an optax state);
- ``rng``: the PRNG key's data;
- ``meta`` (JSON): step, data cursor, metrics, the run config as TOML, the
  model's ``config.json`` and the PRNG key's implementation;
- ``tokenizer`` (JSON): the tokenizer files' text, so a checkpoint is self-contained.

Orbax writes a step into a temporary directory and renames it when every item is
written (the commit), so a process killed mid-save leaves no visible step:
:func:`committed_steps` and :func:`latest_committed_step` list only committed
steps, from any process. Restoring takes target shardings: pass the new mesh's
``NamedSharding`` per parameter (``learner.training.sharding.param_shardings``) and the
arrays land sharded on it, whatever mesh wrote them.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from learner.model.config import ModelConfig
from learner.training.sharding import shard
from shared.config import CheckpointConfig, RunConfig, from_dict, to_toml
from shared.tokenizer import read_tokenizer_files, write_tokenizer_files

ITEMS = ("params", "opt_state", "rng", "meta", "tokenizer")


def committed_steps(directory: str | Path) -> list[int]:
    """Steps whose save was committed, ascending; partial saves are never listed."""
    if not Path(directory).is_dir():
        return []
    return sorted(ocp.path.step.checkpoint_steps(directory))


def latest_committed_step(directory: str | Path) -> int | None:
    steps = committed_steps(directory)
    return steps[-1] if steps else None


@dataclass
class Restored:
    """What a checkpoint holds, restored."""

    step: int
    params: dict[str, jax.Array]
    opt_state: Any = None
    rng: jax.Array | None = None
    data_cursor: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    config_toml: str | None = None
    model_config: ModelConfig | None = None
    tokenizer_files: dict[str, str] = field(default_factory=dict)

    def run_config(self) -> RunConfig | None:
        """The run config saved with the checkpoint, parsed and validated."""
        if self.config_toml is None:
            return None
        return from_dict(tomllib.loads(self.config_toml), source="checkpoint config")

    def write_tokenizer(self, directory: str | Path) -> None:
        write_tokenizer_files(self.tokenizer_files, directory)


def _meta(
    step: int,
    data_cursor: Mapping[str, Any] | None,
    metrics: Mapping[str, Any] | None,
    config: RunConfig | None,
    model_config: ModelConfig | None,
    rng: jax.Array | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "step": step,
        "data_cursor": dict(data_cursor or {}),
        "metrics": {k: _jsonable(v) for k, v in (metrics or {}).items()},
        "config_toml": to_toml(config) if config is not None else None,
        "model_config": None,
        "rng_impl": None,
    }
    if model_config is not None:
        meta["model_config"] = {
            "hf": model_config.to_hf_config(),
            "param_dtype": model_config.param_dtype,
            "dtype": model_config.dtype,
        }
    if rng is not None and jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        meta["rng_impl"] = str(jax.random.key_impl(rng))
    json.dumps(meta)  # fail here, not in the background writer, on a non-JSON cursor
    return meta


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray | jax.Array):
        return v.item() if v.size == 1 else np.asarray(v).tolist()
    return v.item() if isinstance(v, np.generic) else v


class Checkpointer:
    """An Orbax ``CheckpointManager`` over one checkpoint root, for the training loop.

    ``save`` returns once the arrays are copied off the devices; writing goes on in
    the background and commits atomically. Call ``wait`` (or ``close``) before
    relying on a step being on disk.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        async_save: bool = True,
        read_only: bool = False,
    ) -> None:
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else max_to_keep,
            save_interval_steps=0 if read_only else save_interval_steps,
            enable_async_checkpointing=async_save,
            read_only=read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
        )
        handlers = {
            "params": ocp.StandardCheckpointHandler(),
            "opt_state": ocp.StandardCheckpointHandler(),
            "rng": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
            "tokenizer": ocp.JsonCheckpointHandler(),
        }
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )

    @classmethod
    def from_config(cls, cfg: CheckpointConfig, run_dir: str | Path) -> Checkpointer:
        return cls(Path(run_dir) / cfg.dir, max_to_keep=cfg.max_to_keep)

    def save(
        self,
        step: int,
        *,
        params: Mapping[str, jax.Array],
        opt_state: Any = None,
        rng: jax.Array | None = None,
        data_cursor: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        config: RunConfig | None = None,
        model_config: ModelConfig | None = None,
        tokenizer_dir: str | Path | None = None,
        force: bool = False,
    ) -> bool:
        """Start saving ``step``; False when the save interval skips it."""
        meta = _meta(step, data_cursor, metrics, config, model_config, rng)
        if rng is not None and jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
            rng = jax.random.key_data(rng)
        items = {"params": ocp.args.StandardSave(dict(params)), "meta": ocp.args.JsonSave(meta)}
        if opt_state is not None and jax.tree.leaves(opt_state):
            items["opt_state"] = ocp.args.StandardSave(opt_state)
        if rng is not None:
            items["rng"] = ocp.args.StandardSave({"key": rng})
        if tokenizer_dir is not None:
            items["tokenizer"] = ocp.args.JsonSave(read_tokenizer_files(tokenizer_dir))
        return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

    def wait(self) -> None:
        """Block until the last save is committed."""
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        return committed_steps(self.directory)

    def latest_step(self) -> int | None:
        return latest_committed_step(self.directory)

    def restore(
        self,
        step: int | None = None,
        *,
        shardings: Mapping[str, jax.sharding.Sharding] | jax.sharding.Sharding | None = None,
        opt_state_target: Any = None,
        with_opt_state: bool = True,
    ) -> Restored:
        """Restore ``step`` (the latest committed by default).

        ``shardings``: per-parameter (by path) or one for all; default one local
        device. ``opt_state_target``: an abstract pytree (``jax.ShapeDtypeStruct``
        leaves with shardings) giving the optimiser state's structure and
        placement; without it the state comes back as nested dicts and lists.
        """
        step = self.latest_step() if step is None else step
        if step is None or step not in self.steps():
            raise FileNotFoundError(f"{self.directory}: no committed checkpoint at step {step}")
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]
        md = self.manager.item_metadata(step)
        present = {name for name in ITEMS if (self.directory / str(step) / name).is_dir()}
        unstacked = per_layer_names(md["params"])
        if unstacked and with_opt_state and "opt_state" in present:
            raise UnstackedCheckpointError(
                f"{self.directory / str(step)} was written before the decoder blocks were "
                "stacked (it holds per-layer parameters such as "
                f"{sorted(unstacked)[0]!r}): its optimiser state cannot resume this run. "
                "Its parameters still load: start a new run from them with "
                f"learner.init_checkpoint = {str(self.directory)!r} (or export them with "
                "`python -m learner.inspect export`)."
            )
        targets = _targets(md["params"], None if unstacked else shardings)
        items = {"params": ocp.args.StandardRestore(targets)}
        if "rng" in present:
            items["rng"] = ocp.args.StandardRestore(_targets(md["rng"], None))
        if "tokenizer" in present:
            items["tokenizer"] = ocp.args.JsonRestore()
        if with_opt_state and "opt_state" in present:
            target = opt_state_target
            if target is None:
                target = _targets(md["opt_state"], None)
            items["opt_state"] = ocp.args.StandardRestore(target)
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        params = dict(out["params"])
        if unstacked:
            params = _place(stack_layers(params), shardings)
        return Restored(
            step=int(meta["step"]),
            params=params,
            opt_state=out.get("opt_state"),
            rng=_rng(out.get("rng"), meta.get("rng_impl")),
            data_cursor=meta.get("data_cursor") or {},
            metrics=meta.get("metrics") or {},
            config_toml=meta.get("config_toml"),
            model_config=model_config_of(meta),
            tokenizer_files=dict(out.get("tokenizer") or {}),
        )

    def metadata(self, step: int) -> tuple[dict[str, Any], Any, Any]:
        """(meta JSON, parameter and optimiser-state array metadata) without reading arrays."""
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        md = self.manager.item_metadata(step)
        return meta["meta"], md["params"], md.get("opt_state")

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnstackedCheckpointError(RuntimeError):
    """A checkpoint of per-layer parameters asked to resume a run (its optimiser state)."""


_PER_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def per_layer_names(params_metadata: Any) -> list[str]:
    """The parameter names of the layout before stacking (``layers.3.mlp.up_proj``), if any."""
    tree = getattr(params_metadata, "tree", params_metadata) or {}
    return [k for k in tree if isinstance(k, str) and _PER_LAYER.match(k)]


def stack_layers(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Per-layer parameters (``layers.N.name``) stacked along a leading layer axis
    (``layers.name``), the layout of :class:`learner.model.params.Model`; others kept."""
    out: dict[str, Any] = {}
    per_layer: dict[str, dict[int, Any]] = {}
    for key, value in params.items():
        m = _PER_LAYER.match(key)
        if m is None:
            out[key] = value
        else:
            per_layer.setdefault(f"layers.{m.group(2)}", {})[int(m.group(1))] = value
    for name, by_index in per_layer.items():
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"{name}: layers {sorted(by_index)} are not 0..{len(by_index) - 1}")
        out[name] = np.stack([np.asarray(by_index[i]) for i in range(len(by_index))])
    return out


def _place(params: dict[str, Any], shardings: Any) -> dict[str, jax.Array]:
    """``params`` placed as ``restore`` places them: per parameter, one for all, or one
    local device."""
    if not isinstance(shardings, Mapping):
        one = shardings or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = dict.fromkeys(params, one)
    return shard(params, shardings)


def model_config_of(meta: Mapping[str, Any]) -> ModelConfig | None:
    mc = meta.get("model_config")
    if not mc:
        return None
    return ModelConfig.from_hf_config(mc["hf"], param_dtype=mc["param_dtype"], dtype=mc["dtype"])


def _rng(item: Any, impl: str | None) -> jax.Array | None:
    if not item or "key" not in item:
        return None
    data = jnp.asarray(item["key"])
    return jax.random.wrap_key_data(data, impl=impl) if impl else data


def _targets(metadata: Any, shardings: Any) -> Any:
    """Restore targets from saved array metadata: saved shape and dtype, the given placement."""
    tree = getattr(metadata, "tree", metadata)
    if tree is None:
        return None
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def one(path: tuple, m: Any) -> Any:
        if not hasattr(m, "shape"):
            return m
        if isinstance(shardings, Mapping):
            sharding = shardings[jax.tree_util.keystr(path, simple=True, separator=".")]
        else:
            sharding = shardings or default
        return jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(one, tree)
