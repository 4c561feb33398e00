"""One episode as token sequences, for GRPO: the whole episode as one, or one per turn.

The prompt is the chat template applied to the system message (the mode's
actions) and the first user message (question and first observation). Then, per
step: the model's generated ids are appended exactly as the server returned
them (loss mask 1, the server's logprobs, the weight version that produced
them), never re-tokenized; the environment's observation follows as a new user
turn (mask 0), cut to ``observation_tokens``. An episode that would overflow
``max_context_tokens`` ends as truncated.

:func:`run_episode` returns that whole sequence (``rollout.trajectory =
"sequence"``). :func:`run_episode_turns` returns one sequence per turn
(``"per_turn"``): turn k's prompt (mask 0) is built by the :class:`Context`
policy from the head and the earlier turns, and is exactly what the inference
server was given for turn k; turn k's generated ids follow (mask 1). With
``history = "full"`` that prompt is the whole sequence's prefix, so the per-turn
sequences score the same tokens with the same prefixes; with ``"keep_last"``
only the last ``keep_last`` observations are kept and earlier ones become a
one-line stub (the action and the URL), so a long episode's turns each fit the
window although the whole episode would not. The model's own turns are kept
verbatim (observation masking). With ``"window"`` only the last ``keep_last`` turns
are kept at all (the model's action and the observation after it), earlier turns are
dropped: every turn's prompt is bounded (the head plus ``keep_last`` turns) however
long the episode runs.

A scripted policy (oracle, noisy oracle) runs through the same code: its text is
tokenized and marked as actions, with logprob 0 and version 0.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from rollout.env import Environment
from rollout.sidecar.inference import Generation, InferenceClient, InferenceError, Sampling
from shared.chat import TurnFormat, observation_turn, stub_text
from shared.tokenizer import Tokenizer
from shared.wire import Trajectory

HISTORIES = ("full", "keep_last", "window")  # env.history: what each turn's prompt keeps


@dataclass
class Sequence:
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    versions: list[int]

    def add(
        self, ids: list[int], *, mask: int, logprobs=None, version: int | list[int] = -1
    ) -> None:
        """Append ``ids``; ``version`` is one policy version for all, or one per id."""
        self.tokens += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        if not mask:
            self.versions += [-1] * len(ids)
        elif isinstance(version, list):
            self.versions += version
        else:
            self.versions += [version] * len(ids)


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


@dataclass(frozen=True)
class Context:
    """The context policy: which observations each turn's prompt holds (``env.history``)."""

    # "full": every observation; "keep_last": the last keep_last ones, older ones as stubs;
    # "window": the last keep_last turns only, older ones dropped
    history: str = "full"
    keep_last: int = 3  # observations (turns, under "window") kept verbatim

    def __post_init__(self) -> None:
        if self.history not in HISTORIES or self.keep_last < (self.history == "window"):
            raise ValueError(f"bad context policy {self.history!r} / keep_last {self.keep_last}")

    def prompt(self, head: list[int], turns: list[_Turn]) -> list[int]:
        """The prompt of the turn after ``turns``: the head, then each earlier turn's
        generated ids and its observation, verbatim or (older than keep_last) the stub;
        under "window" the turns older than the last keep_last are left out."""
        out = list(head)
        keep_from = len(turns) - self.keep_last if self.history != "full" else 0
        for j, t in enumerate(turns):
            if j < keep_from and self.history == "window":
                continue
            out += t.gen
            out += t.observation if j >= keep_from else t.stub
        return out


@dataclass
class _Turn:
    gen: list[int]  # the generated ids, as the server returned them
    observation: list[int]  # the observation turn that followed (closing, user turn)
    stub: list[int]  # the same turn with the observation replaced by a one-line stub


@dataclass
class _Played:
    whole: Sequence  # the episode as one sequence (history "full")
    turns: list[Sequence]  # each turn's prompt (mask 0) and generated ids (mask 1)
    status: str
    reward: float
    breakdown: dict
    times: dict[str, float]


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
    p = await _play(env, task, tok, limits, Context(), client, sampling, scripted)
    return _trajectory(p, p.whole, -1, env, task, group_id, sample_index)


async def run_episode_turns(
    env: Environment,
    task: dict,
    tok: Tokenizer,
    *,
    group_id: str,
    sample_index: int,
    limits: Limits,
    context: Context = Context(),
    client: InferenceClient | None = None,
    sampling: Sampling | None = None,
    scripted: Policy | None = None,
) -> list[Trajectory]:
    """Run one episode to its end; one trajectory per turn (turn 0, 1, ...), each with the
    episode's reward, status and steps. An episode without a turn gives its head as turn 0."""
    p = await _play(env, task, tok, limits, context, client, sampling, scripted)
    turns = p.turns or [Sequence(list(p.whole.tokens), [0] * len(p.whole.tokens),
                                 [0.0] * len(p.whole.tokens), [-1] * len(p.whole.tokens))]  # fmt: skip
    return [_trajectory(p, s, k, env, task, group_id, sample_index) for k, s in enumerate(turns)]


