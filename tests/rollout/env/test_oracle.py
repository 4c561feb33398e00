"""The oracle through the full harness, in every mode: the observations carry the evidence."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, WEB_CACHE

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.browser]


@pytest.mark.parametrize("mode", ["api", "playwright", "som"])
def test_oracle_succeeds_on_200_test_tasks(mode, tmp_path, web_url):
    cmd = [sys.executable, "-m", "rollout.eval", "--mode", mode, "--policy", "oracle"]
    cmd += ["--split", "test", "--n", "200", "--parallel", "4", "--out", str(tmp_path)]
    cmd += ["--set", f"web.cache_dir={WEB_CACHE}", "--set", f"web.url={web_url}"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n"] == 200 and result["infra_errors"] == 0
    assert result["success_rate"] >= 0.98, result
    logs = list(tmp_path.glob("*.progress.log"))
    records = list(tmp_path.glob("*.trajectory.jsonl"))
    assert len(logs) == len(records) == 200


@pytest.mark.parametrize("mode", ["api", "som"])
def test_shortcut_oracle_answers_from_the_search_snippet(mode, tmp_path, web_url):
    # city_timezone's evidence ("X is in the Y time zone.") is in the city's search snippet:
    # with rollout.oracle_shortcut the oracle answers right after the search (2 steps, not 3)
    # and still only with what it read; searching with the question as asked finds it too.
    cmd = [sys.executable, "-m", "rollout.eval", "--mode", mode, "--policy", "oracle"]
    cmd += ["--split", "test", "--n", "12", "--parallel", "4", "--out", str(tmp_path)]
    cmd += ["--set", f"web.cache_dir={WEB_CACHE}", "--set", f"web.url={web_url}"]
    cmd += ["--set", "rollout.oracle_shortcut=true", "--set", 'rollout.task_types=["qa"]']
    cmd += ["--set", "rollout.oracle_query=question"]  # the question as asked finds it too
    cmd += ["--set", 'rollout.task_templates=["city_timezone"]']
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # som: the question is typed into the start page's search form and its button
    # pressed (2 steps), then the answer: 3.
    steps = {"api": 2.0, "som": 3.0}[mode]
    assert result["success_rate"] == 1.0 and result["mean_steps"] == steps, result
