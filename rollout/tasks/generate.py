"""Turning template candidates into tasks: splits, de-duplication, sampling, JSON.

A task is a plain dict (JSON):
``id, question, answer, aliases, type, hops, start_url, evidence [{url, quote}],
gold_path [{action, args}]``, plus ``key_facts`` for ``multi_doc`` tasks and
``template`` / ``subject`` for bookkeeping. A gold-path visit to a long page
carries the #fragment of the section holding the evidence (as a reader would
follow a table of contents); the evidence URL is the page itself. Ids read ``<split>-<type>-<number>``
and are stable: the same template and subject give the same id in any run.

Long-horizon tasks (``rollout.tasks.long_horizon``, drawn only when named) have
explicit gold paths with ``next_page`` steps (follow the list's "Next page" link)
and visits with a ``data`` URL (the source of the page's JavaScript panel), and may
carry ``derived: true`` (the answer is computed from the evidence: a count, a sum)
and ``tolerance`` (relative, for numeric answers; see the ``qa`` verifier).
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Iterable

from rollout.tasks import chains as _chains  # noqa: F401  (registers the chain templates)
from rollout.tasks.long_horizon import FAMILIES, LONG_TEMPLATES
from rollout.tasks.templates import TEMPLATES, Candidate
from rollout.web.build import LocalWeb

TYPES = ("qa", "browse_comp", "citation", "multi_doc")
SPLITS = {"train": (0, 80), "dev": (80, 90), "test": (90, 100)}  # percent of subjects
CITATION_SUFFIX = " Cite the URL of the page where you found the answer."


def split_of(subject: str) -> str:
    """The split a subject entity belongs to, by a stable hash of its key."""
    bucket = int(hashlib.sha256(subject.encode()).hexdigest()[:8], 16) % 100
    return next(name for name, (lo, hi) in SPLITS.items() if lo <= bucket < hi)


_CACHE: dict[tuple[str, str], list[Candidate]] = {}  # (build key, template) -> candidates


def all_candidates(
    lw: LocalWeb, types: Iterable[str] = TYPES, templates: Iterable[str] | None = None
) -> dict[str, list[Candidate]]:
    """Candidates by template name (a citation variant as ``name+citation``), ambiguous
    questions removed, for the requested types; with ``templates``, only those templates
    are built (the others cost a process several seconds: the city templates alone make
    64,000 candidates).

    Computed once per build and template; treat as read-only. A question is ambiguous when
    its template gives it two different answers; no two templates share a question text
    (``tests/rollout/tasks/test_generate.py`` checks it over every candidate), so a
    template's candidates do not depend on which others were built.
    """
    wanted = set(types)
    unknown = wanted - set(TYPES)
    if unknown:
        raise ValueError(f"unknown task types {sorted(unknown)}; known: {', '.join(TYPES)}")
    if templates is None:
        bases = list(TEMPLATES)
    else:
        bases = list(dict.fromkeys(t.removesuffix("+citation") for t in templates))
        bases = [t for t in bases if t in TEMPLATES]
    if _CACHE and next(iter(_CACHE))[0] != lw.key:
        _CACHE.clear()  # one build at a time is all a process uses
    out: dict[str, list[Candidate]] = {}
    for name in bases:
        key = (lw.key, name)
        if key not in _CACHE:
            _CACHE[key] = _unambiguous(list(TEMPLATES[name](lw)))
        cands = _CACHE[key]
        if not cands:
            continue
        if "citation" in wanted and cands[0].type == "qa":
            ckey = (lw.key, f"{name}+citation")
            if ckey not in _CACHE:
                _CACHE[ckey] = [_as_citation(c) for c in cands if c.hops <= 2]
            if _CACHE[ckey]:
                out[f"{name}+citation"] = _CACHE[ckey]
        if cands[0].type in wanted:
            out[name] = cands
    return out


def _unambiguous(cands: list[Candidate]) -> list[Candidate]:
    answers: dict[str, set[str]] = defaultdict(set)
    for c in cands:
        answers[c.question].add(c.answer.lower())
    return [c for c in cands if len(answers[c.question]) == 1]


def _as_citation(c: Candidate) -> Candidate:
    return Candidate(
        f"{c.template}+citation", "citation", c.subject, c.question + CITATION_SUFFIX, c.answer,
        c.evidence, c.query, list(c.aliases), list(c.key_facts), c.start, dict(c.anchors),
        c.path, c.derived, c.tolerance, c.bridge,
    )  # fmt: skip


def task_id(split: str, c: Candidate) -> str:
    number = int(hashlib.sha256(f"{c.template}|{c.subject}".encode()).hexdigest()[:12], 16)
    return f"{split}-{c.type}-{number % 10**10:010d}"


def to_task(c: Candidate, split: str, base_url: str) -> dict:
    base = base_url.rstrip("/")
    task = {
        "id": task_id(split, c),
        "question": c.question,
        "answer": c.answer,
        "aliases": [a for a in dict.fromkeys(c.aliases) if a and a != c.answer],
        "type": c.type,
        "hops": c.hops,
        "start_url": base + c.start,
        "evidence": [{"url": base + path, "quote": quote} for path, quote in c.evidence],
        "gold_path": gold_path(c, base),
        "template": c.template,
        "subject": c.subject,
    }
    if c.derived:
        task["derived"] = True  # the answer is computed from the evidence, not quoted
    if c.tolerance is not None:
        task["tolerance"] = c.tolerance
    if c.bridge is not None:
        task["bridge"] = c.bridge  # where one hop short ends (the noisy oracle's habit)
    if c.type == "multi_doc":
        task["key_facts"] = list(c.key_facts)
    return task


def gold_path(c: Candidate, base: str) -> list[dict]:
    """The candidate's gold path with absolute URLs: its explicit ``path``, or a search
    and a visit to each evidence page."""
    if c.path is None:
        return [{"action": "search", "args": {"query": c.query}}] + [
            {"action": "visit", "args": {"url": _at(base + path, c.anchors.get(path))}}
            for path in c.pages
        ]
    out = []
    for action, args in c.path:
        args = {k: base + v if k in ("url", "data") else v for k, v in args.items()}
        out.append({"action": action, "args": args})
    return out


def gold_steps(c: Candidate) -> int:
    """Actions on the candidate's gold path (the answer not counted)."""
    return len(c.path) if c.path is not None else 1 + len(c.pages)


