"""The reward of an episode: task score, then format tiers, then anti-cheat, in one breakdown.

``verify(task, answer, record, config)`` is pure and synchronous; ``verify_async``
first asks the LLM judge for a verdict when the task is ``multi_doc`` and a judge
is configured, then calls ``verify`` with it. Citations are split off the answer
before anything else (:func:`~rollout.verifiers.citations.split_citations`), so
every score and detector sees the answer's text alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.registry import verifiers
from rollout.tracking.records import EpisodeRecord
from rollout.verifiers.anticheat import detect
from rollout.verifiers.citations import split_citations
from rollout.verifiers.config import FormatConfig, VerifierConfig
from rollout.verifiers.judge import Judge, JudgeError, JudgeVerdict
from rollout.verifiers.scorers import TaskError

_DEFAULT = VerifierConfig()


@dataclass(frozen=True)
class Reward:
    """The reward and how it came about; ``breakdown["verdict"]`` is a one-word summary."""

    value: float
    breakdown: dict[str, float | str | bool]

    def parts(self) -> dict[str, float]:
        """The numeric parts (booleans as 0/1) for the wire; their keys depend only on
        the task type and the config, never on the answer."""
        return {
            k: float(v)
            for k, v in self.breakdown.items()
            if isinstance(v, int | float) and k != "value"
        }


def verify(
    task: Mapping[str, Any],
    answer: str | None,
    record: EpisodeRecord,
    config: VerifierConfig | None = None,
    *,
    judgement: JudgeVerdict | None = None,
) -> Reward:
    """Score ``answer`` (None: the episode gave none) for ``task`` given the episode's record,
    with the scorer its ``type`` names in :data:`rollout.registry.verifiers`."""
    config = config or _DEFAULT
    kind = task.get("type")
    if not isinstance(kind, str) or kind not in verifiers:
        raise TaskError(
            f"task {task.get('id')!r}: unknown type {kind!r}; expected one of "
            f"{', '.join(verifiers.names())}"
        )
    scorer = verifiers.get(kind)  # in-tree, or a plugin's (rollout.registry)
    body, cited = split_citations(answer or "")
    answered = bool(body)
    score, parts = scorer(task, body, cited, record, config, judgement)
    if not answered:
        score = 0.0
    well_formed = answered and record.parse_errors <= config.format.max_parse_errors
    value = format_tiers(score, well_formed, config.format)
    flags = detect(task, body, record, config.anticheat)
    fired = [name for name, hit in flags.items() if hit and name in config.anticheat.zero_on]
    if fired:
        value = 0.0
    breakdown: dict[str, float | str | bool] = {"type": kind, "answered": answered, "score": score}
    breakdown.update(parts)
    breakdown.update(format_ok=well_formed, parse_errors=float(record.parse_errors))
    breakdown.update(flags)
    breakdown.update(zeroed=bool(fired), verdict=_verdict(answered, score, fired))
    return Reward(value, breakdown)


def format_tiers(score: float, well_formed: bool, config: FormatConfig) -> float:
    """Search-R1 tiers: well-formed ``max(s, w)``, malformed ``max(0, s - w)``."""
    if well_formed:
        return max(score, config.weight)
    return max(0.0, score - config.weight)


def _verdict(answered: bool, score: float, fired: list[str]) -> str:
    if fired:
        return "zeroed: " + ", ".join(fired)
    if not answered:
        return "no answer"
    if score >= 1.0:
        return "correct"
    return "partial" if score > 0 else "incorrect"


async def verify_async(
    task: Mapping[str, Any],
    answer: str | None,
    record: EpisodeRecord,
    config: VerifierConfig | None = None,
    *,
    judge: Judge | None = None,
) -> Reward:
    """:func:`verify`, with the judge's verdict for a ``multi_doc`` task when a judge is
    configured (``judge`` reuses a client; otherwise one is opened for this call).

    A judge failure raises :class:`JudgeError` unless ``multi_doc.on_judge_error`` is
    ``"coverage"``, which scores coverage alone and records ``judge_error``.
    """
    config = config or _DEFAULT
    settings = config.multi_doc
    body = split_citations(answer or "")[0]
    if task.get("type") != "multi_doc" or settings.judge is None or not body:
        return verify(task, answer, record, config)
    facts = tuple(task.get("key_facts") or ())
    question, reference = str(task.get("question", "")), str(task.get("answer", ""))
    try:
        if judge is None:
            async with Judge(settings.judge) as own:
                verdict = await own.grade(question, body, reference=reference, key_facts=facts)
        else:
            verdict = await judge.grade(question, body, reference=reference, key_facts=facts)
    except JudgeError as e:
        if settings.on_judge_error == "raise":
            raise
        reward = verify(task, answer, record, config)
        return Reward(reward.value, {**reward.breakdown, "judge_error": e.reason})
    return verify(task, answer, record, config, judgement=verdict)
