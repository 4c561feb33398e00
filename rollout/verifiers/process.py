"""The process reward: an auxiliary per-episode term beside the outcome, the outcome kept primary.

``r = r_outcome + term``: ``r_outcome`` is the verifier's reward (task score, format
tiers, anti-cheat; or a page-defined reward), ``r_process`` in [0, 1] comes from
``ProcessConfig.source``, and the term is ``weight * r_process`` bounded as
:class:`~rollout.verifiers.config.ProcessConfig` says: an episode is *right* when
``r_outcome >= SUCCESS`` (1.0, the success threshold of ``rollout.eval``, the
engine's counter and the learner's success rate: a correct, well-formed, unflagged
answer) and *wrong* otherwise; a wrong episode's term is at most ``cap`` times its
distance to ``SUCCESS``, so with ``cap < 1`` every wrong total is below 1.0 and every
right total at least 1.0. Success counts are therefore the same with or without it.

Sources:

- ``evidence``: the fraction of the task's distinct evidence pages (``task["evidence"]``
  URLs, compared by :func:`~rollout.verifiers.citations.url_key`) that a step before
  the answer landed on or asked for without error (1-hop: 0 or 1). The start page is
  given, not reached, and does not count. An environment kind whose steps read
  something other than pages names what a step reached (``EnvKind.reached``): the
  ``tools`` kind's lookups reach the figures they showed, ``tools://figures/ISO/indicator``,
  which its tasks' evidence lists. A task without evidence pages scores 0 with
  ``process_note`` saying so.
- ``prm``: a process reward model behind any OpenAI-compatible chat endpoint grades
  up to ``prm_max_steps`` steps (evenly spread, the last included), one request each,
  through the judge's client (:meth:`~rollout.verifiers.judge.Judge.ask`: its
  timeout, retries and strict parsing); each reply ends with ``SCORE: x``, x in
  [0, 1], and ``r_process`` is their mean. When a step gets no score after the
  retries ``r_process`` is 0 and ``process_error`` says why; the episode goes on.

The breakdown gains, whatever the episode, the numbers ``outcome``, ``process``,
``process_term`` and the source's counts (evidence: ``evidence_pages``,
``evidence_reached``; prm: ``prm_steps``), so a group's reward parts keep one set of
keys on the wire; and the strings ``process_source`` and, when there is one,
``process_note`` or ``process_error``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rollout.registry import envs
from rollout.tracking.records import EpisodeRecord, Step
from rollout.verifiers.citations import url_key
from rollout.verifiers.config import SUCCESS, ProcessConfig, VerifierConfig
from rollout.verifiers.judge import Judge, JudgeError, MalformedVerdict
from rollout.verifiers.reward import Reward

Parts = dict[str, float | str | bool]

PRM_RUBRIC = (
    "You grade one step of a web-research agent's episode. The agent answers a question "
    "by searching and reading web pages, one action per step. A good step makes progress "
    "towards a correct answer supported by the pages: a relevant search, opening a page "
    "likely to hold the evidence, reading on where the answer is, answering with what the "
    "pages said. A bad step repeats an earlier one, wanders off, fails to parse, or answers "
    "without support. Think briefly, then end your reply with one final line that is "
    "exactly SCORE: followed by a number from 0 (a bad step) to 1 (a good step)."
)
RAW_CHARS = 2000  # of the graded step's text shown to the PRM
OBSERVATION_CHARS = 2000  # of what came back
EARLIER_STEPS = 30  # earlier steps listed (one line each), the most recent ones
_SCORE = re.compile(r"SCORE:\s*([0-9]*\.?[0-9]+)")


def term(outcome: float, r_process: float, config: ProcessConfig, *, zeroed: bool = False) -> float:
    """The process term added to ``outcome`` (see :class:`ProcessConfig`)."""
    if zeroed:
        return 0.0
    raw = config.weight * min(1.0, max(0.0, r_process))
    if outcome >= SUCCESS:
        return raw
    return min(raw, config.cap * (SUCCESS - outcome))


async def with_process(
    task: Mapping[str, Any],
    record: EpisodeRecord,
    outcome: Reward,
    config: VerifierConfig | None,
    *,
    judge: Judge | None = None,
) -> Reward:
    """``outcome`` with the process term added and logged apart; unchanged when the process
    reward is off. ``judge`` reuses a PRM client; otherwise one is opened for this call."""
    settings = config.process if config is not None else None
    if settings is None or not settings.on:
        return outcome
    if settings.source == "evidence":
        r_process, parts = evidence_reached(task, record)
    else:
        r_process, parts = await prm_score(task, record, settings, judge=judge)
    zeroed = bool(outcome.breakdown.get("zeroed", False))
    added = term(outcome.value, r_process, settings, zeroed=zeroed)
    breakdown: Parts = {
        **outcome.breakdown,
        "outcome": outcome.value,
        "process": r_process,
        "process_term": added,
        "process_source": settings.source,
    }
    breakdown.update(parts)
    return Reward(outcome.value + added, breakdown)


# ----------------------------------------------------------------------------- evidence


def evidence_pages(task: Mapping[str, Any]) -> list[str]:
    """The task's distinct evidence pages as :func:`url_key` keys, in order
    (``evidence`` items are ``{"url", "quote"}`` or bare URLs)."""
    urls = []
    for item in task.get("evidence") or ():
        url = item.get("url") if isinstance(item, Mapping) else item
        if isinstance(url, str) and url.strip():
            urls.append(url_key(url))
    return list(dict.fromkeys(urls))


def pages_reached(record: EpisodeRecord) -> set[str]:
    """Every page a tool step before the answer landed on or asked for, without error,
    and what the episode's environment kind says such a step reached besides
    (``EnvKind.reached``: a tool lookup's figures)."""
    reached: set[str] = set()
    extra = _reached_by(record.mode)
    for step in record.steps:
        if step.action == "answer":
            break
        if not step.ran_tool or step.error is not None:
            continue
        urls = [step.url, step.args.get("url"), *(extra(step) if extra else ())]
        for url in urls:
            if isinstance(url, str) and url:
                reached.add(url_key(url))
    return reached


def _reached_by(mode: str) -> Callable[[Step], Iterable[str]] | None:
    return envs.get(mode).reached if mode in envs else None


def evidence_reached(task: Mapping[str, Any], record: EpisodeRecord) -> tuple[float, Parts]:
    """(the fraction of evidence pages reached, its parts)."""
    pages = evidence_pages(task)
    if not pages:
        note = "the task names no evidence pages"
        return 0.0, {"evidence_pages": 0.0, "evidence_reached": 0.0, "process_note": note}
    found = sum(1 for key in pages if key in pages_reached(record))
    return found / len(pages), {
        "evidence_pages": float(len(pages)),
        "evidence_reached": float(found),
    }


# ----------------------------------------------------------------------------- PRM


def parse_score(content: str) -> float:
    """The score on the reply's last non-empty line, ``SCORE: x`` with x in [0, 1];
    :class:`MalformedVerdict` (retried) for anything else."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    m = _SCORE.fullmatch(lines[-1]) if lines else None
    if m is None or not 0.0 <= float(m.group(1)) <= 1.0:
        last = lines[-1][:80] if lines else "(empty reply)"
        raise MalformedVerdict(f"malformed score: the last line is {last!r}")
    return float(m.group(1))


def steps_to_score(steps: Sequence[Step], most: int) -> list[Step]:
    """At most ``most`` of ``steps``, evenly spread, the first and the last included."""
    n = len(steps)
    if n <= most:
        return list(steps)
    if most == 1:
        return [steps[-1]]
    picks = dict.fromkeys(round(i * (n - 1) / (most - 1)) for i in range(most))
    return [steps[i] for i in picks]


def prm_messages(
    task: Mapping[str, Any], record: EpisodeRecord, step: Step, prompt: str = ""
) -> list[dict[str, str]]:
    """The rubric (``prompt``, or :data:`PRM_RUBRIC`) as the system message; the question,
    the earlier steps (one line each) and the graded step as the user's."""
    earlier = [s for s in record.steps if s.index < step.index][-EARLIER_STEPS:]
    lines = [f"{s.index}. {_call(s)} -> {s.summary or s.error or ''}" for s in earlier]
    parts = [f"Question:\n{task.get('question', '')}"]
    parts.append("Earlier steps:\n" + ("\n".join(lines) if lines else "(none)"))
    parts.append(f"Step {step.index} to grade, the agent's text:\n<<<\n{step.raw[:RAW_CHARS]}\n>>>")
    parts.append(f"It became: {_call(step)}" + (f" ({step.error})" if step.error else ""))
    seen = step.observation[:OBSERVATION_CHARS] or "(nothing: the episode ended)"
    parts.append(f"What came back:\n<<<\n{seen}\n>>>")
    user = "\n\n".join(parts)
    return [{"role": "system", "content": prompt or PRM_RUBRIC}, {"role": "user", "content": user}]


def _call(step: Step) -> str:
    if step.action is None:
        return "(unparseable)"
    args = ", ".join(f"{k}={json.dumps(v, default=str)[:200]}" for k, v in step.args.items())
    return f"{step.action}({args})"


async def prm_score(
    task: Mapping[str, Any],
    record: EpisodeRecord,
    config: ProcessConfig,
    *,
    judge: Judge | None = None,
) -> tuple[float, Parts]:
    """(the mean PRM score of the graded steps, its parts); 0 with ``process_error`` when
    a step got no score after the retries."""
    steps = steps_to_score(record.steps, config.prm_max_steps)
    if not steps:
        return 0.0, {"prm_steps": 0.0, "process_note": "the episode took no step"}
    assert config.prm is not None  # ProcessConfig checks it
    if judge is None:
        async with Judge(config.prm) as own:
            return await _grade_steps(own, task, record, steps, config.prm_prompt)
    return await _grade_steps(judge, task, record, steps, config.prm_prompt)


async def _grade_steps(
    judge: Judge, task: Mapping[str, Any], record: EpisodeRecord, steps: list[Step], prompt: str
) -> tuple[float, Parts]:
    asked = [judge.ask(prm_messages(task, record, s, prompt), parse_score) for s in steps]
    replies = await asyncio.gather(*asked, return_exceptions=True)
    for step, reply in zip(steps, replies, strict=True):
        if isinstance(reply, JudgeError):
            return 0.0, {"prm_steps": 0.0, "process_error": f"step {step.index}: {reply.reason}"}
        if isinstance(reply, BaseException):
            raise reply
    scores = [score for score, _, _ in replies]
    return sum(scores) / len(scores), {"prm_steps": float(len(scores))}
