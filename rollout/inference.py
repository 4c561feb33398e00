"""Client for inference servers speaking SGLang's native HTTP API (SGLang itself, or
``python -m learner.serve``, the embedded server that speaks the same protocol).

- ``generate`` posts token ids with explicit sampling parameters and
  ``return_logprob``, and returns output ids, per-token logprobs, the finish
  reason and the weight version that produced them.
- Timeouts on every call; connection errors and 5xx answers are retried with
  exponential backoff; a cancelled call aborts its request on the server
  (``/abort_request`` with the request's ``rid``).
- Several servers: an episode sticks to one server (its prompt prefix stays in
  that server's cache) unless the server is unhealthy; a new episode goes to the
  least-loaded healthy server.
- ``update_weights``: pause -> ``/update_weights_from_disk`` -> continue on every
  server, each result checked. The pause is ``{"mode": "retract"}``: running requests
  go back to the server's queue and finish under the new weights (SGLang's default
  mode, ``abort``, would end them with what they had generated so far).
- A generation the server aborted (``finish_reason`` ``abort``: a pause, an
  ``/abort_request`` from elsewhere) is not the model's reply: it is asked again, and
  after ``retries`` aborted tries the call fails as an infrastructure error.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import aiohttp


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

    def as_params(self) -> dict:
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
        return params


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]  # one per output id
    finish: str  # "stop" | "length" | "abort"
    weight_version: str


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
    servers: list[_Server] = field(init=False)
    sticky: dict[str, _Server] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("at least one inference server URL is needed")
        self.servers = [_Server(u.rstrip("/")) for u in self.urls]

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

    async def generate(
        self, input_ids: list[int], sampling: Sampling, *, episode: str | None = None
    ) -> Generation:
        payload = {
            "input_ids": input_ids,
            "sampling_params": sampling.as_params(),
            "return_logprob": True,
            "logprob_start_len": len(input_ids),
        }
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
            server = self._pick(episode)
            rid = uuid.uuid4().hex
            try:
                data = await self._post(server, "/generate", {**payload, "rid": rid})
                server.failures, server.healthy = 0, True
                gen = _generation(data)
                if gen.finish == "abort":  # cut short by the server, not ended by the model
                    last = _Retryable(f"{server.url}/generate: the request was aborted")
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

    async def _post(self, server: _Server, path: str, body: dict) -> dict:
        server.inflight += 1
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.post(server.url + path, json=body, timeout=timeout) as r:
                if r.status >= 500:
                    raise _Retryable(f"{server.url}{path}: HTTP {r.status}")
                if r.status != 200:
                    raise InferenceError(f"{server.url}{path}: HTTP {r.status}: {await r.text()}")
                return await r.json()
        finally:
            server.inflight -= 1

    async def _abort(self, server: _Server, rid: str) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            await self.session.post(
                server.url + "/abort_request", json={"rid": rid}, timeout=timeout
            )
        except (aiohttp.ClientError, TimeoutError):
            pass

    # ------------------------------------------------------------------ weights

    async def update_weights(self, path: str, version: str) -> None:
        """Every server loads the new weights; raises when any of them fails to."""
        for s in self.servers:  # retract: running requests are kept, not aborted
            await self._post(s, "/pause_generation", {"mode": "retract"})
        try:
            results = await asyncio.gather(
                *(
                    self._post(
                        s,
                        "/update_weights_from_disk",
                        {"model_path": path, "weight_version": version, "flush_cache": True,
                         "abort_all_requests": False},
                    )
                    for s in self.servers
                ),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for s in self.servers:
                try:
                    await self._post(s, "/continue_generation", {})
                except (aiohttp.ClientError, TimeoutError, InferenceError):
                    s.healthy = False
        failed = [
            f"{s.url}: {r if isinstance(r, Exception) else r.get('message')}"
            for s, r in zip(self.servers, results, strict=True)
            if isinstance(r, Exception) or not r.get("success")
        ]
        if failed:
            raise InferenceError(f"weight update to {version} failed: {'; '.join(failed)}")

    async def health(self) -> dict[str, bool]:
        out = {}
        for s in self.servers:
            try:
                timeout = aiohttp.ClientTimeout(total=5)
                async with self.session.get(s.url + "/health", timeout=timeout) as r:
                    s.healthy = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                s.healthy = False
            out[s.url] = s.healthy
        return out


class _Retryable(Exception):
    pass


def _generation(data: dict) -> Generation:
    """SGLang's response: ``output_ids`` and ``meta_info`` (logprobs as [lp, id, text])."""
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        lps = [float(item[0]) for item in meta["output_token_logprobs"]]
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type", "length") if isinstance(finish, dict) else str(finish)
        version = str(meta.get("weight_version", ""))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise InferenceError(f"unreadable generate response: {e!r}") from None
    if len(lps) != len(ids):
        raise InferenceError(f"{len(ids)} output ids but {len(lps)} logprobs")
    return Generation(ids, lps, kind, version)
