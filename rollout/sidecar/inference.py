"""Client for the inference engines: SGLang's native HTTP API (SGLang itself, or
``python -m learner.serve``, the embedded server that speaks the same protocol) and
vLLM's token-in/token-out API. Token ids in; token ids, per-token logprobs and the
weight version of every token out; the rollout never cares which engine answered.

- ``generate`` posts token ids with explicit sampling parameters and asks for the
  sampled tokens' logprobs; it returns output ids, per-token logprobs, the finish
  reason and, per token, the weight version that produced it, from the engine's
  own answer (its ``weight_versions`` spans: a generation the update reached
  mid-way records both versions, each on its own tokens).
- Timeouts on every call; connection errors and 5xx answers are retried with
  exponential backoff; a cancelled call aborts its request on the server.
- Several servers: an episode sticks to one server (its prompt prefix stays in
  that server's cache) unless the server is unhealthy; a new episode goes to the
  least-loaded healthy server.
- ``update_weights`` with each engine's own API, on every server, each result
  checked. SGLang (and ``learner.serve``): pause ``{"mode": "retract"}`` (running
  requests go back to the queue and are recomputed on the new weights; SGLang's
  default, ``abort``, would end them with what they had) ->
  ``/update_weights_from_disk`` with the policy version as ``weight_version`` ->
  continue. vLLM: ``/pause?mode=wait`` (running requests finish on the weights
  they started with; new ones wait) -> ``/collective_rpc`` ``reload_weights`` from
  the exported directory -> ``/update_weight_version`` -> ``/reset_prefix_cache``
  -> ``/resume``.
- A generation the server aborted (finish reason ``abort``: a pause, an abort from
  elsewhere) is not the model's reply: it is asked again, and after ``retries``
  aborted tries the call fails as an infrastructure error.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

BACKENDS = ("embedded", "sglang", "vllm")
VLLM_UNSET = "default"  # a vLLM engine's weight version until one is set


class InferenceError(RuntimeError):
    """An inference server failed in a way retries did not fix (an infrastructure error)."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # generate max_new_tokens whatever the model's eos (benchmarks)

    def as_params(self) -> dict:
        """SGLang's ``sampling_params``."""
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "no_stop_trim": True,  # keep the stop token: the sequence is what was sampled
            "skip_special_tokens": False,
        }
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params

    def as_vllm_params(self) -> dict:
        """vLLM's ``SamplingParams``: the sampled token's logprob only (``logprobs: 0``)."""
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k if self.top_k > 0 else 0,
            "max_tokens": self.max_new_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "logprobs": 0,
            "skip_special_tokens": False,
            "detokenize": False,
        }
        if self.seed is not None:
            params["seed"] = self.seed
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]  # one per output id
    finish: str  # "stop" | "length" | "abort"
    weight_version: str  # the version the generation ended under
    versions: tuple[str, ...] = ()  # per output id, from the engine's spans; () = all one

    def token_versions(self) -> list[str]:
        """The weight version that produced each output token."""
        return (
            list(self.versions) if self.versions else [self.weight_version] * len(self.output_ids)
        )


@dataclass(eq=False)
class _Server:
    url: str
    inflight: int = 0
    healthy: bool = True
    failures: int = 0


