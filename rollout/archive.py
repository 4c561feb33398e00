"""The web an episode saw, recorded as WARC and replayed from it with the network off.

Every response an episode receives (search answers, page fetches, a browser's requests) is
an :class:`Exchange`. An :class:`ArchiveWriter` appends each one to a WARC 1.1 file of its
own in a directory, as a response record and a request record naming it
(``WARC-Concurrent-To``), each its own gzip member and written before ``write`` returns, so
a process killed at any point loses at most the exchange it was writing. :class:`Archive`
reads every file back, skipping and counting what is torn, and answers requests in the
order they were recorded.

``python -m rollout.archive inspect DIR`` summarises an archive; ``export DIR EPISODE
OUT.warc.gz`` writes one episode's exchanges (and the shared ones) to a single WARC file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import mmap
import os
import re
import sys
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socket import gethostname
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.utils import Digester
from warcio.warcwriter import WARCWriter

KINDS: tuple[str, ...] = ("search", "page", "browser")
WARC_VERSION = "WARC/1.1"
ORIGINAL = "X-Archive-Original-"  # prefix of a response header the archive had to change
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 12
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")  # not allowed bare in a URI or a request line
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # not allowed in a WARC header value
_FIELDS = ("WARC-Record-ID", "WARC-Concurrent-To", "WARC-Target-URI", "WARC-Date", "WARC-Episode", "WARC-Archive-Kind")  # fmt: skip
_Key = tuple[str, str, bytes]  # (METHOD, normalised URL, sha256 of the request body)


@dataclass(frozen=True)
class Exchange:
    """One request and the response it got."""

    method: str
    url: str  # stored with any control character or space percent-encoded
    request_headers: tuple[tuple[str, str], ...]
    request_body: bytes
    status: int
    reason: str
    response_headers: tuple[tuple[str, str], ...]
    # The body as the client received it, decoded of any Content-Encoding; the archive
    # stores such a header as X-Archive-Original-Content-Encoding (see `archived_headers`).
    response_body: bytes
    episode: str  # which episode got it ("" when shared)
    kind: str  # one of KINDS
    date: str = field(default="", compare=False)  # WARC-Date recorded; "" before writing


def normalise_url(url: str) -> str:
    """The URL as lookups compare it: scheme and host lowercased, the default port dropped,
    the fragment dropped, an empty path as "/", the query kept as is (order matters)."""
    url = url.split("#", 1)[0]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number: compare the text
        return url
    if not parts.netloc:
        return urlunsplit((parts.scheme, "", parts.path, parts.query, ""))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + host
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme):
        netloc += f":{port}"
    query = "?" + parts.query if "?" in url else ""
    return f"{parts.scheme}://{netloc}{parts.path or '/'}{query}"


def _key(method: str, url: str, body: bytes) -> _Key:
    return method.upper(), normalise_url(url), hashlib.sha256(body).digest()


# ----------------------------------------------------------------------------- writing


def archived_headers(ex: Exchange) -> tuple[tuple[str, str], ...]:
    """The response headers as stored beside the decoded body: Content-Encoding and
    Transfer-Encoding renamed X-Archive-Original-*, and a Content-Length that is not the
    body's replaced by the body's (the original kept likewise), so that standard tools
    read the body right."""
    out: list[tuple[str, str]] = []
    bodyless = ex.method.upper() == "HEAD" or ex.status in (204, 304)
    for name, value in ex.response_headers:
        lower = name.lower()
        if lower in ("content-encoding", "transfer-encoding"):
            out.append((ORIGINAL + name, value))
        elif (
            lower == "content-length"
            and not bodyless
            and value.strip() != str(len(ex.response_body))
        ):
            out += [(name, str(len(ex.response_body))), (ORIGINAL + name, value)]
        else:
            out.append((name, value))
    return tuple(out)


def _escape(text: str, unsafe: re.Pattern = _UNSAFE) -> str:
    """``unsafe`` characters percent-encoded: a URI or request line holds no controls or
    spaces, a WARC header value no controls."""
    return unsafe.sub(lambda m: f"%{ord(m.group()):02X}", text)


def _head(start: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """An HTTP message head, UTF-8 (surrogate escapes give back the bytes a client
    decoded); CR and LF inside a header become spaces so they cannot end it."""
    lines = [start, *(f"{n}: {v}".replace("\r", " ").replace("\n", " ") for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def _request_target(url: str) -> str:
    parts = urlsplit(url)
    if not parts.netloc:
        return _escape(url)
    return _escape((parts.path or "/") + ("?" + parts.query if parts.query else ""))


def _record(rec_type: str, uri: str, head: bytes, body: bytes, fields: dict) -> ArcWarcRecord:
    """A request or response record; warcio computes the block digest and the length."""
    payload = Digester("sha1")
    payload.update(body)
    headers = [
        ("WARC-Type", rec_type),
        ("WARC-Record-ID", StatusAndHeadersParser.make_warc_id()),
        ("WARC-Target-URI", uri),
        *fields.items(),
        ("WARC-Payload-Digest", str(payload)),
    ]
    block = head + body
    rec_headers = StatusAndHeaders("", headers, protocol=WARC_VERSION)
    content_type = f"application/http; msgtype={rec_type}"
    return ArcWarcRecord(
        "warc", rec_type, rec_headers, io.BytesIO(block), None, content_type, len(block)
    )


def encode_exchange(ex: Exchange) -> bytes:
    """The exchange as two gzip members: its response record, then its request record,
    which names the response in WARC-Concurrent-To (warcio's order for a pair)."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True, warc_version=WARC_VERSION)
    uri = _escape(ex.url)
    fields = {
        "WARC-Date": ex.date or writer.curr_warc_date(),
        "WARC-Episode": _escape(ex.episode, _CONTROL),
        "WARC-Archive-Kind": _escape(ex.kind, _CONTROL),
    }
    head = _head(f"HTTP/1.1 {ex.status} {ex.reason}".rstrip(" "), archived_headers(ex))
    response = _record("response", uri, head, ex.response_body, fields)
    fields["WARC-Concurrent-To"] = response.rec_headers.get_header("WARC-Record-ID")
    head = _head(f"{ex.method.upper()} {_request_target(ex.url)} HTTP/1.1", ex.request_headers)
    writer.write_record(response)
    writer.write_record(_record("request", uri, head, ex.request_body, fields))
    return out.getvalue()


def _warcinfo(filename: str) -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True, warc_version=WARC_VERSION)
    info = {
        "software": "deep-research-harness rollout.archive (warcio)",
        "format": "WARC File Format 1.1",
        "hostname": gethostname(),
        "pid": str(os.getpid()),
    }
    writer.write_record(writer.create_warcinfo_record(filename, info))
    return out.getvalue()


