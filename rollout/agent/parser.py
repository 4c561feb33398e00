"""Model text -> typed :class:`~rollout.agent.actions.Action`, one dialect per mode, never raising.

``parse(text, mode, policy)`` returns an action or a :class:`ParseError` whose
message tells the agent exactly what to fix (the unknown name and the allowed
ones, the missing argument, the expected form with an example from the action
table), so a failure becomes an observation the agent can correct itself from.
Nothing it does raises to its caller, whatever the text: it is bounded in length
(:data:`MAX_REPLY_CHARS`), its regular expressions are linear, ``ast`` is guarded
against deep nesting, and a last safety net turns an unexpected exception into a
ParseError of kind ``internal``.

Tolerated slips: reasoning around the action (``<think>...</think>`` blocks are
dropped first; a stray ``</think>`` drops everything before it; a reply that ends
inside ``<think>`` has no action and is told so), markdown fences,
odd case and whitespace, smart quotes, a missing closing tag or parenthesis at the
very end, and several actions in one reply (the first runs; its ``note`` says how
many were ignored). Only the mode's own actions are accepted, and URL arguments
must pass the :class:`~rollout.net.urls.UrlPolicy` (relative URLs resolve against
``base_url``, the page the agent is on); the action carries the normalised URL.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable
from typing import Any

from rollout.agent.actions import ACTIONS, Action, ActionSpec, Param, action_names, spec_for
from rollout.agent.dialects import (
    BareWord,
    Candidate,
    Found,
    ParseError,
    Unreadable,
    read_call,
    read_xml,
)
from rollout.net.urls import UrlPolicy, UrlRefused, check_url
from rollout.registry import envs

__all__ = ["MAX_REPLY_CHARS", "ParseError", "ParseResult", "parse", "strip_reasoning"]

MAX_REPLY_CHARS = 256_000  # longer replies are refused unread
MAX_INT = 10**9  # largest magnitude accepted for a whole-number argument

ParseResult = Action | ParseError

_READERS: dict[str, Callable[[str, str], Found]] = {  # by the mode's dialect
    "xml": read_xml,
    "call": read_call,
    "som": read_call,
}
_DEFAULT_POLICY = UrlPolicy()
_THINK = re.compile(r"<\s{0,4}(/?)\s{0,4}think(?:ing)?\s{0,4}>", re.I)
_INT_TEXT = re.compile(r"\s{0,8}\[?\s{0,8}([+-]?\d{1,10})\s{0,8}\]?\s{0,8}")


def parse(
    text: str, mode: str, policy: UrlPolicy | None = None, *, base_url: str | None = None
) -> ParseResult:
    """The first action in ``text`` for ``mode``, or a ParseError for the agent to read.

    ``policy`` defaults to ``UrlPolicy()`` (the local web: 127.0.0.1 and localhost);
    ``base_url`` is the page the agent is on. ``mode`` is a registered environment kind
    (:data:`rollout.registry.envs`); an unknown one is the caller's bug and raises
    ValueError; nothing about ``text`` does.
    """
    read = _READERS[envs.get(mode).dialect]
    try:
        return _parse(text, mode, read, policy or _DEFAULT_POLICY, base_url)
    except Exception as e:  # a parser bug must cost one step, not the episode
        return ParseError(
            f"Your reply could not be read ({type(e).__name__}). {_form_hint(mode)}", "internal"
        )


def _parse(
    text: Any, mode: str, read: Callable[[str, str], Found], policy: UrlPolicy, base_url: str | None
) -> ParseResult:
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return ParseError(f"Your reply is not text. {_form_hint(mode)}", "no_action")
    if len(text) > MAX_REPLY_CHARS:
        return ParseError(
            f"Your reply is {len(text)} characters long; the limit is {MAX_REPLY_CHARS}. "
            f"Keep it short and end with one action. {_form_hint(mode)}",
            "too_long",
        )
    body, unclosed_think = strip_reasoning(text)
    found = read(body, mode)
    if found is None:
        return _no_action(mode, unclosed_think)
    if isinstance(found, ParseError):
        return found
    spec = spec_for(mode, found.name)
    if spec is None:
        return _unknown_action(mode, found.name)
    action = _bind(spec, found, policy, base_url)
    if isinstance(action, ParseError) or not found.more:
        return action
    ignored = "1 more action was" if found.more == 1 else f"{found.more} more actions were"
    note = (
        f"Only the first action of your reply was run ({action.render(max_chars=60)}); "
        f"{ignored} ignored. Write one action per reply."
    )
    return dataclasses.replace(action, note=note)


def strip_reasoning(text: str) -> tuple[str, bool]:
    """``text`` without ``<think>`` blocks, and whether it ended inside one.

    A closing ``</think>`` with no opening tag (chat templates that open the block
    in the prompt) drops everything before it.
    """
    kept: list[str] = []
    pos, inside = 0, False
    for m in _THINK.finditer(text):
        closing = bool(m.group(1))
        if not closing and not inside:
            kept.append(text[pos : m.start()])
            inside = True
        elif closing and inside:
            pos, inside = m.end(), False
        elif closing:
            kept, pos = [], m.end()
    if not inside:
        kept.append(text[pos:])
    return "".join(kept), inside


# ----------------------------------------------------------------------------- binding


def _bind(
    spec: ActionSpec, found: Candidate, policy: UrlPolicy, base_url: str | None
) -> ParseResult:
    """Match positional and keyword values to the table's parameters and check each."""
    params = spec.params
    if len(found.positional) > len(params):
        takes = ", ".join(p.name for p in params) or "no arguments"
        return ParseError(
            f"{spec.name} takes {len(params)} argument{'s' * (len(params) != 1)} ({takes}) "
            f"but got {len(found.positional)}. {_expected(spec)}",
            "extra_argument",
        )
    values = {p.name: v for p, v in zip(params, found.positional, strict=False)}
    names = {p.name for p in params}
    for key, value in found.keywords.items():
        key = key.lower()
        if key not in names:
            allowed = ", ".join(p.name for p in params) or "none"
            return ParseError(
                f'{spec.name} has no argument "{key}"; its arguments: {allowed}. {_expected(spec)}',
                "extra_argument",
            )
        if key in values:
            return ParseError(f'{spec.name} got "{key}" twice. {_expected(spec)}', "extra_argument")
        values[key] = value
    kwargs = {}
    for param in params:
        if param.name not in values:
            return ParseError(
                f'{spec.name} is missing its argument "{param.name}". {_expected(spec)}',
                "missing_argument",
            )
        value = _coerce(spec, param, values[param.name], policy, base_url)
        if isinstance(value, ParseError):
            return value
        kwargs[param.name] = value
    return spec.cls(**kwargs)


