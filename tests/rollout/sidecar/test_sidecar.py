"""The rollout sidecar over real HTTP: batches, auth, limits, weights, metrics, dashboard, crashes."""

import os
import signal
import struct
import time
import zlib

import aiohttp
import pytest

from shared.wire import decode_groups
from tests.conftest import run_until, start_server, stop_server
from tests.rollout.sidecar.test_metrics import FAMILIES, scrape, value

pytestmark = pytest.mark.multiprocess
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def sidecar_args(web_url: str, run_dir, **extra) -> list[str]:
    sets = {
        "web.url": web_url, "rollout.policy": "oracle", "rollout.port": 0,
        "rollout.group_size": 2, "rollout.max_concurrent_episodes": 4, "env.mode": "api",
        "rollout.buffer_max_groups": 8, "checkpoint.dir": str(run_dir / "ckpt"),
        "rollout.task_types": '["qa"]', **extra,
    }  # fmt: skip
    args = ["rollout.serve", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


@pytest.fixture(scope="module")
def sidecar(web_url, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sidecar")
    args = sidecar_args(
        web_url, run_dir, **{"rollout.auth_token": TOKEN, "rollout.max_request_bytes": 2048}
    )
    proc, url = start_server(args, "serving on")
    yield url, run_dir
    stop_server(proc)


async def test_batches_decode_and_are_well_formed(sidecar):
    url, _ = sidecar
    params = {"groups": "3", "timeout": "60"}
    async with (
        aiohttp.ClientSession(headers=AUTH) as s,
        s.get(f"{url}/batch", params=params) as r,
    ):
        assert r.status == 200 and r.content_type == "application/x-msgpack"
        groups = decode_groups(await r.read())
    assert groups and int(r.headers["X-Groups"]) == len(groups)
    for g in groups:
        assert len(g) == 2 and len({t.sample_index for t in g.trajectories}) == 2
        for t in g.trajectories:
            assert t.status in ("ok", "truncated")
            gen = t.loss_mask == 1
            assert gen.any() and (t.versions[~gen] == -1).all() and (t.versions[gen] >= 0).all()
            assert (t.logprobs[~gen] == 0).all()
        assert len({tuple(sorted(t.reward_parts)) for t in g.trajectories}) == 1


@pytest.mark.reliability
async def test_the_bearer_token_is_required_everywhere(sidecar, fault):
    row = fault("sidecar requests without or with a wrong bearer token", "401 on every endpoint")
    url, _ = sidecar
    async with aiohttp.ClientSession() as s:
        for method, path in [
            ("GET", "/batch"),
            ("GET", "/metrics"),
            ("GET", "/"),
            ("GET", "/api/summary"),
            ("POST", "/weights"),
        ]:
            async with s.request(method, url + path) as r:
                assert r.status == 401, path
        async with s.get(url + "/health", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
    row["observed"] = "401 on /batch, /metrics, /, /api/summary, /weights, /health"


@pytest.mark.reliability
async def test_oversized_and_malformed_requests_are_refused(sidecar, fault):
    row = fault(
        "oversized body, malformed JSON, path traversal on /weights; an absurd batch size",
        "413, 400, 400 (must lie under the checkpoint root), 400; the sidecar serves on",
    )
    url, _run_dir = sidecar
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async with s.post(f"{url}/weights", data=b"x" * 4096) as r:
            assert r.status == 413
        async with s.post(f"{url}/weights", data=b"{not json") as r:
            assert r.status == 400
        async with s.post(f"{url}/weights", json={"version": 1, "path": "../../etc"}) as r:
            assert r.status == 400 and "must lie under" in (await r.json())["error"]
        async with s.get(f"{url}/batch", params={"groups": "100000"}) as r:
            assert r.status == 400
        async with s.post(f"{url}/weights", json={"version": 4, "path": "step_4"}) as r:
            assert r.status == 200 and (await r.json())["success"]
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    fams = scrape(text)
    assert {name: t for name, (t, _) in fams.items()} == FAMILIES
    assert value(fams, "rollout_policy_version") == 4
    row["observed"] = "413 / 400 / 400 / 400, then a valid /weights is accepted"


@pytest.mark.browser
async def test_the_dashboard_in_a_real_browser(sidecar, browser):
    url, _ = sidecar
    ctx = await browser.new_context(extra_http_headers=AUTH)
    try:
        page = await ctx.new_page()
        await page.goto(url + "/")
        await page.wait_for_selector("#episodes tbody tr")  # (the page's CSP forbids eval)
        assert "EPISODES" in (await page.inner_text("#counters")).upper()
        assert await page.locator("#chart-success_rate svg").count() == 1
        assert await page.locator("#episodes td.reward").first.inner_text()
        await page.locator("#episodes tbody tr td.task a").first.click()
        await page.wait_for_selector("#steps li.step")
        assert "/episode/" in page.url
    finally:
        await ctx.close()


def _logged_groups(run_dir) -> list[str]:
    from shared.wire import decode_group

    data = (run_dir / "buffer" / "groups.log").read_bytes()
    ids, pos = [], 0
    while pos + 8 <= len(data):
        n, crc = struct.unpack_from("<II", data, pos)
        body = data[pos + 8 : pos + 8 + n]
        if len(body) < n or zlib.crc32(body) != crc:
            break
        ids.append(decode_group(body).group_id)
        pos += 8 + n
    return ids


async def _pull(url: str, received: list[str], acks: list[str], timeout: float = 30) -> list[str]:
    async with aiohttp.ClientSession() as s:
        params = {"groups": "4", "timeout": str(timeout), "ack": ",".join(acks)}
        async with s.get(f"{url}/batch", params=params) as r:
            got = [g.group_id for g in decode_groups(await r.read())]
    received.extend(got)
    return got


@pytest.mark.slow
@pytest.mark.reliability
async def test_sigkill_and_restart_serve_every_finished_group_exactly_once(
    web_url, tmp_path, fault
):
    row = fault(
        "the sidecar killed with SIGKILL and restarted",
        "every finished group served exactly once across the restart; nothing acknowledged is lost",
    )
    args = sidecar_args(web_url, tmp_path)
    log = (tmp_path / "sidecar.log").open("a")
    proc, url = start_server(args, "serving on", log=log)
    received: list[str] = []
    acks: list[str] = []
    try:
        for _ in range(3):
            acks = await _pull(url, received, acks)
        # it finishes more groups that nobody has taken
        run_until(proc, lambda: len(_logged_groups(tmp_path)) > len(received))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    before_kill = _logged_groups(tmp_path)
    assert len(before_kill) > len(received)
    proc, url = start_server(args, "serving on", log=log)
    try:
        deadline = time.monotonic() + 120
        while not set(before_kill) <= set(received):
            assert time.monotonic() < deadline, "finished groups were lost"
            acks = await _pull(url, received, acks, timeout=10)
    finally:
        stop_server(proc)
        log.close()
    assert len(received) == len(set(received)), "a group was served twice"
    row["observed"] = "every group received once, none lost"
