"""The rollout side's inference client against a loopback stand-in answering in SGLang's
documented ``/generate`` schema (``output_ids``, ``meta_info.finish_reason``,
``output_token_logprobs`` as ``[logprob, id, text]``, ``weight_version``): an aborted
generation is asked again, never handed to the episode as the model's reply, and a weight
update pauses the servers without aborting what runs. The same behaviour against the real
embedded server is in ``tests/learner/serving/test_serve.py``."""

from __future__ import annotations

from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from rollout.sidecar.inference import InferenceClient, InferenceError, Sampling


def reply(ids: list[int], finish: dict, version: str = "7") -> dict:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": len(ids),
            "weight_version": version,
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
        },
    }


@asynccontextmanager
async def loopback(app: web.Application):
    """``app`` served on a free loopback port for the block: its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def stand_in():
    """A server whose next /generate answers are scripted; it records every call."""
    state = {"answers": [], "calls": []}

    async def generate(request):
        body = await request.json()
        state["calls"].append(("/generate", body))
        return web.json_response(state["answers"].pop(0))

    async def control(request):
        state["calls"].append((request.path, await request.json()))
        return web.json_response({"success": True, "message": "ok"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/pause_generation", "/continue_generation", "/update_weights_from_disk"):
        app.router.add_post(path, control)
    async with loopback(app) as url, aiohttp.ClientSession() as session:
        yield state, InferenceClient([url], session, retries=2)


async def test_an_aborted_generation_is_asked_again_not_returned(stand_in):
    state, client = stand_in
    state["answers"] = [
        reply([], {"type": "abort", "message": "paused"}),
        reply([5, 6], {"type": "abort"}),
        reply([8, 9, 2], {"type": "stop", "matched": 2}, version="8"),
    ]
    g = await client.generate([1, 2, 3], Sampling(max_new_tokens=16))
    assert (g.output_ids, g.finish, g.weight_version) == ([8, 9, 2], "stop", "8")
    sent = [body for path, body in state["calls"] if path == "/generate"]
    assert len(sent) == 3 and all(b["input_ids"] == [1, 2, 3] for b in sent)
    assert len({b["rid"] for b in sent}) == 3  # each try a request of its own
    assert client.servers[0].healthy  # an abort is not the server failing


async def test_a_generation_aborted_on_every_try_is_an_infrastructure_error(stand_in):
    state, client = stand_in
    state["answers"] = [reply([4], {"type": "abort"}) for _ in range(3)]
    with pytest.raises(InferenceError, match=r"after 3 tries: .*aborted"):
        await client.generate([1, 2, 3], Sampling(max_new_tokens=16))


async def test_a_weight_update_pauses_with_retract_then_continues(stand_in):
    state, client = stand_in
    await client.update_weights("/ckpt/3", "3")
    assert [path for path, _ in state["calls"]] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    assert state["calls"][0][1] == {"mode": "retract"}
    assert state["calls"][1][1]["abort_all_requests"] is False


async def test_each_tokens_version_comes_from_the_servers_spans(stand_in):
    """SGLang's ``weight_versions`` spans (``[start, end)`` over the output) give every
    token its own version: 2 tokens of "7", then 3 of "8"; without spans, all "8"."""
    state, client = stand_in
    spans = reply([4, 5, 6, 7, 2], {"type": "stop", "matched": 2}, version="8")
    spans["meta_info"]["weight_versions"] = [
        {"version": "7", "start": 0, "end": 2},
        {"version": "8", "start": 2, "end": 5},
    ]
    state["answers"] = [spans, reply([4, 2], {"type": "stop", "matched": 2}, version="8")]
    g = await client.generate([1, 2, 3], Sampling(max_new_tokens=16))
    assert g.token_versions() == ["7", "7", "8", "8", "8"] and g.weight_version == "8"
    g = await client.generate([1, 2, 3], Sampling(max_new_tokens=16))
    assert g.token_versions() == ["8", "8"]


def test_vllm_replies_are_read_with_their_spans():
    """vLLM's ``/inference/v1/generate`` choice: ids, ``logprobs.content``, spans."""
    from rollout.sidecar.inference import _read, _vllm_generation

    data = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "token_ids": [9, 8, 7],
                "logprobs": {"content": [{"token_id": t, "logprob": -0.25 * t} for t in (9, 8, 7)]},
                "weight_versions": [
                    {"version": "3", "start": 0, "end": 1},
                    {"version": "4", "start": 1, "end": 3},
                ],
            }
        ]
    }
    g = _read(_vllm_generation, data)
    assert g.output_ids == [9, 8, 7] and g.logprobs == [-2.25, -2.0, -1.75]
    assert (g.finish, g.weight_version, g.token_versions()) == ("length", "4", ["3", "4", "4"])
    data["choices"][0]["logprobs"]["content"].pop()
    with pytest.raises(InferenceError, match="3 output ids but 2 logprobs"):
        _read(_vllm_generation, data)


async def test_a_vllm_server_is_ready_only_once_it_has_a_weight_version():
    """vLLM answers ``/health`` before its version is set (``GET /weight_info`` says
    ``"default"`` until ``/update_weight_version``): in that window its tokens carry no
    step, so a server that answers but has no version is not ready yet."""
    state = {"version": "default", "health": 200}

    async def health(request):
        return web.Response(status=state["health"])

    async def weight_info(request):
        return web.json_response({"weight_version": state["version"]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/weight_info", weight_info)
    async with loopback(app) as url, aiohttp.ClientSession() as session:
        vllm = InferenceClient([url], session, backend="vllm")
        sglang = InferenceClient([url], session, backend="sglang")
        assert await vllm.health() == {url: False}
        assert await sglang.health() == {url: True}  # SGLang takes its version at start
        state["version"] = "12"
        assert await vllm.health() == {url: True}
        state["health"] = 503
        assert await vllm.health() == {url: False}
