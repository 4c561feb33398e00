"""The learner's old module paths import as deprecated aliases of the modules that replaced them."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import learner
from learner.model import params
from learner.moved import MOVED

ROOT = Path(__file__).resolve().parents[2]


def test_every_old_path_names_a_module_that_exists_and_no_file_is_left_at_it():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), old
        assert not (ROOT / old.replace(".", "/")).is_dir(), old


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_itself_and_keeps_its_real_name(old):
    new = importlib.import_module(MOVED[old])
    spec = new.__spec__
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {MOVED[old]}"):
        alias = importlib.import_module(old)
    assert alias is new
    assert sys.modules[old] is new
    assert getattr(learner, old.rsplit(".", 1)[1]) is new
    # the module still knows its own name: the alias leaves its spec alone
    assert new.__spec__ is spec
    assert new.__name__ == MOVED[old]


def test_the_old_module_learner_model_serves_its_names_from_params():
    assert _names_of_model_package() == frozenset(params.__all__)
    with pytest.warns(DeprecationWarning, match="learner.model.Model has moved"):
        from learner.model import Model
    assert Model is params.Model
    # the warning points at the line that asked for the name
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        learner.model.set_params  # noqa: B018
    assert seen and seen[0].filename == __file__
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        learner.model.nothing_here  # noqa: B018
    # a submodule is still imported as a submodule, not looked up among params' names
    from learner.model import hf

    assert hf.__name__ == "learner.model.hf"


def _names_of_model_package():
    return importlib.import_module("learner.model")._PARAMS_NAMES


def test_a_script_written_against_the_old_paths_runs_in_a_fresh_process():
    """The imports of a script from before the packages by role (as the Tunix comparison's
    is), in a process of its own: each warns once, at the script's own line, and gives the
    objects of the new modules."""
    script = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    from learner.batching import pack
    from learner.engine import Engine, Request, SamplingParams, bucket
    from learner.model import Model, param_info, set_params
    from learner.modelconfig import ModelConfig
    from learner.sharding import make_mesh
    from learner.step import compile_step, new_state, place_batch, token_logprobs
import learner.model.params, learner.serving.engine, learner.training.step
assert pack.__module__ == "learner.training.batching"
assert Engine is learner.serving.engine.Engine and Model is learner.model.params.Model
assert compile_step is learner.training.step.compile_step
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
        "learner.model.set_params,learner.modelconfig,learner.sharding,learner.step"
    ]
