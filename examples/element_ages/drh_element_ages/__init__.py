"""Example plugin: element-age tasks (a task source) and their verifier (a task type).

``element_ages(request)`` is a task source (entry-point group
``deep_research_harness.task_sources``): it reads the chemical elements of the local
web and asks how many years before 2000 each was discovered. The evidence is the
element's page ("Gold was discovered in ..."); the answer is computed from it
(``derived``), so the scripted oracle answers once it has read the evidence.

``score_years_before(...)`` is the verifier of the task type ``years_before`` (group
``deep_research_harness.verifiers``), with the in-tree scorers' signature.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from rollout.registry import TaskRequest

TYPE = "years_before"
YEAR = 2000
SPLITS = {"train": (0, 80), "dev": (80, 90), "test": (90, 100)}  # percent of elements
_NUMBER = re.compile(r"[-+]?\d[\d,]*")


def _split(subject: str) -> str:
    bucket = int(hashlib.sha256(subject.encode()).hexdigest()[:8], 16) % 100
    return next(name for name, (lo, hi) in SPLITS.items() if lo <= bucket < hi)


def element_ages(request: TaskRequest) -> list[dict]:
    """``request.n`` tasks (all when None) of ``request.split``, in element order."""
    from rollout.web.build import load

    base = request.web_url.rstrip("/")
    tasks = []
    for e in load(request.cfg.web.cache_dir).world.elements.values():
        subject = f"element:{e.number}"
        if not e.discovery_year or _split(subject) != request.split:
            continue
        page = f"{base}/elements/{e.symbol}"
        tasks.append(
            {
                "id": f"{request.split}-{TYPE}-{e.number:03d}",
                "question": f"How many years before {YEAR} was {e.name} discovered?",
                "answer": str(YEAR - e.discovery_year),
                "type": TYPE,
                "hops": 1,
                "start_url": base + "/",
                "evidence": [
                    {"url": page, "quote": f"{e.name} was discovered in {e.discovery_year}"}
                ],
                "gold_path": [
                    {"action": "search", "args": {"query": f"{e.name} chemical element"}},
                    {"action": "visit", "args": {"url": page}},
                ],
                "derived": True,  # computed from the page's year, not quoted by it
                "template": "element_ages",
                "subject": subject,
            }
        )
    return tasks if request.n is None else tasks[: request.n]


def score_years_before(
    task: Mapping[str, Any], body: str, cited: list[str], record, config, judgement
) -> tuple[float, dict[str, float | str | bool]]:
    """1.0 when the answer's first whole number is the task's count of years, else 0.0."""
    m = _NUMBER.search(body)
    stated = int(m.group().replace(",", "")) if m else None
    right = stated is not None and stated == int(task["answer"])
    return float(right), {"years_exact": float(right), "years_stated": stated is not None}
