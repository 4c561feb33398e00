"""A stop (SIGTERM) during a child phase of the pipeline (an evaluation, the
demonstrations) or during a dry run's re-run with simulated devices ends the child with
it, instead of waiting out the child's run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

DRIVER = """
import sys
from pathlib import Path
from learner.embedded.pipeline import run_with_progress
from learner.train import _raise_on_sigterm

_raise_on_sigterm()
child = [sys.executable, "-c", sys.argv[1]]
run_with_progress(child, "eval test", 100, "episodes", Path(sys.argv[2]), timeout=3600)
"""

CHILD = """
import os, sys, time
open({pid_file!r}, "w").write(str(os.getpid()))
for i in range(600):
    print(f"[progress] eval test {{i}}/100 episodes", file=sys.stderr, flush=True)
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


RELAY_DRIVER = """
import os, sys
from learner.training.dryrun import relay
from learner.train import _raise_on_sigterm

_raise_on_sigterm()
relay([sys.executable, "-c", sys.argv[1]], dict(os.environ))
"""


def test_sigterm_during_a_child_phase_stops_the_child_at_once(tmp_path):
    _stop_driver_then_child(tmp_path, DRIVER, [str(tmp_path / "logs" / "eval.log")])


def test_sigterm_during_the_dry_run_s_rerun_stops_the_child_at_once(tmp_path):
    _stop_driver_then_child(tmp_path, RELAY_DRIVER, [])


def _stop_driver_then_child(tmp_path, driver_code: str, extra: list[str]):
    pid_file = tmp_path / "child.pid"
    child = CHILD.format(pid_file=str(pid_file))
    driver = subprocess.Popen(
        [sys.executable, "-c", driver_code, child, *extra],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    child_pid = None
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the child phase did not start"
            time.sleep(0.1)
        child_pid = int(pid_file.read_text())
        time.sleep(0.5)  # progress is flowing
        t0 = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        driver.wait(30)  # the child's own run is 60 s: waiting it out would time out here
        stopped_in = time.monotonic() - t0
        assert driver.returncode == 128 + signal.SIGTERM
        assert stopped_in < 10, stopped_in
        deadline = time.monotonic() + 5
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the child phase outlived the stop"
    finally:  # nothing outlives the test, whatever it found
        for pid in (driver.pid, child_pid):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        driver.communicate()
