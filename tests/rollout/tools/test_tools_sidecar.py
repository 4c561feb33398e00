"""The tool domain taken by configuration alone: the sidecar (engine, buffer, wire) serves
GRPO groups of ``env.kind = "tools"`` episodes from ``rollout.task_source = "tools"``, and
``rollout.eval`` runs it with no ``--mode``: nothing in the core names the domain."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from shared.wire import decode_groups
from tests.conftest import REPO, start_server, stop_server

CONFIG = """\
[env]
kind = "tools"
max_steps = 10

[rollout]
task_source = "tools"
policy = "noisy_oracle"
oracle_noise = 0.0            # its habits have tests of their own (test_oracle.py)
group_size = 4
"""


@pytest.mark.multiprocess
def test_the_sidecar_serves_groups_of_tool_episodes(tmp_path, web_url):
    config = tmp_path / "tools.toml"
    config.write_text(CONFIG)
    log = (tmp_path / "sidecar.log").open("w")
    proc, url = start_server(
        ["rollout.serve", "--config", str(config), "--run-dir", str(tmp_path / "run"),
         "--set", "rollout.port=0", "--set", f"web.url={web_url}", "--set", "inference.urls=[]"],
        "serving on", log=log,
    )  # fmt: skip
    groups = []
    try:  # /batch answers with what is ready once a group is: ask until two came
        deadline = time.monotonic() + 90
        while len(groups) < 2 and time.monotonic() < deadline:
            with urllib.request.urlopen(f"{url}/batch?groups=2&timeout=60", timeout=90) as r:
                groups += decode_groups(r.read())
        groups = groups[:2]
    finally:
        stop_server(proc)
        log.close()
    assert len(groups) == 2
    for g in groups:
        assert g.num_episodes == 4 and g.task_id.startswith("train")
        assert set(g.statuses) <= {"ok", "truncated"}
        assert all(int(t.loss_mask.sum()) > 0 for t in g.trajectories)  # the model's turns
    rewards = [float(r) for g in groups for r in g.episode_rewards]
    assert max(rewards) == 1.0  # the oracle's answers verified by the qa scorer's tolerance


def test_rollout_eval_takes_the_environment_from_the_config(tmp_path):
    config = tmp_path / "tools.toml"
    config.write_text(CONFIG)
    out = subprocess.run(
        [sys.executable, "-m", "rollout.eval", "--config", str(config), "--policy", "oracle",
         "--split", "test", "--n", "40"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mode"] == "tools" and result["n"] == 40 and result["infra_errors"] == 0
    assert result["success_rate"] >= 0.98