def _coerce(
    spec: ActionSpec, param: Param, value: Any, policy: UrlPolicy, base_url: str | None
) -> Any:
    """The argument in its declared type, or a ParseError naming the argument and the form."""
    shown = value.source if isinstance(value, Unreadable) else repr(value)[:60]
    if isinstance(value, BareWord):
        shown = value.word
    if param.kind == "int":
        number = _as_int(value)
        if number is None:
            return _bad(spec, param, f"a whole number, got {shown}")
        return number
    if param.kind == "choice":
        word = value.word if isinstance(value, BareWord) else value
        if isinstance(word, str) and word.strip().strip("\"'").lower() in param.choices:
            return word.strip().strip("\"'").lower()
        return _bad(spec, param, f"one of {', '.join(param.choices)}, got {shown}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return _bad(spec, param, f"a string in quotes, got {shown}")
    if not param.allow_empty:
        value = value.strip()
        if not value:
            return _bad(spec, param, "a non-empty string")
    if param.kind == "url":
        try:
            return check_url(value, policy, base=base_url)
        except UrlRefused as e:
            return ParseError(
                f"URL refused: {value[:200]!r}: {e.reason}. {_expected(spec)}", "refused_url"
            )
    return value


def _as_int(value: Any) -> int | None:
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        m = _INT_TEXT.fullmatch(value)
        value = int(m.group(1)) if m else None
    if isinstance(value, int) and abs(value) <= MAX_INT:
        return value
    return None


def _bad(spec: ActionSpec, param: Param, wanted: str) -> ParseError:
    return ParseError(
        f'{spec.name}: the argument "{param.name}" must be {wanted}. {_expected(spec)}',
        "bad_argument",
    )


# ----------------------------------------------------------------------------- messages


def _expected(spec: ActionSpec) -> str:
    return f"Expected: {spec.signature()}, e.g. {spec.example}"


def _form_hint(mode: str) -> str:
    examples = " or ".join(spec.example for spec in ACTIONS[mode][:2])
    return f"Write exactly one action, e.g. {examples}. Allowed actions: {_names(mode)}."


def _names(mode: str) -> str:
    return ", ".join(action_names(mode))


def _no_action(mode: str, unclosed_think: bool) -> ParseError:
    if unclosed_think:
        return ParseError(
            "Your reply ended inside <think>: close it with </think>, then write one action. "
            + _form_hint(mode),
            "no_action",
        )
    return ParseError(f"No action found in your reply. {_form_hint(mode)}", "no_action")


def _unknown_action(mode: str, name: str) -> ParseError:
    if not name:
        return ParseError(f"The action name is empty. {_form_hint(mode)}", "unknown_action")
    shown = name[:60]
    close = difflib.get_close_matches(name, action_names(mode), n=1, cutoff=0.6)
    guess = f' Did you mean "{close[0]}"?' if close else ""
    example = ACTIONS[mode][0].example
    return ParseError(
        f'Unknown action "{shown}".{guess} Allowed actions in this mode: {_names(mode)}. '
        f"For example: {example}",
        "unknown_action",
    )
