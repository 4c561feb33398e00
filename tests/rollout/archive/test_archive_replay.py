"""Record an oracle evaluation's web, stop the web, replay it: the same observations, byte for
byte, and the same rewards (``python -m rollout.eval --archive record|replay``, as a user
runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rollout.archive.store import Archive
from tests.conftest import REPO, WEB_CACHE

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _eval(mode: str, n: int, out: Path, *extra: str) -> dict:
    args = [
        sys.executable, "-m", "rollout.eval", "--mode", mode, "--policy", "oracle",
        "--split", "test", "--n", str(n), "--out", str(out), "--parallel", "4",
        "--set", f"web.cache_dir={WEB_CACHE}", *extra,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _web_of(out: Path) -> str:
    first = next(out.glob("*.trajectory.jsonl")).read_text().splitlines()[0]
    parts = urlsplit(json.loads(first)["task"]["start_url"])
    return f"{parts.scheme}://{parts.netloc}"


def _episodes(out: Path) -> dict[str, tuple[list[str], float | None]]:
    """Each episode's observations (as the model saw them) and its reward."""
    episodes = {}
    for path in sorted(out.glob("*.trajectory.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line]
        observations = [e["observation"] for e in events if e.get("event") == "step"]
        ends = [e for e in events if e.get("event") == "end"]
        episodes[path.name] = (observations, ends[-1].get("reward") if ends else None)
    return episodes


@pytest.mark.parametrize(
    "mode",
    [
        "api",
        pytest.param("playwright", marks=pytest.mark.browser),
        pytest.param("som", marks=pytest.mark.browser),
    ],
)
def test_a_recorded_evaluation_replays_identically_with_the_web_down(tmp_path, web_url, mode):
    """50 test tasks (the JavaScript panels, pagination and the login among them)."""
    recorded = _eval(mode, 50, tmp_path / "rec", "--archive", "record")
    archive = Archive.open(tmp_path / "rec" / "archive")
    assert recorded["success_rate"] == 1.0 and len(archive) > 50 and archive.torn == 0
    # The web the recording ran against (a child of that eval, stopped with it): the replay
    # names the same address, where nothing listens any more.
    dead_web = _web_of(tmp_path / "rec")
    replayed = _eval(
        mode, 50, tmp_path / "rep", "--archive", "replay",
        "--archive-dir", str(tmp_path / "rec" / "archive"), "--set", f"web.url={dead_web}",
    )  # fmt: skip
    assert replayed["success_rate"] == recorded["success_rate"]
    assert replayed["mean_steps"] == recorded["mean_steps"] and replayed["infra_errors"] == 0
    before, after = _episodes(tmp_path / "rec"), _episodes(tmp_path / "rep")
    assert len(before) == 50 and before.keys() == after.keys()
    for name in before:
        assert after[name] == before[name], name  # observations byte for byte, and rewards


def _finished(run_dir: Path) -> dict[str, list[dict]]:
    """The episodes a run finished (an ``end`` event): their events, by episode id."""
    out = {}
    for path in sorted(run_dir.glob("*.trajectory.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # the torn last line of an episode cut by the kill
                break
        if events and events[-1].get("event") == "end":
            out[path.name.removesuffix(".trajectory.jsonl")] = events
    return out


@pytest.mark.reliability
async def test_a_sidecar_killed_while_recording_leaves_an_archive_that_replays(
    web_url, tmp_path, fault
):
    """SIGKILL mid-run: every episode the sidecar finished replays from what it archived, its
    observations byte for byte (the model's texts fed again, under the same episode id)."""
    import os
    import signal

    import aiohttp

    from rollout.env import make_env
    from rollout.net.core import Net
    from shared.config import EnvConfig, SearchConfig
    from tests.conftest import run_until, start_server
    from tests.rollout.sidecar.test_sidecar import sidecar_args

    row = fault(
        "the sidecar killed with SIGKILL while recording its episodes' web",
        "an archive that replays every finished episode, observation for observation",
    )
    args = sidecar_args(web_url, tmp_path, **{"env.archive": "record"})
    proc, _ = start_server(args, "serving on")
    try:  # episodes run (and the buffer fills) while it records; killed once 8 are done
        run_until(proc, lambda: len(_finished(tmp_path / "episodes")) >= 8)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    finished = _finished(tmp_path / "episodes")
    archive = Archive.open(tmp_path / "archive")
    assert len(finished) >= 8, len(finished)
    cfg = EnvConfig(archive="replay", archive_dir=str(tmp_path / "archive"), max_steps=30)
    net = Net(web_url, cfg)
    async with aiohttp.ClientSession() as s:
        for episode_id, events in finished.items():
            start, steps = events[0], [e for e in events if e.get("event") == "step"]
            env = make_env(
                "api", web_url, cfg, SearchConfig(), session=s, net=net, episode_id=episode_id
            )
            await env.reset(start["task"])
            for step in steps:
                r = await env.step(step["raw"])
                assert r.text == step["observation"] or r.terminated, (episode_id, step["index"])
            assert r.reward == events[-1]["reward"], episode_id
            await env.close()
    row["observed"] = (
        f"{len(finished)} finished episodes replayed identically from {len(archive)} archived "
        f"exchanges ({archive.torn} torn records skipped)"
    )


async def test_a_request_missing_from_the_archive_is_an_error_or_fetched_live(tmp_path):
    import aiohttp
    from aiohttp import web

    from rollout.env import make_env
    from rollout.net.core import Net
    from shared.config import EnvConfig, SearchConfig

    hits: list[str] = []

    async def page(request):
        hits.append(request.path)
        body = f"<main><p>{request.path} visit {len(hits)}</p></main>"
        return web.Response(text=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    site = f"http://127.0.0.1:{runner.addresses[0][1]}"
    task = {"id": "a-1", "question": "?", "answer": "x", "aliases": [], "type": "qa", "hops": 1,
            "start_url": site + "/", "evidence": []}  # fmt: skip
    directory = str(tmp_path / "archive")

    async def visits(cfg: EnvConfig, urls: list[str]) -> list[str]:
        net = Net(site, cfg)
        async with aiohttp.ClientSession() as s:
            env = make_env("api", site, cfg, SearchConfig(), session=s, net=net, episode_id="e")
            await env.reset(task)
            texts = [(await env.step(f"<visit>{site}{u}</visit>")).text for u in urls]
            await env.close()
        await net.close()
        return texts

    try:
        (a,) = await visits(EnvConfig(archive="record", archive_dir=directory), ["/a"])
        replay = EnvConfig(archive="replay", archive_dir=directory)
        a_again, b = await visits(replay, ["/a", "/b"])
        assert a_again == a and "/a visit 1" in a and hits == ["/a"]  # served from the archive
        assert "Error:" in b and f"not in the archive: {site}/b" in b
        live = EnvConfig(archive="replay", archive_dir=directory, archive_fallback="live")
        a_live, b_live = await visits(live, ["/a", "/b"])
        assert a_live == a and "/b visit 2" in b_live and hits == ["/a", "/b"]
        urls = [ex.url for ex in Archive.open(directory).exchanges()]
        assert urls == [f"{site}/a", f"{site}/b"]  # the live fetch was recorded
    finally:
        await runner.cleanup()


@pytest.mark.browser
async def test_the_login_pagination_and_panels_replay_in_the_browser_with_the_web_down(tmp_path):
    """No generated task signs in, so a scripted playwright episode on a web of its own
    does: the members' login (a form POST and its session cookie), pages behind it, a
    paginated list and a JavaScript panel; recorded, the web stopped, replayed."""
    from rollout.env import browser_pool, episode_lease, make_env
    from rollout.net.core import Net
    from rollout.sidecar.procs import web_for
    from shared.config import EnvConfig, RolloutConfig

    url, web = await web_for(str(WEB_CACHE), None)
    script = [
        f'goto("{url}/members/login")',
        'fill("input[name=username]", "reader")',
        'fill("input[name=password]", "factbook")',
        'click("main form button")',
        f'goto("{url}/members/notes/FR")',
        f'goto("{url}/geo/country/FR/cities?page=2")',
        f'goto("{url}/airports/CDG")',
        'extract_text("main")',
    ]
    task = {"id": "replay-1", "question": "?", "answer": "x", "aliases": [], "type": "qa",
            "hops": 1, "start_url": url + "/", "evidence": []}  # fmt: skip

    async def run(archive: str) -> list[str]:
        cfg = EnvConfig(archive=archive, archive_dir=str(tmp_path / "archive"), max_steps=50)
        net = Net(url, cfg)
        async with (
            browser_pool(url, cfg, RolloutConfig(browsers=1), net) as pool,
            episode_lease(pool, "scripted") as lease,
        ):
            env = make_env("playwright", url, cfg, lease=lease, net=net, episode_id="scripted")
            texts = [(await env.reset(task)).text]
            texts += [(await env.step(line)).text for line in script]
            await env.close()
        await net.close()
        return texts

    try:
        recorded = await run("record")
    finally:
        await web.stop()
    assert "Population sources for" in recorded[5] and "Members only" not in recorded[5]
    assert "page 2" in recorded[6].lower() and "392 ft" in recorded[7]
    replayed = await run("replay")  # nothing listens at the web's address any more
    assert replayed == recorded
