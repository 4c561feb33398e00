"""The sidecar's dashboard: live curves, the recent episodes, and each episode step by step.

Pages (their HTML, CSS and JavaScript are files of ``rollout/sidecar/dashboard_static``, served
by the sidecar itself: nothing is fetched from elsewhere, it works offline):

  GET /                          curves (success rate, mean reward, episodes/s, step
                                 latency, actions per episode, the fraction ended at the
                                 budget) and a table of the recent episodes, filterable
                                 by template, status and reward; polls the API every 3 s
  GET /episode/{id}              one episode: every step's action, the model's text and
                                 the observation it got, with the marked (SoM) screenshot
                                 of that observation; the reward's breakdown; the last
                                 marked screenshot
  GET /episode/{id}/screenshot.png, /episode/{id}/step/{n}/screenshot.png
                                 (per-step ones: 64 MB over the kept episodes, oldest
                                 dropped first, ``rollout.sidecar.engine.SCREENSHOT_BYTES``)
  GET /dashboard/{file}          the pages' CSS and JavaScript

JSON for the pages:

  GET /api/summary[?since=T]     the engine's counters and the curves' points after unix
                                 time T (all kept points without it)
  GET /api/episodes              the recent episodes, newest first, without their steps
  GET /api/episode/{id}          one episode with its steps

The curves come from a ring of samples of the engine's cumulative counters, taken every
``SAMPLE_EVERY_S`` while the app runs; each point's rates are over the ``WINDOW_S``
before it. The episodes are the engine's ``stats.recent`` (the last 50).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from rollout.env.observation import image_type
from rollout.sidecar.engine import EngineStats, RolloutEngine

SAMPLE_EVERY_S = 2.0
SAMPLES = 1800  # an hour of samples
WINDOW_S = 60.0  # each point's rates are over this many seconds before it
STATIC = {  # the files of rollout/sidecar/dashboard_static the sidecar serves, and their types
    "index.html": "text/html",
    "episode.html": "text/html",
    "dashboard.css": "text/css",
    "common.js": "text/javascript",
    "overview.js": "text/javascript",
    "episode.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
# Everything comes from the sidecar; the model's text is only ever set as text, and this
# keeps it so should a page change.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Sample:
    """The engine's cumulative counters at one moment (``t``: ``time.monotonic()``,
    ``wall``: unix time)."""

    t: float
    wall: float
    episodes: int = 0  # infra errors included
    infra_errors: int = 0  # never scored: not in the success rate's denominator
    successes: int = 0
    scored: int = 0  # episodes with a reward (the mean reward's denominator)
    reward_sum: float = 0.0
    timed: int = 0  # episodes that took a step (one step-latency observation each)
    step_ms_sum: float = 0.0
    actions_sum: int = 0  # actions of the episodes that ran (infra errors left out)
    truncated: int = 0  # episodes that ran out of budget

    @classmethod
    def of(cls, s: EngineStats) -> Sample:
        return cls(
            time.monotonic(), time.time(), s.episodes, s.infra_errors, s.successes, s.scored,
            s.reward_sum, sum(s.step_ms), s.step_ms_sum, s.actions_sum, s.truncated,
        )  # fmt: skip


class Series:
    """A bounded ring of samples, and the curves' points computed from it."""

    def __init__(self, stats: EngineStats, maxlen: int = SAMPLES):
        self.stats = stats
        origin = Sample(stats.started, time.time() - (time.monotonic() - stats.started))
        self.ring: deque[Sample] = deque([origin], maxlen=maxlen)

    def sample(self) -> None:
        self.ring.append(Sample.of(self.stats))

    def points(self, window_s: float = WINDOW_S, since: float = 0.0) -> list[dict]:
        """One point per sample after the first, at unix time ``t``: episodes/s, and the
        success rate, mean reward, mean step latency, mean actions per episode and the
        fraction that ended at the budget, of the episodes finished in the window before
        it (None where none finished there)."""
        ring = list(self.ring)
        out, j = [], 0
        for i in range(1, len(ring)):
            b = ring[i]
            while ring[j].t < b.t - window_s:
                j += 1
            a = ring[min(j, i - 1)]
            if b.wall <= since:
                continue
            ran = (b.episodes - b.infra_errors) - (a.episodes - a.infra_errors)
            scored, timed = b.scored - a.scored, b.timed - a.timed
            out.append(
                {"t": b.wall,
                 "episodes_per_s": (b.episodes - a.episodes) / max(1e-9, b.t - a.t),
                 "success_rate": (b.successes - a.successes) / ran if ran else None,
                 "mean_reward": (b.reward_sum - a.reward_sum) / scored if scored else None,
                 "step_ms": (b.step_ms_sum - a.step_ms_sum) / timed if timed else None,
                 "episode_actions": (b.actions_sum - a.actions_sum) / ran if ran else None,
                 "ended_budget": (b.truncated - a.truncated) / ran if ran else None}
            )  # fmt: skip
        return out


