"""The archive core: exchanges written as WARC, read back by us and by warcio's own tools,
answered in recorded order, and nothing lost to torn files, threads, processes or kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from rollout.archive.store import ORIGINAL, Archive, ArchiveWriter, Exchange, main, normalise_url
from tests.conftest import REPO


def _ex(url: str = "http://example.com/a", body: bytes = b"hello", **kw) -> Exchange:
    fields = {
        "method": "GET", "url": url, "request_headers": (("User-Agent", "test"),),
        "request_body": b"", "status": 200, "reason": "OK",
        "response_headers": (("Content-Type", "text/html"),), "response_body": body,
        "episode": "ep-0", "kind": "page",
    }  # fmt: skip
    return Exchange(**{**fields, **kw})


def _write(directory: Path, exchanges: list[Exchange], **kw) -> ArchiveWriter:
    with ArchiveWriter(directory, **kw) as writer:
        for ex in exchanges:
            writer.write(ex)
    return writer


def _variety() -> list[Exchange]:
    """Binary, empty and POST bodies, repeated headers, non-ASCII URLs, every kind."""
    out = [
        _ex(body=bytes(range(256)) * 40, response_headers=(("Content-Type", "image/png"),)),
        _ex("http://example.com/empty", b"", status=204, reason="No Content"),
        _ex("https://api.example.org/search", b'{"hits": []}', method="POST",
            request_body=b"q=caf\xc3\xa9&k=5", kind="search", episode=""),
        _ex("http://example.com/cookies", response_headers=(
            ("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2"), ("Vary", "Accept"))),
        _ex("http://例え.jp/パス?q=ü&x=1", "ünïcödé".encode(), episode="ép-1"),
        _ex("http://example.com/missing", b"not here", status=404, reason="", kind="browser"),
    ]  # fmt: skip
    out += [_ex(f"http://h{i % 5}.example/p/{i}", os.urandom(i * 37), episode=f"ep-{i % 3}") for i in range(40)]  # fmt: skip
    return out


def test_exchanges_round_trip_exactly(tmp_path):
    written = _variety()
    writer = _write(tmp_path, written)
    archive = Archive.open(tmp_path)
    assert list(archive.exchanges()) == written and archive.torn == 0
    assert len(archive) == len(written) and archive.files == writer.files
    assert archive.episodes() == ["", "ep-0", "ep-1", "ep-2", "ép-1"]
    assert list(archive.exchanges("ép-1")) == [written[4]]
    assert all(ex.date.endswith("Z") for ex in archive.exchanges())  # the WARC-Date recorded
    assert writer.bytes_written == sum(p.stat().st_size for p in writer.files) == archive.bytes


def test_a_decoded_body_is_stored_without_claiming_its_encoding(tmp_path):
    headers = (("Content-Encoding", "gzip"), ("Content-Length", "12"), ("Transfer-Encoding", "chunked"))  # fmt: skip
    _write(tmp_path, [_ex(body=b"decoded body, longer", response_headers=headers)])
    (ex,) = Archive.open(tmp_path).exchanges()
    assert ex.response_headers == (
        (ORIGINAL + "Content-Encoding", "gzip"), ("Content-Length", "20"),
        (ORIGINAL + "Content-Length", "12"), (ORIGINAL + "Transfer-Encoding", "chunked"),
    )  # fmt: skip
    assert ex.response_body == b"decoded body, longer"


@pytest.mark.parametrize(
    ("url", "same_as"),
    [
        ("HTTP://Example.COM:80/a#x", "http://example.com/a"),
        ("https://example.com:443", "https://example.com/"),
        ("https://example.com:8443/A?B=1", "https://example.com:8443/A?B=1"),
        ("http://[::1]:80/x", "http://[::1]/x"),
        ("http://user@Host.com/", "http://user@host.com/"),
        ("http://example.com/p?", "http://example.com/p?"),
    ],
)
def test_normalise_url(url, same_as):
    assert normalise_url(url) == same_as


def test_normalise_url_keeps_what_matters():
    assert normalise_url("http://a.com/p?x=1&y=2") != normalise_url("http://a.com/p?y=2&x=1")
    assert normalise_url("http://a.com/P") != normalise_url(
        "http://a.com/p"
    )  # paths are case-sensitive
    assert normalise_url("http://a.com/p?") != normalise_url("http://a.com/p")
    assert normalise_url("http://a.com:bad/") == "http://a.com:bad/"  # never raises


def test_repeats_answer_in_recorded_order_then_the_last_of_any_episode(tmp_path):
    url = "http://example.com/counter"
    recorded = [
        _ex(url, b"a1", episode="a"), _ex(url, b"b1", episode="b"), _ex(url, b"a2", episode="a"),
        _ex(url, b"b2", episode="b"), _ex("http://example.com/other", b"o", episode="a"),
    ]  # fmt: skip
    _write(tmp_path, recorded)
    archive = Archive.open(tmp_path)
    bodies = [archive.lookup("GET", url, episode="a").response_body for _ in range(4)]
    assert bodies == [b"a1", b"a2", b"b2", b"b2"]  # a's two, then the last among all
    assert archive.lookup("GET", url, episode="b").response_body == b"b1"  # b's cursor is its own
    assert archive.lookup("GET", url, episode="new").response_body == b"b2"  # none of its own
    assert archive.lookup("GET", url).response_body == b"b2"
    assert archive.lookup("GET", "http://example.com/never", episode="a") is None
    archive.reset_cursors()
    assert archive.lookup("GET", url, episode="a").response_body == b"a1"


def test_lookup_matches_method_normalised_url_and_body(tmp_path):
    url = "http://Example.com:80/api#frag"
    _write(tmp_path, [
        _ex(url, b"one", method="POST", request_body=b'{"q": 1}', episode=""),
        _ex(url, b"two", method="POST", request_body=b'{"q": 2}', episode=""),
        _ex(url, b"get", episode=""),
    ])  # fmt: skip
    archive = Archive.open(tmp_path)
    assert archive.lookup("post", "http://example.com/api", b'{"q": 2}').response_body == b"two"
    assert archive.lookup("POST", "HTTP://EXAMPLE.COM/api", b'{"q": 1}').response_body == b"one"
    assert archive.lookup("POST", "http://example.com/api", b'{"q": 3}') is None
    assert archive.lookup("POST", "http://example.com/api") is None  # the empty body differs
    assert archive.lookup("GET", "http://example.com/api").response_body == b"get"


def test_rotation_spreads_over_files_that_all_read_back(tmp_path):
    written = [_ex(f"http://example.com/{i}", os.urandom(3000)) for i in range(60)]
    writer = _write(tmp_path, written, max_bytes=1 << 16)
    assert len(writer.files) >= 3
    assert all(p.stat().st_size < (1 << 16) + 4000 for p in writer.files)
    archive = Archive.open(tmp_path)
    assert list(archive.exchanges()) == written and archive.torn == 0


def test_files_are_standard_warc_for_warcio_and_its_cli(tmp_path):
    written = _variety()
    writer = _write(tmp_path, written)
    (path,) = writer.files
    records = []
    with path.open("rb") as f:
        for rec in ArchiveIterator(f):
            h = rec.rec_headers
            assert h.protocol == "WARC/1.1"
            for name in ("WARC-Record-ID", "WARC-Date", "WARC-Type", "Content-Length"):
                assert h.get_header(name), name
            if rec.rec_type != "warcinfo":
                assert h.get_header("WARC-Target-URI") and h.get_header("WARC-Archive-Kind")
                assert h.get_header("WARC-Episode") is not None
                records.append((rec.rec_type, h, rec.http_headers, rec.content_stream().read()))
    assert [r[0] for r in records] == ["response", "request"] * len(written)
    for ex, (_, resp, http, payload), (_, req, _, _) in zip(written, records[::2], records[1::2], strict=True):  # fmt: skip
        assert req.get_header("WARC-Concurrent-To") == resp.get_header("WARC-Record-ID")
        assert payload == ex.response_body and int(http.get_statuscode()) == ex.status
    index = subprocess.run(
        [sys.executable, "-m", "warcio.cli", "index", "-f", "warc-type,http:status,warc-episode", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in index.stdout.splitlines()]
    assert len(rows) == 1 + 2 * len(written) and rows[1]["http:status"] == "200"
    check = subprocess.run([sys.executable, "-m", "warcio.cli", "check", str(path)], capture_output=True)  # fmt: skip
    assert check.returncode == 0, check.stdout  # every block and payload digest holds


def test_a_torn_last_record_is_skipped_and_counted(tmp_path):
    written = [_ex(f"http://example.com/{i}", os.urandom(500)) for i in range(10)]
    (path,) = _write(tmp_path, written).files
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # cut inside the last exchange's request record
    archive = Archive.open(tmp_path)
    assert list(archive.exchanges()) == written[:-1]
    assert archive.torn == 2  # the cut member, and the response it leaves without a request


def test_garbage_appended_is_skipped_and_counted(tmp_path):
    written = [_ex(f"http://example.com/{i}") for i in range(5)]
    (path,) = _write(tmp_path, written).files
    with path.open("ab") as f:
        f.write(b"\x1f\x8b\x08 not really gzip" + os.urandom(2000))
    archive = Archive.open(tmp_path)
    assert list(archive.exchanges()) == written and archive.torn == 1


def test_reading_resumes_after_a_corrupt_record_midfile(tmp_path):
    written = [_ex(f"http://example.com/{i}", os.urandom(3000)) for i in range(6)]
    (path,) = _write(tmp_path, written).files
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 50] = os.urandom(50)
    path.write_bytes(bytes(data))
    archive = Archive.open(tmp_path)
    got = list(archive.exchanges())
    assert 1 <= archive.torn <= 3 and len(got) == len(written) - 1
    assert got[0] == written[0] and got[-1] == written[-1]  # the later records recovered


def test_threads_writing_one_archive_lose_nothing(tmp_path):
    writer = ArchiveWriter(tmp_path, max_bytes=1 << 16)

    def work(t: int) -> None:
        for i in range(50):
            writer.write(_ex(f"http://example.com/{t}/{i}", os.urandom(200), episode=f"t{t}"))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    archive = Archive.open(tmp_path)
    assert len(archive) == 200 and archive.torn == 0
    for t in range(4):  # each thread's writes in the order it made them
        urls = [ex.url for ex in archive.exchanges(f"t{t}")]
        assert urls == [f"http://example.com/{t}/{i}" for i in range(50)]


_CHILD = """
import os, sys
from rollout.archive.store import ArchiveWriter, Exchange
writer = ArchiveWriter(sys.argv[1], max_bytes=int(sys.argv[3]))
n = int(sys.argv[4])
i = 0
while n < 0 or i < n:
    writer.write(Exchange("GET", f"http://child/{sys.argv[2]}/{i}", (), b"", 200, "OK", (),
                          os.urandom(300), sys.argv[2], "page"))
    print(i, flush=True)
    i += 1
