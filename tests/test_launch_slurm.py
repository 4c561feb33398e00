"""``launch/learner.sbatch`` as SLURM would run it, on one machine.

SLURM itself is not here, so ``srun`` is a labelled stand-in on ``PATH`` (the one part
that cannot run here): it records each command line and runs the dry-run step as 2 tasks
with the variables SLURM gives each task (``SLURM_JOB_ID``, ``SLURM_NTASKS``,
``SLURM_PROCID``, ``SLURM_STEP_NODELIST``). What runs is the real script, the real
``launch/learner.sh`` and ``learner.train``, and JAX's own SLURM detection joining the two
processes through ``jax.distributed``; the training step after it is only recorded.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from shared.config import load

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "launch" / "learner.sbatch"

FAKE_SRUN = """#!/bin/bash
# STAND-IN for SLURM's srun (no SLURM on this machine): records the command, runs a
# --dry-run as 2 tasks with SLURM's per-task variables, and only records anything else.
echo "$*" >> "$SRUN_LOG"
while [[ $1 == --* ]]; do shift; done
case " $* " in *" --dry-run "*) ;; *) exit 0;; esac
pids=()
for i in 0 1; do
  SLURM_JOB_ID=$FAKE_JOB_ID SLURM_NTASKS=2 SLURM_PROCID=$i SLURM_LOCALID=0 \\
  SLURM_STEP_NODELIST=localhost SLURM_NODELIST=localhost "$@" > "$SRUN_LOG.$i" 2>&1 &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
"""


def test_the_sbatch_script_asks_for_the_config_s_nodes():
    text = SBATCH.read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M).group(1))
    cfg = load(REPO / "configs" / "qwen2.5-14b-2x8xh100.toml")
    assert nodes == cfg.mesh.num_processes == 2
    gpus = int(re.search(r"^#SBATCH --gpus-per-node=(\d+)$", text, re.M).group(1))
    assert nodes * gpus == cfg.mesh.num_devices
    assert os.access(SBATCH, os.X_OK)


@pytest.mark.multiprocess
def test_sbatch_runs_the_dry_run_as_two_slurm_tasks_then_the_run(tmp_path):
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    log = tmp_path / "srun.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "XLA_"))}
    env.update(
        PATH=f"{srun.parent}:{env['PATH']}", SRUN_LOG=str(log), JAX_PLATFORMS="cpu",
        FAKE_JOB_ID=str(random.randrange(1, 4000)), SLURM_SUBMIT_DIR=str(REPO),
    )  # fmt: skip
    sets = ["--set", "mesh.num_devices=4", "--set", "mesh.data=1", "--set", "mesh.fsdp=4",
            "--set", "mesh.num_processes=2", "--set", "learner.groups_per_step=1",
            "--set", "learner.length_buckets=[256]"]  # fmt: skip
    proc = subprocess.run(
        ["bash", str(SBATCH), "configs/tiny.toml", *sets],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = log.read_text().splitlines()
    assert first.split()[1:5] == [
        "launch/learner.sh",
        "configs/tiny.toml",
        "--dry-run",
        "--compile",
    ]
    assert second.split()[1:3] == ["launch/learner.sh", "configs/tiny.toml"]
    assert "--dry-run" not in second and second.endswith(" ".join(sets))
    for i in (0, 1):  # each task joined the other: one step over both processes' devices
        out = Path(f"{log}.{i}").read_text()
        report = json.loads(out.strip().splitlines()[-1])["dry_run"]
        assert report["processes"] == 2, out[-2000:]
        assert report["compiled"]["fits"], report
