"""Where each exchange of an archive lies, so that opening one reads no body.

Two kinds of index, both rebuilt from the WARC files whenever they disagree with them
(the WARC files are the record; an index is only ever a cache of where things are):

- Per file, ``<name>.warc.gz.idx``, appended by the :class:`~rollout.archive.store.ArchiveWriter`
  beside each WARC file, after each exchange it writes: a header naming the file's web
  origin and the digest of its warcinfo record (so a different file under the same name
  is not trusted), then one fixed 40-byte entry per exchange (key, episode, offset,
  the two members' lengths). Entries are contiguous from the warcinfo on; an entry that
  does not follow the previous one or ends past the file's end ends what is trusted,
  and the rest of the file is scanned (:func:`rollout.archive.format.scan`), so an
  exchange whose entry a kill cut off, a torn tail or appended garbage read as before.
  Corruption inside an indexed stretch is found when that exchange is read.
- Per directory, ``archive.index``: every exchange's location sorted by key, with a
  header listing the WARC files and the sizes it covers. Opening an archive whose files
  have those sizes maps this file (``mmap``) and reads nothing else: lookups are a
  binary search over the contiguous key column, touching a few pages. Otherwise it is
  built from the per-file indexes (scanning only what they do not cover), written
  (atomically, if the directory is writable) and mapped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollout.archive.format import (
    Loc,
    Record,
    Scanned,
    episode_hash,
    request_key,
    scan,
    to_exchange,
)

FILE_MAGIC = b"rollout.archive file index 1\n"
DIR_MAGIC = b"rollout.archive index 1\n"
DIR_INDEX = "archive.index"
ENTRY = struct.Struct("<16sQQII")  # key, episode, response offset, response and request lengths
_ENTRY = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("ep", "<u8"), ("off", "<u8"), ("rlen", "<u4"), ("qlen", "<u4")])  # fmt: skip
ROW = np.dtype([
    ("lo", "<u8"), ("ep", "<u8"), ("file", "<u4"), ("r_off", "<u8"), ("r_len", "<u4"),
    ("r_in", "<u4"), ("q_file", "<u4"), ("q_off", "<u8"), ("q_len", "<u4"), ("q_in", "<u4"),
])  # fmt: skip


def file_index_path(warc: Path) -> Path:
    return warc.with_name(warc.name + ".idx")


def file_index_header(origin: str | None, info: bytes) -> bytes:
    """The per-file index's header, for a WARC file that starts with the member ``info``;
    padded to 8 bytes so the entries are aligned."""
    meta = {"origin": origin, "start": len(info), "warcinfo": hashlib.sha256(info).hexdigest()}
    head = FILE_MAGIC + json.dumps(meta).encode()
    return head + b" " * (-(len(head) + 1) % 8) + b"\n"


def file_index_entry(key: bytes, episode: str, offset: int, rlen: int, qlen: int) -> bytes:
    return ENTRY.pack(key, episode_hash(episode), offset, rlen, qlen)


def _read_head(data: bytes | mmap.mmap, magic: bytes) -> tuple[dict, int] | None:
    """The JSON header after ``magic`` and the offset after it."""
    if data[: len(magic)] != magic:
        return None
    end = data.find(b"\n", len(magic))
    if end < 0:
        return None
    try:
        return json.loads(data[len(magic) : end]), end + 1
    except ValueError:
        return None


def _covered(warc: Path, size: int) -> tuple[np.ndarray, int, str | None] | None:
    """The trusted entries of ``warc``'s own index, the offset where they stop covering
    it, and its origin; None when it has no index to trust."""
    try:
        data = file_index_path(warc).read_bytes()
    except OSError:
        return None
    head = _read_head(data, FILE_MAGIC)
    if head is None:
        return None
    meta, at = head
    start = int(meta.get("start", -1))
    with warc.open("rb") as f:
        info = f.read(start) if 0 < start <= size else b""
    if not info or hashlib.sha256(info).hexdigest() != meta.get("warcinfo"):
        return None
    entries = np.frombuffer(data, _ENTRY, count=(len(data) - at) // _ENTRY.itemsize, offset=at)
    ends = entries["off"] + entries["rlen"] + entries["qlen"]
    starts = np.concatenate((np.array([start], np.uint64), ends[:-1]))
    bad = np.flatnonzero((entries["off"] != starts) | (ends > size))
    n = int(bad[0]) if len(bad) else len(entries)
    return entries[:n], int(ends[n - 1]) if n else start, meta.get("origin")


@dataclass(frozen=True)
class FileMeta:
    name: str  # relative to the archive's root
    size: int  # bytes indexed
    origin: str | None  # the local web's origin its warcinfo names


class _Pairing:
    """Request and response records scanned, paired by WARC-Concurrent-To (either way)
    as they come; each pair becomes a row."""

    def __init__(self, scans: list[Scanned]):
        self.scans = scans  # per file number: its origin
        self.rows: list[tuple] = []
        self.torn = 0
        self._waiting: dict[str, tuple[Loc, Record]] = {}  # by record id
        self._named: dict[str, str] = {}  # concurrent-to -> id of the record naming it

    def add(self, loc: Loc, rec: Record) -> None:
        other_id = (
            rec.concurrent if rec.concurrent in self._waiting else self._named.get(rec.rec_id)
        )
        other = self._waiting.get(other_id) if other_id else None
        if other is None or other[1].rec_type == rec.rec_type:
            self._waiting[rec.rec_id] = (loc, rec)
            if rec.concurrent:
                self._named[rec.concurrent] = rec.rec_id
            return
        del self._waiting[other_id]
        self._named.pop(other[1].concurrent, None)
        (r_loc, resp), (q_loc, req) = (loc, rec), other
        if rec.rec_type == "request":
            (r_loc, resp), (q_loc, req) = other, (loc, rec)
        ex = to_exchange(resp, req)
        if ex is None:
            self.torn += 2
            return
        origin = self.scans[r_loc.file].origin
        key = request_key(ex.method, ex.url, ex.request_body, (origin,) if origin else ())
        hi, lo = struct.unpack("<QQ", key)
        self.rows.append((hi, lo, episode_hash(ex.episode), r_loc.file, r_loc.offset, r_loc.length, r_loc.inner, q_loc.file, q_loc.offset, q_loc.length, q_loc.inner))  # fmt: skip

    def unpaired(self) -> int:
        return len(self._waiting)


class Index:
    """Every exchange's key and location, sorted by key (then recorded order)."""

    def __init__(self, keys: np.ndarray, rows: np.ndarray, files: list[FileMeta], torn: int, buf=None):  # fmt: skip
        self.keys, self.rows, self.files, self.torn = keys, rows, files, torn
        self._buf = buf  # the mapped index file, kept open while the arrays view it

    def __len__(self) -> int:
        return len(self.keys)

    def rows_for(self, key: bytes) -> np.ndarray:
        """The rows of one key, in recorded order."""
        hi, lo = struct.unpack("<QQ", key)
        hi = np.uint64(hi)
        a, b = np.searchsorted(self.keys, hi, "left"), np.searchsorted(self.keys, hi, "right")
        rows = self.rows[a:b]
        return rows[rows["lo"] == np.uint64(lo)]

    def recorded_order(self) -> np.ndarray:
        """Row numbers in the order the exchanges were recorded."""
        r = self.rows
        return np.lexsort((r["r_in"], r["r_off"], r["file"]))


