"""The web an episode saw, recorded as WARC and replayed from it with the network off.

Every response an episode receives (search answers, page fetches, a browser's requests) is
an :class:`Exchange`. An :class:`ArchiveWriter` appends each one to a WARC 1.1 file of its
own in a directory, as a response record and a request record naming it
(``WARC-Concurrent-To``), each its own gzip member and written before ``write`` returns, so
a process killed at any point loses at most the exchange it was writing
(:mod:`rollout.archive.format`). :class:`Archive` answers requests in the order they were
recorded from an index of where each exchange lies (:mod:`rollout.archive.index`): opening
one reads no body, and a lookup reads only the exchange it returns; torn stretches are
skipped and counted.

A run's local web listens on a new port each time; the writer records its origin, and an
archive opened with the replaying run's origin answers requests at that origin with what
was recorded at the old one, the old origin in what it returns rewritten to the new
(:mod:`rollout.archive.origin` says why and how).

``python -m rollout.archive inspect DIR`` summarises an archive; ``export DIR EPISODE
OUT.warc.gz`` writes one episode's exchanges (and the shared ones) to a single WARC file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from rollout.archive.format import (
    KINDS,
    ORIGINAL,
    Exchange,
    Loc,
    Record,
    archived_headers,
    encode_exchange,
    encode_pair,
    episode_hash,
    inflate,
    normalise_url,
    read_record,
    request_key,
    to_exchange,
    warcinfo,
)
from rollout.archive.index import (
    file_index_entry,
    file_index_header,
    file_index_path,
    open_index,
)
from rollout.archive.origin import Rewrite, origin_of

__all__ = [
    "KINDS", "ORIGINAL", "Archive", "ArchiveWriter", "Exchange", "archived_headers",
    "encode_exchange", "export_episode", "main", "normalise_url", "summary",
]  # fmt: skip


# ----------------------------------------------------------------------------- writing


class ArchiveWriter:
    """Appends exchanges to WARC files of its own in ``directory``.

    Each writer (and each process it is forked into) writes files no one else does,
    ``archive-<pid>-<seq>.warc.gz`` created exclusively, so any number of processes can
    record into one directory; beside each, ``<file>.idx`` says where each exchange lies.
    A file is closed once it passes ``max_bytes`` and the next one is started.
    Thread-safe. ``fsync`` also survives a power loss, not only a kill. ``origin`` is the
    local web's (``http://127.0.0.1:PORT``), named in each file's warcinfo record so that
    a replay at another address can map it.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 256 << 20,
        fsync: bool = False,
        origin: str | None = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.origin = origin_of(origin) if origin else None
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._index_fd: int | None = None
        self._pid = os.getpid()  # the process that opened self._fd
        self._seq = 0
        self._size = 0  # bytes in the current file
        self._bytes = 0
        self._files: list[Path] = []
        self._closed = False

    @property
    def bytes_written(self) -> int:
        """Bytes written to all WARC files so far (compressed, as on disk)."""
        return self._bytes

    @property
    def files(self) -> list[Path]:
        """The WARC files this writer created, in order."""
        return list(self._files)

    def write(self, ex: Exchange) -> None:
        """Append one exchange; on return it is in the file (in the OS, not a buffer)."""
        response, request = encode_pair(ex)
        key = request_key(ex.method, ex.url, ex.request_body, (self.origin,) if self.origin else ())
        with self._lock:
            if self._closed:
                raise ValueError("write to a closed ArchiveWriter")
            if self._fd is None or self._pid != os.getpid():
                self._open()
            offset = self._size
            self._write_all(response + request)
            entry = file_index_entry(key, ex.episode, offset, len(response), len(request))
            self._write_index(entry)
            if self._size >= self.max_bytes:
                self._close_file()

    def close(self) -> None:
        """Close the current file; further writes raise."""
        with self._lock:
            self._closed = True
            self._close_file()

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if self._fd is not None:  # forked: the parent keeps writing to its file, not us
            os.close(self._fd)
            if self._index_fd is not None:
                os.close(self._index_fd)
            self._pid, self._seq = os.getpid(), 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        while True:
            path = self.directory / f"archive-{self._pid}-{self._seq:05d}.warc.gz"
            self._seq += 1
            try:
                self._fd = os.open(path, flags, 0o644)
                break
            except FileExistsError:  # an earlier process with this pid, or another writer
                continue
        self._size = 0
        self._files.append(path)
        info = warcinfo(path.name, self.origin)
        self._write_all(info)
        try:  # the file's name is ours, so is its index's: one left by a removed file goes
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self._index_fd = os.open(file_index_path(path), flags, 0o644)
        except OSError:  # no index: the file is scanned when the archive is opened
            self._index_fd = None
        self._write_index(file_index_header(self.origin, info))

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        _write_fd(self._fd, data, self.fsync)
        self._size += len(data)
        self._bytes += len(data)

    def _write_index(self, data: bytes) -> None:
        if self._index_fd is not None:
            _write_fd(self._index_fd, data, self.fsync)

    def _close_file(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
            if self._index_fd is not None:
                os.close(self._index_fd)
        self._fd = self._index_fd = None


def _write_fd(fd: int, data: bytes, fsync: bool) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    if fsync:
        os.fsync(fd)


# ----------------------------------------------------------------------------- reading


def _natural(path: Path) -> list[Any]:
    """Sort key in which archive-7-00010 follows archive-7-00009 whatever the digits."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(path))]


class _Files:
    """Open file descriptors of an archive's files, by number, closed together."""

    def __init__(self, paths: list[Path]):
        self.paths, self._fds = paths, {}

    def read(self, loc: Loc, extra: int = 0) -> bytes:
        fd = self._fds.get(loc.file)
        if fd is None:
            fd = self._fds[loc.file] = os.open(self.paths[loc.file], os.O_RDONLY)
        return os.pread(fd, loc.length + extra, loc.offset)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class Archive:
    """A replayable archive: every readable exchange of every *.warc.gz (and .warc) file
    under a directory, answered in the order they were recorded.

    ``origin``, the replaying run's local web: requests at it match what was recorded at
    each file's own web origin, and what comes back says ``origin`` where the recording
    said its own. None: requests match at the recorded origins, answers as recorded."""

    def __init__(self, index, files: list[Path], origin: str | None = None):
        self.files = files  # the files read, in reading order
        self.origin = origin_of(origin) if origin else None
        self._index = index
        recorded = [m.origin for m in index.files]
        self.origins = sorted({o for o in recorded if o})  # the web origins recorded
        self._match = (self.origin,) if self.origin else tuple(self.origins)
        self._unmarked = any(o is None for o in recorded)  # files recorded without an origin
        self._rewrite = {
            i: Rewrite(o, self.origin)
            for i, o in enumerate(recorded)
            if o and self.origin and o != self.origin
        }
        self._unreadable: set[tuple[int, int, int]] = set()
        self._cursors: dict[tuple[str, bytes], int] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: str | Path, *, origin: str | None = None) -> Archive:
        """Index every WARC file under ``directory`` (or that one file): from the saved
        index when it is current, else from the files' own indexes and what they miss.
        Never raises on a torn or corrupt file, which is skipped and counted in
        :attr:`torn`."""
        root = Path(directory)
        if not root.exists():
            raise FileNotFoundError(f"no archive at {root}")
        if root.is_file():
            paths = [root]
        else:
            paths = sorted(
                (p for p in root.rglob("*.warc*") if p.name.endswith((".warc", ".warc.gz"))),
                key=_natural,
            )
        return cls(open_index(root, paths), paths, origin)

    @property
    def torn(self) -> int:
        """Torn stretches of files and records without their pair, skipped; and exchanges
        found unreadable when read (corrupted inside an indexed stretch)."""
        return self._index.torn + len(self._unreadable)

    def lookup(
        self, method: str, url: str, body: bytes = b"", *, episode: str = ""
    ) -> Exchange | None:
        """The response recorded for this request: the episode's next unused one for it in
        recorded order, else (shared resources) the last one any episode recorded; None
        when it was never recorded."""
        key = request_key(method, url, body, self._match)
        rows = self._index.rows_for(key)
        if not len(rows) and self._unmarked and self._match:
            key = request_key(method, url, body)  # as a file without an origin keys it
            rows = self._index.rows_for(key)
        if not len(rows):
            return None
        with self._lock:
            mine = np.flatnonzero(rows["ep"] == np.uint64(episode_hash(episode)))
            used = self._cursors.get((episode, key), 0)
            if used < len(mine):
                self._cursors[episode, key] = used + 1
                row = rows[mine[used]]
            else:
                row = rows[-1]
        files = _Files(self.files)
        try:
            return self._read(row, files)
        finally:
            files.close()

    def reset_cursors(self) -> None:
        """Forget which responses were used: the next lookups start from the first again."""
        with self._lock:
            self._cursors.clear()

    def __len__(self) -> int:
        return len(self._index)

    def episodes(self) -> list[str]:
        """Every episode that recorded something, sorted ("" for shared exchanges)."""
        return sorted({ex.episode for ex in self.exchanges()})

    def exchanges(self, episode: str | None = None) -> Iterator[Exchange]:
        """The exchanges in recorded order: all, or one episode's."""
        rows = self._index.rows
        order = self._index.recorded_order()
        if episode is not None:
            order = order[rows["ep"][order] == np.uint64(episode_hash(episode))]
        files = _Files(self.files)
        try:
            for i in order:
                ex = self._read(rows[i], files)
                if ex is not None and (episode is None or ex.episode == episode):
                    yield ex
        finally:
            files.close()

    @property
    def bytes(self) -> int:
        """The archive's files' size on disk."""
        return sum(p.stat().st_size for p in self.files if p.exists())

    def _read(self, row: np.void, files: _Files) -> Exchange | None:
        r = Loc(int(row["file"]), int(row["r_off"]), int(row["r_len"]), int(row["r_in"]))
        q = Loc(int(row["q_file"]), int(row["q_off"]), int(row["q_len"]), int(row["q_in"]))
        ex = _read_pair(files, r, q)
        if ex is None:
            with self._lock:
                self._unreadable.add((r.file, r.offset, r.inner))
            return None
        rewrite = self._rewrite.get(r.file)
        if rewrite is None:
            return ex
        return dataclasses.replace(
            ex, url=rewrite.text(ex.url), request_headers=rewrite.headers(ex.request_headers),
            request_body=rewrite.bytes(ex.request_body),
            response_headers=rewrite.headers(ex.response_headers),
            response_body=rewrite.bytes(ex.response_body),
        )  # fmt: skip


