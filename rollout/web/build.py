"""Building the local web once, and reusing the build from a cache on later starts.

The build (world, pages, Python docs, search index) is a pure function of the
data packages' versions, the documentation's files and this package's source,
so it is cached under a key of all three: a changed input is a new key, never a
stale page. A cache file that cannot be read is rebuilt, not trusted.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rollout.web import pydocs
from rollout.web.data import World, data_fingerprint
from rollout.web.search import SearchIndex
from rollout.web.site import Page, Site

_SOURCE_DIR = Path(__file__).resolve().parent


@dataclass
class LocalWeb:
    world: World
    site: Site
    docs: dict[str, Page]  # URL path -> page (text only; served from disk)
    index: SearchIndex
    doc_entries: list[pydocs.DocEntry]
    key: str

    def page(self, path: str) -> Page | None:
        return self.site.pages.get(path) or self.docs.get(path)


def cache_key(docs_root: Path = pydocs.DOCS_ROOT) -> str:
    """The build's inputs, hashed without loading them (a world takes seconds to load):
    the data packages' versions, this package's source (``data.py``, what makes a world
    of them, included) and the documentation's file names and sizes."""
    h = hashlib.sha256(data_fingerprint().encode())
    for f in sorted(_SOURCE_DIR.glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    for f in sorted(docs_root.rglob("*.html")):
        h.update(f"{f.relative_to(docs_root)}:{f.stat().st_size}".encode())
    return h.hexdigest()[:20]


def _log(msg: str) -> None:
    print(f"[web] {msg}", file=sys.stderr, flush=True)


def build(world: World | None = None, key: str = "") -> LocalWeb:
    t0 = time.monotonic()
    world = world or World()
    _log(
        f"world: {len(world.countries)} countries, {len(world.cities):,} cities, "
        f"{len(world.airports):,} airports, {len(world.elements)} elements"
    )
    site = Site(world)
    _log(f"rendered {len(site.pages):,} pages ({time.monotonic() - t0:.1f} s)")
    docs = {p.path: p for p in pydocs.load_pages()}
    entries = pydocs.added_entries()
    index = SearchIndex([*site.pages.values(), *docs.values()])
    _log(f"indexed {len(index):,} pages ({time.monotonic() - t0:.1f} s)")
    return LocalWeb(world, site, docs, index, entries, key)


def load(cache_dir: str | Path | None) -> LocalWeb:
    """The local web, from ``cache_dir`` when a build for the same inputs is there (the
    world is loaded from its data packages only when the web is built)."""
    key = cache_key()
    if cache_dir is None:
        return build(key=key)
    path = Path(cache_dir) / f"web-{key}.pkl"
    if path.is_file():
        t0 = time.monotonic()
        try:
            with path.open("rb") as fh:
                web = pickle.load(fh)
            if isinstance(web, LocalWeb) and web.key == key:
                _log(f"loaded the cached build {path} ({time.monotonic() - t0:.1f} s)")
                return web
        except Exception as e:  # a torn or foreign file: rebuild rather than trust it
            _log(f"ignoring unreadable cache {path}: {type(e).__name__}: {e}")
    web = build(key=key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as fh:
        pickle.dump(web, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one
    return web
