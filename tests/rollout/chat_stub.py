"""A real OpenAI-compatible chat-completions server on 127.0.0.1 for the tests of the
clients that call one (the LLM judge, the PRM): the response body and the server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


def completion(model: str, content: str) -> dict:
    """A chat-completions response body carrying ``content``, as the API documents it."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }  # fmt: skip


@asynccontextmanager
async def serve_chat(
    key: web.AppKey,
    state: Any,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[Any]:
    """Serve ``handler`` at ``/v1/chat/completions`` on a free port, with ``state`` under
    ``key`` in the app; ``state.url`` is set to the server's base URL."""
    app = web.Application()
    app[key] = state
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield state
    finally:
        await runner.cleanup()
