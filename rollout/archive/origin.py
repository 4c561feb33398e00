"""The local web's origin in an archive: recorded with it, taken out of its lookup keys,
and rewritten to the replaying run's origin.

Each invocation starts the local web on a free port, so a recording made at
``http://127.0.0.1:38931`` is replayed by a run whose web is at ``http://127.0.0.1:39153``.
The recorded bytes are kept as they were seen (the WARC stays a faithful record, and
standard tools read the real URLs): each file names its writer's web origin in its
warcinfo record (``web-origin``). Replay then does two things with it, and only for
that one origin (other hosts are compared and served verbatim):

- Keys: the origin, wherever it occurs in a request's URL or body (bare, after a scheme,
  or percent-encoded as in ``?next=http%3A%2F%2F127.0.0.1%3A38931%2F``), is replaced by
  one placeholder before hashing (:func:`canonical`), both when the index is built
  (with each file's recorded origin) and on lookup (with the replaying run's), so
  ``GET {new}/airports/CDG`` finds what ``GET {old}/airports/CDG`` recorded.
- Answers: the recorded origin in the exchange's URL, headers and bodies (search results'
  URLs, absolute links, ``Location``, CORS headers) is rewritten to the replaying run's
  (:class:`Rewrite`), so the agent's next request, built from what it was shown, is at
  the new origin too, and is both allowed and found.

Rewriting on replay rather than storing a placeholder was chosen so that nothing in
the files is invented: they are what the server sent, an export of one episode is a
valid record of it, and an archive recorded before origins were stored still replays
at its own address.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

PLACEHOLDER = "\x00web\x00"  # what the origin becomes in a key (never in a real URL)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lowercased, the default port dropped."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host += f":{port}"
    return f"{scheme}://{host}"


@functools.lru_cache(maxsize=64)
def _pattern(origin: str, as_bytes: bool) -> re.Pattern:
    """The origin's authority, bare or after its scheme, plain or percent-encoded, not
    inside a longer name (``127.0.0.1:3893`` does not match in ``127.0.0.1:38931``)."""
    scheme, _, netloc = origin.partition("://")
    host, port = netloc, ""
    if not netloc.endswith("]") and ":" in netloc:
        host, port = netloc.rsplit(":", 1)
    colon = r"(?P<colon>:|%3A)" + re.escape(port) if port else ""
    tail = r"(?![\w-]|\.\w)" if port else r"(?![\w-]|\.\w|:\d|%3A\d)"
    text = (
        rf"(?:(?<![\w.-])|(?<=%2F))(?:{re.escape(scheme)}(?P<sep>://|%3A%2F%2F))?"
        rf"{re.escape(host)}{colon}{tail}"
    )
    return re.compile(text.encode() if as_bytes else text, re.IGNORECASE | re.ASCII)


def canonical(text: str, origins: Iterable[str]) -> str:
    """``text`` with every occurrence of each origin replaced by :data:`PLACEHOLDER`."""
    for origin in origins:
        if origin:
            text = _pattern(origin, False).sub(PLACEHOLDER, text)
    return text


def canonical_bytes(data: bytes, origins: Iterable[str]) -> bytes:
    """:func:`canonical` for a request body."""
    for origin in origins:
        if origin and data:
            data = _pattern(origin, True).sub(PLACEHOLDER.encode(), data)
    return data


class Rewrite:
    """Replaces one origin by another in text and bytes, keeping each occurrence's form:
    bare, after the scheme, or percent-encoded."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new
        scheme, _, netloc = new.partition("://")
        self._scheme = scheme
        self._host, self._port = netloc, ""
        if not netloc.endswith("]") and ":" in netloc:
            self._host, self._port = netloc.rsplit(":", 1)

    def _replace(self, m: re.Match) -> str:
        sep, colon = m.group("sep"), m.groupdict().get("colon")
        if isinstance(sep, bytes):
            sep = sep.decode()
        if isinstance(colon, bytes):
            colon = colon.decode()
        encoded = (sep or colon or ":").startswith("%")
        out = ""
        if sep:
            out = self._scheme + ("%3A%2F%2F" if encoded else "://")
        out += self._host
        if self._port:
            out += ("%3A" if encoded else ":") + self._port
        return out

    def text(self, text: str) -> str:
        return _pattern(self.old, False).sub(self._replace, text)

    def bytes(self, data: bytes) -> bytes:
        if not data:
            return data
        return _pattern(self.old, True).sub(lambda m: self._replace(m).encode(), data)

    def headers(self, headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        return tuple((name, self.text(value)) for name, value in headers)
