"""The finished-group buffer: bounded, persisted on disk, each group served exactly once.

Two append-only files in the buffer directory, both fsynced on every write:

- ``groups.log``: every finished group, as ``[length u32][crc32 u32][wire message]``
  frames (``shared.wire``). A torn or corrupt tail (a crash mid-write) is cut off
  on open; everything before it was complete.
- ``served.log``: one line per group that left the buffer: ``served <id>`` once
  the learner acknowledged receiving it, ``dropped <id> <reason>`` when it was
  too stale to train on.

Serving is two-phase: ``take`` hands groups out and keeps them leased;
``ack(ids)`` (the learner's next request carries the ids it received) makes
them served for good. After a crash and restart, groups that were finished but
not acknowledged are served again, and acknowledged ones never are, so every
finished group reaches the learner exactly once (an ack may arrive at the new
process: ids are durable). ``put`` waits while ``max_pending`` groups are
waiting (backpressure on the rollout engine).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
import zlib
from collections import OrderedDict
from pathlib import Path

from shared.wire import TrajectoryGroup, WireError, decode_group, encode_group

_FRAME = struct.Struct("<II")


class TrajectoryBuffer:
    def __init__(self, directory: str | Path, max_pending: int = 64, lease_s: float = 600.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_pending = max_pending
        self.pending: OrderedDict[str, TrajectoryGroup] = OrderedDict()
        self.leased: dict[str, tuple[float, TrajectoryGroup]] = {}
        self.lease_s = lease_s  # unacked leases older than this are served again
        self.done: set[str] = set()
        self.counts = {"finished": 0, "served": 0, "dropped": 0, "recovered": 0}
        self._changed = asyncio.Condition()
        self._recover()
        self._groups = open(self.dir / "groups.log", "ab")  # noqa: SIM115
        self._served = open(self.dir / "served.log", "a", encoding="utf-8")  # noqa: SIM115

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        done_lines = self._read_served()
        path = self.dir / "groups.log"
        data = path.read_bytes() if path.exists() else b""
        pos = 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            body = data[pos + _FRAME.size : pos + _FRAME.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break
            try:
                group = decode_group(bytes(body))
            except WireError:
                break
            pos += _FRAME.size + length
            self.counts["finished"] += 1
            if group.group_id not in done_lines:
                self.pending[group.group_id] = group
                self.counts["recovered"] += 1
        if pos < len(data):  # a torn tail: cut it so new frames follow whole ones
            with open(path, "r+b") as fh:
                fh.truncate(pos)
                fh.flush()
                os.fsync(fh.fileno())
        self.done = set(done_lines)

    def _read_served(self) -> set[str]:
        path = self.dir / "served.log"
        ids = set()
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                parts = line.split(" ", 2)
                if len(parts) >= 2 and parts[0] in ("served", "dropped"):
                    ids.add(parts[1])
                    self.counts[parts[0]] += 1
        return ids

    # ------------------------------------------------------------------ producer

    async def put(self, group: TrajectoryGroup) -> None:
        """Persist a finished group, waiting while the buffer is full."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.pending) < self.max_pending)
            payload = bytes(encode_group(group))
            self._groups.write(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
            self._groups.flush()
            os.fsync(self._groups.fileno())
            self.pending[group.group_id] = group
            self.counts["finished"] += 1
            self._changed.notify_all()

    # ------------------------------------------------------------------ consumer

    async def take(self, n: int, timeout: float, is_stale=None) -> list[TrajectoryGroup]:
        """Up to ``n`` groups, waiting up to ``timeout`` s for the first; leased until acked.

        ``is_stale(group) -> reason or None`` drops groups too old to train on."""
        async with self._changed:
            self._expire_leases()
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.pending), timeout)
            except TimeoutError:
                return []
            out = []
            while self.pending and len(out) < n:
                gid, group = self.pending.popitem(last=False)
                reason = is_stale(group) if is_stale is not None else None
                if reason:
                    self._mark("dropped", gid, reason)
                    continue
                self.leased[gid] = (time.monotonic(), group)
                out.append(group)
            self._changed.notify_all()
            return out

    def ack(self, ids: list[str]) -> int:
        """The learner received these groups: they are served for good."""
        n = 0
        for gid in ids:
            if gid in self.done:
                continue
            self.leased.pop(gid, None)
            self.pending.pop(gid, None)  # an ack for a group re-queued after a restart
            self._mark("served", gid)
            n += 1
        return n

    def _mark(self, kind: str, gid: str, reason: str = "") -> None:
        line = f"{kind} {gid}" + (f" {reason}" if reason else "")
        self._served.write(line + "\n")
        self._served.flush()
        os.fsync(self._served.fileno())
        self.done.add(gid)
        self.counts[kind] += 1

    def _expire_leases(self) -> None:
        """Leases nobody acknowledged in ``lease_s`` (a consumer went away) go back first."""
        now = time.monotonic()
        for gid, (t, group) in reversed(list(self.leased.items())):
            if now - t > self.lease_s:
                del self.leased[gid]
                self.pending[gid] = group
                self.pending.move_to_end(gid, last=False)

    @property
    def depth(self) -> int:
        return len(self.pending)

    def close(self) -> None:
        self._groups.close()
        self._served.close()
