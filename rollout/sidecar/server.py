"""`python -m rollout.serve --config ...`: the rollout sidecar (aiohttp).

It runs the rollout engine against the web, the browsers and the inference
servers the config names, and serves finished GRPO groups to the learner:

  GET  /batch?groups=N&timeout=S[&ack=ID,ID]  msgpack TrajectoryGroups (long poll);
                                             ``ack`` confirms the groups of the
                                             previous batch (they are never served again)
  POST /weights {"version", "path"}          new weights: every inference server loads
                                             them (pause, update, continue)
  GET  /health                               "ok"
  GET  /metrics                              Prometheus text
  GET  /                                     a live dashboard: curves, recent episodes,
                                             each episode step by step (``rollout.sidecar.dashboard``)

Binds to 127.0.0.1 by default. With ``rollout.auth_token`` set, every endpoint
wants ``Authorization: Bearer <token>``; request bodies are capped at
``rollout.max_request_bytes``. The local web is started as a child process unless
``web.url`` names one; ``inference.urls`` must name the servers when the policy
is the model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import itertools
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rollout.env import browsers_for
from rollout.registry import TaskRequest, envs, task_sources
from rollout.sidecar import dashboard
from rollout.sidecar.buffer import TrajectoryBuffer
from rollout.sidecar.engine import STEP_BUCKETS_MS, EngineStats, RolloutEngine, cycle_tasks
from rollout.sidecar.inference import InferenceClient, InferenceError
from rollout.sidecar.procs import web_for
from shared.config import RunConfig, add_config_args, config_from_args
from shared.lifeline import watch_parent
from shared.tokenizer import load_tokenizer
from shared.wire import encode_groups

ENGINE = web.AppKey("engine", RolloutEngine)
CONFIG = web.AppKey("config", RunConfig)
METRICS = web.AppKey("metrics", CollectorRegistry)
MAX_GROUPS_PER_BATCH = 256
MAX_POLL_S = 120.0


def _auth_middleware(token: str | None):
    @web.middleware
    async def check(request: web.Request, handler):
        if token is not None:
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
                return web.json_response(
                    {"error": "missing or wrong bearer token"}, status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
        return await handler(request)

    return check


def _number(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    try:
        value = float(request.query.get(name, default))
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a number") from None
    if not lo <= value <= hi:
        raise web.HTTPBadRequest(text=f"{name} must be in [{lo}, {hi}]")
    return value


async def batch(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    n = int(_number(request, "groups", 1, 1, MAX_GROUPS_PER_BATCH))
    timeout = _number(request, "timeout", 30, 0, MAX_POLL_S)
    acks = [a for a in request.query.get("ack", "").split(",") if a]
    engine.buffer.ack(acks)
    lag = engine.cfg.rollout.max_policy_lag

    def stale(group) -> str | None:
        v = group.columns["versions"]
        used = v[v >= 0]
        oldest = int(used.min()) if used.size else engine.version
        return (
            f"version {oldest} < {engine.version - lag}" if oldest < engine.version - lag else None
        )

    groups = await engine.buffer.take(n, timeout, stale)
    return web.Response(
        body=encode_groups(groups),
        content_type="application/x-msgpack",
        headers={"X-Groups": str(len(groups))},
    )


async def weights(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    cfg = request.app[CONFIG]
    try:
        body = await request.json()
        version, path = body["version"], body["path"]
        if not isinstance(path, str) or not isinstance(version, int | str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": 'expected {"version": int, "path": str}'}, status=400)
    root = Path(cfg.checkpoint.dir).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        return web.json_response({"error": f"path must lie under {root}"}, status=400)
    if engine.client is None:
        engine.version = int(version)
        return web.json_response({"success": True, "message": "no inference servers to update"})
    try:
        await engine.client.update_weights(str(target), str(version))
    except InferenceError as e:
        return web.json_response({"success": False, "message": str(e)}, status=502)
    engine.version = int(version)
    return web.json_response({"success": True, "message": f"weights {version} loaded"})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


class EngineCollector(Collector):
    """The engine's counters as Prometheus metric families, read from ``engine.stats``,
    the buffer and the pool at scrape time (nothing is counted twice)."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        yield from _counters(self.engine)
        yield from _gauges(self.engine)
        yield _step_latency(self.engine.stats)


