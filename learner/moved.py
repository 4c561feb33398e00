"""The learner's module paths from before its packages by role, kept as aliases.

The learner's modules once sat side by side in ``learner/`` (``learner.step``,
``learner.engine``, ``learner.batching``, ...); they now live in :mod:`learner.model`,
:mod:`learner.serving`, :mod:`learner.training` and :mod:`learner.embedded`. A script
written against the old paths still imports: each old name resolves to the very module
that replaced it (one module object under two names, so its state and its classes are
shared), with a ``DeprecationWarning`` naming the new path. ``learner.model`` was a module
and is now a package; its old names (``Model``, ``param_info``, ``set_params``, ...) are
served by the package's ``__getattr__`` from :mod:`learner.model.params`.

:func:`install` puts the finder on :data:`sys.meta_path` once; ``import learner`` calls it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old module path -> the module that holds its code now
MOVED: dict[str, str] = {
    "learner.api": "learner.serving.api",
    "learner.attention": "learner.model.attention",
    "learner.batching": "learner.training.batching",
    "learner.checkpoint": "learner.training.checkpoint",
    "learner.decoder": "learner.model.decoder",
    "learner.distributed": "learner.training.distributed",
    "learner.dryrun": "learner.training.dryrun",
    "learner.engine": "learner.serving.engine",
    "learner.extend": "learner.serving.extend",
    "learner.grpo": "learner.training.grpo",
    "learner.hf": "learner.model.hf",
    "learner.host_memory": "learner.training.host_memory",
    "learner.loading": "learner.model.loading",
    "learner.logprobs": "learner.model.logprobs",
    "learner.loop": "learner.training.loop",
    "learner.modelconfig": "learner.model.config",
    "learner.pipeline": "learner.embedded.pipeline",
    "learner.prefix_cache": "learner.serving.prefix_cache",
    "learner.safetensors_io": "learner.model.safetensors_io",
    "learner.sampling": "learner.serving.sampling",
    "learner.scheduler": "learner.serving.scheduler",
    "learner.sharding": "learner.training.sharding",
    "learner.source": "learner.training.source",
    "learner.step": "learner.training.step",
    "learner.trackers": "learner.training.trackers",
}


def warn_moved(old: str, new: str, *, stacklevel: int) -> None:
    warnings.warn(
        f"{old} has moved to {new}; the old path is an alias and will go",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module that replaced it, leaving that module untouched."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        # the import system sets ``__spec__`` on what this returns; exec_module puts the
        # module's own spec back, so it still knows its real name (pickling, reloads)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        # here -> warn_moved; the import machinery's frames are skipped: the warning names the import
        warn_moved(fullname, new, stacklevel=3)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
