"""A run whose test split cannot give ``learner.test_tasks`` tasks stops at start-up with
the task source's message, before its warm start (demonstrations, SFT) spends anything;
``rollout.eval --check-tasks`` is the check: the evaluation's own task loading, no episode."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

CONFIG = """\
[env]
kind = "tools"

[rollout]
task_source = "tools"
task_templates = ["tools_combined_population"]

[sft]
demos = 16
steps = 2

[learner]
test_tasks = {n}

[logging]
run_dir = "{runs}"
progress = false
"""


def _config(tmp_path, n: int):
    path = tmp_path / "tools.toml"
    path.write_text(CONFIG.format(n=n, runs=tmp_path / "runs"))
    return path


def _check(config, n: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollout.eval", "--config", str(config), "--split", "test",
         "--n", str(n), "--check-tasks", "--set", "web.url=http://127.0.0.1:9"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_tasks_counts_the_split_and_runs_no_episode(tmp_path):
    config = _config(tmp_path, 0)
    out = _check(config, 12)  # the web named is not running: no episode may need it
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "split": "test", "asked": 12, "tasks": 12,
    }  # fmt: skip
    out = _check(config, 100_000)
    assert out.returncode == 2
    assert "task source 'tools'" in out.stderr and "asked 100000" in out.stderr


def test_a_run_asking_more_test_tasks_than_exist_stops_before_its_warm_start(tmp_path):
    config = _config(tmp_path, 100_000)
    out = subprocess.run(
        [sys.executable, "-m", "learner.train", "--config", str(config),
         "--set", "web.url=http://127.0.0.1:9"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("learner.train: learner.test_tasks = 100000: ")
    assert "asked 100000" in last and "Traceback" not in out.stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    assert not (run / "sft").exists() and not (run / "demos").exists()


FILE_CONFIG = """\
[env]
kind = "tools"

[rollout]
task_source = "file"
tasks_file = "{tasks}"

[learner]
test_tasks = 5
"""


def test_a_tasks_file_with_fewer_tasks_is_warned_about_and_a_missing_one_stops(tmp_path, caplog):
    from learner.embedded.pipeline import check_test_tasks
    from rollout.tools import generate_tasks
    from shared.config import load

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in generate_tasks("test", 3, 0)))
    config = tmp_path / "file.toml"
    config.write_text(FILE_CONFIG.format(tasks=tasks))
    with caplog.at_level("WARNING", logger="learner.train"):
        found = check_test_tasks(load(config), ["--config", str(config)], "http://127.0.0.1:9")
    assert found == 3
    assert "learner.test_tasks = 5, but the test split gives 3" in caplog.text

    out = subprocess.run(
        [sys.executable, "-m", "rollout.eval", "--config", str(config), "--n", "5",
         "--check-tasks", "--tasks", str(tmp_path / "missing.jsonl"),
         "--set", "web.url=http://127.0.0.1:9"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "task source 'file'" in out.stderr and "missing.jsonl" in out.stderr