def build(root: Path, paths: list[Path]) -> Index:
    """The index of ``paths`` (under ``root``) from their own indexes and what they miss."""
    metas, chunks, scans, torn = [], [], [], 0
    pairing = _Pairing(scans)
    for file_no, path in enumerate(paths):
        size = path.stat().st_size
        covered = _covered(path, size)
        entries, tail, origin = covered if covered is not None else (None, 0, None)
        if entries is not None and len(entries):
            chunks.append(_columns_of(entries, file_no))
        found = Scanned(origin)  # the origin, from the file's index or else its warcinfo
        scans.append(found)
        for loc, rec in scan(path, file_no, found, tail, size):
            pairing.add(loc, rec)
        metas.append(FileMeta(_relative(root, path), size, found.origin))
        torn += found.torn
    torn += pairing.torn + pairing.unpaired()
    if pairing.rows:
        scanned = np.array(pairing.rows, dtype=[("hi", "<u8"), *ROW.descr])
        chunks.append({name: scanned[name] for name in scanned.dtype.names})
    if not chunks:
        return Index(np.empty(0, "<u8"), np.empty(0, ROW), metas, torn)
    cols = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
    position = (cols["file"].astype(np.uint64) << np.uint64(40)) | cols["r_off"]
    if len(position) > 1 and not np.all(position[1:] > position[:-1]):  # scanned rows last
        recorded = np.lexsort((cols["r_in"], cols["r_off"], cols["file"]))
        cols = {name: col[recorded] for name, col in cols.items()}
    # by key, recorded order kept among equal keys; only the first 8 bytes are sorted on
    # (lookups compare the rest in the few rows those select)
    order = np.argsort(cols["hi"], kind="stable")
    rows = np.empty(len(order), ROW)
    for name in ROW.names:
        rows[name] = cols[name][order]
    return Index(cols["hi"][order], rows, metas, torn)


