"""The parallel rollout engine: G episodes per task, concurrently, into the group buffer.

- For each task, ``group_size`` samples run at once; ``max_concurrent_episodes``
  bounds all episodes in flight.
- An episode that ends in ``infra_error`` (a lost browser, an inference server
  that stayed down) is rerun, up to ``max_retries`` times; a group that still
  cannot be completed is dropped and counted, so an infrastructure failure is
  never scored as a zero reward inside a GRPO group.
- With ``rollout.trajectory = "per_turn"`` an episode becomes one sequence per turn
  (prompts under the ``env.history`` context policy); the group still holds G
  episodes, each one's turns contiguous (``shared.wire``).
- Finished groups go to the persisted buffer, whose ``put`` waits while it is
  full (backpressure).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from rollout.agent.policies import scripted_oracle
from rollout.env import episode_lease, make_env
from rollout.sidecar.buffer import TrajectoryBuffer
from rollout.sidecar.episode import Limits, play_episode
from rollout.sidecar.inference import InferenceClient, Sampling
from rollout.verifiers import verifier_config
from shared.config import RunConfig
from shared.tokenizer import Tokenizer
from shared.wire import Trajectory, TrajectoryGroup

STEP_BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


@dataclass
class EngineStats:
    episodes: int = 0
    successes: int = 0
    infra_errors: int = 0
    reruns: int = 0
    groups: int = 0
    groups_dropped: int = 0
    started: float = field(default_factory=time.monotonic)
    step_ms: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS_MS) + 1))
    step_ms_sum: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=50))
    reward_sum: float = 0.0  # over the episodes scored (infra errors are never scored)
    scored: int = 0  # episodes that got a reward: the mean reward is reward_sum / scored
    # the reward's parts over the same episodes (rollout.verifiers.process): the outcome,
    # r_process and the process term added (the outcome alone when the process reward is off)
    outcome_sum: float = 0.0
    process_sum: float = 0.0
    process_term_sum: float = 0.0
    # the episodes' length and where they ended, over the episodes that ran (not infra errors)
    actions_sum: int = 0  # actions taken
    truncated: int = 0  # episodes that ran out of their step or context budget

    def observe_steps(self, ms: float) -> None:
        i = next((i for i, b in enumerate(STEP_BUCKETS_MS) if ms <= b), len(STEP_BUCKETS_MS))
        self.step_ms[i] += 1
        self.step_ms_sum += ms


class RolloutEngine:
    def __init__(
        self,
        cfg: RunConfig,
        web_url: str,
        tasks: Iterator[dict],
        tokenizer: Tokenizer,
        buffer: TrajectoryBuffer,
        session: aiohttp.ClientSession,
        *,
        client: InferenceClient | None = None,
        pool=None,
        run_dir: str | Path | None = None,
        seed: int = 0,
    ):
        self.cfg, self.web_url, self.tasks, self.tok = cfg, web_url, tasks, tokenizer
        self.buffer, self.session, self.client, self.pool = buffer, session, client, pool
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.stats = EngineStats()
        self.version = 0  # the policy version the inference servers hold
        self.rng = random.Random(seed)
        self._episodes = asyncio.Semaphore(cfg.rollout.max_concurrent_episodes)
        self._counter = itertools.count()
        # Group ids must never repeat, across restarts too: the buffer serves by id.
        self._instance = uuid.uuid4().hex[:8]
        self.errors: deque[str] = deque(maxlen=20)
        inf = cfg.inference
        self.limits = Limits(inf.max_context_tokens, inf.observation_tokens, inf.max_new_tokens)
        self.verifier = verifier_config(cfg.reward)  # the outcome's defaults, [reward]'s process
        self.sampling = Sampling(
            inf.temperature, inf.top_p, inf.top_k, inf.max_new_tokens, tokenizer.stop_ids
        )
        if cfg.rollout.policy == "model" and client is None:
            raise ValueError("rollout.policy = 'model' needs an inference client")

    async def run(self) -> None:
        """Produce groups until cancelled."""
        g = self.cfg.rollout.group_size
        workers = max(1, -(-self.cfg.rollout.max_concurrent_episodes // g))
        await asyncio.gather(*(self._worker() for _ in range(workers)))

    async def _worker(self) -> None:
        for task in self.tasks:
            gid = f"{task['id']}.{self._instance}.{next(self._counter)}"
            group = await self.run_group(task, gid)
            if group is not None:
                await self.buffer.put(group)

    async def run_group(self, task: dict, group_id: str) -> TrajectoryGroup | None:
        samples = await asyncio.gather(
            *(self._sample(task, group_id, i) for i in range(self.cfg.rollout.group_size))
        )
        if any(t is None for t in samples):
            self.stats.groups_dropped += 1
            return None
        self.stats.groups += 1
        return TrajectoryGroup(group_id, task["id"], [t for turns in samples for t in turns])

    async def _sample(self, task: dict, group_id: str, i: int) -> list[Trajectory] | None:
        for attempt in range(self.cfg.rollout.max_retries + 1):
            if attempt:  # back off: a restarting server or browser needs a moment
                self.stats.reruns += 1
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 10.0))
            turns = await self._episode(task, group_id, i, attempt)
            t = turns[0]
            self.stats.episodes += 1
            if t.status != "infra_error":
                self.stats.successes += t.reward >= 1.0
                self.stats.actions_sum += t.num_steps
                self.stats.truncated += t.status == "truncated"
                return turns
            self.stats.infra_errors += 1
        return None

    async def _episode(self, task: dict, group_id: str, i: int, attempt: int) -> list[Trajectory]:
        """The episode's sequences: one (``sequence``) or one per turn (``per_turn``)."""
        from rollout.env.pool import BrowserLost

        mode = self.cfg.env.kind
        episode_id = f"{group_id}-{i}-{attempt}".replace("/", "_")
        async with self._episodes:
            try:
                async with episode_lease(self.pool, episode_id) as lease:
                    env = make_env(
                        mode, self.web_url, self.cfg.env, self.cfg.search, session=self.session,
                        lease=lease, run_dir=self.run_dir, episode_id=episode_id,
                        verifier=self.verifier,
                    )  # fmt: skip
                    scripted = self._scripted(task, i)
                    t0 = time.monotonic()
                    kw = dict(
                        group_id=group_id, sample_index=i, limits=self.limits,
                        client=self.client, sampling=self.sampling, scripted=scripted,
                    )  # fmt: skip
                    trajs = await play_episode(env, task, self.tok, self.cfg, **kw)
                    traj = trajs[0]
                    if traj.num_steps:
                        self.stats.observe_steps((time.monotonic() - t0) * 1e3 / traj.num_steps)
                    self._remember(task, env, trajs)
                    return trajs
            except BrowserLost:
                return [_infra_trajectory(task, group_id, i)]
            except Exception as e:  # failure isolation: one episode's bug ends only it
                self.errors.append(f"{episode_id}: {type(e).__name__}: {e}")
                return [_infra_trajectory(task, group_id, i)]

    def _scripted(self, task: dict, i: int):
        """The environment kind's scripted oracle when ``rollout.policy`` asks for one."""
        r = self.cfg.rollout
        if r.policy not in ("oracle", "noisy_oracle"):
            return None
        noisy = r.policy == "noisy_oracle"
        seed = self.rng.randrange(2**31) if noisy else 0
        kind = self.cfg.env.kind
        return scripted_oracle(kind, task, self.web_url, r, noisy=noisy, seed=seed).next

    def _remember(self, task: dict, env, trajs: list[Trajectory]) -> None:
        """Keep the episode for the dashboard (:mod:`rollout.sidecar.dashboard`): its steps (each
        one's text and view cut to a bound), its reward and breakdown, its training
        sequences (one, or one per turn) with their lengths, and its last SoM screenshot."""
        traj, rec = trajs[0], env.record
        steps = [
            {"index": s.index, "action": s.action, "args": s.args, "summary": s.summary,
             "error": s.error, "note": s.note, "url": s.url,
             "ms": round(max(0.0, s.ended - s.started) * 1e3),
             "raw": s.raw[:VIEW_RAW_CHARS], "raw_chars": len(s.raw),
             "view": s.observation[:VIEW_CHARS], "view_chars": len(s.observation)}
            for s in rec.steps
        ]  # fmt: skip
        shot = getattr(env.backend, "last_screenshot", None)
        shots = dict(getattr(env, "screenshots", {}))  # each step's marked view (som)
        for st in steps:
            st["screenshot"] = st["index"] in shots
        self.stats.reward_sum += traj.reward
        self.stats.scored += 1
        parts = traj.reward_parts
        self.stats.outcome_sum += parts.get("outcome", traj.reward)
        self.stats.process_sum += parts.get("process", 0.0)
        self.stats.process_term_sum += parts.get("process_term", 0.0)
        self.stats.recent.append(
            {"id": rec.episode_id, "task": task["id"], "question": task["question"],
             "template": task.get("template") or task.get("type") or "",
             "expected": task.get("answer"), "answer": rec.answer, "mode": rec.mode,
             "status": traj.status, "reward": traj.reward, "error": rec.error,
             "breakdown": dict(rec.breakdown or traj.reward_parts),
             "prompt": rec.user_prompt[:VIEW_CHARS], "steps": steps, "ended": time.time(),
             "trajectory": "per_turn" if traj.turn >= 0 else "sequence",
             "sequences": [t.length for t in trajs], "timings": dict(traj.timings),
             "screenshot": shot or None, "step_screenshots": shots}
        )  # fmt: skip
        bound_screenshots(self.stats.recent, SCREENSHOT_BYTES)