@dataclass
class InferenceClient:
    urls: list[str]
    session: aiohttp.ClientSession
    timeout_s: float = 60.0
    retries: int = 3
    backend: str = "sglang"  # the protocol: "sglang" (SGLang, learner.serve) or "vllm"
    servers: list[_Server] = field(init=False)
    sticky: dict[str, _Server] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("at least one inference server URL is needed")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        self.servers = [_Server(u.rstrip("/")) for u in self.urls]

    @property
    def vllm(self) -> bool:
        return self.backend == "vllm"

    # ------------------------------------------------------------------ routing

    def _pick(self, episode: str | None) -> _Server:
        s = self.sticky.get(episode) if episode else None
        if s is not None and s.healthy:
            return s
        candidates = [s for s in self.servers if s.healthy] or self.servers
        s = min(candidates, key=lambda x: (x.inflight, self.servers.index(x)))
        if episode:
            self.sticky[episode] = s
        return s

    def release(self, episode: str) -> None:
        """Forget an episode's server (call when the episode ends)."""
        self.sticky.pop(episode, None)

    # ------------------------------------------------------------------ generate

    def _request(self, input_ids: list[int], sampling: Sampling, rid: str) -> tuple[str, dict]:
        if self.vllm:
            body = {"request_id": rid, "token_ids": input_ids,
                    "sampling_params": sampling.as_vllm_params()}  # fmt: skip
            return "/inference/v1/generate", body
        body = {
            "input_ids": input_ids,
            "sampling_params": sampling.as_params(),
            "return_logprob": True,
            "logprob_start_len": len(input_ids),
            "rid": rid,
        }
        return "/generate", body

    async def generate(
        self, input_ids: list[int], sampling: Sampling, *, episode: str | None = None
    ) -> Generation:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
            server = self._pick(episode)
            rid = uuid.uuid4().hex
            path, body = self._request(input_ids, sampling, rid)
            try:
                data = await self._post(server, path, body)
                server.failures, server.healthy = 0, True
                gen = _read(_vllm_generation if self.vllm else _generation, data)
                if gen.finish == "abort":  # cut short by the server, not ended by the model
                    last = _Retryable(f"{server.url}{path}: the request was aborted")
                    continue
                return gen
            except asyncio.CancelledError:
                asyncio.ensure_future(self._abort(server, rid))  # noqa: RUF006
                raise
            except (aiohttp.ClientConnectionError, TimeoutError, _Retryable) as e:
                last = e
                server.failures += 1
                server.healthy = server.failures < 2
        raise InferenceError(f"generate failed after {self.retries + 1} tries: {last!r}")

    async def _post(
        self, server: _Server, path: str, body: dict | None, *, timeout_s: float | None = None
    ) -> Any:
        server.inflight += 1
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
            async with self.session.post(server.url + path, json=body, timeout=timeout) as r:
                if r.status >= 500:
                    raise _Retryable(f"{server.url}{path}: HTTP {r.status}: {await _text(r)}")
                if r.status != 200:
                    raise InferenceError(f"{server.url}{path}: HTTP {r.status}: {await _text(r)}")
                if r.content_type != "application/json":
                    return {}
                return await r.json()
        finally:
            server.inflight -= 1

    async def _abort(self, server: _Server, rid: str) -> None:
        path, body = ("/abort_requests", {"request_ids": [rid]}) if self.vllm else (
            "/abort_request", {"rid": rid})  # fmt: skip
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            await self.session.post(server.url + path, json=body, timeout=timeout)
        except (aiohttp.ClientError, TimeoutError):
            pass

    # ------------------------------------------------------------------ weights

    async def update_weights(self, path: str, version: str) -> None:
        """Every server loads the new weights; raises when any of them fails to."""
        update = self._update_vllm if self.vllm else self._update_sglang
        results = await asyncio.gather(
            *(update(s, path, version) for s in self.servers), return_exceptions=True
        )
        failed = [
            f"{s.url}: {r}" for s, r in zip(self.servers, results, strict=True) if r is not None
        ]
        if failed:
            raise InferenceError(f"weight update to {version} failed: {'; '.join(failed)}")

    @property
    def _load_timeout_s(self) -> float:
        """A weight load (and vLLM's wait for running requests): at least 10 minutes."""
        return max(self.timeout_s, 600.0)

    async def _update_sglang(self, s: _Server, path: str, version: str) -> None:
        await self._post(s, "/pause_generation", {"mode": "retract"})  # running ones are kept
        try:
            r = await self._post(
                s,
                "/update_weights_from_disk",
                {"model_path": path, "weight_version": version, "flush_cache": True,
                 "abort_all_requests": False},
                timeout_s=self._load_timeout_s,
            )  # fmt: skip
            if not r.get("success"):
                raise InferenceError(r.get("message") or "update_weights_from_disk failed")
        finally:
            await self._resume(s, "/continue_generation", {})

    async def _update_vllm(self, s: _Server, path: str, version: str) -> None:
        # vLLM's engine dies when reload_weights finds no checkpoint (EngineDeadError,
        # the server exits): a path that is not an export is refused here, before it
        if not (Path(path) / "config.json").is_file():
            raise InferenceError(f"{path}: not an HF export (no config.json); nothing loaded")
        # mode=wait: running requests end on the weights they began with (a reload under
        # a kept request would leave its KV computed by the old weights)
        await self._post(s, "/pause?mode=wait", None, timeout_s=self._load_timeout_s)
        try:
            r = await self._post(
                s,
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": path}},
                timeout_s=self._load_timeout_s,
            )
            if not isinstance(r, dict):
                raise InferenceError(f"reload_weights: unexpected answer {r!r}")
            await self._post(s, "/update_weight_version", {"new_version": version})
            await self._post(s, "/reset_prefix_cache", None)
        finally:
            await self._resume(s, "/resume", None)

    async def _resume(self, s: _Server, path: str, body: dict | None) -> None:
        try:
            await self._post(s, path, body)
        except (aiohttp.ClientError, TimeoutError, InferenceError, _Retryable):
            s.healthy = False

    async def health(self) -> dict[str, bool]:
        """Each server's readiness: it answers ``/health``, and a vLLM server also has a
        weight version. vLLM starts as ``"default"`` and takes its version by a request
        after it serves (``learner.engines`` sends it at once), so a restarted engine is
        ready only when that has landed: before, its tokens would carry no step."""
        out = {}
        timeout = aiohttp.ClientTimeout(total=5)
        for s in self.servers:
            try:
                async with self.session.get(s.url + "/health", timeout=timeout) as r:
                    s.healthy = r.status == 200
                if s.healthy and self.vllm:
                    async with self.session.get(s.url + "/weight_info", timeout=timeout) as r:
                        info = await r.json() if r.status == 200 else {}
                    s.healthy = info.get("weight_version", VLLM_UNSET) != VLLM_UNSET
            except (aiohttp.ClientError, TimeoutError, ValueError):
                s.healthy = False
            out[s.url] = s.healthy
        return out