def _counters(engine: RolloutEngine) -> Iterator[CounterMetricFamily]:
    s = engine.stats
    episodes = CounterMetricFamily(
        "rollout_episodes",
        "Episodes run, reruns included, by outcome (success: reward >= 1; "
        "infra_error: a lost browser or inference server, never scored).",
        labels=["outcome"],
    )
    episodes.add_metric(["success"], s.successes)
    episodes.add_metric(["failure"], s.episodes - s.infra_errors - s.successes)
    episodes.add_metric(["infra_error"], s.infra_errors)
    yield episodes
    groups = CounterMetricFamily(
        "rollout_groups",
        "GRPO groups completed, or dropped when an episode's reruns were used up.",
        labels=["outcome"],
    )
    groups.add_metric(["completed"], s.groups)
    groups.add_metric(["dropped"], s.groups_dropped)
    yield groups
    yield CounterMetricFamily(
        "rollout_reruns", "Episodes run again after an infra_error.", value=s.reruns
    )
    yield CounterMetricFamily(
        "rollout_episodes_scored", "Episodes that got a reward.", value=s.scored
    )
    parts = CounterMetricFamily(
        "rollout_reward_parts",
        "Sums over the scored episodes of the reward (total) and its parts: the outcome, "
        "r_process in [0, 1] (process) and the term it added (process_term); the outcome "
        "alone is the total when reward.process is off.",
        labels=["part"],
    )
    for part, value in _reward_parts(s).items():
        parts.add_metric([part], value)
    yield parts
    yield CounterMetricFamily(
        "rollout_stale_groups_dropped",
        "Finished groups the buffer dropped as older than rollout.max_policy_lag.",
        value=engine.buffer.counts["dropped"],
    )


def _gauges(engine: RolloutEngine) -> Iterator[GaugeMetricFamily]:
    s = engine.stats
    elapsed = max(1e-9, time.monotonic() - s.started)
    yield GaugeMetricFamily(
        "rollout_episodes_per_second", "Episodes per second since start.", s.episodes / elapsed
    )
    yield GaugeMetricFamily(
        "rollout_success_ratio",
        "Share of episodes (infra errors excluded) with reward >= 1.",
        s.successes / max(1, s.episodes - s.infra_errors),
    )
    means = GaugeMetricFamily(
        "rollout_reward_mean",
        "Mean over the scored episodes of the reward (total) and its parts (outcome, "
        "process, process_term), each apart.",
        labels=["part"],
    )
    for part, value in _reward_parts(s).items():
        means.add_metric([part], value / max(1, s.scored))
    yield means
    yield GaugeMetricFamily(
        "rollout_buffer_depth", "Finished groups waiting in the buffer.", engine.buffer.depth
    )
    live = engine.pool.live_browsers if engine.pool is not None else 0
    yield GaugeMetricFamily("rollout_live_browsers", "Browsers up in the pool.", live)
    yield GaugeMetricFamily(
        "rollout_policy_version", "Weights version the inference servers hold.", engine.version
    )


def _reward_parts(s: EngineStats) -> dict[str, float]:
    return {
        "total": s.reward_sum, "outcome": s.outcome_sum, "process": s.process_sum,
        "process_term": s.process_term_sum,
    }  # fmt: skip


def _step_latency(s: EngineStats) -> HistogramMetricFamily:
    """``stats.step_ms`` (counts per ``STEP_BUCKETS_MS`` bucket) as a cumulative histogram
    in seconds."""
    bounds = [floatToGoString(ms / 1e3) for ms in STEP_BUCKETS_MS] + ["+Inf"]
    return HistogramMetricFamily(
        "rollout_step_latency_seconds",
        "Mean seconds per step, one observation per episode that took a step.",
        buckets=list(zip(bounds, itertools.accumulate(s.step_ms), strict=True)),
        sum_value=s.step_ms_sum / 1e3,
    )


