"""Answer text normalisation and matching, SQuAD style.

:func:`normalize_answer` follows the SQuAD evaluation script (lowercase, drop
punctuation, drop the articles a/an/the, collapse whitespace), with one
extension: every Unicode punctuation character is dropped, not only ASCII
punctuation, so smart quotes and dashes do not break a match.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

_ARTICLES = re.compile(r"\b(a|an|the)\b")


@lru_cache(maxsize=4096)
def _is_punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P") or char in "$+<=>^`|~"


def normalize_answer(text: str) -> str:
    """Lowercase, without punctuation and articles, whitespace collapsed."""
    text = "".join(c for c in text.lower() if not _is_punctuation(c))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 over normalised tokens (multiset overlap)."""
    pred, ref = tokens(prediction), tokens(gold)
    if not pred or not ref:
        return float(pred == ref)
    overlap = sum((Counter(pred) & Counter(ref)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def contains(haystack: str, needle: str) -> bool:
    """Whether the normalised ``needle`` occurs in the normalised ``haystack`` on word
    boundaries ("cat" is in "the cat sat", not in "concatenate"); an empty needle never is."""
    n = normalize_answer(needle)
    return bool(n) and f" {n} " in f" {normalize_answer(haystack)} "


def best(prediction: str, golds: Iterable[str], metric) -> float:
    """The highest ``metric(prediction, gold)`` over the gold answers (0.0 if none)."""
    return max((metric(prediction, g) for g in golds), default=0.0)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """The numbers written in ``text`` ("12,345" and "12345.5" alike)."""
    out = []
    for m in _NUMBER.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def numeric_match(prediction: str, gold: str, rel_tol: float) -> float:
    """1.0 when the prediction states exactly one number and it is within ``rel_tol``
    (relative) of the gold's first number, else 0.0."""
    said, want = numbers(prediction), numbers(gold)
    if len(said) != 1 or not want:
        return 0.0
    return float(abs(said[0] - want[0]) <= rel_tol * max(abs(want[0]), 1.0))
