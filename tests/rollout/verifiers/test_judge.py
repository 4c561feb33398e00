"""The LLM judge against a real OpenAI-compatible chat-completions server on 127.0.0.1.

The server checks the request schema and answers deterministically from markers
in the user message: ``[[slow]]`` sleeps past the client's timeout,
``[[malformed]]`` replies without a verdict line, ``[[flaky]]`` fails twice with
503 before answering, ``[[garbage]]`` returns a body that is not JSON and
``[[bad-request]]`` returns 400. Otherwise the answer is CORRECT when it mentions
Paris, or, on a length-biased server, when the judge's filler is appended.
"""

import asyncio
import time
import types
from collections import Counter
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.tracking.records import EpisodeRecord, Step
from rollout.verifiers import JudgeConfig, MultiDocConfig, VerifierConfig, verify_async
from rollout.verifiers import judge as judge_module
from rollout.verifiers.judge import (
    DEFAULT_FILLER,
    RUBRIC,
    Judge,
    JudgeError,
    JudgeItem,
    completions_url,
    length_bias,
    parse_verdict,
)
from tests.rollout.chat_stub import completion, serve_chat

QUESTION = "What is the capital of France?"


def valid_request(body: object) -> bool:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return False
    messages = body.get("messages")
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
            for m in messages
        )
    )


@dataclass
class FakeJudge:
    """What the server saw, and how it behaves."""

    biased: bool = True  # rewards the filler (a length-biased judge)
    requests: list = field(default_factory=list)
    seen: Counter = field(default_factory=Counter)  # requests per marker
    url: str = ""


STATE = web.AppKey("state", FakeJudge)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app[STATE]
    body = await request.json()
    app.requests.append({"body": body, "headers": dict(request.headers)})
    if not valid_request(body):
        return web.json_response({"error": {"message": "invalid request"}}, status=400)
    user = body["messages"][-1]["content"]
    for marker in ("[[slow]]", "[[malformed]]", "[[flaky]]", "[[garbage]]", "[[bad-request]]"):
        if marker in user:
            app.seen[marker] += 1
            break
    else:
        marker = ""
    if marker == "[[slow]]":
        await asyncio.sleep(3)
    elif marker == "[[malformed]]":
        return web.json_response(completion(body["model"], "I believe the answer is right."))
    elif marker == "[[flaky]]" and app.seen[marker] <= 2:
        return web.json_response({"error": "overloaded"}, status=503)
    elif marker == "[[garbage]]":
        return web.Response(text="<html>upstream error</html>", content_type="text/html")
    elif marker == "[[bad-request]]":
        return web.json_response({"error": {"message": "bad model"}}, status=400)
    answer = user.split("Candidate answer:", 1)[1]
    correct = "Paris" in answer or (app.biased and DEFAULT_FILLER in answer)
    verdict = "VERDICT: CORRECT" if correct else "VERDICT: INCORRECT"
    return web.json_response(completion(body["model"], f"The answer is checked.\n{verdict}\n"))


@pytest_asyncio.fixture
async def server():
    async with serve_chat(STATE, FakeJudge(), chat_completions) as state:
        yield state


def config(app, **over):
    fields = dict(url=app.url, model="judge-test", timeout_s=5.0, retries=2, backoff_s=0.01)
    fields.update(over)
    return JudgeConfig(**fields)


# ----------------------------------------------------------------------------- grading


async def test_a_correct_and_an_incorrect_verdict(server):
    async with Judge(config(server)) as judge:
        yes = await judge.grade(QUESTION, "Paris", reference="Paris", key_facts=("Paris",))
        no = await judge.grade(QUESTION, "Lyon", reference="Paris")
    assert (yes.correct, yes.score, yes.attempts) == (True, 1.0, 1)
    assert (no.correct, no.score) == (False, 0.0)
    body = server.requests[0]["body"]
    assert body["model"] == "judge-test" and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": RUBRIC}
    user = body["messages"][1]["content"]
    for part in (
        f"Question:\n{QUESTION}",
        "Reference answer:\nParis",
        "- Paris",
        "<<<\nParis\n>>>",
    ):
        assert part in user


