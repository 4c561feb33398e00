"""The persisted group buffer: exactly-once serving across restarts, torn tails, backpressure."""

import asyncio

import numpy as np
import pytest

from rollout.sidecar.buffer import TrajectoryBuffer
from shared.wire import Trajectory, TrajectoryGroup


def group(gid: str, version: int = 3, G: int = 2) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            "task",
            gid,
            i,
            np.arange(5, dtype=np.int32),
            np.array([0, 1, 1, 0, 1], np.uint8),
            np.array([0, -0.5, -0.2, 0, -1], np.float32),
            np.array([-1, version, version, -1, version], np.int32),
            reward=float(i),
            reward_parts={"em": float(i)},
            num_steps=2,
            timings={"wall_s": 1.0},
        )
        for i in range(G)
    ]
    return TrajectoryGroup(gid, "task", trajs)


async def test_put_take_ack_and_restart_serve_each_group_once(tmp_path):
    b = TrajectoryBuffer(tmp_path, max_pending=10)
    for i in range(5):
        await b.put(group(f"g{i}"))
    first = await b.take(2, timeout=1)
    assert [g.group_id for g in first] == ["g0", "g1"]
    b.ack(["g0", "g1"])
    second = await b.take(2, timeout=1)  # leased, never acked: the process "dies"
    assert [g.group_id for g in second] == ["g2", "g3"]
    b.close()
    again = TrajectoryBuffer(tmp_path, max_pending=10)
    assert again.counts["recovered"] == 3
    rest = await again.take(10, timeout=1)
    assert [g.group_id for g in rest] == ["g2", "g3", "g4"]
    assert rest[0] == group("g2")
    again.ack([g.group_id for g in rest])
    assert await again.take(10, timeout=0.05) == []
    again.close()


async def test_an_ack_reaching_the_new_process_is_honoured(tmp_path):
    b = TrajectoryBuffer(tmp_path)
    await b.put(group("a"))
    await b.put(group("b"))
    assert [g.group_id for g in await b.take(1, timeout=1)] == ["a"]
    b.close()  # killed before the learner's ack arrived
    b2 = TrajectoryBuffer(tmp_path)
    b2.ack(["a"])  # the learner's next request carries it
    assert [g.group_id for g in await b2.take(5, timeout=1)] == ["b"]
    b2.close()


async def test_a_torn_tail_is_cut_and_writing_goes_on(tmp_path):
    b = TrajectoryBuffer(tmp_path)
    await b.put(group("whole"))
    b.close()
    with open(tmp_path / "groups.log", "ab") as fh:
        fh.write(b"\x10\x00\x00\x00garbage")  # a frame cut short by a crash
    b2 = TrajectoryBuffer(tmp_path)
    assert list(b2.pending) == ["whole"]
    await b2.put(group("after"))
    b2.close()
    b3 = TrajectoryBuffer(tmp_path)
    assert list(b3.pending) == ["whole", "after"]
    b3.close()


async def test_put_waits_while_full(tmp_path):
    b = TrajectoryBuffer(tmp_path, max_pending=2)
    await b.put(group("a"))
    await b.put(group("b"))
    third = asyncio.create_task(b.put(group("c")))
    await asyncio.sleep(0.1)
    assert not third.done()  # backpressure
    await b.take(1, timeout=1)
    await asyncio.wait_for(third, 1)
    b.close()


async def test_stale_groups_are_dropped_and_counted(tmp_path):
    b = TrajectoryBuffer(tmp_path)
    await b.put(group("old", version=1))
    await b.put(group("new", version=9))

    def stale(g):
        return "too old" if g.columns["versions"].max() < 5 else None

    assert [g.group_id for g in await b.take(5, timeout=1, is_stale=stale)] == ["new"]
    assert b.counts["dropped"] == 1
    assert "dropped old too old" in (tmp_path / "served.log").read_text()
    b.close()


async def test_unacked_leases_come_back_after_the_lease_time(tmp_path):
    b = TrajectoryBuffer(tmp_path, lease_s=0.05)
    await b.put(group("x"))
    assert len(await b.take(1, timeout=1)) == 1
    await asyncio.sleep(0.1)
    assert [g.group_id for g in await b.take(1, timeout=1)] == ["x"]
    b.close()


@pytest.mark.parametrize("n", [0, 3])
async def test_take_waits_for_the_first_group(tmp_path, n):
    b = TrajectoryBuffer(tmp_path)
    for i in range(n):
        await b.put(group(f"g{i}"))
    later = asyncio.get_running_loop().call_later(
        0.1, lambda: asyncio.ensure_future(b.put(group("late")))
    )
    got = await b.take(1, timeout=2)
    assert got and got[0].group_id == ("late" if n == 0 else "g0")
    later.cancel()
    b.close()
