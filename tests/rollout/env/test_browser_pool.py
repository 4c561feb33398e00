"""The browser pool with real Chromium processes: leases, crashes, hangs, recycling, cleanup."""

import asyncio
import os
import signal

import pytest

from rollout.env.pool import BrowserLost, BrowserPool, PoolConfig
from rollout.sidecar.procs import group_pids

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]

FAST = dict(health_interval_s=0.3, health_timeout_s=1.5, launch_timeout_s=20.0)


async def until(cond, timeout=15.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_contexts_are_isolated_and_cleanup_leaves_no_process():
    pool = BrowserPool(PoolConfig(browsers=2, contexts_per_browser=2, **FAST))
    await pool.start()
    groups = list(pool.pids)
    assert len(groups) == 2 and all(group_pids(g) for g in groups)
    async with pool.context() as a, pool.context() as b:
        assert a.browser_id != b.browser_id  # least-loaded first
        await a.context.add_cookies([{"name": "k", "value": "1", "url": "http://127.0.0.1/"}])
        assert await a.context.cookies() and not await b.context.cookies()
        page = await a.context.new_page()
        await page.set_content("<p id=x>hello</p>")
        assert await page.inner_text("#x") == "hello"
    async with pool.context() as c:  # a new context starts empty
        assert not await c.context.cookies()
    await pool.close()
    for g in groups:
        assert group_pids(g) == [], f"processes of group {g} survived close()"


async def test_killed_browser_fails_only_its_leases_and_is_replaced():
    async with BrowserPool(PoolConfig(browsers=2, contexts_per_browser=1, **FAST)) as pool:
        async with pool.context() as victim, pool.context() as bystander:
            p1 = await victim.context.new_page()
            p2 = await bystander.context.new_page()
            os.killpg(victim.pid, signal.SIGKILL)
            await until(lambda: victim.browser_lost)
            assert not bystander.browser_lost
            with pytest.raises(Exception, match="closed"):
                await p1.set_content("<p>x</p>")
            await p2.set_content("<p id=y>still here</p>")
            assert await p2.inner_text("#y") == "still here"
            await until(lambda: pool.live_browsers == 2)
            assert victim.pid not in pool.pids and group_pids(victim.pid) == []
        assert pool.stats["lost"] == 1
        async with pool.context() as fresh:  # the replacement serves new leases
            assert not fresh.browser_lost


async def test_a_hung_browser_is_killed_and_replaced():
    async with BrowserPool(PoolConfig(browsers=1, contexts_per_browser=2, **FAST)) as pool:
        async with pool.context() as lease:
            os.killpg(lease.pid, signal.SIGSTOP)  # alive, but answers nothing
            await until(lambda: lease.browser_lost)
            await until(lambda: group_pids(lease.pid) == [])  # killed, group and all
        await until(lambda: pool.live_browsers == 1)
        async with pool.context() as again:
            page = await again.context.new_page()
            await page.set_content("<b>ok</b>")


async def test_a_browser_slow_to_answer_once_is_not_killed():
    # A starved machine: one health check goes unanswered, the next ones are answered.
    config = PoolConfig(browsers=1, contexts_per_browser=2, **FAST)
    async with BrowserPool(config) as pool, pool.context() as lease:
        os.killpg(lease.pid, signal.SIGSTOP)
        await asyncio.sleep(2.5)  # at most two checks time out (3 are needed)
        os.killpg(lease.pid, signal.SIGCONT)
        await asyncio.sleep(3.0)
        assert not lease.browser_lost and pool.stats["lost"] == 0
        page = await lease.context.new_page()
        await page.set_content("<b>ok</b>")


async def test_browsers_are_recycled_after_k_contexts():
    async with BrowserPool(
        PoolConfig(browsers=1, contexts_per_browser=1, recycle_after=3, **FAST)
    ) as pool:
        first = pool.pids[0]
        for _ in range(3):
            async with pool.context():
                pass
        await until(lambda: pool.pids and pool.pids[0] != first)
        assert group_pids(first) == [] and pool.stats["recycled"] == 1


async def test_leases_wait_when_every_browser_is_full():
    async with BrowserPool(PoolConfig(browsers=1, contexts_per_browser=1, **FAST)) as pool:
        order = []

        async def hold(name, seconds):
            async with pool.context():
                order.append(f"{name}+")
                await asyncio.sleep(seconds)
                order.append(f"{name}-")

        await asyncio.gather(hold("a", 0.3), hold("b", 0.0))
        assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


async def test_missing_executable_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="chromium-headless-shell"):
        await BrowserPool(PoolConfig(executable="/nonexistent/chromium-headless-shell")).start()


def test_browser_lost_is_a_runtime_error():
    assert issubclass(BrowserLost, RuntimeError)