def bound_screenshots(recent, budget: int) -> None:
    """At most ``budget`` bytes of per-step screenshots over the kept episodes: the oldest
    episodes' go first (their last screenshot stays)."""
    total = sum(len(b) for ep in recent for b in ep["step_screenshots"].values())
    for ep in recent:  # oldest first
        if total <= budget:
            return
        total -= sum(len(b) for b in ep["step_screenshots"].values())
        ep["step_screenshots"] = {}
        for st in ep["steps"]:
            st["screenshot"] = False


VIEW_CHARS = 6000  # of each step's observation kept for the dashboard (50 episodes x 50 steps)
VIEW_RAW_CHARS = 600  # of the model's text
SCREENSHOT_BYTES = 64 << 20  # of the kept episodes' per-step screenshots (~100 KB each)


def _infra_trajectory(task: dict, group_id: str, i: int) -> Trajectory:
    import numpy as np

    empty_i, empty_f = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return Trajectory(
        task["id"], group_id, i, empty_i, np.zeros(0, np.uint8), empty_f, empty_i,
        reward=0.0, status="infra_error",
    )  # fmt: skip


def cycle_tasks(tasks: list[dict], seed: int = 0) -> Iterator[dict]:
    """Tasks in a fresh shuffled order each pass, forever."""
    rng = random.Random(seed)
    order = list(tasks)
    while True:
        rng.shuffle(order)
        yield from order