ENGINE = web.AppKey("dashboard_engine", RolloutEngine)
SERIES = web.AppKey("dashboard_series", Series)


def register(app: web.Application, engine: RolloutEngine) -> None:
    """Add the dashboard's pages and API to the sidecar's app; sample while it runs."""
    app[ENGINE], app[SERIES] = engine, Series(engine.stats)
    app.cleanup_ctx.append(_sampling)
    app.router.add_get("/", overview)
    app.router.add_get("/episode/{id}", episode_page)
    app.router.add_get("/episode/{id}/screenshot.png", screenshot)
    app.router.add_get("/episode/{id}/step/{n}/screenshot.png", step_screenshot)
    app.router.add_get("/dashboard/{file}", static)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/episodes", episodes)
    app.router.add_get("/api/episode/{id}", episode)


async def _sampling(app: web.Application):
    series = app[SERIES]

    async def every() -> None:
        while True:
            series.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    task = asyncio.create_task(every())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _file(name: str) -> bytes:
    return (resources.files("rollout.sidecar") / "dashboard_static" / name).read_bytes()


def _page(name: str, status: int = 200) -> web.Response:
    return web.Response(
        body=_file(name), status=status, content_type="text/html", charset="utf-8",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )  # fmt: skip


def _json(data, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, default=str), status=status, content_type="application/json"
    )


def _find(request: web.Request) -> dict:
    want = request.match_info["id"]
    for ep in request.app[ENGINE].stats.recent:
        if ep["id"] == want:
            return ep
    raise web.HTTPNotFound(text=f"episode {want!r} is not among the last kept")


async def overview(request: web.Request) -> web.Response:
    return _page("index.html")


async def episode_page(request: web.Request) -> web.Response:
    try:
        _find(request)
    except web.HTTPNotFound:
        return _page("episode.html", status=404)  # the page says so, from the API's 404
    return _page("episode.html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in STATIC or name.endswith(".html"):
        raise web.HTTPNotFound()
    kind = STATIC[name]
    return web.Response(
        body=_file(name), content_type=kind, charset="utf-8" if kind.startswith("text/") else None,
        headers={"Cache-Control": "no-cache"},
    )  # fmt: skip


async def screenshot(request: web.Request) -> web.Response:
    shot = _find(request)["screenshot"]
    if not shot:
        raise web.HTTPNotFound(text="this episode has no marked screenshot")
    return web.Response(body=shot, content_type=f"image/{image_type(shot)}")


async def step_screenshot(request: web.Request) -> web.Response:
    shots = _find(request)["step_screenshots"]
    try:
        shot = shots.get(int(request.match_info["n"]))
    except ValueError:
        raise web.HTTPBadRequest(text="the step is a number") from None
    if not shot:
        raise web.HTTPNotFound(text="no screenshot of this step is kept")
    return web.Response(body=shot, content_type=f"image/{image_type(shot)}")


async def summary(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    s = engine.stats
    try:
        since = float(request.query.get("since", 0))
    except ValueError:
        raise web.HTTPBadRequest(text="since must be a number") from None
    counters = {
        "episodes": s.episodes, "successes": s.successes, "scored": s.scored,
        "infra_errors": s.infra_errors, "reruns": s.reruns, "groups": s.groups,
        "groups_dropped": s.groups_dropped, "buffer_depth": engine.buffer.depth,
        "policy_version": engine.version,
        "live_browsers": engine.pool.live_browsers if engine.pool is not None else None,
        "uptime_s": time.monotonic() - s.started,
    }  # fmt: skip
    cfg = engine.cfg
    return _json(
        {"counters": counters, "errors": list(engine.errors)[-5:],
         "run": {"mode": cfg.env.mode, "policy": cfg.rollout.policy,
                 "group_size": cfg.rollout.group_size, "trajectory": cfg.rollout.trajectory},
         "window_s": WINDOW_S, "sample_every_s": SAMPLE_EVERY_S,
         "points": request.app[SERIES].points(since=since)}
    )  # fmt: skip


def _row(ep: dict) -> dict:
    """An episode as a table row: everything but its steps' text and its screenshot."""
    steps = ep["steps"]
    return {
        **{
            k: v
            for k, v in ep.items()
            if k not in ("steps", "screenshot", "step_screenshots", "prompt")
        },
        "num_steps": len(steps),
        "step_errors": sum(1 for st in steps if st["error"]),
        "last_action": steps[-1]["action"] if steps else None,
        "has_screenshot": bool(ep["screenshot"]),
    }


async def episodes(request: web.Request) -> web.Response:
    return _json({"episodes": [_row(ep) for ep in reversed(request.app[ENGINE].stats.recent)]})


async def episode(request: web.Request) -> web.Response:
    ep = _find(request)
    return _json({**_row(ep), "steps": ep["steps"], "prompt": ep["prompt"]})
