"""Module paths that moved, kept importable as aliases of the modules that replaced them.

When a package's modules are regrouped (``learner.step`` into ``learner.training.step``,
``rollout.parser`` into ``rollout.agent.parser``), code written against the old paths
should keep working for a while and say what to change. :class:`MovedFinder` resolves
each old path of a table to the very module that replaced it (one module object under
two names, so its state and classes are shared; the module keeps its own name and spec),
with a ``DeprecationWarning`` naming the new path at the line that imported it. A module
that became a package of the same name keeps its old names through the package's
``__getattr__`` (:func:`forward_names`).

Each side owns its table (``learner/moved.py``, ``rollout/moved.py``) and installs it when
the side is imported; this module imports nothing of either.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["MovedFinder", "forward_names", "install", "warn_moved"]


def warn_moved(old: str, new: str, *, stacklevel: int) -> None:
    """The warning for a use of ``old``; ``stacklevel`` counts from the caller of this."""
    warnings.warn(
        f"{old} has moved to {new}; the old path is an alias and will go",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module that replaced it, leaving that module untouched."""

    def __init__(self, new: str):
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        # the import system sets ``__spec__`` on what this returns; exec_module puts the
        # module's own spec back, so it still knows its real name (pickling, reloads)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of ``table`` (old path -> new path), and nothing else."""

    def __init__(self, table: Mapping[str, str]):
        self.table = table

    def find_spec(self, fullname, path=None, target=None):
        new = self.table.get(fullname)
        if new is None:
            return None
        # here -> the import machinery (its frames are skipped) -> the importing line
        warn_moved(fullname, new, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install(table: Mapping[str, str]) -> None:
    """Put a finder for ``table`` last on :data:`sys.meta_path`, once: an old path is only
    looked up once no module or package of that name exists."""
    if not any(isinstance(f, MovedFinder) and f.table is table for f in sys.meta_path):
        sys.meta_path.append(MovedFinder(table))


def forward_names(package: str, module: str, names: frozenset[str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` that serves ``names`` from ``module`` (the module
    the package's old single-module self became), with the warning; other names are not
    there (so ``from package import submodule`` still imports the submodule)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warn_moved(f"{package}.{name}", f"{module}.{name}", stacklevel=2)
        return getattr(importlib.import_module(module), name)

    __getattr__.served = names  # type: ignore[attr-defined]
    return __getattr__
