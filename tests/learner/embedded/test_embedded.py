"""The embedded default, end to end: demonstrations, SFT, test evaluation, GRPO, summary;
web, inference server and sidecars as children, none left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


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
def test_embedded_pipeline_runs_every_phase_and_leaves_no_process(tmp_path):
    sets = [
        "learner.steps=3", "learner.groups_per_step=2", "rollout.group_size=2",
        "rollout.max_concurrent_episodes=4", "inference.max_new_tokens=16", "env.max_steps=3",
        "learner.length_buckets=[512]", "checkpoint.every_steps=2", "logging.progress=false",
        f"logging.run_dir={tmp_path}", "logging.run_name=emb", "learner.eval_every=2",
        "learner.eval_tasks=3", "sft.demos=8", "sft.steps=2", "sft.batch_size=2",
        "sft.copy_steps=2", "sft.copy_rows=1", "learner.test_tasks=4",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "learner.train", *[a for s in sets for a in ("--set", s)]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
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
    assert sorted(children) == ["demo-sidecar", "inference", "sidecar", "web"]
    # Warm start: demonstrations through the sidecar, exported, fine-tuned on.
    assert len(list((run / "demos" / "episodes").glob("*.trajectory.jsonl"))) >= 8
    assert (run / "sft" / "sft.jsonl").read_text().count("\n") >= 1
    assert (run / "sft" / "checkpoints" / "2").is_dir()
    assert "starting from" in out.stderr and "[progress] SFT: 2/2 steps" in out.stderr
    # every phase's progress and every GRPO step in a log that is not a terminal
    for phase in ("demos", "SFT", "eval test-before-t1", "eval test-after-greedy", "GRPO"):
        assert f"[progress] {phase}: " in out.stderr, phase
    assert out.stderr.count("grpo step ") == 3
    # Test split before and after, at the sampling temperature and greedily.
    for name in ("before-t1", "before-greedy", "after-t1", "after-greedy"):
        result = json.loads((run / "eval" / f"test-{name}" / "result.json").read_text())
        assert result["n"] == 4 and len(result["ci95"]) == 2
        assert len(list((run / "eval" / f"test-{name}").glob("*.trajectory.jsonl"))) == 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n_test"] == 4 and summary["mode"] == "api" and summary["temperature"] == 1.0
    assert summary["wall_minutes"] > 0 and "gain_points" in summary
    assert "SFT start" in out.stdout and "after GRPO" in out.stdout
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "latest").resolve() == run.resolve()
    pids = {int(p) for p in children.values()}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _groups_alive(pids) == []  # no grandchild (browser) either
    assert (
        summary["sft_greedy_ci95"]
        == json.loads((run / "eval" / "test-before-greedy" / "result.json").read_text())["ci95"]
    )
    assert len(summary["grpo_greedy_ci95"]) == 2

    # Resumed for one more step, with the control: the summary is written again from the
    # saved results before GRPO, and its wall time counts both invocations.
    first = [json.loads(x) for x in (run / "invocations.jsonl").read_text().splitlines()]
    assert len(first) == 1 and first[0]["first_step"] == 0 and first[0]["last_step"] == 3
    more = [a for s in sets for a in ("--set", s)] + ["--set", "learner.steps=4", "--control"]
    out = subprocess.run(
        [sys.executable, "-m", "learner.train", *more],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # the same web port as the first invocation: the policy learned the port of its demos
    port = (run / "web_port").read_text().strip()
    assert f"web started at http://127.0.0.1:{port} " in out.stderr
    rows = [json.loads(x) for x in (run / "invocations.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["first_step"] == 3 and rows[1]["last_step"] == 4
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["invocations"] == 2
    assert resumed["wall_minutes"] == pytest.approx(sum(r["minutes"] for r in rows), abs=0.01)
    assert resumed["wall_minutes"] > summary["wall_minutes"]
    assert resumed["sft_success"] == summary["sft_success"]  # the saved results, not new ones
    # The control: both invocations' GRPO time spent on more SFT from the warm start, at
    # the warm start's pace, served by a server of its own and tested the same way.
    sft_lines = [
        json.loads(x) for x in (run / "sft" / "sft_metrics.jsonl").read_text().splitlines()
    ]
    pace = sft_lines[-1]["elapsed_s"] / sft_lines[-1]["step"]
    grpo_s = 60 * sum(r["grpo_minutes"] for r in rows)
    assert all(r["grpo_minutes"] > 0 for r in rows)
    steps = resumed["control_sft_steps"]
    assert steps == pytest.approx(max(1, grpo_s / pace), abs=1.5)
    assert (run / "control" / "checkpoints" / str(steps)).is_dir()
    assert "control-inference" in (run / "logs" / "children.pids").read_text()
    for name, key in (("control-greedy", "control_greedy"), ("control-t1", "control")):
        result = json.loads((run / "eval" / f"test-{name}" / "result.json").read_text())
        assert result["n"] == 4 and result["temperature"] == (0.0 if "greedy" in name else 1.0)
        assert resumed[f"{key}_success"] == result["success_rate"]
        assert resumed[f"{key}_ci95"] == result["ci95"]
    assert resumed["control_minutes"] > 0
    assert "control: " in out.stderr


PARENT = """
import sys, time
from pathlib import Path
from learner.embedded.children import Children
children = Children(Path(sys.argv[1]))
print(children.start("web", ["rollout.web", "--port", "0"]), flush=True)
time.sleep(600)
"""


@pytest.mark.multiprocess
def test_a_child_ends_when_the_run_that_started_it_is_killed(tmp_path):
    """SIGKILL leaves learner.train no way to stop its children: they watch it instead
    (shared.lifeline) and stop their own process group."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().startswith("http://127.0.0.1:")
        pid = int((tmp_path / "children.pids").read_text().split()[1])
        assert _groups_alive({pid})
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while _groups_alive({pid}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _groups_alive({pid}) == []
    finally:
        parent.kill()


def test_the_watch_starts_only_in_a_child_of_the_named_parent(monkeypatch):
    from shared import lifeline

    monkeypatch.delenv(lifeline.ENV, raising=False)
    assert lifeline.watch_parent() is False
    monkeypatch.setenv(lifeline.ENV, str(os.getpid()))  # not this process's parent
    assert lifeline.watch_parent() is False
    assert lifeline.ENV not in os.environ  # not passed on to this process's children
