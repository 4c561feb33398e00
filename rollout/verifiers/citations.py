"""Citations in an answer, and whether the episode's record supports them.

The citation syntax, as the action description tells the agent: the answer
ends with one line per source, ``[1] http://...``. Bare ``http(s)://`` URLs
anywhere else in the answer count as citations too. :func:`split_citations`
separates the answer's text from its cited URLs so correctness is judged on the
text alone (in every task type: an answer that cites is not penalised in EM).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from rollout.tracking.records import EpisodeRecord
from rollout.verifiers.text import contains

_CITATION_LINE = re.compile(
    r"^[ \t]{0,8}\[\d{1,3}\][ \t]{0,8}:?[ \t]{0,8}(https?://\S{1,4096})(?:[ \t][^\n]{0,300})?$",
    re.M | re.I,
)
_SOURCES_HEADER = re.compile(
    r"^[ \t]{0,8}(sources|references|citations)[ \t]{0,4}:?[ \t]*$", re.M | re.I
)
_BARE_URL = re.compile(r"https?://[^\s<>\"'\[\]{}|\\^`]{1,4096}", re.I)
_MARKER = re.compile(r"\[\d{1,3}\]")
_TRAILING = ".,;:!?*_'\""


def split_citations(answer: str) -> tuple[str, list[str]]:
    """(the answer's text without citations, the cited URLs in order, without repeats)."""
    urls: list[str] = []
    for m in _CITATION_LINE.finditer(answer):
        urls.extend(_BARE_URL.findall(m.group(1)))
    body = _CITATION_LINE.sub("", answer)
    urls.extend(_clean(u) for u in _BARE_URL.findall(body))
    body = _BARE_URL.sub(lambda m: " " + m.group(0)[len(_clean(m.group(0))) :], body)
    body = _SOURCES_HEADER.sub("", _MARKER.sub(" ", body))
    body = re.sub(r"\(\s{0,8}(?:source:?)?\s{0,8}\)", " ", body, flags=re.I)
    unique = list(dict.fromkeys(_clean(u) for u in urls))
    return " ".join(body.split()), unique


def _clean(url: str) -> str:
    """Strip punctuation a sentence adds after a URL; keep balanced parentheses."""
    while url and (url[-1] in _TRAILING or (url[-1] == ")" and url.count("(") < url.count(")"))):
        url = url[:-1]
    return url


def url_key(url: str) -> str:
    """A URL for comparison: lowercase scheme and host, no fragment, no default port,
    no trailing slash (except the root)."""
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").rstrip(".")
        port = parts.port
    except ValueError:
        return url.strip()
    scheme = parts.scheme.lower()
    if port is not None and {"http": 80, "https": 443}.get(scheme) != port:
        host = f"{host}:{port}"
    path = parts.path.rstrip("/") or "/"
    return urlunsplit((scheme, host, path, parts.query, ""))


def visited_pages(record: EpisodeRecord) -> dict[str, str]:
    """Text of every page the episode landed on, keyed by :func:`url_key`; a page visited
    twice holds both texts. The requested URL and the landing URL (after redirects) both count."""
    pages: dict[str, str] = {}
    for step in record.steps:
        if not step.ran_tool:
            continue
        text = step.page_text or ""
        urls = {step.url, step.args.get("url") if step.url else None} - {None}
        for url in urls:
            key = url_key(str(url))
            pages[key] = f"{pages[key]}\n{text}" if key in pages else text
    return pages


def citation_support(
    cited: list[str], record: EpisodeRecord, quotes: list[str]
) -> tuple[int, int, int]:
    """(cited, supported, unvisited): the distinct cited pages (compared by :func:`url_key`),
    those the episode visited whose recorded text holds an evidence quote (any visited
    page counts when the task has no quotes), and those it never visited."""
    pages = visited_pages(record)
    keys = list(dict.fromkeys(url_key(url) for url in cited))
    supported = unvisited = 0
    for key in keys:
        text = pages.get(key)
        if text is None:
            unvisited += 1
        elif not quotes or any(contains(text, q) for q in quotes):
            supported += 1
    return len(keys), supported, unvisited