async def test_the_bearer_token_comes_from_the_named_environment_variable(server, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-local")
    async with Judge(config(server, api_key_env="JUDGE_TEST_KEY")) as judge:
        await judge.grade(QUESTION, "Paris")
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-local"


async def test_a_slow_judge_times_out_and_is_retried(server):
    start = time.monotonic()
    async with Judge(config(server, timeout_s=0.2, retries=1)) as judge:
        with pytest.raises(JudgeError, match=r"timed out after 0\.2 s") as info:
            await judge.grade(QUESTION, "Paris [[slow]]")
    assert info.value.attempts == 2 and server.seen["[[slow]]"] == 2
    assert time.monotonic() - start < 2.0  # two 0.2 s attempts, not the server's 3 s


async def test_a_malformed_verdict_is_an_error_not_a_zero(server):
    async with Judge(config(server, retries=2)) as judge:
        with pytest.raises(JudgeError, match="malformed verdict") as info:
            await judge.grade(QUESTION, "Paris [[malformed]]")
    assert info.value.attempts == 3 and server.seen["[[malformed]]"] == 3


async def test_server_errors_are_retried_with_doubling_backoff(server, monkeypatch):
    delays = []

    async def no_wait(seconds):
        delays.append(seconds)

    monkeypatch.setattr(judge_module, "asyncio", types.SimpleNamespace(sleep=no_wait))
    async with Judge(config(server, retries=2, backoff_s=0.5)) as judge:
        verdict = await judge.grade(QUESTION, "Paris [[flaky]]")
    assert verdict.correct and verdict.attempts == 3  # 503, 503, then the verdict
    assert delays == [0.5, 1.0]


async def test_a_body_that_is_not_json_is_retried_then_reported(server):
    async with Judge(config(server, retries=1)) as judge:
        with pytest.raises(JudgeError, match="malformed response"):
            await judge.grade(QUESTION, "Paris [[garbage]]")
    assert server.seen["[[garbage]]"] == 2


async def test_client_errors_are_not_retried(server):
    async with Judge(config(server, retries=3)) as judge:
        with pytest.raises(JudgeError, match="HTTP 400") as info:
            await judge.grade(QUESTION, "Paris [[bad-request]]")
    assert info.value.attempts == 1 and server.seen["[[bad-request]]"] == 1


async def test_an_unreachable_judge_is_an_error(server):
    dead = JudgeConfig(url="http://127.0.0.1:9", retries=1, backoff_s=0.0, timeout_s=1.0)
    async with Judge(dead) as judge:
        with pytest.raises(JudgeError, match="request failed") as info:
            await judge.grade(QUESTION, "Paris")
    assert info.value.attempts == 2


@pytest.mark.parametrize(
    ("content", "verdict"),
    [
        ("Reasoning.\nVERDICT: CORRECT", True),
        ("VERDICT: INCORRECT\n\n  ", False),
        ("  VERDICT: CORRECT  ", True),
        ("VERDICT: CORRECT\nactually no", None),  # the verdict must be the last line
        ("verdict: correct", None),  # exact words only
        ("VERDICT: PARTIALLY CORRECT", None),
        ("**VERDICT: CORRECT**", None),
        ('{"score": 1}', None),
        ("", None),
    ],
)
def test_parse_verdict_is_strict(content, verdict):
    if verdict is None:
        with pytest.raises(JudgeError, match="malformed verdict"):
            parse_verdict(content)
    else:
        assert parse_verdict(content) is verdict


@pytest.mark.parametrize(
    "url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/chat/completions"]
)
def test_completions_url(url):
    assert completions_url(url) == "http://h:1/v1/chat/completions"


# ----------------------------------------------------------------------------- length bias

ITEMS = [JudgeItem(QUESTION, "Paris", "Paris"), JudgeItem(QUESTION, "Lyon", "Paris")]


async def test_length_bias_reports_the_gap_of_a_biased_judge(server):
    async with Judge(config(server)) as judge:
        report = await length_bias(judge, ITEMS)
    # plain: Paris correct, Lyon not -> 1/2; padded: both correct -> 2/2; gap 0.5, 1 flip
    assert (report.items, report.plain, report.padded, report.flips) == (2, 0.5, 1.0, 1)
    assert report.gap == 0.5


async def test_length_bias_of_an_unbiased_judge_is_zero(server):
    server.biased = False
    async with Judge(config(server)) as judge:
        report = await length_bias(judge, ITEMS)
    assert (report.plain, report.padded, report.gap, report.flips) == (0.5, 0.5, 0.0, 0)


# ----------------------------------------------------------------------------- in the verifier

MULTI = {
    "id": "train-multi_doc-000001",
    "question": QUESTION,
    "answer": "Paris",
    "type": "multi_doc",
    "hops": 1,
    "key_facts": ["Paris", "Seine"],
}


def researched():
    return EpisodeRecord("e", MULTI, "api", steps=[Step(1, "r", "search", {"query": "q"}, "x")])


def judged(app, on_error="raise"):
    multi = MultiDocConfig(judge=config(app, retries=0), on_judge_error=on_error)
    return VerifierConfig(multi_doc=multi)


async def test_verify_async_mixes_the_judge_into_multi_doc(server):
    reward = await verify_async(MULTI, "Paris", researched(), judged(server))
    # coverage: "paris" yes, "seine" no -> 1/2; judge CORRECT; 0.5 * 0.5 + 0.5 * 1 = 0.75
    assert reward.value == pytest.approx(0.75)
    assert reward.breakdown["judge_used"] is True
    async with Judge(config(server)) as shared:  # a caller's client is reused
        again = await verify_async(MULTI, "Paris", researched(), judged(server), judge=shared)
    assert again.value == pytest.approx(0.75)


async def test_a_judge_failure_raises_or_falls_back_as_configured(server):
    answer = "Paris [[malformed]]"
    with pytest.raises(JudgeError):
        await verify_async(MULTI, answer, researched(), judged(server))
    reward = await verify_async(MULTI, answer, researched(), judged(server, "coverage"))
    assert reward.value == pytest.approx(0.5)  # coverage 1/2 alone
    assert "malformed verdict" in reward.breakdown["judge_error"]
    assert reward.breakdown["judge_used"] is False


async def test_other_task_types_never_call_the_judge(server):
    qa = {**MULTI, "type": "qa"}
    reward = await verify_async(qa, "Paris", researched(), judged(server))
    assert reward.value == 1.0 and server.requests == []
    empty = await verify_async(MULTI, None, researched(), judged(server))
    assert empty.value == 0.0 and server.requests == []  # no answer, nothing to judge