def _read_pair(files: _Files, r: Loc, q: Loc) -> Exchange | None:
    """The exchange whose response and request records lie at ``r`` and ``q``."""
    adjacent = q.file == r.file and q.offset == r.offset + r.length
    data = files.read(r, q.length if adjacent else 0)
    resp_data, req_data = data[: r.length], data[r.length :] if adjacent else files.read(q)
    resp = _read_at(files, r, resp_data)
    req = _read_at(files, q, req_data)
    if resp is None or req is None or resp.rec_type != "response" or req.rec_type != "request":
        return None
    return to_exchange(resp, req)


def _read_at(files: _Files, loc: Loc, data: bytes) -> Record | None:
    """The record at ``loc`` from its bytes ``data`` (a gzip member, unless the file is an
    uncompressed .warc); None if they are not whole."""
    if len(data) != loc.length:
        return None
    if not files.paths[loc.file].name.endswith(".warc"):
        member = inflate(data)
        if member is None:
            return None
        data = member[0]
    return read_record(data, loc.inner)


# ----------------------------------------------------------------------------- export, CLI


def export_episode(archive: Archive, episode: str, out: str | Path) -> int:
    """Write ``episode``'s exchanges and the shared ones ("") to one WARC file, in recorded
    order, with their recorded dates; the number written. The file names the web origin
    its exchanges say (the archive's ``origin``, or the one it recorded)."""
    path, n = Path(out), 0
    origins = [archive.origin] if archive.origin else archive.origins
    with path.open("wb") as f:
        f.write(warcinfo(path.name, origins[0] if len(origins) == 1 else None))
        for ex in archive.exchanges():
            if ex.episode in (episode, ""):
                f.write(encode_exchange(ex))
                n += 1
    return n