def metrics_registry(engine: RolloutEngine) -> CollectorRegistry:
    """A registry of its own per app: several engines can live in one process."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    return registry


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(engine: RolloutEngine, cfg: RunConfig) -> web.Application:
    app = web.Application(
        client_max_size=cfg.rollout.max_request_bytes,
        middlewares=[_auth_middleware(cfg.rollout.auth_token)],
    )
    app[ENGINE], app[CONFIG] = engine, cfg
    app[METRICS] = metrics_registry(engine)
    app.router.add_get("/batch", batch)
    app.router.add_post("/weights", weights)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    dashboard.register(app, engine)
    return app


async def serve(cfg: RunConfig, run_dir: Path, tasks_file: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    web_url, web_child = await web_for(cfg.web.cache_dir, cfg.web.url)
    try:
        tasks = _load_tasks(cfg, tasks_file, web_url)
        if cfg.rollout.policy != "model" and envs.get(cfg.env.kind).oracle is None:
            raise ValueError(
                f"env.kind = {cfg.env.kind!r} has no scripted oracle: rollout.policy = "
                f"{cfg.rollout.policy!r} needs one"
            )
        pool_cm = browsers_for(cfg.env.kind, web_url, cfg.env, cfg.rollout)
        async with aiohttp.ClientSession() as session, pool_cm as pool:
            client = None
            if cfg.rollout.policy == "model":
                client = InferenceClient(
                    list(cfg.inference.urls), session,
                    timeout_s=cfg.inference.timeout_s, retries=cfg.inference.retries,
                    backend=cfg.inference.backend,
                )  # fmt: skip
            buffer = TrajectoryBuffer(
                run_dir / cfg.rollout.buffer_dir, cfg.rollout.buffer_max_groups
            )
            engine = RolloutEngine(
                cfg, web_url, cycle_tasks(tasks, cfg.rollout.seed), load_tokenizer(), buffer,
                session, client=client, pool=pool, run_dir=run_dir / "episodes",
                seed=cfg.rollout.seed,
            )  # fmt: skip
            runner = web.AppRunner(make_app(engine, cfg), access_log=None, shutdown_timeout=1)
            await runner.setup()
            await web.TCPSite(runner, cfg.rollout.host, cfg.rollout.port).start()
            print(f"serving on http://{cfg.rollout.host}:{runner.addresses[0][1]}", flush=True)
            work = asyncio.create_task(engine.run())
            waiter = asyncio.create_task(stop.wait())
            await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            await runner.cleanup()
            buffer.close()
    finally:
        if web_child is not None:
            await web_child.stop()


def _load_tasks(cfg: RunConfig, tasks_file: str | None, web_url: str) -> list[dict]:
    """The tasks episodes cycle through: from the config's task source
    (``rollout.task_source``; ``tasks_file``, the ``--tasks`` flag, is the ``file`` source),
    all it gives for ``rollout.split``."""
    rollout = cfg.rollout
    if tasks_file:
        rollout = dataclasses.replace(rollout, task_source="file", tasks_file=tasks_file)
        cfg = dataclasses.replace(cfg, rollout=rollout)
    source = task_sources.get(rollout.task_source)
    tasks = list(source(TaskRequest(cfg, web_url, rollout.split)))
    if not tasks:
        raise ValueError(f"rollout.task_source = {rollout.task_source!r} gave no tasks")
    return tasks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout.serve", description=__doc__)
    add_config_args(p)
    p.add_argument("--run-dir", default=None, help="where the buffer and episode logs go")
    p.add_argument(
        "--tasks",
        help="a JSONL file of tasks (rollout.task_source = 'file'; default: the config's "
        "task source, the generator's split)",
    )
    args = p.parse_args(argv)
    cfg = config_from_args(args)
    run_dir = Path(args.run_dir or Path(cfg.logging.run_dir) / "sidecar")
    watch_parent()  # started by learner.train: end with it
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.env.archive != "off" and cfg.env.archive_dir is None:  # <run>/archive
        env = dataclasses.replace(cfg.env, archive_dir=str(run_dir / "archive"))
        cfg = dataclasses.replace(cfg, env=env)
    asyncio.run(serve(cfg, run_dir, args.tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
