"""launch/rollout.sh with SIDECARS=2: the commands it runs, and two real sidecars on loopback."""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rollout.sidecar.procs import group_pids

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "rollout.sh"


def _env(**extra: str) -> dict:
    env = dict(os.environ, **extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's python
    return env


def test_dry_run_gives_each_sidecar_its_port_run_dir_seed_and_share(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), "configs/tiny.toml", "--set", "rollout.port=9100",
         "--set", "rollout.browsers=3", "--set", "rollout.seed=7", "--run-dir", str(tmp_path / "sc"),
         "--tasks", "t.jsonl"],
        env=_env(SIDECARS="2", DRY_RUN="1"), capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    for i, line in enumerate(lines):
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", "rollout.serve"]
        sets = [argv[k + 1] for k, a in enumerate(argv) if a == "--set"]
        last = {}
        for s in sets:  # later --set wins
            k, v = s.split("=", 1)
            last[k] = v
        assert last["rollout.port"] == str(9100 + i)
        assert last["rollout.seed"] == str(7 + i)
        assert last["rollout.browsers"] == "2"  # ceil(3 / 2)
        assert last["rollout.max_concurrent_episodes"] == "16"  # tiny.toml's 32 / 2
        assert argv[argv.index("--run-dir") + 1] == f"{tmp_path / 'sc'}-{i}"
        assert argv[argv.index("--tasks") + 1] == "t.jsonl"  # other flags pass through


def test_dry_run_of_one_sidecar_is_the_plain_command():
    out = subprocess.run(
        ["bash", str(SCRIPT), "configs/tiny.toml"],
        env=_env(DRY_RUN="1"), capture_output=True, text=True, check=True,
    )  # fmt: skip
    (line,) = out.stdout.splitlines()
    assert "--run-dir runs/sidecar" in line and "rollout.browsers=1" in line


def test_a_bad_sidecar_count_is_refused():
    out = subprocess.run(
        ["bash", str(SCRIPT), "configs/tiny.toml"], env=_env(SIDECARS="0"),
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2 and "SIDECARS" in out.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_sidecars_come_up_healthy_and_stop_cleanly(web_url, tmp_path):
    args = ["bash", str(SCRIPT), "configs/tiny.toml"]
    for kv in (f"web.url={web_url}", "rollout.policy=oracle", "rollout.port=0", "env.mode=api",
               "rollout.group_size=2", "rollout.max_concurrent_episodes=4",
               "rollout.buffer_max_groups=4", f"checkpoint.dir={tmp_path / 'ckpt'}"):  # fmt: skip
        args += ["--set", kv]
    args += ["--run-dir", str(tmp_path / "sidecar")]
    proc = subprocess.Popen(
        args, cwd=REPO, env=_env(SIDECARS="2"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    urls: dict[str, str] = {}
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"\[sidecar-(\d)\] serving on (\S+)", line):
                urls[m[1]] = m[2]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while len(urls) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(urls) == 2, "".join(lines[-20:])
        assert urls["0"] != urls["1"]
        for url in urls.values():
            with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
                assert r.status == 200
        assert (tmp_path / "sidecar-0").is_dir() and (tmp_path / "sidecar-1").is_dir()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0, "".join(lines[-20:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    assert group_pids(proc.pid) == []  # no sidecar (nor its output filter) left behind
    for url in urls.values():
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=2)
