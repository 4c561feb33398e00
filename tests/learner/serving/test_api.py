"""``learner.serving.api``: the embedded server's SGLang reply fields, with hand-derived values."""

from __future__ import annotations

from learner.serving.api import version_spans


def test_the_embedded_servers_spans_are_sglangs():
    """(old version, tokens generated under it) at each update, then the current one:
    updates after token 3 (from "1") and after token 3 again (from "2", an update that
    changed nothing before the next token) over 6 tokens: "1" on [0, 3), "3" on [3, 6)."""
    assert version_spans([("1", 3), ("2", 3)], "3", 6) == [
        {"version": "1", "start": 0, "end": 3},
        {"version": "3", "start": 3, "end": 6},
    ]
    assert version_spans([], "5", 4) == [{"version": "5", "start": 0, "end": 4}]
    assert version_spans([("5", 2)], "5", 4) == [{"version": "5", "start": 0, "end": 4}]