def _columns_of(entries: np.ndarray, file_no: int) -> dict[str, np.ndarray]:
    """Row columns for a file's own index entries (a response and its request, back to
    back, each a gzip member of one record)."""
    n, off = len(entries), entries["off"]
    file, zero = np.full(n, file_no, np.uint32), np.zeros(n, np.uint32)
    return {
        "hi": entries["hi"], "lo": entries["lo"], "ep": entries["ep"], "file": file,
        "r_off": off, "r_len": entries["rlen"], "r_in": zero, "q_file": file,
        "q_off": off + entries["rlen"], "q_len": entries["qlen"], "q_in": zero,
    }  # fmt: skip


def _relative(root: Path, path: Path) -> str:
    return str(path.relative_to(root)) if root.is_dir() else path.name


def _fingerprint(root: Path, paths: list[Path]) -> list[list]:
    return [[_relative(root, p), p.stat().st_size] for p in paths]


def save(index: Index, path: Path) -> None:
    """Write the directory index atomically (a new file renamed over the old)."""
    meta = {
        "n": len(index),
        "torn": index.torn,
        "files": [[m.name, m.size, m.origin] for m in index.files],
    }
    head = DIR_MAGIC + json.dumps(meta).encode()
    head += b" " * (-(len(head) + 1) % 8) + b"\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(head)
            f.write(memoryview(np.ascontiguousarray(index.keys)))
            f.write(memoryview(np.ascontiguousarray(index.rows)).cast("B"))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def load(path: Path, root: Path, paths: list[Path]) -> Index | None:
    """The directory index at ``path``, mapped, if it covers exactly ``paths`` as they are."""
    try:
        with path.open("rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # missing, or empty
        return None
    head = _read_head(buf, DIR_MAGIC)
    if head is None:
        buf.close()
        return None
    meta, at = head
    files = [FileMeta(name, size, origin) for name, size, origin in meta.get("files", [])]
    n = int(meta.get("n", -1))
    if [[m.name, m.size] for m in files] != _fingerprint(root, paths) or len(buf) != at + n * (8 + ROW.itemsize):  # fmt: skip
        buf.close()
        return None
    with contextlib.suppress(AttributeError, OSError):  # lookups jump: read no pages ahead
        buf.madvise(mmap.MADV_RANDOM)
    keys = np.frombuffer(buf, "<u8", count=n, offset=at)
    rows = np.frombuffer(buf, ROW, count=n, offset=at + 8 * n)
    return Index(keys, rows, files, int(meta.get("torn", 0)), buf)


def open_index(root: Path, paths: list[Path]) -> Index:
    """The index of ``paths``: the directory's, when it is current; else built, and saved
    for the next opening when ``root`` is a writable directory."""
    if not root.is_dir():
        return build(root, paths)
    path = root / DIR_INDEX
    index = load(path, root, paths)
    if index is not None:
        return index
    index = build(root, paths)
    try:
        save(index, path)
    except OSError:  # a read-only archive: this process keeps the index in memory
        return index
    return load(path, root, paths) or index
