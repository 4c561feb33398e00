"""An episode as one token sequence: the layout both the rollout side and SFT use.

The prompt is the chat template applied to the system message and the first user
message. Then, per step: the assistant's ids (loss mask 1, ending with the stop
token); the observation as a new user turn (mask 0), cut to
``observation_tokens``. :func:`render_chat` rebuilds exactly that sequence from
a chat in the ``messages`` format (``rollout.sft_export`` writes it), so a
policy fine-tuned on exported demonstrations sees the token layout it will act
in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.tokenizer import Tokenizer

_A, _B = "\x00A\x00", "\x00B\x00"  # probes to find the template's turn boundaries


@dataclass(frozen=True)
class TurnFormat:
    """The chat template's text between an assistant message and the next user message."""

    after_assistant: str  # e.g. "<|im_end|>\n"
    before_user: str  # e.g. "<|im_start|>user\n"
    after_user: str  # e.g. "<|im_end|>\n<|im_start|>assistant\n" (ends with the gen prompt)

    @classmethod
    def of(cls, tok: Tokenizer) -> TurnFormat:
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        with_obs = [*base, {"role": "assistant", "content": _A}, {"role": "user", "content": _B}]
        text = tok.apply_chat_template(with_obs, add_generation_prompt=True)
        between = text[text.index(_A) + len(_A) : text.index(_B)]
        alone = tok.apply_chat_template(
            [*base, {"role": "assistant", "content": _A}], add_generation_prompt=False
        )
        after_a = alone[alone.index(_A) + len(_A) :]
        split = len(after_a) if between.startswith(after_a) else 0
        return cls(between[:split], between[split:], text[text.index(_B) + len(_B) :])


def observation_turn(
    tok: Tokenizer, fmt: TurnFormat, observation: str, observation_tokens: int, closing: str = ""
) -> list[int]:
    """The ids between one assistant turn and the next: the observation as a user turn."""
    obs_ids = tok.encode(observation)[:observation_tokens]
    return tok.encode(closing + fmt.before_user) + obs_ids + tok.encode(fmt.after_user)


def stub_text(index: int, action: str | None, args: dict, url: str | None) -> str:
    """The line that replaces an old observation: the step, its action and the URL after it."""
    call = f"{action}({', '.join(f'{k}={v!r}' for k, v in args.items())})" if action else "?"
    if len(call) > 120:
        call = call[:117] + "..."
    return f"[observation {index} elided: {call} -> {url or 'no page'}]"


class ChatError(ValueError):
    """A chat that is not system?, user, then alternating assistant / observation turns."""


def render_chat(
    tok: Tokenizer,
    messages: Sequence[Mapping[str, str]],
    *,
    observation_tokens: int,
    max_context_tokens: int,
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a chat laid out as an episode; assistant turns carry mask 1.

    Observation turns have role ``tool`` (or ``user``). Turns that would not fit in
    ``max_context_tokens`` are dropped from the end, as an episode would have ended.
    An assistant message with ``"weight": 0`` is context, not a target (mask 0): a
    per-turn example (``rollout.sft_export --per-turn``) trains only its last turn.
    """
    msgs = list(messages)
    head = 2 if msgs and msgs[0].get("role") == "system" else 1
    if len(msgs) < head or msgs[head - 1].get("role") != "user":
        raise ChatError("a chat starts with an optional system message, then a user message")
    fmt = TurnFormat.of(tok)
    ids = tok.encode(tok.apply_chat_template(msgs[:head], add_generation_prompt=True))
    mask = [0] * len(ids)
    stop = tok.stop_ids[0]
    expect_assistant = True
    for m in msgs[head:]:
        role, text = m.get("role"), m.get("content")
        if not isinstance(text, str):
            raise ChatError(f"message content must be a string, got {type(text).__name__}")
        if expect_assistant != (role == "assistant") or role not in ("assistant", "tool", "user"):
            raise ChatError(f"unexpected {role!r} turn: turns must alternate")
        expect_assistant = not expect_assistant
        if role == "assistant":
            room = max_context_tokens - len(ids)
            if room < 4:
                break
            act = [*tok.encode(text)[: room - 1], stop]
            ids += act
            mask += [0 if m.get("weight", 1) == 0 else 1] * len(act)
        else:
            turn = observation_turn(tok, fmt, text, observation_tokens)
            if len(ids) + len(turn) + 4 > max_context_tokens:
                break
            ids += turn
            mask += [0] * len(turn)
    return ids, mask
