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