async def _play(env, task, tok, limits, context, client, sampling, scripted) -> _Played:
    t0 = time.monotonic()
    times = {"gen_s": 0.0, "env_s": 0.0}
    fmt = TurnFormat.of(tok)
    await env.reset(task)
    head = tok.encode(tok.apply_chat_template(env.messages(), add_generation_prompt=True))
    seq = Sequence([], [], [], [])
    seq.add(head, mask=0)
    turns: list[_Turn] = []
    out: list[Sequence] = []
    status, reward, breakdown = "truncated", 0.0, {}
    text = env.user_prompt()
    stops = set(tok.stop_ids)
    try:
        while True:
            prompt = context.prompt(head, turns)
            room = limits.max_context_tokens - len(prompt)
            if room < 4:
                break
            g0 = time.monotonic()
            gen = await _act(text, tok, prompt, room, limits, client, sampling, scripted, env)
            times["gen_s"] += time.monotonic() - g0
            version = [_version(v) for v in gen.token_versions()]  # the engine's, per token
            seq.add(gen.output_ids, mask=1, logprobs=gen.logprobs, version=version)
            n = len(prompt)
            turn = Sequence(list(prompt), [0] * n, [0.0] * n, [-1] * n)  # a copy: add() extends
            turn.add(gen.output_ids, mask=1, logprobs=gen.logprobs, version=version)
            out.append(turn)
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
            obs = observation_turn(tok, fmt, r.text, limits.observation_tokens, closing)
            stub = obs
            if context.history == "keep_last":
                s = env.record.steps[-1]
                line = stub_text(s.index, s.action, s.args, s.url)
                stub = observation_turn(tok, fmt, line, limits.observation_tokens, closing)
            turns.append(_Turn(list(gen.output_ids), obs, stub))
            if len(context.prompt(head, turns)) + 4 > limits.max_context_tokens:
                break  # the next prompt would overflow the context
            if context.history == "full":
                seq.add(obs, mask=0)
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
    return _Played(seq, out, status, reward, breakdown, times)


async def play_episode(env: Environment, task: dict, tok: Tokenizer, cfg, **kw) -> list[Trajectory]:
    """The episode's sequences as the run config ``cfg`` asks: one per turn under its
    context policy (``rollout.trajectory = "per_turn"``, ``env.history``), or one for the
    whole episode. ``kw``: :func:`run_episode`'s."""
    if cfg.rollout.trajectory == "per_turn":
        context = Context(cfg.env.history, cfg.env.keep_last)
        return await run_episode_turns(env, task, tok, context=context, **kw)
    return [await run_episode(env, task, tok, **kw)]


def _trajectory(p: _Played, seq: Sequence, turn, env, task, group_id, sample_index) -> Trajectory:
    return Trajectory(
        task_id=task["id"],
        group_id=group_id,
        sample_index=sample_index,
        tokens=np.asarray(seq.tokens, dtype=np.int32),
        loss_mask=np.asarray(seq.mask, dtype=np.uint8),
        logprobs=np.asarray(seq.logprobs, dtype=np.float32),
        versions=np.asarray(seq.versions, dtype=np.int32),
        reward=float(p.reward),
        reward_parts={k: float(v) for k, v in p.breakdown.items() if _numeric(v)},
        status=p.status,
        num_steps=len(env.record.steps),
        timings={k: float(v) for k, v in p.times.items() if k in ("gen_s", "env_s", "wall_s")},
        turn=turn,
    )


def _closing(fmt: TurnFormat, tok: Tokenizer, ids: list[int], stops: set[int]) -> str:
    """What still closes the assistant turn: its stop token may already be generated."""
    text = fmt.after_assistant
    last = tok.id_to_token(ids[-1]) if ids and ids[-1] in stops else None
    return text[len(last) :] if last and text.startswith(last) else text


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and v == v and abs(float(v)) != float("inf")


async def _act(text, tok, prompt, room, limits, client, sampling, scripted, env) -> Generation:
    if scripted is not None:
        ids = [*tok.encode(scripted(text))[: room - 1], tok.stop_ids[0]]
        return Generation(ids, [0.0] * len(ids), "stop", "0")
    assert client is not None and sampling is not None
    s = Sampling(**{**sampling.__dict__, "max_new_tokens": min(limits.max_new_tokens, room)})
    return await client.generate(prompt, s, episode=env.episode_id)


Runner = Callable[..., Awaitable[Trajectory]]
