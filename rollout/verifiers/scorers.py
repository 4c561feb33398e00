"""Task scores by type: pure functions of the task, the answer's text and citations, and the record.

Each scorer returns ``(score in [0, 1], parts)``; the parts' keys depend only on
the task type, so every trajectory of a GRPO group carries the same reward parts.

- ``qa``: exact match and SQuAD token F1, each the max over the answer and its
  aliases; ``VerifierConfig.qa_metric`` picks which one is the score. A task with a
  numeric ``tolerance`` (relative) also counts as an exact match an answer stating one
  number within that tolerance of the answer's (sums over many pages).
- ``browse_comp``: normalised exact match over the answer and aliases.
- ``citation``: correctness (the citation config's metric) x citation score
  (see :class:`~rollout.verifiers.config.CitationConfig`).
- ``multi_doc``: key-fact coverage (normalised containment), mixed with the
  judge's verdict when one is given (see :class:`~rollout.verifiers.config.MultiDocConfig`).

They are registered by type in :data:`rollout.registry.verifiers` by
:func:`register_scorers`, which the registry calls on its first lookup; a plugin adds a
task type with a scorer of the same signature (entry-point group
``deep_research_harness.verifiers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rollout.registry import verifiers
from rollout.tracking.records import EpisodeRecord
from rollout.verifiers.citations import citation_support
from rollout.verifiers.config import VerifierConfig
from rollout.verifiers.judge import JudgeVerdict
from rollout.verifiers.text import best, contains, exact_match, numeric_match, token_f1

Parts = dict[str, float | str | bool]
Scorer = Callable[..., tuple[float, Parts]]


class TaskError(ValueError):
    """A task that cannot be scored: unknown type or missing fields."""


def golds(task: Mapping[str, Any]) -> list[str]:
    """The task's answer and aliases, non-empty strings only."""
    answers = [task.get("answer"), *(task.get("aliases") or [])]
    found = [a for a in answers if isinstance(a, str) and a.strip()]
    if not found:
        raise TaskError(f"task {task.get('id')!r} has no answer")
    return found


def score_qa(
    task: Mapping[str, Any],
    body: str,
    cited: list[str],
    record: EpisodeRecord,
    config: VerifierConfig,
    judgement: JudgeVerdict | None,
) -> tuple[float, Parts]:
    answers = golds(task)
    em, f1 = best(body, answers, exact_match), best(body, answers, token_f1)
    tol = task.get("tolerance")
    numeric = isinstance(tol, int | float) and not isinstance(tol, bool) and tol >= 0
    if numeric and em < 1.0 and numeric_match(body, answers[0], float(tol)):
        em = f1 = 1.0
    return (f1 if config.qa_metric == "f1" else em), {"em": em, "f1": f1}


def score_browse_comp(
    task: Mapping[str, Any],
    body: str,
    cited: list[str],
    record: EpisodeRecord,
    config: VerifierConfig,
    judgement: JudgeVerdict | None,
) -> tuple[float, Parts]:
    em = best(body, golds(task), exact_match)
    return em, {"em": em}


def score_citation(
    task: Mapping[str, Any],
    body: str,
    cited: list[str],
    record: EpisodeRecord,
    config: VerifierConfig,
    judgement: JudgeVerdict | None,
) -> tuple[float, Parts]:
    answers = golds(task)
    metric = exact_match if config.citation.metric == "em" else token_f1
    correct = best(body, answers, metric)
    quotes = [
        e["quote"] for e in task.get("evidence") or [] if isinstance(e, dict) and e.get("quote")
    ]
    n, supported, unvisited = citation_support(cited, record, quotes)
    penalty = config.citation.unvisited_penalty
    cite_score = max(0.0, (supported - penalty * unvisited) / n) if n else 0.0
    parts: Parts = {
        "correct": correct,
        "cited": float(n),
        "supported": float(supported),
        "unvisited": float(unvisited),
        "citation_score": cite_score,
    }
    return correct * cite_score, parts


def score_multi_doc(
    task: Mapping[str, Any],
    body: str,
    cited: list[str],
    record: EpisodeRecord,
    config: VerifierConfig,
    judgement: JudgeVerdict | None,
) -> tuple[float, Parts]:
    facts = [f for f in task.get("key_facts") or [] if isinstance(f, str) and f.strip()]
    facts = facts or golds(task)
    covered = sum(1 for fact in facts if contains(body, fact))
    coverage = covered / len(facts)
    parts: Parts = {"coverage": coverage, "facts_covered": float(covered)}
    parts["judge_used"] = judgement is not None
    parts["judge_score"] = judgement.score if judgement is not None else 0.0
    if judgement is None:
        return coverage, parts
    w = config.multi_doc.judge_weight
    return (1 - w) * coverage + w * judgement.score, parts


BUILTIN_SCORERS: dict[str, Scorer] = {
    "qa": score_qa,
    "browse_comp": score_browse_comp,
    "citation": score_citation,
    "multi_doc": score_multi_doc,
}


def register_scorers() -> None:
    """Register :data:`BUILTIN_SCORERS` in :data:`rollout.registry.verifiers`; the
    registry calls this on its first lookup (it names it among its in-tree entries)."""
    for name, scorer in BUILTIN_SCORERS.items():
        verifiers.register(name, scorer)


# Every task type's scorer, in-tree and plugins' (``name in SCORERS``, ``SCORERS[name]``).
SCORERS = verifiers