def summary(archive: Archive, *, urls: bool = False) -> dict[str, Any]:
    """What the archive holds: files, exchanges, torn records, bytes, hosts, episodes."""
    hosts: dict[str, dict[str, int]] = defaultdict(lambda: {"exchanges": 0, "bytes": 0})
    episodes: dict[str, int] = defaultdict(int)
    for ex in archive.exchanges():
        host = hosts[urlsplit(ex.url).hostname or ""]
        host["exchanges"] += 1
        host["bytes"] += len(ex.response_body)
        episodes[ex.episode] += 1
    out: dict[str, Any] = {
        "files": [{"path": str(p), "bytes": p.stat().st_size} for p in archive.files],
        "exchanges": len(archive),
        "torn": archive.torn,
        "bytes": archive.bytes,
        "hosts": dict(sorted(hosts.items(), key=lambda kv: -kv[1]["exchanges"])),
        "episodes": dict(sorted(episodes.items())),
    }
    if urls:
        out["urls"] = [
            {
                "method": ex.method,
                "url": ex.url,
                "status": ex.status,
                "bytes": len(ex.response_body),
                "episode": ex.episode,
            }
            for ex in archive.exchanges()
        ]
    return out


def _print_summary(s: dict[str, Any]) -> None:
    print(
        f"{len(s['files'])} files, {s['exchanges']} exchanges, {s['torn']} torn, {s['bytes']} bytes"
    )
    print("hosts:")
    for host, h in s["hosts"].items():
        print(f"  {h['exchanges']:>7} {h['bytes']:>12}  {host or '(none)'}")
    print("episodes:")
    for episode, n in s["episodes"].items():
        print(f"  {n:>7}  {episode or '(shared)'}")
    for u in s.get("urls", []):
        print(f"{u['status']} {u['bytes']:>10} {u['method']} {u['url']}  {u['episode']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rollout.archive", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="what an archive holds")
    inspect.add_argument("directory")
    inspect.add_argument("--json", action="store_true", help="as one JSON object")
    inspect.add_argument("--urls", action="store_true", help="every URL with status and size")
    export = sub.add_parser("export", help="one episode (and the shared exchanges) as one WARC")
    export.add_argument("directory")
    export.add_argument("episode")
    export.add_argument("out", help="the WARC file to write (.warc.gz)")
    args = p.parse_args(argv)
    if not Path(args.directory).is_dir():
        print(f"error: no archive directory {args.directory}", file=sys.stderr)
        return 1
    archive = Archive.open(args.directory)
    if args.command == "inspect":
        s = summary(archive, urls=args.urls)
        if args.json:
            print(json.dumps(s, ensure_ascii=False))
        else:
            _print_summary(s)
        return 0
    if args.episode not in archive.episodes():
        known = ", ".join(repr(e) for e in archive.episodes()[:10]) or "none"
        print(
            f"error: no episode {args.episode!r} in {args.directory} (it has {known})",
            file=sys.stderr,
        )
        return 1
    n = export_episode(archive, args.episode, args.out)
    print(f"wrote {n} exchanges to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
