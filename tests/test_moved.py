"""Module paths from before the packages by role import as deprecated aliases of the
modules that replaced them, on both sides (``shared.moved``, ``learner/moved.py``,
``rollout/moved.py``)."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import learner
import rollout
from learner.moved import MOVED as LEARNER_MOVED
from rollout.moved import MOVED as ROLLOUT_MOVED

ROOT = Path(__file__).resolve().parents[1]
MOVED = {**LEARNER_MOVED, **ROLLOUT_MOVED}
# packages that were modules of the same name: (package, the module their old names come from)
BECAME_PACKAGES = [
    ("learner.model", "learner.model.params"),
    ("rollout.net", "rollout.net.core"),
    ("rollout.archive", "rollout.archive.store"),
]


def test_every_old_path_names_a_module_that_exists_and_nothing_is_left_at_it():
    assert len(LEARNER_MOVED) == 25 and len(ROLLOUT_MOVED) == 24
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), old
        assert not (ROOT / old.replace(".", "/")).is_dir(), old


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_itself_and_keeps_its_real_name(old):
    new = importlib.import_module(MOVED[old])
    spec = new.__spec__
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
        importlib.import_module(old)
    assert [(w.category, str(w.message)) for w in seen] == [
        (
            DeprecationWarning,
            f"{old} has moved to {MOVED[old]}; the old path is an alias and will go",
        )
    ]
    assert alias is new
    assert sys.modules[old] is new
    parent = learner if old.startswith("learner.") else rollout
    assert getattr(parent, old.rsplit(".", 1)[1]) is new
    # the module still knows its own name: the alias leaves its spec alone
    assert new.__spec__ is spec
    assert new.__name__ == MOVED[old]


@pytest.mark.parametrize("package, module", BECAME_PACKAGES)
def test_a_module_that_became_a_package_serves_its_old_names(package, module):
    pkg, source = importlib.import_module(package), importlib.import_module(module)
    served = pkg.__getattr__.served  # the names given to forward_names
    if hasattr(source, "__all__"):
        assert served == frozenset(source.__all__)
    for name in sorted(served):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            value = getattr(pkg, name)
        assert value is getattr(source, name), name
        assert [str(w.message) for w in seen] == [
            f"{package}.{name} has moved to {module}.{name}; the old path is an alias and will go"
        ]
        assert seen[0].category is DeprecationWarning and seen[0].filename == __file__
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        pkg.nothing_here  # noqa: B018


def test_a_submodule_is_still_imported_as_one_not_looked_up_among_the_old_names():
    from learner.model import hf
    from rollout.net import urls

    assert hf.__name__ == "learner.model.hf" and urls.__name__ == "rollout.net.urls"


def test_scripts_written_against_the_old_paths_run_in_a_fresh_process():
    """The imports of scripts from before the packages by role (the Tunix comparison's,
    and a rollout one), in a process of their own: each old name warns at the script's
    own line and gives the objects of the new modules."""
    script = """
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    from learner.batching import pack
    from learner.engine import Engine, Request, SamplingParams, bucket
    from learner.model import Model, param_info, set_params
    from learner.modelconfig import ModelConfig
    from learner.sharding import make_mesh
    from learner.step import compile_step, new_state, place_batch, token_logprobs
    from rollout.parser import parse
    from rollout.net import Net
import learner.model.params, learner.serving.engine, learner.training.step
import rollout.agent.parser, rollout.net.core
assert pack.__module__ == "learner.training.batching"
assert Engine is learner.serving.engine.Engine and Model is learner.model.params.Model
assert compile_step is learner.training.step.compile_step
assert parse is rollout.agent.parser.parse and Net is rollout.net.core.Net
moved = sorted({str(w.message).split(" has moved")[0] for w in seen
                if w.category is DeprecationWarning and w.filename == "<string>"})
print(",".join(moved))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "learner.batching,learner.engine,learner.model.Model,learner.model.param_info,"
        "learner.model.set_params,learner.modelconfig,learner.sharding,learner.step,"
        "rollout.net.Net,rollout.parser"
    ]
