"""Reward-hacking detectors: cheap checks of shapes an answer takes when a policy games a scorer.

- ``restated_question``: the answer is the question said back (at least
  ``restate_min_tokens`` tokens, at most ``restate_max_novel`` of them absent from the
  question), which containment and F1 scorers can reward when the question holds
  the answer's words.
- ``stitched_snippets``: the answer is mostly search-result snippets pasted
  together: at least ``stitch_overlap`` of its word 4-grams appear in the
  search observations of the episode (answers of at least ``stitch_min_tokens``).
- ``overlong``: more than ``max_answer_words`` words, which buys coverage.
- ``no_tool_use``: a task that needs evidence (``hops >= 1``) answered without a tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.tracking.records import EpisodeRecord
from rollout.verifiers.config import AntiCheatConfig
from rollout.verifiers.text import tokens

_NGRAM = 4


def detect(
    task: Mapping[str, Any], body: str, record: EpisodeRecord, config: AntiCheatConfig
) -> dict[str, bool]:
    """Every detector's verdict on an answer's text (citations removed)."""
    return {
        "restated_question": restates_question(str(task.get("question", "")), body, config),
        "stitched_snippets": stitches_snippets(body, record, config),
        "overlong": len(body.split()) > config.max_answer_words,
        "no_tool_use": _hops(task) >= 1 and not record.tool_steps,
    }


def restates_question(question: str, body: str, config: AntiCheatConfig) -> bool:
    answer = tokens(body)
    if len(answer) < config.restate_min_tokens:
        return False
    asked = set(tokens(question))
    novel = sum(1 for t in answer if t not in asked)
    return novel <= config.restate_max_novel * len(answer)


def stitches_snippets(body: str, record: EpisodeRecord, config: AntiCheatConfig) -> bool:
    answer = tokens(body)
    if len(answer) < max(config.stitch_min_tokens, _NGRAM):
        return False
    seen: set[tuple[str, ...]] = set()
    for step in record.steps:
        if step.action == "search" and step.error is None:
            seen |= _ngrams(tokens(step.observation))
    grams = [tuple(answer[i : i + _NGRAM]) for i in range(len(answer) - _NGRAM + 1)]
    found = sum(1 for g in grams if g in seen)
    return found >= config.stitch_overlap * len(grams)


def _ngrams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + _NGRAM]) for i in range(len(words) - _NGRAM + 1)}


def _hops(task: Mapping[str, Any]) -> int:
    try:
        return int(task.get("hops", 0) or 0)
    except (TypeError, ValueError):
        return 0
