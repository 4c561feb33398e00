"""The archive's bytes: an :class:`Exchange` as a WARC 1.1 response record and a request
record naming it (``WARC-Concurrent-To``), each its own gzip member, and back.

Reading goes by location: :func:`scan` walks a file (or the stretch of it no index
covers) and says where each request and response record lies, skipping what is torn;
:func:`read_exchange` reads one exchange back from the two locations alone, so an
archive can answer from an index without holding any body in memory.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socket import gethostname
from urllib.parse import urlsplit, urlunsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.utils import Digester
from warcio.warcwriter import WARCWriter

from rollout.archive.origin import canonical, canonical_bytes

KINDS: tuple[str, ...] = ("search", "page", "browser")
WARC_VERSION = "WARC/1.1"
ORIGINAL = "X-Archive-Original-"  # prefix of a response header the archive had to change
ORIGIN_FIELD = "web-origin"  # the warcinfo field naming the local web's origin
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 12
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")  # not allowed bare in a URI or a request line
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # not allowed in a WARC header value
_FIELDS = ("WARC-Record-ID", "WARC-Concurrent-To", "WARC-Target-URI", "WARC-Date", "WARC-Episode", "WARC-Archive-Kind")  # fmt: skip
_WARC_PARSER = StatusAndHeadersParser(["WARC/1.1", "WARC/1.0", "WARC/0.17", "WARC/0.18"])


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


def request_key(method: str, url: str, body: bytes, origins: Iterable[str] = ()) -> bytes:
    """What lookups compare, 16 bytes: the method, the normalised URL and the request body,
    the web ``origins`` in them replaced by one placeholder (:mod:`rollout.archive.origin`)."""
    origins = tuple(origins)
    url = canonical(normalise_url(url), origins)
    digest = hashlib.sha256(canonical_bytes(body, origins)).digest()
    text = f"{method.upper()}\x00{url}\x00".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(text + digest, digest_size=16).digest()


def episode_hash(episode: str) -> int:
    """The episode id as the index stores it (64 bits)."""
    digest = hashlib.blake2b(episode.encode("utf-8", "surrogateescape"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


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


def encode_pair(ex: Exchange) -> tuple[bytes, bytes]:
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
    split = out.tell()
    writer.write_record(_record("request", uri, head, ex.request_body, fields))
    data = out.getvalue()
    return data[:split], data[split:]


def encode_exchange(ex: Exchange) -> bytes:
    """The exchange as its two gzip members, response first."""
    return b"".join(encode_pair(ex))


def warcinfo(filename: str, origin: str | None = None) -> bytes:
    """A file's first record; ``origin`` is the local web's (``web-origin``), if any."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True, warc_version=WARC_VERSION)
    info = {
        "software": "deep-research-harness rollout.archive (warcio)",
        "format": "WARC File Format 1.1",
        "hostname": gethostname(),
        "pid": str(os.getpid()),
    }
    if origin:
        info[ORIGIN_FIELD] = origin
    writer.write_record(writer.create_warcinfo_record(filename, info))
    return out.getvalue()


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Loc:
    """Where one record lies: ``length`` bytes at ``offset`` of file ``file``, a gzip
    member whose record starts ``inner`` bytes into its content (``inner`` is 0 for a
    member of one record; an uncompressed file's record is the bytes themselves)."""

    file: int
    offset: int
    length: int
    inner: int = 0


@dataclass(frozen=True)
class Record:
    """A request or response record as read, its block whole."""

    rec_type: str
    rec_id: str
    concurrent: str  # WARC-Concurrent-To, "" if none
    uri: str
    date: str
    episode: str
    kind: str
    block: bytes


def inflate(view: memoryview | bytes, pos: int = 0) -> tuple[bytes, int] | None:
    """The gzip member at ``pos`` decompressed and the offset after it; None if there is
    no whole, valid member there (a corrupt one fails its CRC)."""
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


