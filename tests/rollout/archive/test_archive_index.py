"""The archive's offset index: opening reads no body, lookups read the right ones, and the
index is rebuilt (never trusted) when the WARC files disagree with it."""

from __future__ import annotations

import gzip
import os
import shutil
import tracemalloc

from rollout.archive.index import DIR_INDEX, file_index_path
from rollout.archive.store import Archive, Exchange
from tests.rollout.archive.test_archive import _write


def _ex(i: int, body: bytes, episode: str = "", **kw) -> Exchange:
    fields = {
        "method": "GET", "url": f"http://example.com/{i}", "request_headers": (),
        "request_body": b"", "status": 200, "reason": "OK", "response_headers": (),
        "response_body": body, "episode": episode, "kind": "page",
    }  # fmt: skip
    return Exchange(**{**fields, **kw})


def _body(i: int, size: int = 100) -> bytes:
    return f"body {i} ".encode() + os.urandom(size)


def test_opening_holds_no_body_and_lookups_read_the_right_ones(tmp_path):
    bodies = [_body(i, 64 << 10) for i in range(300)]  # 19 MB of incompressible bodies
    _write(tmp_path, [_ex(i, b, episode=f"e{i % 7}") for i, b in enumerate(bodies)])
    for opening in ("build", "saved"):  # the first opening builds the index, the next maps it
        tracemalloc.start()
        archive = Archive.open(tmp_path)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # a few hundred bytes per exchange at most; one body alone is 64 KB
        assert held < 256 << 10 and peak < 2 << 20, (opening, held, peak)
        assert len(archive) == 300 and archive.torn == 0
        for i in (0, 1, 150, 299, 42):
            got = archive.lookup("GET", f"http://example.com/{i}", episode=f"e{i % 7}")
            assert got.response_body == bodies[i] and got.url == f"http://example.com/{i}"
        assert archive.lookup("GET", "http://example.com/300") is None
    assert (tmp_path / DIR_INDEX).is_file()


def test_a_saved_index_is_reused_until_a_file_changes(tmp_path):
    _write(tmp_path, [_ex(i, _body(i)) for i in range(20)])
    Archive.open(tmp_path)
    saved = tmp_path / DIR_INDEX
    stamp = saved.stat().st_mtime_ns, saved.stat().st_ino
    Archive.open(tmp_path)
    assert (saved.stat().st_mtime_ns, saved.stat().st_ino) == stamp  # mapped, not rebuilt
    _write(tmp_path, [_ex(i, _body(i)) for i in range(20, 25)])  # another writer's file
    archive = Archive.open(tmp_path)
    assert len(archive) == 25 and archive.lookup("GET", "http://example.com/24") is not None
    assert (saved.stat().st_mtime_ns, saved.stat().st_ino) != stamp


def test_files_without_their_own_index_read_the_same(tmp_path):
    written = [_ex(i, _body(i), episode=f"e{i % 3}") for i in range(40)]
    writer = _write(tmp_path / "a", written, max_bytes=1 << 12)
    assert len(writer.files) > 3
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for path in writer.files:
        file_index_path(tmp_path / "b" / path.name).unlink()
    (tmp_path / "b" / DIR_INDEX).unlink(missing_ok=True)
    indexed, scanned = Archive.open(tmp_path / "a"), Archive.open(tmp_path / "b")
    assert list(indexed.exchanges()) == list(scanned.exchanges()) == written
    assert indexed.torn == scanned.torn == 0
    for ep in ("e0", "e1", "e2"):
        assert list(indexed.exchanges(ep)) == list(scanned.exchanges(ep)) == written[int(ep[1]) :: 3]  # fmt: skip


def test_a_wrong_or_damaged_file_index_is_not_trusted(tmp_path):
    written = [_ex(i, _body(i)) for i in range(10)]
    (path,) = _write(tmp_path / "a", written).files
    index = file_index_path(path)
    original = index.read_bytes()
    damaged = bytearray(original)
    damaged[-30:-20] = os.urandom(10)  # the last entry's offsets no longer follow
    index.write_bytes(bytes(damaged))
    assert list(Archive.open(tmp_path / "a").exchanges()) == written
    # another, larger file under the same name, beside the first one's intact index: its
    # warcinfo is not the one the index names
    other = [_ex(i, b"other " + _body(i)) for i in range(10)]
    (replacement,) = _write(tmp_path / "b", other).files
    shutil.copy(replacement, path)
    index.write_bytes(original)
    archive = Archive.open(tmp_path / "a")
    assert list(archive.exchanges()) == other and archive.torn == 0


def test_an_exchange_whose_index_entry_a_kill_cut_off_is_read(tmp_path):
    written = [_ex(i, _body(i)) for i in range(10)]
    (path,) = _write(tmp_path, written).files
    index = file_index_path(path)
    index.write_bytes(index.read_bytes()[:-50])  # the last entry and part of the one before
    archive = Archive.open(tmp_path)
    assert list(archive.exchanges()) == written and archive.torn == 0
    assert archive.lookup("GET", "http://example.com/9").response_body == written[9].response_body


def test_repeats_keep_recorded_order_across_files_and_episodes(tmp_path):
    url = "http://example.com/counter"
    recorded = [_ex(0, f"{ep}{k}".encode(), ep, url=url) for k in range(3) for ep in "ab"]
    _write(tmp_path, recorded, max_bytes=1 << 10)  # one exchange per file
    archive = Archive.open(tmp_path)
    assert [archive.lookup("GET", url, episode="a").response_body for _ in range(4)] == [
        b"a0", b"a1", b"a2", b"b2"  # a's three in order, then the last of any episode
    ]  # fmt: skip
    assert archive.lookup("GET", url, episode="b").response_body == b"b0"


def test_warc_files_of_other_tools_are_indexed_by_scanning(tmp_path):
    """An uncompressed .warc and a .warc.gz compressed whole (one gzip member for all its
    records), as other tools write them: no index of their own, read all the same."""
    written = [_ex(i, _body(i), episode=f"e{i % 2}") for i in range(12)]
    (path,) = _write(tmp_path / "ours", written).files
    plain = gzip.decompress(path.read_bytes())
    for name, data in (("plain.warc", plain), ("whole.warc.gz", gzip.compress(plain))):
        directory = tmp_path / name.split(".")[0]
        directory.mkdir()
        (directory / name).write_bytes(data)
        archive = Archive.open(directory)
        assert list(archive.exchanges()) == written and archive.torn == 0, name
        assert archive.lookup("GET", "http://example.com/7", episode="e1") == written[7]
