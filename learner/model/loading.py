"""Where a model comes from: a built-in config, an HF directory, or an Orbax checkpoint.

``learner.serve``, ``learner.inspect`` and the benchmarks open models through
:func:`open_source`, which also finds the tokenizer that goes with the weights
(the checkpoint's own files, the HF directory's, or the tiny tokenizer), so a
served model always decodes with the tokenizer it was trained with.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from flax import nnx

from learner.model import hf
from learner.model.config import ModelConfig, tiny_config
from learner.model.params import Model, get_params, set_params
from learner.training.checkpoint import Checkpointer, Restored, committed_steps
from shared.tokenizer import TINY_TOKENIZER_DIR


@dataclass
class Source:
    """A model with its weights and the tokenizer directory that belongs to it."""

    model: Model
    tokenizer_dir: Path
    path: str  # what was opened: "tiny", a config, an HF dir or a checkpoint step dir
    step: int | None = None


def resolve_checkpoint(path: str | Path) -> tuple[Path, int]:
    """(checkpoint root, step) for a root (its latest committed step) or a step directory."""
    path = Path(path).absolute()
    steps = committed_steps(path)
    if steps:
        return path, steps[-1]
    if path.name.isdigit() and int(path.name) in committed_steps(path.parent):
        return path.parent, int(path.name)
    raise FileNotFoundError(f"{path}: neither a checkpoint directory nor a committed step")


def is_hf_dir(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


def init_config(name: str, *, param_dtype: str = "float32", dtype: str = "float32") -> ModelConfig:
    """``tiny`` or a path to an HF ``config.json`` (or its directory)."""
    if name == "tiny":
        return tiny_config(param_dtype=param_dtype, dtype=dtype)
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{name}: not 'tiny' and not a config.json")
    return ModelConfig.from_hf_config(
        json.loads(path.read_text()), param_dtype=param_dtype, dtype=dtype
    )


def restore_checkpoint(path: str | Path) -> Restored:
    root, step = resolve_checkpoint(path)
    ck = Checkpointer(root, read_only=True, async_save=False)
    try:
        return ck.restore(step, with_opt_state=False)
    finally:
        ck.close()


def _model_from_restored(r: Restored, param_dtype: str, dtype: str, seed: int) -> Model:
    if r.model_config is None:
        raise ValueError("the checkpoint does not record its model config")
    cfg = dataclasses.replace(r.model_config, param_dtype=param_dtype, dtype=dtype)
    model = Model(cfg, rngs=nnx.Rngs(seed))
    set_params(model, r.params)
    return model


def open_source(
    *,
    init: str | None = None,
    hf_dir: str | Path | None = None,
    checkpoint: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
    param_dtype: str = "float32",
    dtype: str = "float32",
    seed: int = 0,
) -> Source:
    """Open exactly one of ``init`` / ``hf_dir`` / ``checkpoint``; ``tokenizer_dir`` overrides."""
    if sum(x is not None for x in (init, hf_dir, checkpoint)) != 1:
        raise ValueError("give exactly one of init, hf_dir, checkpoint")
    if init is not None:
        model = Model(init_config(init, param_dtype=param_dtype, dtype=dtype), rngs=nnx.Rngs(seed))
        tok = Path(tokenizer_dir) if tokenizer_dir else TINY_TOKENIZER_DIR
        return Source(model, tok, init)
    if hf_dir is not None:
        model = hf.load_hf(hf_dir, param_dtype=param_dtype, dtype=dtype, seed=seed)
        return Source(model, Path(tokenizer_dir or hf_dir), str(hf_dir))
    root, step = resolve_checkpoint(checkpoint)  # type: ignore[arg-type]
    r = restore_checkpoint(root / str(step))
    model = _model_from_restored(r, param_dtype, dtype, seed)
    return Source(model, _tokenizer_of(r, tokenizer_dir), str(root / str(step)), step)


def _tokenizer_of(r: Restored, override: str | Path | None) -> Path:
    if override is not None:
        return Path(override)
    if not r.tokenizer_files:
        return TINY_TOKENIZER_DIR
    out = Path(tempfile.mkdtemp(prefix="tokenizer-"))
    atexit.register(shutil.rmtree, out, True)
    r.write_tokenizer(out)
    return out


def load_weights_into(model: Model, path: str | Path) -> str:
    """Replace ``model``'s weights from an HF directory or a checkpoint; what was loaded.

    The architecture must match (every parameter's name and shape); a mismatch
    raises before any weight is changed.
    """
    if is_hf_dir(path):
        cfg = hf.load_config(path)
        params = hf.load_params(path, cfg)
        what = f"HF weights from {path}"
    else:
        r = restore_checkpoint(path)
        params, what = r.params, f"checkpoint step {r.step} from {path}"
    current = {p: tuple(v.shape) for p, v in get_params(model).items()}
    bad = sorted(k for k in current if k not in params or tuple(params[k].shape) != current[k])
    if bad or set(params) - set(current):
        raise ValueError(f"{path}: weights do not fit the served model (first mismatch: {bad[:3]})")
    set_params(model, params)
    return what