class _Retryable(Exception):
    pass


async def _text(r: aiohttp.ClientResponse) -> str:
    return (await r.text())[:2000]


def _span_versions(spans: list[dict] | None, n: int, last: str) -> tuple[str, ...]:
    """Per-token versions from ``[{"version", "start", "end"}, ...]`` covering ``n``
    output tokens; () when the engine gave none (every token then has ``last``)."""
    if not spans:
        return ()
    out = [last] * n
    for sp in spans:
        a, b = int(sp["start"]), min(int(sp["end"]), n)
        out[a:b] = [str(sp["version"])] * max(0, b - a)
    return tuple(out)


def _generation(data: dict) -> tuple:
    """SGLang's response: ``output_ids`` and ``meta_info`` (logprobs as [lp, id, text],
    ``weight_version`` and, when the weights changed under it, ``weight_versions``)."""
    meta = data["meta_info"]
    ids = [int(t) for t in data["output_ids"]]
    lps = [float(item[0]) for item in meta["output_token_logprobs"]]
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type", "length") if isinstance(finish, dict) else str(finish)
    return ids, lps, kind, str(meta.get("weight_version", "")), meta.get("weight_versions")


def _vllm_generation(data: dict) -> tuple:
    """vLLM's ``/inference/v1/generate`` response: ``choices[0]`` with ``token_ids``,
    ``logprobs.content[].logprob``, ``finish_reason`` and ``weight_versions`` spans."""
    choice = data["choices"][0]
    ids = [int(t) for t in choice["token_ids"]]
    content = (choice.get("logprobs") or {}).get("content") or []
    lps = [float(item["logprob"]) for item in content]
    spans = choice.get("weight_versions") or []
    version = str(spans[-1]["version"]) if spans else ""
    return ids, lps, str(choice.get("finish_reason") or "length"), version, spans


def _read(parse, data: dict) -> Generation:
    """A reply read by ``parse`` into a checked :class:`Generation`, each token with its
    version; an unreadable reply is an infrastructure error."""
    try:
        ids, lps, kind, version, spans = parse(data)
        versions = _span_versions(spans, len(ids), version)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise InferenceError(f"unreadable generate response: {e!r}") from None
    if len(lps) != len(ids):
        raise InferenceError(f"{len(ids)} output ids but {len(lps)} logprobs")
    return Generation(ids, lps, kind, version, versions)
