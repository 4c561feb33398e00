"""The environment wrapper: ``reset(task)``, ``step(model text or Action)``, ``close()``.

One episode per instance. Every step is parsed (the mode's dialect and URL
allowlist), run by the mode's backend under a timeout, recorded (episode record
and progress tracker) and, at the end (``answer``, or truncation), scored: by the task's verifier
(its ``type``), or by the reward its ``"reward"`` names (a page-defined reward read
from the browser's page, or a verifier by name; see :mod:`rollout.env.page_reward`).
``reset`` and ``step`` both return a :class:`StepResult`. Errors have one policy
per kind:

- the agent's errors (unparsable text, a refused URL, a missing selector, a
  page that fails or times out) become an error observation and the episode
  goes on;
- infrastructure errors (the browser under the episode died) end the episode
  with status ``infra_error``, which the rollout engine reruns rather than
  scoring as a zero.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollout.agent.actions import Action, Answer, describe_actions
from rollout.agent.parser import ParseError, parse
from rollout.env import page_reward
from rollout.env.observation import Observation, render
from rollout.net.urls import UrlPolicy
from rollout.registry import envs
from rollout.tracking.records import EpisodeRecord, Step
from rollout.tracking.tracker import EpisodeTracker
from rollout.verifiers import Reward, VerifierConfig, verify, with_process
from rollout.verifiers.scorers import SCORERS, golds


class ToolError(RuntimeError):
    """An action that could not be carried out; shown to the agent, the episode goes on."""


class ActionTimeout(ToolError):
    """The action ran out of time inside the tool (e.g. a page that never finished loading)."""


class InfraError(RuntimeError):
    """The infrastructure under the episode failed; the episode ends as ``infra_error``."""


class Backend(Protocol):
    """How a mode carries out actions (api: HTTP; playwright and som: a browser)."""

    async def start(self, start_url: str) -> Observation: ...
    async def act(self, action: Action) -> Observation: ...
    async def recover(self) -> None: ...  # after a timeout, make the next action possible
    async def close(self) -> None: ...
    @property
    def url(self) -> str | None: ...


@dataclass
class StepResult:
    observation: Observation
    text: str  # the observation as the model reads it ("" once the episode is over)
    reward: float
    terminated: bool  # ended by an answer, or by an infrastructure failure
    truncated: bool  # ended by the step budget
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeLimits:
    max_steps: int = 30
    action_timeout_s: float = 10.0
    observation_chars: int = 4000


class Environment:
    def __init__(
        self,
        mode: str,
        backend: Backend,
        policy: UrlPolicy,
        *,
        limits: EpisodeLimits = EpisodeLimits(),
        verifier: VerifierConfig | None = None,
        run_dir: str | Path | None = None,
        episode_id: str | None = None,
        prompt: str = "full",
    ):
        self.mode, self.backend, self.policy = mode, backend, policy
        self.prompt = prompt  # "full" or "compact" action descriptions
        self.limits, self.verifier = limits, verifier
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.episode_id = episode_id or uuid.uuid4().hex[:16]
        self.record: EpisodeRecord | None = None
        self.tracker: EpisodeTracker | None = None
        self.done = False
        self.first: Observation | None = None
        self.screenshots: dict[int, bytes] = {}  # step index -> the PNG its observation had

    # ------------------------------------------------------------------ prompts

    def system_prompt(self) -> str:
        return describe_actions(self.mode, self.policy_hosts(), compact=self.prompt == "compact")

    def policy_hosts(self) -> tuple[str, ...]:
        return tuple(getattr(self.policy, "allowed_hosts", ()))

    def user_prompt(self) -> str:
        assert self.record is not None and self.first is not None, "reset() first"
        question = self.record.task["question"]
        return f"Question: {question}\n\n{render(self.first, self.limits.observation_chars)}"

    def messages(self) -> list[dict[str, str]]:
        """The chat so far's opening: system (the actions) and user (question + first view)."""
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": self.user_prompt()},
        ]

    # ------------------------------------------------------------------ episode

    async def reset(self, task: Mapping[str, Any]) -> StepResult:
        """Start the episode at ``task["start_url"]``: the first observation, as a
        :class:`StepResult` (``text`` as the model reads it, reward 0, not over).
        A task that cannot be scored here raises ``ValueError`` before anything starts."""
        if self.record is not None:
            raise RuntimeError("an Environment runs one episode; make a new one")
        self.check_task(task)
        self.record = EpisodeRecord(self.episode_id, dict(task), self.mode, started=time.time())
        try:
            self.first = await asyncio.wait_for(
                self.backend.start(str(task.get("start_url") or "")), self.limits.action_timeout_s
            )
        except (TimeoutError, ToolError) as e:
            msg = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e)
            start = str(task.get("start_url") or "")
            self.first = Observation("", url=start, error=f"start page: {msg}")
        self.record.system_prompt = self.system_prompt()
        self.record.user_prompt = self.user_prompt()
        if self.run_dir is not None:
            self.tracker = EpisodeTracker(self.run_dir, self.record)
        return StepResult(
            self.first, render(self.first, self.limits.observation_chars), 0.0, False, False
        )

    def check_task(self, task: Mapping[str, Any]) -> None:
        """``ValueError`` (naming the task) unless the task can be started and scored in
        this mode: a ``start_url``, a ``question``, and a valid ``"reward"`` or a known ``type``, with the
        answer its verifier compares with."""
        tid = task.get("id")
        if not task.get("start_url") and self._opens_page():
            raise ValueError(f"task {tid!r}: no start_url")
        if not isinstance(task.get("question"), str):
            raise ValueError(f"task {tid!r}: no question (the text the agent is asked)")
        spec = task.get("reward")
        if spec is not None:
            try:
                page_reward.validate(spec)
            except ValueError as e:
                raise ValueError(f"task {tid!r}: {e}") from None
            if page_reward.needs_page(spec):
                if not hasattr(self.backend, "page"):
                    kind = page_reward.kind_of(spec)
                    raise ValueError(
                        f"task {tid!r}: a {kind} reward is read from the browser's page, "
                        f"and {self.mode} mode has no page; use playwright or som mode"
                    )
                return
        name = spec["verifier"] if spec is not None else task.get("type")
        if not isinstance(name, str) or name not in SCORERS:
            raise ValueError(
                f"task {tid!r}: unknown type {name!r}; expected one of {', '.join(SCORERS)}, "
                'or a "reward" ({"page_js": ...}, {"page_text": ...} or {"verifier": ...})'
            )
        if name == "multi_doc" and any(
            isinstance(f, str) and f.strip() for f in task.get("key_facts") or ()
        ):
            return
        try:
            golds(task)
        except ValueError as e:
            raise ValueError(f"{e} (the {name} verifier compares the answer with it)") from None

    def _opens_page(self) -> bool:
        """Whether this kind's episodes open on the task's ``start_url`` (every web kind)."""
        return self.mode not in envs or envs.get(self.mode).opens_page

    async def step(self, action: Action | str) -> StepResult:
        if self.record is None:
            raise RuntimeError("reset() before step()")
        if self.done:
            raise RuntimeError("the episode is over")
        started = time.time()
        raw = action if isinstance(action, str) else action.render()
        parsed = (
            parse(action, self.mode, self.policy, base_url=self.backend.url)
            if isinstance(action, str)
            else action
        )
        if isinstance(parsed, ParseError):
            obs = Observation("", url=self.backend.url, error=parsed.message, summary="parse error")
            return await self._after(raw, None, obs, started, "parse_error")
        if isinstance(parsed, Answer):
            return await self._answer(raw, parsed, started)
        error = None
        try:
            obs = await asyncio.wait_for(self.backend.act(parsed), self.limits.action_timeout_s)
        except (TimeoutError, ActionTimeout) as e:
            if not isinstance(e, ActionTimeout):
                await self.backend.recover()
            error = "timeout"
            why = str(e) or f"{parsed.name} timed out after {self.limits.action_timeout_s:g} s"
            obs = Observation("", url=self.backend.url, error=why, summary="timed out")
        except ToolError as e:
            error = "tool_error"
            obs = Observation("", url=self.backend.url, error=str(e), summary=f"error: {e}")
        except InfraError as e:
            return self._infra(raw, parsed, started, str(e))
        if parsed.note:
            obs = Observation(**{**obs.__dict__, "note": parsed.note})
        return await self._after(raw, parsed, obs, started, error)

    # ------------------------------------------------------------------ endings

    def _record_step(self, raw, action, obs, text, started, error) -> None:
        step = Step(
            index=len(self.record.steps) + 1,
            raw=raw,
            action=action.name if action is not None else None,
            args=action.args() if action is not None else {},
            observation=text,
            summary=obs.summary or (obs.error or "")[:100],
            error=error,
            url=obs.url,
            page_text=obs.page_text,
            started=started,
            ended=time.time(),
            note=getattr(action, "note", "") or "",
        )
        if obs.screenshot is not None:
            self.screenshots[step.index] = obs.screenshot
        if self.tracker is not None:
            self.tracker.log_step(step)
        else:
            self.record.steps.append(step)

    async def _after(self, raw, action, obs, started, error) -> StepResult:
        text = render(obs, self.limits.observation_chars)
        self._record_step(raw, action, obs, text, started, error)
        info = {"error": error, "step_ms": (time.time() - started) * 1e3}
        if len(self.record.steps) >= self.limits.max_steps:
            reward = await self._finish("truncated", None)
            info.update(status="truncated", reward_breakdown=reward.breakdown)
            return StepResult(obs, text, reward.value, False, True, info)
        return StepResult(obs, text, 0.0, False, False, info)

    async def _answer(self, raw: str, action: Answer, started: float) -> StepResult:
        obs = Observation("", url=self.backend.url, summary="answered")
        self._record_step(raw, action, obs, "", started, None)
        reward = await self._finish("ok", action.text)
        info = {"status": "ok", "reward_breakdown": reward.breakdown, "answer": action.text}
        return StepResult(obs, "", reward.value, True, False, info)

    def _infra(self, raw: str, action: Action, started: float, why: str) -> StepResult:
        obs = Observation("", url=self.backend.url, error=why, summary="infrastructure error")
        self._record_step(raw, action, obs, "", started, "tool_error")
        self.done = True
        if self.tracker is not None:
            self.tracker.finish("infra_error", error=why)
        else:
            self.record.status, self.record.error = "infra_error", why
        return StepResult(obs, "", 0.0, True, False, {"status": "infra_error", "error": why})

    async def _finish(self, status: str, answer: str | None) -> Reward:
        self.done = True
        reward = await self.score(answer)
        if self.tracker is not None:
            self.tracker.finish(status, answer=answer, reward=reward)
        else:
            rec = self.record
            rec.status, rec.answer, rec.reward = status, answer, reward.value
            rec.breakdown, rec.ended = dict(reward.breakdown), time.time()
        return reward

    async def score(self, answer: str | None) -> Reward:
        """The episode's reward for ``answer`` (None: it gave none): its outcome (below),
        plus the process term when ``verifier.process`` is on, logged apart in the
        breakdown (:mod:`rollout.verifiers.process`)."""
        outcome = await self.outcome(answer)
        return await with_process(self.record.task, self.record, outcome, self.verifier)

    async def outcome(self, answer: str | None) -> Reward:
        """The outcome reward: the task's ``"reward"`` (read from the page, or a verifier by
        name) when it has one, else its ``type``'s verifier. A page that cannot be read
        scores 0.0 with ``page_reward_error``."""
        task = self.record.task
        spec = task.get("reward")
        if spec is None:
            return verify(task, answer, self.record, self.verifier)
        if not page_reward.needs_page(spec):
            named = {**task, "type": spec["verifier"]}
            return verify(named, answer, self.record, self.verifier)
        page = getattr(self.backend, "page", None)
        value, parts = await page_reward.read_page_reward(page, spec, self.limits.action_timeout_s)
        return Reward(value, {**parts, "answered": bool((answer or "").strip())})

    async def truncate(self) -> Reward:
        """End the episode now as truncated (e.g. its token budget ran out), scored as such."""
        if self.done:
            raise RuntimeError("the episode is over")
        return await self._finish("truncated", None)

    async def close(self) -> None:
        if self.record is not None and not self.record.finished:
            self.done = True
            if self.tracker is not None:
                self.tracker.finish("truncated", error="closed before the episode ended")
        if self.tracker is not None:
            self.tracker.close()
        await self.backend.close()
