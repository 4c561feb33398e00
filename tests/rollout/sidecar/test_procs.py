"""Process-group clean-up: a killed group is only gone once its members have torn down."""

import os
import signal
import subprocess
import time

import pytest

from rollout.sidecar.procs import group_pids, wait_group_gone

pytestmark = pytest.mark.multiprocess


def _group_of_sleepers(n: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["sh", "-c", " ".join(["sleep 60 &"] * n) + " wait"], start_new_session=True
    )
    for _ in range(1000):  # the shell and its n sleepers (10 s at most)
        if len(group_pids(proc.pid)) == n + 1:
            return proc
        time.sleep(0.01)
    raise AssertionError(f"group {proc.pid} never had {n + 1} members")


async def test_a_killed_group_is_waited_for_until_no_member_is_left():
    proc = _group_of_sleepers(4)
    os.killpg(proc.pid, signal.SIGKILL)
    assert await wait_group_gone(proc.pid, 5.0)
    assert group_pids(proc.pid) == []
    proc.wait()


async def test_a_live_group_is_reported_after_the_timeout():
    proc = _group_of_sleepers(1)
    try:
        assert not await wait_group_gone(proc.pid, 0.2)
        assert len(group_pids(proc.pid)) == 2
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
