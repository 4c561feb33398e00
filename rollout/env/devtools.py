"""A browser's DevTools protocol on a websocket of the environment's own, uncompressed.

Playwright reaches the pool's browsers over CDP on a websocket that negotiates
permessage-deflate, so every reply is compressed by Chromium and inflated by
Playwright's driver before it is passed on. For a screenshot that is most of its
cost beyond the capture itself: a 1280 x 720 PNG of a text page is ~240 KB, ~325 KB in
base64, and deflating it took Chromium's DevTools thread ~22 ms a shot on a 2-core
machine (the capture's readback and encoding ~30 ms more; see docs/results/environment.md).
Screenshots go through this channel instead: the same browser, its DevTools port on
loopback, a flat session on the page's target, no compression.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

import aiohttp


async def page_target_id(context, page) -> str:
    """The DevTools target id of a Playwright ``page`` of ``context`` (asked on a session
    of Playwright's own, detached after), for :meth:`DevTools.attach`."""
    own = await context.new_cdp_session(page)
    try:
        info = await own.send("Target.getTargetInfo")
    finally:
        await own.detach()
    return info["targetInfo"]["targetId"]


class DevToolsError(Exception):
    """A protocol error the browser answered, or the channel closing under a call."""


class DevTools:
    """One websocket to a browser's DevTools endpoint (``ws://127.0.0.1:PORT/...``).

    ``await DevTools.connect(port)``; ``await dt.send(method, params, session=...)``;
    ``await dt.attach(target_id)`` gives a session id for a page's target (flat mode:
    the page's commands go on this same socket). ``close()`` ends it; calls in flight
    then fail with ``DevToolsError``."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse):
        self._http, self._ws = http, ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read(), name="devtools-reader")
        self.closed = False

    @classmethod
    async def connect(cls, port: int, timeout_s: float = 5.0) -> DevTools:
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        try:
            async with http.get(f"http://127.0.0.1:{port}/json/version") as r:
                url = (await r.json(content_type=None))["webSocketDebuggerUrl"]
            # compress=0: no permessage-deflate (the point); no size cap (a full-page shot)
            ws = await http.ws_connect(url, compress=0, max_msg_size=0, autoping=True)
        except BaseException:
            await http.close()
            raise
        return cls(http, ws)

    async def send(
        self, method: str, params: dict | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        if self.closed:
            raise DevToolsError(f"{method}: the DevTools channel is closed")
        i = next(self._ids)
        message: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        fut = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        try:
            await self._ws.send_str(json.dumps(message))
            return await fut
        finally:
            self._pending.pop(i, None)

    async def attach(self, target_id: str) -> str:
        """A flat session on ``target_id`` (a page's), for its commands on this socket."""
        r = await self.send("Target.attachToTarget", {"targetId": target_id, "flatten": True})
        return r["sessionId"]

    async def _read(self) -> None:
        why = "the DevTools channel closed"
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                fut = self._pending.get(data.get("id"))  # events (no id) are not asked for
                if fut is None or fut.done():
                    continue
                if "error" in data:
                    err = data["error"]
                    fut.set_exception(DevToolsError(f"{err.get('message')} ({err.get('code')})"))
                else:
                    fut.set_result(data.get("result", {}))
        except Exception as e:  # a broken socket: every call in flight learns why
            why = f"the DevTools channel broke: {e}"
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(DevToolsError(why))

    async def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader  # its finally fails the calls in flight
        await self._http.close()