class ArchiveWriter:
    """Appends exchanges to WARC files of its own in ``directory``.

    Each writer (and each process it is forked into) writes files no one else does,
    ``archive-<pid>-<seq>.warc.gz`` created exclusively, so any number of processes can
    record into one directory. A file is closed once it passes ``max_bytes`` and the next
    one is started. Thread-safe. ``fsync`` also survives a power loss, not only a kill.
    """

    def __init__(self, directory: str | Path, *, max_bytes: int = 256 << 20, fsync: bool = False):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()  # the process that opened self._fd
        self._seq = 0
        self._size = 0  # bytes in the current file
        self._bytes = 0
        self._files: list[Path] = []
        self._closed = False

    @property
    def bytes_written(self) -> int:
        """Bytes written to all files so far (compressed, as on disk)."""
        return self._bytes

    @property
    def files(self) -> list[Path]:
        """The files this writer created, in order."""
        return list(self._files)

    def write(self, ex: Exchange) -> None:
        """Append one exchange; on return it is in the file (in the OS, not a buffer)."""
        data = encode_exchange(ex)
        with self._lock:
            if self._closed:
                raise ValueError("write to a closed ArchiveWriter")
            if self._fd is None or self._pid != os.getpid():
                self._open()
            self._write_all(data)
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
        self._write_all(_warcinfo(path.name))

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)
        self._size += len(data)
        self._bytes += len(data)

    def _close_file(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Record:
    """A request or response record as read, its block whole."""

    rec_type: str
    rec_id: str
    concurrent: str  # WARC-Concurrent-To, "" if none
    uri: str
    date: str
    episode: str
    kind: str
    block: bytes


def _inflate(view: memoryview, pos: int) -> tuple[bytes, int] | None:
    """The gzip member at ``pos`` decompressed and the offset after it; None if there is
    no whole, valid member there."""
    inflater, out, size = zlib.decompressobj(zlib.MAX_WBITS | 16), [], _CHUNK
    try:
        while not inflater.eof:
            if pos >= len(view):
                return None  # truncated
            chunk = view[pos : pos + size]  # small first: what follows the member is copied
            out.append(inflater.decompress(chunk))
            pos, size = pos + len(chunk), min(size * 4, 1 << 20)
    except zlib.error:
        return None
    return b"".join(out), pos - len(inflater.unused_data)


def _members(buf: mmap.mmap | bytes) -> Iterator[bytes | None]:
    """Each gzip member's content in order, and None for each stretch of bytes that is not
    one (truncated, corrupt, appended garbage); reading resumes at the next valid member."""
    with memoryview(buf) as view:
        pos = 0
        while pos < len(view):
            member = _inflate(view, pos)
            if member is None:
                yield None
                while member is None:
                    pos = buf.find(_GZIP_MAGIC, pos + 1)
                    if pos < 0:
                        return
                    member = _inflate(view, pos)
            data, pos = member
            yield data


def _records(data: bytes) -> tuple[list[_Record], bool]:
    """The request and response records in uncompressed WARC ``data``, and whether all of
    it read cleanly (other record types are skipped, not counted)."""
    found: list[_Record] = []
    try:
        for rec in ArchiveIterator(io.BytesIO(data), no_record_parse=True):
            h = rec.rec_headers
            block = rec.raw_stream.read()
            if len(block) != int(h.get_header("Content-Length") or -1):
                return found, False
            if rec.rec_type in ("request", "response"):
                found.append(
                    _Record(rec.rec_type, *(h.get_header(f) or "" for f in _FIELDS), block)
                )
    except Exception:  # a corrupt record can fail anywhere in warcio; it is counted instead
        return found, False
    return found, True


def _read_file(path: Path) -> tuple[list[_Record], int]:
    """A file's records and how many torn stretches it has."""
    if path.stat().st_size == 0:
        return [], 0
    if path.name.endswith(".warc"):
        records, clean = _records(path.read_bytes())
        return records, int(not clean)
    records, torn = [], 0
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for data in _members(buf):
            got, clean = _records(data) if data is not None else ([], False)
            records += got
            torn += not clean
    return records, torn


def _parse_head(block: bytes) -> tuple[str, tuple[tuple[str, str], ...], bytes] | None:
    """An HTTP message's start line, headers and body; None if it has no end of head."""
    head, sep, body = block.partition(b"\r\n\r\n")
    if not sep:
        return None
    start, *lines = head.decode("utf-8", "surrogateescape").split("\r\n")
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers.append((name.strip(), value.strip(" \t")))
    return start, tuple(headers), body


def _exchange(response: _Record, request: _Record) -> Exchange | None:
    resp, req = _parse_head(response.block), _parse_head(request.block)
    if resp is None or req is None:
        return None
    status_line, response_headers, response_body = resp
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return Exchange(
        method=req[0].split(" ", 1)[0], url=response.uri or request.uri,
        request_headers=req[1], request_body=req[2], status=int(parts[1]),
        reason=parts[2] if len(parts) > 2 else "", response_headers=response_headers,
        response_body=response_body, episode=response.episode, kind=response.kind,
        date=response.date,
    )  # fmt: skip


def _natural(path: Path) -> list[Any]:
    """Sort key in which archive-7-00010 follows archive-7-00009 whatever the digits."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(path))]


class Archive:
    """A replayable archive: every readable exchange of every *.warc.gz (and .warc) file
    under a directory, answered in the order they were recorded."""

    def __init__(self, exchanges: Iterable[Exchange], *, files: Iterable[Path] = (), torn: int = 0):
        self.files = list(files)  # the files read, in reading order
        self.torn = torn  # torn stretches of files and records without their pair, skipped
        self._exchanges = list(exchanges)
        self._all: dict[_Key, list[int]] = defaultdict(list)
        self._mine: dict[tuple[str, _Key], list[int]] = defaultdict(list)
        for i, ex in enumerate(self._exchanges):
            key = _key(ex.method, ex.url, ex.request_body)
            self._all[key].append(i)
            self._mine[ex.episode, key].append(i)
        self._cursors: dict[tuple[str, _Key], int] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: str | Path) -> Archive:
        """Read every WARC file under ``directory`` (or that one file); never raises on
        a torn or corrupt file, which is skipped and counted in :attr:`torn`."""
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
        records, torn = [], 0
        for path in paths:
            got, bad = _read_file(path)
            records += got
            torn += bad
        exchanges, torn = _pair(records, torn)
        return cls(exchanges, files=paths, torn=torn)

    def lookup(
        self, method: str, url: str, body: bytes = b"", *, episode: str = ""
    ) -> Exchange | None:
        """The response recorded for this request: the episode's next unused one for it in
        recorded order, else (shared resources) the last one any episode recorded; None
        when it was never recorded."""
        key = _key(method, url, body)
        with self._lock:
            mine = self._mine.get((episode, key), [])
            used = self._cursors.get((episode, key), 0)
            if used < len(mine):
                self._cursors[episode, key] = used + 1
                return self._exchanges[mine[used]]
        every = self._all.get(key)
        return self._exchanges[every[-1]] if every else None

    def reset_cursors(self) -> None:
        """Forget which responses were used: the next lookups start from the first again."""
        with self._lock:
            self._cursors.clear()

    def __len__(self) -> int:
        return len(self._exchanges)

    def episodes(self) -> list[str]:
        """Every episode that recorded something, sorted ("" for shared exchanges)."""
        return sorted({ex.episode for ex in self._exchanges})

    def exchanges(self, episode: str | None = None) -> Iterator[Exchange]:
        """The exchanges in recorded order: all, or one episode's."""
        return (ex for ex in self._exchanges if episode is None or ex.episode == episode)

    @property
    def bytes(self) -> int:
        """The archive's files' size on disk."""
        return sum(p.stat().st_size for p in self.files if p.exists())


def _pair(records: list[_Record], torn: int) -> tuple[list[Exchange], int]:
    """Exchanges from request and response records linked by WARC-Concurrent-To (either
    way), in the order of their responses; every record left unpaired or unreadable counts
    as torn."""
    ids = {r.rec_id: r for r in records}
    partner: dict[str, _Record] = {}  # response id -> its request
    for r in records:
        other = ids.get(r.concurrent)
        if other is not None and {r.rec_type, other.rec_type} == {"request", "response"}:
            response, request = (r, other) if r.rec_type == "response" else (other, r)
            partner[response.rec_id] = request
    exchanges, paired = [], 0
    for r in records:
        request = partner.get(r.rec_id) if r.rec_type == "response" else None
        ex = _exchange(r, request) if request is not None else None
        if ex is not None:
            exchanges.append(ex)
            paired += 2
    return exchanges, torn + len(records) - paired


# ----------------------------------------------------------------------------- export, CLI


def export_episode(archive: Archive, episode: str, out: str | Path) -> int:
    """Write ``episode``'s exchanges and the shared ones ("") to one WARC file, in recorded
    order, with their recorded dates; the number written."""
    path, n = Path(out), 0
    with path.open("wb") as f:
        f.write(_warcinfo(path.name))
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