def _members(view: memoryview, start: int) -> Iterator[tuple[int, int, bytes | None]]:
    """(offset, length, content) of each gzip member from ``start`` on, and a content of
    None for each stretch of bytes that is not one (truncated, corrupt, appended garbage);
    reading resumes at the next valid member."""
    with view:
        pos = start
        while pos < len(view):
            member = inflate(view, pos)
            if member is None:
                yield pos, 0, None
                while member is None:
                    pos = _find(view, _GZIP_MAGIC, pos + 1)
                    if pos < 0:
                        return
                    member = inflate(view, pos)
            data, end = member
            yield pos, end - pos, data
            pos = end


def _find(view: memoryview, needle: bytes, pos: int) -> int:
    """``needle``'s first offset at or after ``pos`` in ``view``, or -1 (without copying)."""
    return view.obj.find(needle, pos, len(view))  # the mmap's find, bounded by the view


def _records(data: bytes) -> tuple[list[tuple[int, int, ArcWarcRecord, bytes]], bool]:
    """(offset, length, record, block) of each record in uncompressed WARC ``data``, and
    whether all of it read cleanly."""
    found = []
    try:
        it = ArchiveIterator(io.BytesIO(data), no_record_parse=True)
        for rec in it:
            block = rec.raw_stream.read()
            if len(block) != int(rec.rec_headers.get_header("Content-Length") or -1):
                return found, False
            it.read_to_end(rec)
            found.append((it.get_record_offset(), it.get_record_length(), rec, block))
    except Exception:  # a corrupt record can fail anywhere in warcio; it is counted instead
        return found, False
    return found, True


def _as_record(rec: ArcWarcRecord, block: bytes) -> Record:
    h = rec.rec_headers
    return Record(rec.rec_type, *(h.get_header(f) or "" for f in _FIELDS), block)


def _info_origin(block: bytes) -> str | None:
    for line in block.decode("utf-8", "replace").splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() == ORIGIN_FIELD:
            return value.strip() or None
    return None


@dataclass
class Scanned:
    """What :func:`scan` found in one file besides its records: the local web's origin its
    warcinfo names, and the torn stretches."""

    origin: str | None = None
    torn: int = 0


def scan(
    path: Path, file_no: int, found: Scanned, start: int = 0, end: int | None = None
) -> Iterator[tuple[Loc, Record]]:
    """The request and response records of ``path`` from byte ``start`` to ``end`` (its
    size) with their locations, one gzip member in memory at a time; never raises on a
    torn or corrupt stretch, which is skipped and counted in ``found``."""
    size = path.stat().st_size if end is None else end
    if size <= start:
        return
    gz = not path.name.endswith(".warc")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if gz:
            stretches = _members(memoryview(buf)[:size], start)
        else:  # an uncompressed file is read whole, as one stretch
            stretches = iter([(start, 0, buf[start:size])])
        for offset, length, data in stretches:
            records, clean = _records(data) if data is not None else ([], False)
            found.torn += not clean
            for inner, rec_length, rec, block in records:
                if rec.rec_type == "warcinfo" and found.origin is None:
                    found.origin = _info_origin(block)
                elif rec.rec_type in ("request", "response"):
                    loc = Loc(file_no, offset, length, inner) if gz else Loc(file_no, offset + inner, rec_length)  # fmt: skip
                    yield loc, _as_record(rec, block)


def read_record(data: bytes, inner: int = 0) -> Record | None:
    """The record starting ``inner`` bytes into uncompressed ``data``; None if torn."""
    stream = io.BytesIO(data)
    stream.seek(inner)
    try:
        headers = _WARC_PARSER.parse(stream)
        length = int(headers.get_header("Content-Length") or -1)
    except Exception:  # not a WARC record head
        return None
    block = stream.read(length) if length >= 0 else b""
    if length < 0 or len(block) != length:
        return None
    rec_type = headers.get_header("WARC-Type") or ""
    return Record(rec_type, *(headers.get_header(f) or "" for f in _FIELDS), block)


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


def to_exchange(response: Record, request: Record) -> Exchange | None:
    """The exchange a response record and its request record hold; None if either's
    HTTP message is unreadable."""
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
