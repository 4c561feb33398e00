"""One episode as one token sequence, for GRPO.

The prompt is the chat template applied to the system message (the mode's
actions) and the first user message (question and first observation). Then, per
step: the model's generated ids are appended exactly as the server returned
them (loss mask 1, the server's logprobs, the weight version that produced
them), never re-tokenized; the environment's observation follows as a new user
turn (mask 0), cut to ``observation_tokens``. An episode that would overflow
``max_context_tokens`` ends as truncated.

A scripted policy (oracle, noisy oracle) runs through the same code: its text is
tokenized and marked as actions, with logprob 0 and version 0.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from rollout.env import Environment
from rollout.inference import Generation, InferenceClient, InferenceError, Sampling
from shared.chat import TurnFormat, observation_turn
from shared.tokenizer import Tokenizer
from shared.wire import Trajectory


@dataclass
class Sequence:
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    versions: list[int]

    def add(self, ids: list[int], *, mask: int, logprobs=None, version: int = -1) -> None:
        self.tokens += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.versions += [version if mask else -1] * len(ids)


Policy = Callable[[str], str]  # scripted: last observation text -> model text


@dataclass(frozen=True)
class Limits:
    max_context_tokens: int = 1024
    observation_tokens: int = 256
    max_new_tokens: int = 64


def _version(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0


async def run_episode(
    env: Environment,
    task: dict,
    tok: Tokenizer,
    *,
    group_id: str,
    sample_index: int,
    limits: Limits,
    client: InferenceClient | None = None,
    sampling: Sampling | None = None,
    scripted: Policy | None = None,
) -> Trajectory:
    """Run one episode to its end; returns the trajectory (status ok/truncated/infra_error)."""
    t0 = time.monotonic()
    times = {"gen_s": 0.0, "env_s": 0.0}
    fmt = TurnFormat.of(tok)
    await env.reset(task)
    prompt = tok.apply_chat_template(env.messages(), add_generation_prompt=True)
    seq = Sequence([], [], [], [])
    seq.add(tok.encode(prompt), mask=0)
    status, reward, breakdown = "truncated", 0.0, {}
    text = env.user_prompt()
    stops = set(tok.stop_ids)
    try:
        while True:
            room = limits.max_context_tokens - len(seq.tokens)
            if room < 4:
                break
            g0 = time.monotonic()
            gen = await _act(text, tok, seq, room, limits, client, sampling, scripted, env)
            times["gen_s"] += time.monotonic() - g0
            seq.add(
                gen.output_ids, mask=1, logprobs=gen.logprobs, version=_version(gen.weight_version)
            )
            reply = tok.decode([t for t in gen.output_ids if t not in stops])
            e0 = time.monotonic()
            r = await env.step(reply)
            times["env_s"] += time.monotonic() - e0
            if r.terminated or r.truncated:
                status = r.info.get("status", "ok")
                reward = r.reward
                breakdown = r.info.get("reward_breakdown", {})
                break
            closing = (
                fmt.after_assistant if not (gen.output_ids and gen.output_ids[-1] in stops) else ""
            )
            turn = observation_turn(tok, fmt, r.text, limits.observation_tokens, closing)
            if len(seq.tokens) + len(turn) + 4 > limits.max_context_tokens:
                break  # the next observation would overflow the context
            seq.add(turn, mask=0)
            text = r.text
        if not env.done:  # the context budget ran out before the step budget
            scored = await env.truncate()
            reward, breakdown = scored.value, scored.breakdown
    except InferenceError as e:
        status, reward, breakdown = "infra_error", 0.0, {}
        env.record.error = str(e)
    finally:
        await env.close()
        if client is not None:
            client.release(env.episode_id)
    times["wall_s"] = time.monotonic() - t0
    return Trajectory(
        task_id=task["id"],
        group_id=group_id,
        sample_index=sample_index,
        tokens=np.asarray(seq.tokens, dtype=np.int32),
        loss_mask=np.asarray(seq.mask, dtype=np.uint8),
        logprobs=np.asarray(seq.logprobs, dtype=np.float32),
        versions=np.asarray(seq.versions, dtype=np.int32),
        reward=float(reward),
        reward_parts={k: float(v) for k, v in breakdown.items() if _numeric(v)},
        status=status,
        num_steps=len(env.record.steps),
        timings={k: float(v) for k, v in times.items() if k in ("gen_s", "env_s", "wall_s")},
    )


def _closing(fmt: TurnFormat, tok: Tokenizer, ids: list[int], stops: set[int]) -> str:
    """What still closes the assistant turn: its stop token may already be generated."""
    text = fmt.after_assistant
    last = tok.id_to_token(ids[-1]) if ids and ids[-1] in stops else None
    return text[len(last) :] if last and text.startswith(last) else text


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and v == v and abs(float(v)) != float("inf")


async def _act(text, tok, seq, room, limits, client, sampling, scripted, env) -> Generation:
    if scripted is not None:
        ids = [*tok.encode(scripted(text))[: room - 1], tok.stop_ids[0]]
        return Generation(ids, [0.0] * len(ids), "stop", "0")
    assert client is not None and sampling is not None
    s = Sampling(**{**sampling.__dict__, "max_new_tokens": min(limits.max_new_tokens, room)})
    return await client.generate(seq.tokens, s, episode=env.episode_id)


Runner = Callable[..., Awaitable[Trajectory]]
