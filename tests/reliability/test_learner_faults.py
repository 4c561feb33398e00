"""Learner faults: a checkpoint save that fails (the disk is full) stops training cleanly."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from learner.training.checkpoint import Checkpointer, committed_steps
from shared.config import from_dict
from tests.conftest import REPO
from tests.learner.step_child import groups as make_groups
from tests.learner.test_train import GROUPS_PER_STEP, FixedSidecar, G, _args

pytestmark = [pytest.mark.reliability, pytest.mark.multiprocess]
FILE_LIMIT = 256 << 10  # bytes: a checkpoint of the model needs megabytes


def _disk_full(argv: list[str]) -> list[str]:
    """``argv`` run with files unable to grow past FILE_LIMIT: writes fail with EFBIG, like
    ENOSPC, even for root (Python ignores SIGXFSZ, so the write fails instead of killing)."""
    limit = f"resource.setrlimit(resource.RLIMIT_FSIZE, ({FILE_LIMIT}, {FILE_LIMIT}))"
    code = f"import os, resource, sys; {limit}; os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", code, *argv]


def test_a_checkpoint_save_that_fails_stops_training_with_the_last_one_intact(tmp_path, fault):
    from learner.training.loop import Trainer

    row = fault(
        "checkpoint save fails (the disk is full)",
        "training stops, exit 1 with a one-line reason; the last committed checkpoint is "
        "intact and restorable; nothing half-written is committed",
    )
    side = FixedSidecar([g for seed in range(2) for g in make_groups(seed, n=4, g=G)])
    args = _args(side.url, tmp_path, "full")
    # The run's step-0 checkpoint, as a first start writes it.
    sets = dict(a.split("=", 1) for a in args[args.index("--set") + 1 :: 2])
    cfg = from_dict(
        {
            "rollout": {"urls": [side.url], "group_size": G},
            "learner": {"groups_per_step": GROUPS_PER_STEP, "length_buckets": [16, 32]},
        }
    )
    assert sets["logging.run_name"] == "full"
    Trainer(cfg, tmp_path / "full").close()
    ckpt = tmp_path / "full" / "checkpoints"
    assert committed_steps(ckpt) == [0]
    with Checkpointer(ckpt, read_only=True) as c:
        before = {k: np.asarray(v) for k, v in c.restore(0).params.items()}

    out = subprocess.run(_disk_full(args), cwd=REPO, capture_output=True, text=True, timeout=300)
    # (Orbax's background threads log to the same stderr: the line may not start it.)
    reason = re.findall(r"learner\.train: stopped: [^\n]*", out.stderr)
    row["observed"] = f"exit {out.returncode}: " + (reason[0] if reason else "no reason given")
    assert out.returncode == 1, out.stderr[-3000:]
    assert len(reason) == 1, out.stderr[-3000:]
    last = reason[0]
    assert last.startswith("learner.train: stopped: saving the checkpoint of step 2 failed")
    assert "File too large" in last
    assert "the last committed checkpoint, step 0, is intact" in last
    assert committed_steps(ckpt) == [0]
    with Checkpointer(ckpt, read_only=True) as c:
        r = c.restore(0)
    for k, v in before.items():
        np.testing.assert_array_equal(np.asarray(r.params[k]), v, err_msg=k)
    assert side.acked == set()  # nothing was acknowledged: every group will be served again
