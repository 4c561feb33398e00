"""The example plugin (``examples/element_ages``), installed like a third-party package and run.

It is installed without network (``pip --no-deps --no-build-isolation --target``) into a
temporary directory that only the child processes see (``PYTHONPATH``): the harness
finds its task source and its verifier through their entry points alone, and a run
config naming them is all ``rollout.eval`` needs (no ``--mode``: the config's env.kind).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, WEB_CACHE

pytestmark = [pytest.mark.multiprocess]

EXAMPLE = REPO / "examples" / "element_ages"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """The child processes' environment, with the example installed on their path."""
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("plugin")
    source = tmp / "src"  # built from a copy: the build leaves nothing in the tree
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_the_plugin_is_found_by_its_entry_points(plugin_env):
    code = """
from rollout.tracking.records import EpisodeRecord
from rollout.registry import task_sources, verifiers
from rollout.verifiers import verify

assert "element_ages" in task_sources.names() and "years_before" in verifiers.names()
task = {"id": "t", "question": "How many years before 2000 was Gold discovered?",
        "answer": "234", "type": "years_before"}
rec = EpisodeRecord("e", task, "api")
right, wrong = verify(task, "234 years", rec), verify(task, "about 200", rec)
print(right.value, right.breakdown["years_exact"], wrong.value, wrong.breakdown["years_exact"])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=plugin_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # right: score 1; wrong: score 0, the reward the format tier's 0.1 (well formed)
    assert out.stdout.split() == ["1.0", "1.0", "0.1", "0.0"]


def test_eval_runs_the_plugin_task_source_scored_by_the_plugin_verifier(
    plugin_env, tmp_path, web_url
):
    config = tmp_path / "run.toml"
    config.write_text(
        f'[env]\nkind = "api"\n\n[rollout]\ntask_source = "element_ages"\n\n'
        f'[web]\nurl = "{web_url}"\ncache_dir = "{WEB_CACHE}"\n\n[logging]\nprogress = false\n'
    )
    out_dir = tmp_path / "out"
    cmd = [sys.executable, "-m", "rollout.eval", "--config", str(config), "--policy", "oracle"]
    cmd += ["--split", "test", "--n", "5", "--parallel", "5", "--out", str(out_dir)]
    out = subprocess.run(cmd, cwd=REPO, env=plugin_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mode"] == "api" and result["n"] == 5 and result["infra_errors"] == 0
    assert result["success_rate"] == 1.0, result
    ends = [
        json.loads(line)
        for path in sorted(out_dir.glob("*.trajectory.jsonl"))
        for line in path.read_text().splitlines()
        if '"event": "end"' in line
    ]
    assert len(ends) == 5
    for end in ends:  # the plugin's verifier scored every episode
        assert end["breakdown"]["type"] == "years_before", end
        assert end["breakdown"]["years_exact"] == 1.0 and end["reward"] == 1.0
