"""The search engine: BM25 over the visible text of every indexed page (bm25s).

Two fields, scored separately and summed: the page's visible text, and its title
(weighted ``TITLE_WEIGHT``), so a long page whose title names the query is not
buried by length normalisation under short pages that merely mention it. Text
is lowercased and split into word tokens, English stop words removed. Ties are
broken by page order, so results are deterministic. A search can be restricted
to one site, which is how each site's own search box works.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollout.web.site import Page


def _import_bm25s():
    """bm25s imports JAX when it can (for an optional top-k backend); the rollout side must
    never load JAX, so hide it during that import and bm25s falls back to numpy."""
    if "jax" in sys.modules:
        import bm25s
    else:
        sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax` now fails
        try:
            import bm25s
        finally:
            del sys.modules["jax"]
    return bm25s


bm25s = _import_bm25s()
from bm25s.stopwords import STOPWORDS_EN  # noqa: E402

_WORD = re.compile(r"\w+", re.U)
_STOP = frozenset(STOPWORDS_EN)
MAX_QUERY_CHARS = 512
MAX_RESULTS = 100
TITLE_WEIGHT = 2.0


def tokenize(text: str) -> list[str]:
    return [t for t in _WORD.findall(text.lower()) if t not in _STOP]


@dataclass(frozen=True)
class Result:
    url: str
    title: str
    snippet: str
    score: float

    def as_json(self) -> dict[str, str]:
        return {"url": self.url, "title": self.title, "snippet": self.snippet}


class SearchIndex:
    """BM25 over pages; ``search`` returns ranked results with a snippet each."""

    def __init__(self, pages: Sequence[Page]):
        self.pages = [p for p in pages if p.indexed]
        self.body = bm25s.BM25()
        self.body.index([tokenize(p.text) for p in self.pages], show_progress=False)
        self.title = bm25s.BM25()
        self.title.index([tokenize(p.title) or ["_"] for p in self.pages], show_progress=False)
        self._sites = np.array([p.site for p in self.pages])

    def __len__(self) -> int:
        return len(self.pages)

    def scores(self, terms: list[str]) -> np.ndarray:
        """(N,) float32: the fielded BM25 score of every page for the query terms."""
        out = np.zeros(len(self.pages), dtype=np.float32)
        for index, weight in ((self.body, 1.0), (self.title, TITLE_WEIGHT)):
            ids = index.get_tokens_ids(terms)
            if ids:
                out += weight * index.get_scores_from_ids(ids)
        return out

    def search(
        self, query: str, k: int = 10, offset: int = 0, site: str | None = None
    ) -> list[Result]:
        """Results offset..offset+k of the ranking (at most ``MAX_RESULTS`` deep)."""
        terms = tokenize(query[:MAX_QUERY_CHARS])
        depth = min(offset + k, MAX_RESULTS)
        if not terms or depth <= offset or not self.pages:
            return []
        scores = self.scores(terms)
        if site is not None:
            scores = np.where(self._sites == site, scores, 0)
        n = min(depth, len(scores))
        kth = np.partition(scores, len(scores) - n)[len(scores) - n]  # n-th largest score
        top = np.flatnonzero((scores >= kth) & (scores > 0))  # ties at the cut included
        ranked = sorted(top.tolist(), key=lambda i: (-scores[i], i))
        return [
            Result(
                self.pages[i].path,
                self.pages[i].title,
                snippet(self.pages[i], terms),
                float(scores[i]),
            )
            for i in ranked[offset:depth]
        ]


def snippet(page: Page, terms: list[str], width: int = 200) -> str:
    """The line of the page's main text that holds the most query terms, cut to ``width``."""
    text = page.main_text or page.text
    lowered = text.lower()
    want = {t for t in terms if t in lowered}
    lines = text.split("\n")
    if want:  # score only the lines that can hold a term
        lines = [ln for ln in lines if any(t in ln.lower() for t in want)] or lines
    best = max(lines, key=lambda ln: (len(want & set(tokenize(ln))), len(ln) > 40), default="")
    return best if len(best) <= width else best[: width - 3].rsplit(" ", 1)[0] + "..."
