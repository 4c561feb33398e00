"""Where the learner's groups come from: rollout sidecars over HTTP, round robin.

``GET /batch?groups=N&timeout=S&ack=ID,...`` long-polls one sidecar for up to N
finished groups. A group is acknowledged only once a *committed* checkpoint
covers it (its id is in that checkpoint's data cursor): a learner that dies
before the commit leaves its groups leased, the sidecar serves them again, and
the resumed learner trains on them exactly once. Groups the cursor already holds
(served again after a lease expired) are skipped and acknowledged.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence

from shared.wire import TrajectoryGroup, WireError, decode_groups


class SidecarError(RuntimeError):
    pass


class GroupSource:
    """Pulls groups from ``urls`` in turn; remembers what to acknowledge to each."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        poll_s: float = 30.0,
        auth_token: str | None = None,
        retry_s: float = 1.0,
        max_failures: int = 60,
    ) -> None:
        if not urls:
            raise ValueError("no sidecar URLs")
        self.urls = [u.rstrip("/") for u in urls]
        self.poll_s, self.retry_s, self.max_failures = poll_s, retry_s, max_failures
        self.headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.origin: dict[str, str] = {}  # group id -> the sidecar that served it
        self.to_ack: dict[str, set[str]] = {u: set() for u in self.urls}
        self._next = 0

    def take(
        self,
        n: int,
        consumed: set[str],
        on_arrival: Callable[[list[TrajectoryGroup]], None] | None = None,
    ) -> list[TrajectoryGroup]:
        """Exactly ``n`` groups none of which is in ``consumed`` (blocks until they come).
        ``on_arrival`` is called with each pull's new groups as they come, before the
        next pull (the learner runs the reference's forward pass on them meanwhile)."""
        out: list[TrajectoryGroup] = []
        failures = 0
        while len(out) < n:
            url = self.urls[self._next % len(self.urls)]
            self._next += 1
            try:
                groups = self._get(url, n - len(out))
                failures = 0
            except (OSError, urllib.error.URLError, SidecarError) as e:
                failures += 1
                if failures >= self.max_failures:
                    raise SidecarError(f"{url}: {e}") from e
                time.sleep(self.retry_s)
                continue
            taken = {g.group_id for g in out}
            new = []
            for g in groups:
                if g.group_id in consumed or g.group_id in taken:
                    self.to_ack[url].add(g.group_id)  # already trained on: confirm it again
                    continue
                self.origin[g.group_id] = url
                new.append(g)
                taken.add(g.group_id)
            out += new
            if new and on_arrival is not None:
                on_arrival(new)
        return out

    def committed(self, group_ids: Iterable[str]) -> None:
        """These groups are in a committed checkpoint: acknowledge them on the next requests."""
        for gid in group_ids:
            url = self.origin.pop(gid, None)
            if url is not None:
                self.to_ack[url].add(gid)

    def flush_acks(self) -> None:
        """Send the acknowledgements still owed (at the end of a run). The protocol asks for
        at least one group: any that comes back stays leased and is served again later."""
        for url in self.urls:
            if self.to_ack[url]:
                with contextlib.suppress(OSError, urllib.error.URLError, SidecarError):
                    self._get(url, 1, timeout=0.0)

    def _get(self, url: str, n: int, timeout: float | None = None) -> list[TrajectoryGroup]:
        acks = sorted(self.to_ack[url])
        query = {"groups": n, "timeout": self.poll_s if timeout is None else timeout}
        if acks:
            query["ack"] = ",".join(acks)
        req = urllib.request.Request(
            f"{url}/batch?{urllib.parse.urlencode(query)}", headers=self.headers
        )
        with urllib.request.urlopen(req, timeout=self.poll_s + 30) as resp:
            if resp.status != 200:
                raise SidecarError(f"GET /batch: HTTP {resp.status}")
            body = resp.read()
        self.to_ack[url] -= set(acks)
        try:
            return decode_groups(body)
        except WireError as e:  # retried like any other sidecar failure, then reported
            raise SidecarError(f"GET /batch: undecodable response: {e.reason}") from None

    def push_weights(self, version: int, path: str) -> list[str]:
        """``POST /weights`` to every sidecar; the messages of those that failed."""
        failed = []
        body = json.dumps({"version": version, "path": path}).encode()
        for url in self.urls:
            req = urllib.request.Request(
                f"{url}/weights",
                data=body,
                headers={**self.headers, "Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    reply = json.loads(resp.read() or b"{}")
                if not reply.get("success", False):
                    failed.append(f"{url}: {reply}")
            except (OSError, urllib.error.URLError, ValueError) as e:
                failed.append(f"{url}: {e}")
        return failed
