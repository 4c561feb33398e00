"""Orbax checkpoints across processes: commit, SIGKILL, restore onto another mesh.

Each scenario runs in child processes (``tests/learner/checkpoint_child.py``): the
writer is killed with SIGKILL, and the restorer runs with 8 simulated CPU devices
(set in its environment, never in this process, whose device count other tests
rely on).
"""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest

from learner.model.params import get_params
from learner.training.checkpoint import Checkpointer, committed_steps, latest_committed_step
from tests.conftest import REPO
from tests.learner.helpers import small_model

pytestmark = pytest.mark.multiprocess


def _child(*args, devices: int | None = None, **kw):
    env = dict(os.environ)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.learner.checkpoint_child", *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_save_kill_restore_onto_an_8_device_mesh(tmp_path):
    ckpt = tmp_path / "ckpt"
    writer = _child("save", ckpt, 5, tmp_path / "saved.npz")
    line = writer.stdout.readline()
    assert line.strip() == "committed 5", line or writer.stderr.read()
    assert latest_committed_step(ckpt) == 5  # seen from another process
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(30) == -signal.SIGKILL
    reader = _child("restore", ckpt, tmp_path / "restored.npz", devices=8)
    out, err = reader.communicate(timeout=300)
    assert reader.returncode == 0, err[-3000:]
    assert "restored 5 onto" in out
    saved, restored = np.load(tmp_path / "saved.npz"), np.load(tmp_path / "restored.npz")
    assert sorted(saved.files) == sorted(restored.files) and len(saved.files) > 30
    for name in saved.files:
        assert saved[name].dtype == restored[name].dtype
        assert np.array_equal(saved[name], restored[name]), name


def test_a_step_killed_mid_save_is_never_committed(tmp_path):
    ckpt = tmp_path / "ckpt"
    child = _child("save-and-die", ckpt)
    _, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, err[-3000:]
    assert committed_steps(ckpt) == [1]
    leftovers = [p.name for p in ckpt.iterdir() if p.name.startswith("2")]
    assert leftovers and all("tmp" in name for name in leftovers)  # it died mid-write
    with Checkpointer(ckpt) as ck:  # a new writer cleans up and carries on
        assert ck.latest_step() == 1
        r = ck.restore()
        assert r.step == 1 and "ballast" not in r.params
        ck.save(2, params=r.params)
    assert committed_steps(ckpt) == [1, 2]
    assert not [p for p in ckpt.iterdir() if "tmp" in p.name]


def test_save_restore_in_process_keeps_everything(tmp_path):
    model = small_model()
    params = get_params(model)
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    with Checkpointer(tmp_path, max_to_keep=2) as ck:
        for step in (10, 20, 30):
            ck.save(
                step,
                params=params,
                opt_state=opt_state,
                rng=jax.random.PRNGKey(step),
                data_cursor={"step": step},
                metrics={"reward": np.float32(0.5)},
            )
        ck.wait()
        assert ck.steps() == [20, 30]  # max_to_keep
        r = ck.restore(20, opt_state_target=jax.eval_shape(tx.init, params))
    assert r.step == 20 and r.data_cursor == {"step": 20} and r.metrics == {"reward": 0.5}
    assert np.array_equal(r.rng, jax.random.PRNGKey(20))  # raw uint32 keys come back raw
    assert type(r.opt_state) is type(opt_state)
    for k, v in params.items():
        assert np.array_equal(r.params[k], v)
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path, read_only=True).restore(10)


def test_an_async_save_is_invisible_until_committed(tmp_path):
    params = {"w": np.arange(4096 * 4096, dtype=np.float32).reshape(4096, 4096)}  # 64 MiB
    ck = Checkpointer(tmp_path)
    ck.save(1, params=params)  # returns while the background write goes on
    seen = []
    while not seen or not seen[-1]:
        seen.append(committed_steps(tmp_path))
        time.sleep(0.002)
    assert seen[0] == []  # the first look, right after save() returned: nothing committed
    assert seen[-1] == [1] and all(s in ([], [1]) for s in seen)
    r = ck.restore(1)  # once listed, the step is whole
    assert np.array_equal(r.params["w"], params["w"])
    ck.close()


def test_a_checkpoint_of_per_layer_parameters_loads_stacked_and_refuses_to_resume(tmp_path):
    """Checkpoints written before the blocks were stacked (``layers.N.name``) still give
    their parameters (stacked), but resuming their optimiser state is refused, saying what
    to do instead."""
    from learner.training.checkpoint import UnstackedCheckpointError, stack_layers

    model = small_model()  # 2 layers
    stacked = {k: np.asarray(v) for k, v in get_params(model).items()}
    old = {}
    for k, v in stacked.items():
        if k.startswith("layers."):
            for i in range(v.shape[0]):
                old[f"layers.{i}.{k[len('layers.') :]}"] = v[i]
        else:
            old[k] = v
    assert set(stack_layers(old)) == set(stacked)
    tx = optax.adam(1e-3)
    with Checkpointer(tmp_path / "old") as ck:
        ck.save(7, params=old, opt_state=tx.init(old), force=True)
    ck = Checkpointer(tmp_path / "old", read_only=True)
    r = ck.restore(with_opt_state=False)
    assert set(r.params) == set(stacked)
    for k, v in stacked.items():
        np.testing.assert_array_equal(np.asarray(r.params[k]), v)
    with pytest.raises(UnstackedCheckpointError, match="init_checkpoint"):
        ck.restore()