def _at(url: str, fragment: str | None) -> str:
    return f"{url}#{fragment}" if fragment else url


def generate(
    lw: LocalWeb,
    split: str,
    n: int,
    types: Iterable[str] = TYPES,
    seed: int = 0,
    base_url: str = "http://127.0.0.1:8900",
    templates: Iterable[str] = (),
    up_to: bool = False,
) -> list[dict]:
    """``n`` tasks of ``split``, drawn evenly across templates, deterministic in ``seed``;
    with ``up_to``, ``n`` is a cap (every task when fewer exist), not a number to meet.

    ``templates`` (names as in ``rollout.tasks.templates.TEMPLATES``, a citation variant
    as ``name+citation``) narrows the draw to those templates; empty means all of ``types``
    except the long-horizon ones (``rollout.tasks.long_horizon``), which are drawn only
    when named (a long-horizon family's name, e.g. ``aggregation``, names its templates).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    rng = random.Random(f"{seed}|{split}")
    wanted = {t for name in templates for t in FAMILIES.get(name, (name,))}
    # only the templates drawn from are built (the long-horizon ones only when named)
    names = sorted(wanted) if wanted else [t for t in TEMPLATES if t not in LONG_TEMPLATES]
    by_template = all_candidates(lw, types, names)
    if wanted - set(by_template):
        by_template = all_candidates(lw, types)  # every name the error can suggest
        raise ValueError(
            f"unknown task templates {sorted(wanted - set(by_template))} for types "
            f"{sorted(types)}; known: {', '.join(sorted(by_template))}"
        )
    pools = []
    for name, cands in sorted(by_template.items()):
        if (wanted and name not in wanted) or (not wanted and name in LONG_TEMPLATES):
            continue
        pool = sorted((c for c in cands if split_of(c.subject) == split), key=lambda c: c.subject)
        rng.shuffle(pool)
        if pool:
            pools.append(pool)
    available = sum(len(p) for p in pools)
    if n > available and up_to:
        n = available
    if n > available:
        raise ValueError(
            f"only {available} {split} tasks of types {sorted(types)}"
            + (f", templates {sorted(wanted)}" if wanted else "")
            + f" exist; asked {n}"
        )
    chosen: list[Candidate] = []
    depth = 0
    while len(chosen) < n:  # round-robin over templates: each contributes evenly
        order = [p for p in pools if depth < len(p)]
        rng.shuffle(order)
        chosen.extend(p[depth] for p in order[: n - len(chosen)])
        depth += 1
    return [to_task(c, split, base_url) for c in chosen]
