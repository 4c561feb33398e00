"""SGLang's ``/generate`` request and response, as plain data: parsing and shaping.

Kept apart from the HTTP server so the protocol can be tested without one and
read in one place. Field names and shapes follow SGLang's native API; where this
server differs it says so (``seed`` is an alias of SGLang's ``sampling_seed``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from learner.serving.engine import Request, SamplingParams
from shared.tokenizer import Tokenizer

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default

# Accepted for compatibility when left at their neutral value; anything else is refused
# rather than silently ignored.
NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "n": 1,
    "stop": None,
    "spaces_between_special_tokens": True,
}


class ApiError(ValueError):
    """A request the server refuses (HTTP 400), with the reason."""


@dataclass(frozen=True)
class ReplyOptions:
    """How one request wants its reply shaped."""

    return_logprob: bool = False
    return_text_in_logprobs: bool = False


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    """A field given once for the whole batch, or as a list with one value per item."""
    if isinstance(value, list):
        if len(value) != n:
            raise ApiError(f"{name} has {len(value)} items for a batch of {n}")
        return value
    return [value] * n


def _prompts(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[list[int]], bool]:
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise ApiError("give exactly one of input_ids and text")
    if text is not None:
        if isinstance(text, str):
            return [tokenizer.encode(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return tokenizer.encode_batch(text), True
        raise ApiError("text must be a string or a non-empty list of strings")
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        prompts, batched = ids, True
    else:
        prompts, batched = [ids], False
    for p in prompts:
        if not isinstance(p, list) or not all(type(t) is int for t in p):
            raise ApiError("input_ids must be a list of integers or a list of such lists")
    return prompts, batched


def parse_sampling(raw: Any) -> SamplingParams:
    """SGLang ``sampling_params`` -> :class:`SamplingParams`, validated."""
    if raw is not None and not isinstance(raw, dict):
        raise ApiError("sampling_params must be an object")
    raw = dict(raw or {})
    seed = raw.pop("sampling_seed", None)
    seed = raw.pop("seed", seed)
    for key, neutral in NEUTRAL.items():
        value = raw.pop(key, neutral)
        if value not in (neutral, [], None):
            raise ApiError(f"sampling_params.{key} = {value!r} is not supported by this server")
    known = set(SamplingParams.__dataclass_fields__) - {"seed"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ApiError(f"unknown sampling_params: {', '.join(unknown)}")
    p = SamplingParams(**{**raw, "seed": seed})
    p.max_new_tokens = DEFAULT_MAX_NEW_TOKENS if p.max_new_tokens is None else p.max_new_tokens
    checks = [
        (isinstance(p.temperature, int | float) and p.temperature >= 0, "temperature >= 0"),
        (isinstance(p.top_p, int | float) and 0 < p.top_p <= 1, "top_p in (0, 1]"),
        (type(p.top_k) is int and (p.top_k == -1 or p.top_k >= 1), "top_k = -1 or >= 1"),
        (type(p.max_new_tokens) is int and p.max_new_tokens >= 0, "max_new_tokens >= 0"),
        (seed is None or type(seed) is int, "an integer sampling_seed"),
        (
            isinstance(p.stop_token_ids, list | tuple)
            and all(type(t) is int for t in p.stop_token_ids),
            "stop_token_ids as a list of integers",
        ),
    ]
    for ok, expected in checks:
        if not ok:
            raise ApiError(f"sampling_params: expected {expected}")
    p.stop_token_ids = tuple(p.stop_token_ids or ())
    return p


def parse_generate(
    body: dict[str, Any], tokenizer: Tokenizer
) -> tuple[list[Request], bool, list[ReplyOptions]]:
    """A ``/generate`` body -> (requests, whether it was a batch, reply options per request)."""
    if body.get("stream"):
        raise ApiError("stream = true is not supported by this server")
    prompts, batched = _prompts(body, tokenizer)
    n = len(prompts)
    sampling = body.get("sampling_params") or {}
    sampling = sampling if isinstance(sampling, list) else [sampling] * n
    if len(sampling) != n:
        raise ApiError(f"sampling_params has {len(sampling)} items for a batch of {n}")
    rids = _per_item(body.get("rid"), n, "rid")
    want = _per_item(body.get("return_logprob", False), n, "return_logprob")
    starts = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len")
    text_in = bool(body.get("return_text_in_logprobs", False))
    reqs, opts = [], []
    for i in range(n):
        rid = rids[i] if rids[i] is not None else uuid.uuid4().hex
        start = starts[i] if starts[i] is not None else -1
        if type(start) is not int:
            raise ApiError("logprob_start_len must be an integer")
        start = start if want[i] else -1
        reqs.append(Request(str(rid), list(prompts[i]), parse_sampling(sampling[i]), start))
        opts.append(ReplyOptions(bool(want[i]), text_in))
    return reqs, batched, opts


def _logprob_items(
    logprobs: list[float | None], ids: list[int], tokenizer: Tokenizer, with_text: bool
) -> list[list[Any]]:
    """SGLang's ``[logprob, token_id, text | null]`` triples."""
    return [
        [lp, tid, tokenizer.decode([tid], skip_special_tokens=False) if with_text else None]
        for lp, tid in zip(logprobs, ids, strict=True)
    ]


def version_spans(changes: list[tuple[str, int]], last: str, n: int) -> list[dict[str, Any]]:
    """SGLang's ``weight_versions``: ``{"version", "start", "end"}`` over the ``n`` output
    tokens, from (old version, tokens generated under it) at each update, then ``last``."""
    spans: list[dict[str, Any]] = []
    for version, end in [*changes, (last, n)]:
        end = min(end, n)
        start = spans[-1]["end"] if spans else 0
        if end <= start:
            continue
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = end
        else:
            spans.append({"version": version, "start": start, "end": end})
    return spans


def build_response(
    r: Request, opts: ReplyOptions, tokenizer: Tokenizer, weight_version: str, latency: float
) -> dict[str, Any]:
    """One item of a ``/generate`` reply."""
    fr = r.finish_reason or {"type": "abort", "message": "aborted"}
    visible = r.output_ids
    if fr["type"] == "stop" and not r.params.no_stop_trim and visible:
        visible = visible[:-1]  # the text leaves the matched stop token out; output_ids keep it
    meta: dict[str, Any] = {
        "id": r.rid,
        "finish_reason": fr,
        "prompt_tokens": len(r.input_ids),
        "completion_tokens": len(r.output_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
        "e2e_latency": latency,
    }
    if r.version_changes:
        meta["weight_versions"] = version_spans(
            r.version_changes, weight_version, len(r.output_ids)
        )
    if opts.return_logprob:
        w = opts.return_text_in_logprobs
        meta["output_token_logprobs"] = _logprob_items(
            r.output_logprobs, r.output_ids, tokenizer, w
        )
        if r.input_logprobs is not None:
            start = len(r.input_ids) - len(r.input_logprobs)
            meta["input_token_logprobs"] = _logprob_items(
                r.input_logprobs, r.input_ids[start:], tokenizer, w
            )
    return {
        "text": tokenizer.decode(visible, skip_special_tokens=r.params.skip_special_tokens),
        "output_ids": list(r.output_ids),
        "meta_info": meta,
    }
