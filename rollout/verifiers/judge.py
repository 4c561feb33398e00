"""An LLM judge over any OpenAI-compatible ``POST /v1/chat/completions`` endpoint.

The judge is asked with a rubric to grade a candidate answer against the
reference answer and key facts, and must end its reply with the line
``VERDICT: CORRECT`` or ``VERDICT: INCORRECT``. Parsing is strict: a reply whose
last non-empty line is anything else is a judge error, never a silent 0. Each
request has a timeout; timeouts, connection errors, HTTP 429/5xx, malformed
responses and malformed verdicts are retried with exponential backoff, other
HTTP errors are not. After the last attempt :class:`JudgeError` is raised.

Judges favour long answers; :func:`length_bias` measures that on a set of answers
by grading each with and without neutral filler appended and reporting the gap.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from rollout.verifiers.config import JudgeConfig

VERDICTS = {"VERDICT: CORRECT": True, "VERDICT: INCORRECT": False}
T = TypeVar("T")

RUBRIC = (
    "You grade answers to research questions. Decide whether the candidate answer is "
    "correct: it must agree with the reference answer and state the key facts; a claim "
    "that contradicts them makes it incorrect. Length, style, confidence and text that adds "
    "no facts earn nothing. Think briefly, then end your reply with one final line that is "
    "exactly VERDICT: CORRECT or VERDICT: INCORRECT."
)

DEFAULT_FILLER = (
    "This answer was compiled after a careful review of the available sources. The "
    "information above has been checked for consistency, and the reasoning behind it "
    "follows the evidence as presented. Further context can be found in the material "
    "consulted while preparing it."
)


class JudgeError(RuntimeError):
    """The judge gave no usable verdict; ``attempts`` requests were made."""

    def __init__(self, reason: str, attempts: int = 1):
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts


class MalformedVerdict(JudgeError):
    """The judge replied, but not with a verdict line; worth another attempt."""


class _Retryable(Exception):
    """A failure worth another attempt."""


@dataclass(frozen=True)
class JudgeVerdict:
    correct: bool
    content: str  # the judge's whole reply
    attempts: int = 1

    @property
    def score(self) -> float:
        return 1.0 if self.correct else 0.0


def parse_verdict(content: str) -> bool:
    """True/False from the reply's last non-empty line; JudgeError for anything else."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    if not lines or lines[-1] not in VERDICTS:
        last = lines[-1][:80] if lines else "(empty reply)"
        raise MalformedVerdict(f"malformed verdict: the last line is {last!r}")
    return VERDICTS[lines[-1]]


def completions_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


def build_messages(
    question: str, answer: str, reference: str = "", key_facts: Sequence[str] = ()
) -> list[dict[str, str]]:
    """The rubric as the system message; question, reference, facts and answer as the user's."""
    parts = [f"Question:\n{question}"]
    if reference:
        parts.append(f"Reference answer:\n{reference}")
    if key_facts:
        parts.append("Key facts:\n" + "\n".join(f"- {fact}" for fact in key_facts))
    parts.append(f"Candidate answer:\n<<<\n{answer}\n>>>")
    return [{"role": "system", "content": RUBRIC}, {"role": "user", "content": "\n\n".join(parts)}]


class Judge:
    """A client of one judge endpoint. Use as ``async with Judge(config) as judge``, or pass
    an ``aiohttp.ClientSession`` the caller owns."""

    def __init__(self, config: JudgeConfig, session: aiohttp.ClientSession | None = None):
        self.config = config
        self._session = session
        self._owns_session = session is None
        self._url = completions_url(config.url)

    async def __aenter__(self) -> Judge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def grade(
        self, question: str, answer: str, *, reference: str = "", key_facts: Sequence[str] = ()
    ) -> JudgeVerdict:
        """The judge's verdict on ``answer``; :class:`JudgeError` when none could be had."""
        messages = build_messages(question, answer, reference, key_facts)
        correct, content, attempts = await self.ask(messages, parse_verdict)
        return JudgeVerdict(correct, content, attempts)

    async def ask(
        self, messages: list[dict[str, str]], parse: Callable[[str], T]
    ) -> tuple[T, str, int]:
        """One exchange under the config's timeout and retries: (``parse(reply)``, the
        reply, attempts made). ``parse`` raises :class:`MalformedVerdict` for a reply
        without a verdict, which is retried like a timeout; :class:`JudgeError` after
        the last attempt. The judge's grading and the process reward model share it."""
        cfg = self.config
        payload = {
            "model": cfg.model,
            "messages": messages,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
        }
        attempts = cfg.retries + 1
        last = ""
        for attempt in range(1, attempts + 1):
            try:
                content = await self._request(payload)
                return parse(content), content, attempt
            except (_Retryable, MalformedVerdict) as e:
                last = str(e)
            except JudgeError as e:
                raise JudgeError(e.reason, attempt) from None
            if attempt < attempts:
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1))
        raise JudgeError(f"no verdict after {attempts} attempts; last error: {last}", attempts)

    async def _request(self, payload: dict[str, Any]) -> str:
        """One POST; the reply's ``choices[0].message.content``."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {}
        if self.config.api_key_env and os.environ.get(self.config.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.config.api_key_env]}"
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        try:
            async with self._session.post(
                self._url, json=payload, headers=headers, timeout=timeout
            ) as resp:
                body = await resp.text(errors="replace")
                status = resp.status
        except TimeoutError:
            raise _Retryable(f"timed out after {self.config.timeout_s} s") from None
        except aiohttp.ClientError as e:
            raise _Retryable(f"request failed: {type(e).__name__}: {e}") from None
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}")
        if status >= 400:
            raise JudgeError(f"HTTP {status}: {body[:200]}")
        return _content(body)


def _content(body: str) -> str:
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Retryable(f"malformed response: {body[:120]!r}") from None
    if not isinstance(content, str):
        raise _Retryable("malformed response: message content is not a string")
    return content


# ----------------------------------------------------------------------------- length bias


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answer: str
    reference: str = ""
    key_facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class LengthBias:
    """How much appending filler that adds no facts moves the judge's scores."""

    items: int
    plain: float  # mean score of the answers as given
    padded: float  # mean score of the same answers with the filler appended
    flips: int  # answers whose verdict changed

    @property
    def gap(self) -> float:
        """padded - plain: > 0 means the judge rewards length."""
        return self.padded - self.plain


async def length_bias(
    judge: Judge, items: Sequence[JudgeItem], filler: str = DEFAULT_FILLER
) -> LengthBias:
    """Grade every answer with and without ``filler`` appended and compare."""

    async def score(item: JudgeItem, answer: str) -> float:
        verdict = await judge.grade(
            item.question, answer, reference=item.reference, key_facts=item.key_facts
        )
        return verdict.score

    plain = await asyncio.gather(*(score(i, i.answer) for i in items))
    padded = await asyncio.gather(*(score(i, f"{i.answer}\n\n{filler}") for i in items))
    n = len(items)
    return LengthBias(
        items=n,
        plain=sum(plain) / n if n else 0.0,
        padded=sum(padded) / n if n else 0.0,
        flips=sum(1 for a, b in zip(plain, padded, strict=True) if a != b),
    )
