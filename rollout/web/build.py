"""Building the local web once, and reusing the build from a cache on later starts.

The build (world, pages, Python docs, search index) is a pure function of the
data packages' versions, the documentation's files and this package's source,
so it is cached under a key of all three: a changed input is a new key, never a
stale page. A cache file that cannot be read is rebuilt, not trusted. Each build is
~180 MB, and every change to this package's source makes a new one: after writing a
build, :func:`prune` keeps the :data:`KEEP_BUILDS` newest and removes the rest (and
temporary files a killed writer left behind).
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
KEEP_BUILDS = 2  # the new build and the one before it (another branch or checkout's)
STALE_TMP_S = 3600.0  # a temporary file this old is a killed writer's


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
    prune(path.parent, keep=KEEP_BUILDS, current=path)
    return web


def prune(cache_dir: Path, keep: int = KEEP_BUILDS, current: Path | None = None) -> list[Path]:
    """Remove all but the ``keep`` newest builds (``web-*.pkl`` by modification time;
    ``current`` is always kept) and temporary files older than :data:`STALE_TMP_S`;
    the paths removed. A process still reading a removed build keeps its open file (a
    removed file lives until closed); one about to open it finds none and rebuilds."""
    removed: list[Path] = []
    builds = []
    for f in cache_dir.glob("web-*.pkl"):
        try:
            builds.append((f.stat().st_mtime, f))
        except FileNotFoundError:  # another process pruned it meanwhile
            continue
    builds.sort(reverse=True)
    kept = {current} if current is not None else set()
    for _, f in builds:
        if len(kept) < max(keep, 1) or f in kept:
            kept.add(f)
            continue
        removed.append(f)
    now = time.time()
    for f in cache_dir.glob("web-*.tmp*"):
        try:
            if now - f.stat().st_mtime > STALE_TMP_S:
                removed.append(f)
        except FileNotFoundError:
            continue
    for f in removed:
        f.unlink(missing_ok=True)
    if removed:
        _log(
            f"removed {len(removed)} old file(s) from {cache_dir}: {', '.join(f.name for f in removed)}"
        )
    return removed
