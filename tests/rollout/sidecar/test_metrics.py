"""The sidecar's /metrics: Prometheus text written by prometheus_client from the engine's
stats at scrape time, one registry per app; base units, outcomes as labels."""

import time
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollout.sidecar.buffer import TrajectoryBuffer
from rollout.sidecar.engine import STEP_BUCKETS_MS, EngineStats, RolloutEngine
from rollout.sidecar.server import make_app, metrics_registry
from rollout.tasks.generate import generate
from shared.config import load
from shared.tokenizer import load_tokenizer

FAMILIES = {
    "rollout_episodes": "counter",
    "rollout_groups": "counter",
    "rollout_reruns": "counter",
    "rollout_stale_groups_dropped": "counter",
    "rollout_episodes_scored": "counter",
    "rollout_reward_parts": "counter",
    "rollout_reward_mean": "gauge",
    "rollout_episodes_per_second": "gauge",
    "rollout_success_ratio": "gauge",
    "rollout_buffer_depth": "gauge",
    "rollout_live_browsers": "gauge",
    "rollout_policy_version": "gauge",
    "rollout_step_latency_seconds": "histogram",
}
BOUNDS = ("0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "+Inf")


def scrape(text: str) -> dict[str, tuple[str, dict]]:
    """{family: (type, {(sample name, sorted labels): value})}."""
    return {
        f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
        for f in text_string_to_metric_families(text)
    }


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return fams[family][1][(sample or family, tuple(sorted(labels.items())))]


def fake_engine(stats: EngineStats, *, depth=0, stale=0, browsers=None, version=0):
    pool = SimpleNamespace(live_browsers=browsers) if browsers is not None else None
    buffer = SimpleNamespace(depth=depth, counts={"dropped": stale})
    return SimpleNamespace(stats=stats, buffer=buffer, pool=pool, version=version)


def test_every_quantity_has_a_conventional_name_type_and_value():
    s = EngineStats(episodes=7, successes=3, infra_errors=2, reruns=2, groups=2, groups_dropped=1)
    s.started = time.monotonic() - 100.0
    for ms in (30, 250, 12_000):  # buckets le=50 ms, le=250 ms (inclusive), +Inf
        s.observe_steps(ms)
    engine = fake_engine(s, depth=3, stale=1, browsers=4, version=9)
    fams = scrape(generate_latest(metrics_registry(engine)).decode())

    assert {name: t for name, (t, _) in fams.items()} == FAMILIES
    total = "rollout_episodes_total"
    assert value(fams, "rollout_episodes", total, outcome="success") == 3
    assert value(fams, "rollout_episodes", total, outcome="failure") == 2  # 7 - 2 infra - 3
    assert value(fams, "rollout_episodes", total, outcome="infra_error") == 2
    assert value(fams, "rollout_groups", "rollout_groups_total", outcome="completed") == 2
    assert value(fams, "rollout_groups", "rollout_groups_total", outcome="dropped") == 1
    assert value(fams, "rollout_reruns", "rollout_reruns_total") == 2
    assert value(fams, "rollout_stale_groups_dropped", "rollout_stale_groups_dropped_total") == 1
    assert 7 / 101 < value(fams, "rollout_episodes_per_second") <= 7 / 100
    assert value(fams, "rollout_success_ratio") == 0.6  # 3 / (7 - 2)
    assert value(fams, "rollout_buffer_depth") == 3
    assert value(fams, "rollout_live_browsers") == 4
    assert value(fams, "rollout_policy_version") == 9

    hist = "rollout_step_latency_seconds"
    cumulative = [0, 1, 1, 2, 2, 2, 2, 2, 2, 3]  # 30 ms <= 0.05 s, 250 ms <= 0.25 s, 12 s > 10 s
    assert [value(fams, hist, hist + "_bucket", le=b) for b in BOUNDS] == cumulative
    assert value(fams, hist, hist + "_count") == 3
    assert value(fams, hist, hist + "_sum") == pytest.approx(12.28)  # (30 + 250 + 12000) ms


def test_each_app_has_its_own_registry():
    a = fake_engine(EngineStats(episodes=1, successes=1), version=1)
    b = fake_engine(EngineStats(episodes=5, successes=0), version=2)
    fa = scrape(generate_latest(metrics_registry(a)).decode())
    fb = scrape(generate_latest(metrics_registry(b)).decode())
    assert value(fa, "rollout_policy_version") == 1 and value(fb, "rollout_policy_version") == 2
    assert value(fa, "rollout_success_ratio") == 1.0 and value(fb, "rollout_success_ratio") == 0.0
    assert not any(f.name.startswith("rollout_") for f in REGISTRY.collect())


@pytest.mark.multiprocess
async def test_a_scrape_matches_the_engine_after_real_episodes(web_url, local_web, tmp_path):
    cfg = load(
        overrides=[
            f"web.url={web_url}", "rollout.policy=oracle", "env.mode=api",
            "rollout.group_size=2", "rollout.max_retries=1", "rollout.max_policy_lag=0",
            f"checkpoint.dir={tmp_path / 'ckpt'}",
        ]
    )  # fmt: skip
    buffer = TrajectoryBuffer(tmp_path / "buffer", 8)
    (task,) = generate(local_web, "train", 1, types=["qa"], seed=11, base_url=web_url)
    broken = {"id": "metrics-broken-1"}  # nothing the oracle can walk: infra_error
    async with aiohttp.ClientSession() as session:
        engine = RolloutEngine(cfg, web_url, iter(()), load_tokenizer(), buffer, session)
        server = TestServer(make_app(engine, cfg))
        await server.start_server()
        try:
            await buffer.put(await engine.run_group(task, "metrics-qa-1.a"))
            async with session.post(server.make_url("/weights"), json={"version": 1, "path": "p"}):
                pass
            # the group (version 0) is now older than max_policy_lag allows: dropped, not served
            async with session.get(server.make_url("/batch"), params={"timeout": "5"}) as r:
                assert r.headers["X-Groups"] == "0"
            await buffer.put(await engine.run_group(task, "metrics-qa-1.b"))
            assert await engine.run_group(broken, "metrics-broken-1.a") is None
            async with session.get(server.make_url("/metrics")) as r:
                assert r.headers["Content-Type"].startswith("text/plain; version=")
                fams = scrape(await r.text())
        finally:
            await server.close()
            buffer.close()

    s = engine.stats
    # two good groups of 2; the broken one: 2 samples x (1 try + 1 rerun), all infra errors
    assert (s.episodes, s.infra_errors, s.reruns, s.groups, s.groups_dropped) == (8, 4, 2, 2, 1)
    assert {name: t for name, (t, _) in fams.items()} == FAMILIES
    total = "rollout_episodes_total"
    assert value(fams, "rollout_episodes", total, outcome="success") == s.successes
    assert value(fams, "rollout_episodes", total, outcome="failure") == 4 - s.successes
    assert value(fams, "rollout_episodes", total, outcome="infra_error") == 4
    assert value(fams, "rollout_groups", "rollout_groups_total", outcome="completed") == 2
    assert value(fams, "rollout_groups", "rollout_groups_total", outcome="dropped") == 1
    assert value(fams, "rollout_reruns", "rollout_reruns_total") == 2
    assert value(fams, "rollout_stale_groups_dropped", "rollout_stale_groups_dropped_total") == 1
    assert value(fams, "rollout_success_ratio") == s.successes / 4
    assert value(fams, "rollout_buffer_depth") == 1
    assert value(fams, "rollout_live_browsers") == 0  # api mode: no pool
    assert value(fams, "rollout_policy_version") == 1
    assert value(fams, "rollout_episodes_per_second") > 0

    hist = "rollout_step_latency_seconds"
    assert len(BOUNDS) == len(STEP_BUCKETS_MS) + 1
    buckets = [value(fams, hist, hist + "_bucket", le=b) for b in BOUNDS]
    assert buckets == [sum(s.step_ms[: i + 1]) for i in range(len(BOUNDS))]
    assert buckets[-1] == value(fams, hist, hist + "_count") == 4  # the good episodes
    assert value(fams, hist, hist + "_sum") == pytest.approx(s.step_ms_sum / 1e3)
