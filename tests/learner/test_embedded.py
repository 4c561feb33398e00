"""The embedded default: web, inference server and sidecar as children; none left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _groups_alive(pgids: set[int]) -> list[str]:
    """Processes (not zombies) whose process group is one of ``pgids``."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids and state != "Z":
            alive.append(text[:80])
    return alive


@pytest.mark.multiprocess
@pytest.mark.slow
def test_embedded_default_trains_three_steps_and_leaves_no_process(tmp_path):
    sets = [
        "learner.steps=3", "learner.groups_per_step=2", "rollout.group_size=2",
        "rollout.max_concurrent_episodes=4", "inference.max_new_tokens=16", "env.max_steps=2",
        "learner.length_buckets=[512]", "checkpoint.every_steps=2", "logging.progress=false",
        f"logging.run_dir={tmp_path}", "logging.run_name=emb", "learner.eval_every=2",
        "learner.eval_tasks=3",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "learner.train", *[a for s in sets for a in ("--set", s)]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "emb"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "eval" not in r] == [1, 2, 3]
    # The dev split was evaluated once, after the weights of step 2 were pushed.
    evals = [r for r in lines if "eval" in r]
    assert [r["step"] for r in evals] == [2]
    assert evals[0]["eval"]["n"] == 3 and evals[0]["eval"]["policy"] == "server"
    assert len(list((run / "eval" / "2").glob("*.trajectory.jsonl"))) == 3
    children = dict(
        line.split() for line in (run / "logs" / "children.pids").read_text().splitlines()
    )
    assert sorted(children) == ["inference", "sidecar", "web"]
    pids = {int(p) for p in children.values()}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _groups_alive(pids) == []  # no grandchild (browser) either
