"""The Python 3.11 documentation, a real pre-existing site served as it is.

It comes from Debian's ``python3.11-doc`` package; pages are served from disk
under ``/docs/`` unchanged. This module lists its pages for the search index
and finds the API entries whose documentation says in which version they were
added (for the task generator).
"""

from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass
from pathlib import Path

from rollout.web.site import Page
from rollout.web.text import visible_text

DOCS_ROOT = Path("/usr/share/doc/python3.11/html")
# Index pages that list every name would match every query: served, not indexed.
_NOT_INDEXED = re.compile(r"^(genindex.*|search|py-modindex)\.html$")
_TITLE = re.compile(r"<title>(.*?)</title>", re.S | re.I)
_ENTRY = re.compile(r'<dt class="sig sig-object py" id="([A-Za-z_][\w.]*)">')
_ADDED = re.compile(r'<span class="versionmodified added">New in version (\d+\.\d+)')


@dataclass(frozen=True)
class DocEntry:
    qualname: str  # e.g. "os.fspath"
    path: str  # URL path of its page, e.g. "/docs/library/os.html"
    added: str  # "3.6"


def docs_available(root: Path = DOCS_ROOT) -> bool:
    return (root / "index.html").is_file()


def load_pages(root: Path = DOCS_ROOT) -> list[Page]:
    """Every HTML page of the documentation, in path order, with its visible text."""
    if not docs_available(root):
        raise RuntimeError(
            f"the Python documentation is not at {root}: install Debian's python3.11-doc "
            "(`make setup` does)"
        )
    pages = []
    for f in sorted(root.rglob("*.html")):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(("_static/", "_sources/", "_images/", "_downloads/")):
            continue
        raw = f.read_text(encoding="utf-8", errors="replace")
        m = _TITLE.search(raw)
        title = " ".join(_html.unescape(m.group(1)).split()) if m else rel
        text, main = visible_text(raw)
        indexed = not _NOT_INDEXED.match(Path(rel).name)
        pages.append(Page(f"/docs/{rel}", title, "docs", "", text, main, indexed))
    return pages


def added_entries(root: Path = DOCS_ROOT) -> list[DocEntry]:
    """API entries documented with exactly one "New in version X.Y", unique by name."""
    found: dict[str, list[DocEntry]] = {}
    for f in sorted((root / "library").glob("*.html")):
        raw = f.read_text(encoding="utf-8", errors="replace")
        marks = list(_ENTRY.finditer(raw))
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(raw)
            versions = _ADDED.findall(raw, m.end(), end)
            if len(versions) == 1:
                path = "/docs/" + f.relative_to(root).as_posix()
                found.setdefault(m.group(1), []).append(DocEntry(m.group(1), path, versions[0]))
    return [v[0] for k, v in sorted(found.items()) if len(v) == 1]
