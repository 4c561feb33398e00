"""The documented "Scaling out" example, run as written through ``launch/*.sh`` on one machine.

The test reads the example's code block from docs/scale/launch.md and runs every command in
it: one web, two sidecars (``SIDECARS=2``), the embedded inference server and two
learner processes joined by ``jax.distributed`` over loopback (``COORDINATOR``,
``NUM_PROCESSES``, ``PROCESS_ID``). It makes only the substitutions the docs
list (hosts to 127.0.0.1, free ports, ``configs/tiny.toml``, a temporary
``/shared``, a random token) and adds the same few ``--set``s to every command to
make the run small. The learners train 3 GRPO steps and exit 0; then the web, the
inference server and the sidecars are stopped with SIGTERM, and each must exit 0
and leave no process of its group behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rollout.sidecar.procs import group_pids

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Added to every command of the example: one config for the whole run, made small.
SMALL = [
    "learner.steps=3",
    "learner.groups_per_step=2",
    "rollout.group_size=2",
    "rollout.max_concurrent_episodes=4",
    "rollout.buffer_max_groups=4",
    "env.max_steps=2",
    "inference.max_new_tokens=16",
    "learner.test_tasks=0",
    "logging.progress=false",
]


def documented_example() -> list[str]:
    """The shell commands of the first ``sh`` block of docs/scale/launch.md's "Scaling out"
    section, continuation lines joined, comments dropped."""
    text = (REPO / "docs" / "scale" / "launch.md").read_text()
    section = text.split("\n## Scaling out\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)[1]
    return [
        c.strip()
        for c in block.replace("\\\n", " ").splitlines()
        if c.strip() and not c.lstrip().startswith("#")
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_pair() -> int:
    """A port p with p + 1 free as well (the second sidecar's)."""
    for _ in range(100):
        p = _free_port()
        with contextlib.ExitStack() as stack:
            try:
                for q in (p, p + 1):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", q))
            except OSError:
                continue
            return p
    raise RuntimeError("no two consecutive free ports")


class Run:
    """The example's processes: started, watched, stopped; nothing survives the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.shared = tmp / "shared"
        self.token = str(10**15 + secrets.randbelow(10**15))  # TOML would read it as a number
        while True:  # the example's ports -> distinct free ones
            sidecar = _free_pair()
            self.ports = {
                "8900": _free_port(),
                "8901": sidecar,
                "8902": sidecar + 1,
                "30000": _free_port(),
                "8476": _free_port(),
            }
            if len(set(self.ports.values())) == len(self.ports):
                break
        self.procs: dict[str, subprocess.Popen] = {}
        self.lines: dict[str, list[str]] = {}
        self.env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")

    def substitute(self, command: str) -> str:
        command = re.sub(r"\bnode[ABC]\b|\b0\.0\.0\.0\b", "127.0.0.1", command)
        for port, free in self.ports.items():
            command = re.sub(rf"\b{port}\b", str(free), command)
        command = command.replace("configs/run.toml", "configs/tiny.toml")
        command = command.replace("/shared/", f"{self.shared}/").replace("$TOKEN", self.token)
        return command

    def start(self, name: str, command: str) -> None:
        words = shlex.split(self.substitute(command))
        env = dict(self.env)
        while "=" in words[0]:  # leading VAR=value assignments
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        for kv in SMALL:
            words += ["--set", kv]
        proc = subprocess.Popen(
            words, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        lines = self.lines[name] = []
        log = (self.tmp / f"{name}.log").open("w")

        def read() -> None:
            with log:
                for line in proc.stdout:
                    lines.append(line)
                    log.write(line)
                    log.flush()

        threading.Thread(target=read, daemon=True).start()

    def tail(self, name: str, n: int = 30) -> str:
        return f"--- {name} ---\n" + "".join(self.lines[name][-n:])

    def wait_ready(self, name: str, count: int = 1, timeout: float = 120.0) -> None:
        """Until ``name`` has printed ``serving on`` ``count`` times."""
        deadline = time.monotonic() + timeout
        while sum("serving on " in line for line in self.lines[name]) < count:
            proc = self.procs[name]
            assert proc.poll() is None, f"{name} exited {proc.returncode}\n{self.tail(name)}"
            assert time.monotonic() < deadline, f"{name} not ready\n{self.tail(name)}"
            time.sleep(0.1)

    def stop(self, name: str, timeout: float = 30.0) -> int:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not stop within {timeout} s of SIGTERM\n{self.tail(name)}")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def test_documented_scaling_out_example_trains_three_steps_and_stops_cleanly(tmp_path):
    commands = documented_example()
    scripts = [next(w for w in shlex.split(c) if "=" not in w) for c in commands]
    assert scripts == [
        "launch/web.sh",
        "launch/rollout.sh",
        "launch/inference.sh",
        "launch/learner.sh",
        "launch/learner.sh",
    ], commands
    web, sidecars, inference, learner0, learner1 = commands
    assert "SIDECARS=2" in sidecars and "PROCESS_ID=0" in learner0 and "PROCESS_ID=1" in learner1

    run = Run(tmp_path)
    t0 = time.monotonic()
    try:
        run.start("web", web)
        run.start("inference", inference)
        run.wait_ready("web")
        run.start("sidecars", sidecars)
        run.start("learner0", learner0)
        run.start("learner1", learner1)
        run.wait_ready("inference")
        run.wait_ready("sidecars", count=2)
        for name in ("learner0", "learner1"):
            try:
                rc = run.procs[name].wait(300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} still running\n{run.tail(name)}\n{run.tail('sidecars')}")
            assert rc == 0, f"{name} exited {rc}\n{run.tail(name)}"
        trained_s = time.monotonic() - t0

        run_dir = run.shared / "runs" / "exp1"
        steps = [
            int(m[1])
            for m in re.finditer(r'^\{"step": (\d+)', (run_dir / "metrics.jsonl").read_text(), re.M)
        ]
        assert steps == [1, 2, 3]  # one line a step: process 0 alone writes them
        for i in (0, 1):  # one job of two processes; each wrote its share of the checkpoint
            assert f"process {i} of 2, 2 devices" in "".join(run.lines[f"learner{i}"])
            assert (run_dir / "checkpoints" / "3" / "params" / f"ocdbt.process_{i}").exists()
        assert (run_dir / "checkpoints" / "3" / "commit_success.txt").is_file()
        # process 0 alone pulled: the sidecars served (and had acknowledged) exactly the
        # 3 x 2 groups the checkpoint's data cursor holds, from both sidecars
        cursor = json.loads((run_dir / "checkpoints" / "3" / "meta" / "metadata").read_text())
        trained = cursor["data_cursor"]["group_ids"]
        served = [
            line.split()[1]
            for i in (0, 1)
            for line in (run_dir / f"sidecar-{i}" / "buffer" / "served.log")
            .read_text()
            .splitlines()
            if line.startswith("served ")
        ]
        assert len(trained) == 6 and sorted(served) == sorted(trained)
        assert len({gid.rsplit(".", 2)[1] for gid in trained}) == 2  # both sidecars (engines)
        # the last weights reached the inference server through the sidecars' POST /weights
        url = f"http://127.0.0.1:{run.ports['30000']}/get_weight_version"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert b'"3"' in r.read()

        for name in ("sidecars", "inference", "web"):
            assert run.stop(name) == 0, f"{name}: not a clean stop\n{run.tail(name)}"
        for name, proc in run.procs.items():
            assert group_pids(proc.pid) == [], f"{name} left processes behind"
        print(f"trained in {trained_s:.1f} s, all stopped in {time.monotonic() - t0:.1f} s")
    finally:
        run.kill_all()