writer.close()
"""


def _child(directory: Path, name: str, n: int, max_bytes: int = 1 << 16) -> subprocess.Popen:
    args = [sys.executable, "-c", _CHILD, str(directory), name, str(max_bytes), str(n)]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True)


@pytest.mark.multiprocess
def test_processes_and_threads_writing_one_directory_lose_nothing(tmp_path):
    children = [_child(tmp_path, f"p{k}", 100) for k in range(2)]
    writer = ArchiveWriter(tmp_path, max_bytes=1 << 16)
    for i in range(100):
        writer.write(_ex(f"http://parent/{i}", episode="parent"))
    writer.close()
    for child in children:
        child.communicate(timeout=120)
        assert child.returncode == 0
    archive = Archive.open(tmp_path)
    assert len(archive) == 300 and archive.torn == 0
    for name, prefix in (("p0", "http://child/p0/"), ("p1", "http://child/p1/"), ("parent", "http://parent/")):  # fmt: skip
        assert [ex.url for ex in archive.exchanges(name)] == [f"{prefix}{i}" for i in range(100)]


@pytest.mark.multiprocess
def test_a_killed_writer_keeps_every_write_that_returned(tmp_path):
    child = _child(tmp_path, "k", -1, max_bytes=1 << 15)
    done = [int(child.stdout.readline()) for _ in range(300)]
    os.kill(child.pid, signal.SIGKILL)
    # read() and not communicate(): communicate reads the pipe's descriptor and would miss
    # the lines readline() already buffered (the writes past the 300th that returned)
    rest = child.stdout.read()
    child.wait(60)
    done += [int(line) for line in rest.splitlines() if line.strip()]
    archive = Archive.open(tmp_path)
    urls = {ex.url for ex in archive.exchanges()}
    assert {f"http://child/k/{i}" for i in done} <= urls
    assert len(urls) <= len(done) + 1 and archive.torn <= 2  # at most the write cut short


def _cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rollout.archive", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def _sample(directory: Path) -> list[Exchange]:
    written = [
        _ex("http://a.example/1", b"x" * 10, episode="e1"),
        _ex("http://a.example/2", b"y" * 20, episode="e2"),
        _ex("http://search.example/q?x=1", b"[]", episode="", kind="search"),
        _ex("http://b.example/", b"z" * 5, episode="e1", status=404, reason="Not Found"),
    ]
    _write(directory, written)
    return written


def test_cli_inspect(tmp_path):
    _sample(tmp_path)
    text = _cli("inspect", str(tmp_path))
    assert text.returncode == 0 and "1 files, 4 exchanges, 0 torn" in text.stdout
    assert "a.example" in text.stdout and "(shared)" in text.stdout
    got = json.loads(_cli("inspect", str(tmp_path), "--json", "--urls").stdout)
    assert got["exchanges"] == 4 and got["torn"] == 0 and len(got["files"]) == 1
    assert got["hosts"]["a.example"] == {"exchanges": 2, "bytes": 30}
    assert got["episodes"] == {"": 1, "e1": 2, "e2": 1}
    assert {(u["url"], u["status"], u["bytes"]) for u in got["urls"]} >= {("http://b.example/", 404, 5)}  # fmt: skip


def test_cli_export_writes_one_episode_and_the_shared_exchanges(tmp_path):
    written = _sample(tmp_path / "archive")
    out = tmp_path / "export" / "e1.warc.gz"
    out.parent.mkdir()
    assert main(["export", str(tmp_path / "archive"), "e1", str(out)]) == 0
    exported = Archive.open(out.parent)
    assert list(exported.exchanges()) == [written[0], written[2], written[3]]
    assert [ex.date for ex in exported.exchanges()] == [
        ex.date for ex in Archive.open(tmp_path / "archive").exchanges() if ex.episode != "e2"
    ]  # the recorded dates kept
    check = subprocess.run([sys.executable, "-m", "warcio.cli", "check", str(out)], capture_output=True)  # fmt: skip
    assert check.returncode == 0


def test_cli_errors(tmp_path):
    _sample(tmp_path)
    missing = _cli("inspect", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no archive directory" in missing.stderr
    unknown = _cli("export", str(tmp_path), "e9", str(tmp_path / "out.warc.gz"))
    assert unknown.returncode == 1 and "no episode 'e9'" in unknown.stderr
    assert not (tmp_path / "out.warc.gz").exists()


def test_open_missing_directory_raises_and_empty_directory_is_empty(tmp_path):
    with pytest.raises(FileNotFoundError):
        Archive.open(tmp_path / "nope")
    (tmp_path / "empty.warc.gz").write_bytes(b"")
    archive = Archive.open(tmp_path)
    assert len(archive) == 0 and archive.torn == 0 and archive.episodes() == []


def test_a_closed_writer_refuses_writes(tmp_path):
    writer = _write(tmp_path, [_ex()])
    with pytest.raises(ValueError, match="closed"):
        writer.write(_ex())


@pytest.mark.multiprocess
def test_a_forked_writer_starts_a_file_of_its_own(tmp_path):
    writer = ArchiveWriter(tmp_path)
    writer.write(_ex("http://example.com/before"))
    pid = os.fork()
    if pid == 0:  # the child: its write must not interleave with the parent's file
        writer.write(_ex("http://example.com/child", episode="child"))
        os._exit(0)
    writer.write(_ex("http://example.com/parent"))
    assert os.waitpid(pid, 0)[1] == 0
    writer.close()
    archive = Archive.open(tmp_path)
    assert len(archive.files) == 2 and archive.torn == 0
    assert [ex.url for ex in archive.exchanges("ep-0")] == ["http://example.com/before", "http://example.com/parent"]  # fmt: skip
    assert [ex.url for ex in archive.exchanges("child")] == ["http://example.com/child"]
