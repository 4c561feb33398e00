"""The dialects agents write actions in, read from free text into a :class:`Candidate`.

- ``xml`` (api mode): XML tags, ``<action>search</action><query>...</query>``, or the
  Search-R1 short form ``<search>...</search>``; a missing closing tag at the end is
  tolerated.
- ``call`` (playwright mode): a Python call, bare or in a code fence, read with
  :mod:`ast` (arguments through ``ast.literal_eval``); nothing is ever executed.
- ``som`` (som mode): the same calls plus the bracket form ``click [3]``, ``type [5] "text"``.

A mode (an environment kind, :class:`rollout.registry.EnvKind`) names its dialect and
brings its own action table. A reader finds the first action in the text and counts
the further ones; it returns a :class:`Candidate` (the name as written and the raw argument values),
a :class:`ParseError` when the text holds an action it cannot read, or None when
there is no action at all. Matching a candidate against the mode's table and
checking its arguments is the parser's job (:mod:`rollout.agent.parser`). Every regular
expression here has bounded repetition, so reading is linear in the text length.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from rollout.agent.actions import ACTIONS, spec_for
from rollout.registry import EnvKind, envs

MAX_CALL_CHARS = 64_000  # longest single action call read
MAX_CANDIDATES = 32  # call-like matches tried before giving up

ErrorKind = Literal[
    "too_long",
    "no_action",
    "unknown_action",
    "syntax",
    "missing_argument",
    "extra_argument",
    "bad_argument",
    "refused_url",
    "internal",
]


@dataclass(frozen=True)
class ParseError:
    """Why a reply holds no runnable action; ``message`` is shown to the agent as is."""

    message: str
    kind: ErrorKind


@dataclass(frozen=True)
class BareWord:
    """An unquoted name used as an argument, as in ``scroll(down)``."""

    word: str


@dataclass(frozen=True)
class Unreadable:
    """An argument that is not a literal (a variable, an expression); never evaluated."""

    source: str


@dataclass(frozen=True)
class Candidate:
    """The first action found in a reply, before it is checked against the table."""

    name: str  # lowercase, as written
    positional: tuple[Any, ...] = ()
    keywords: dict[str, Any] = field(default_factory=dict)
    end: int = 0  # index in the text just past the action
    more: int = 0  # further actions found after this one


Found = Candidate | ParseError | None

# ----------------------------------------------------------------------------- XML (api)

_TAG = re.compile(r"<\s{0,8}(/?)\s{0,8}([A-Za-z_][\w\-]{0,63})\s{0,8}>")


@dataclass(frozen=True)
class _Tag:
    start: int
    end: int
    closing: bool
    name: str


def read_xml(text: str, mode: str) -> Found:
    """The first ``<action>`` block or short-form tag in ``text``."""
    tags = [
        _Tag(m.start(), m.end(), bool(m.group(1)), m.group(2).lower()) for m in _TAG.finditer(text)
    ]
    starts = _xml_starts(envs.get(mode))
    first = next((i for i, t in enumerate(tags) if not t.closing and t.name in starts), None)
    if first is None:
        return _xml_without_action(tags, mode)
    if tags[first].name == "action":
        candidate, j = _action_block(text, tags, first, mode)
    else:
        candidate, j = _short_form(text, tags, first, mode)
    more = sum(1 for t in tags[j:] if not t.closing and t.name in starts)
    return Candidate(candidate.name, (), candidate.keywords, candidate.end, more)


@cache
def _xml_starts(kind: EnvKind) -> frozenset[str]:
    """Tags that open an action: ``action`` and the short forms of one-argument actions."""
    return frozenset({"action"} | {s.name for s in kind.actions if len(s.params) == 1})


def _action_block(text: str, tags: list[_Tag], i: int, mode: str) -> tuple[Candidate, int]:
    """``<action>NAME</action>`` followed by argument tags; returns the index after it."""
    j = i + 1
    name_end = tags[j].start if j < len(tags) else len(text)
    name = " ".join(text[tags[i].end : name_end].split()).lower()
    end = name_end
    if j < len(tags) and tags[j].closing and tags[j].name == "action":
        end, j = tags[j].end, j + 1
    spec = spec_for(mode, name)
    wanted = {p.xml_tag: p.name for p in spec.params} if spec else {}
    keywords: dict[str, Any] = {}
    starts = _xml_starts(envs.get(mode))
    while j < len(tags):
        tag = tags[j]
        if not tag.closing and tag.name in wanted and wanted[tag.name] not in keywords:
            value, end, j = _tag_value(text, tags, j, mode)
            keywords[wanted[tag.name]] = value
        elif not tag.closing and tag.name in starts:
            break
        else:
            j += 1
    return Candidate(name, (), keywords, end), j


def _short_form(text: str, tags: list[_Tag], i: int, mode: str) -> tuple[Candidate, int]:
    """``<search>query</search>``: the tag names the action, its content is the argument."""
    name = tags[i].name
    spec = spec_for(mode, name)
    assert spec is not None  # _xml_starts only lists table actions
    value, end, j = _tag_value(text, tags, i, mode)
    return Candidate(name, (), {spec.params[0].name: value}, end), j


def _tag_value(text: str, tags: list[_Tag], i: int, mode: str) -> tuple[str, int, int]:
    """Content of the tag at ``i``: up to its closing tag, else (missing close) up to the
    next action tag or the end. Returns (content, end index in text, next tag index)."""
    name, starts = tags[i].name, _xml_starts(envs.get(mode))
    for k in range(i + 1, len(tags)):
        tag = tags[k]
        if tag.closing and tag.name == name:
            return text[tags[i].end : tag.start], tag.end, k + 1
        if not tag.closing and tag.name in starts and tag.name != name:
            return text[tags[i].end : tag.start], tag.start, k
    return text[tags[i].end :], len(text), len(tags)


def _xml_without_action(tags: list[_Tag], mode: str) -> Found:
    """No action tag: name an argument tag used alone, or an unknown tag used as an action."""
    param_of = {p.xml_tag: s for s in ACTIONS[mode] for p in s.params}
    for tag in tags:
        if tag.closing or tag.name in _NOT_ACTIONS:
            continue
        if tag.name in param_of:
            spec = param_of[tag.name]
            return ParseError(
                f"Found <{tag.name}> without an <action> tag before it. Write e.g. {spec.example}",
                "no_action",
            )
        return Candidate(tag.name)
    return None


# Tags that appear in prose or markup and are not attempts at an action.
_PROSE_TAGS = (
    "think thinking reasoning br p b i u em strong code pre ul ol li div span a h1 h2 h3 "
    "sup sub table tr td th information result results observation tool_response"
)
_NOT_ACTIONS = frozenset(_PROSE_TAGS.split())

# ----------------------------------------------------------------------------- calls

_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_UNKNOWN_CALL = re.compile(
    r"^[ \t>*`]{0,16}(?:await[ \t]{1,4})?(?:[A-Za-z_]\w{0,30}\.){0,3}"
    r"([A-Za-z_]\w{0,40})(?:\(|[ \t]{0,4}\[[^\]\n]{1,200}\])",
    re.M,
)


@cache
def _call_pattern(kind: EnvKind) -> re.Pattern[str]:
    names = sorted((s.name for s in kind.actions), key=len, reverse=True)
    opener = r"[(\[]" if kind.dialect == "som" else r"\("
    return re.compile(rf"\b({'|'.join(names)})\b[ \t]{{0,8}}{opener}", re.I)


def read_call(text: str, mode: str) -> Found:
    """The first call to one of the mode's actions; smart quotes are retried as ASCII."""
    found = _read_call(text, mode)
    failed = found is None or (isinstance(found, ParseError) and found.kind == "syntax")
    if failed and any(q in text for q in "\u201c\u201d\u2018\u2019"):
        retry = _read_call(text.translate(_SMART_QUOTES), mode)
        if isinstance(retry, Candidate) or found is None:
            return retry
    return found


def _read_call(text: str, mode: str) -> Found:
    pattern = _call_pattern(envs.get(mode))
    for start, stop in [*_code_regions(text), (0, len(text))]:
        matches = list(pattern.finditer(text, start, stop))
        first_error: ParseError | None = None
        scanned, tried = start, 0
        for k, m in enumerate(matches):
            if m.start() < scanned:
                continue  # inside a call already read (and found unreadable)
            if tried == MAX_CANDIDATES:
                break
            tried += 1
            found, scanned = _read_one(text, m, stop, mode)
            if isinstance(found, Candidate):
                more = sum(1 for later in matches[k + 1 :] if later.start() >= found.end)
                return Candidate(found.name, found.positional, found.keywords, found.end, more)
            if found.kind != "syntax":
                return found
            first_error = first_error or found
        if first_error is not None:
            return first_error
    return _unknown_call(text)


def _code_regions(text: str) -> list[tuple[int, int]]:
    """Spans inside ``` fences, in order; an unclosed last fence runs to the end."""
    marks = [m.start() for m in re.finditer("```", text)][:256]
    return [
        (marks[k] + 3, marks[k + 1] if k + 1 < len(marks) else len(text))
        for k in range(0, len(marks), 2)
    ]


def _unknown_call(text: str) -> Found:
    """A line that starts with a call to a name outside the table, e.g. ``navigate(...)``."""
    for start, stop in [*_code_regions(text), (0, len(text))]:
        m = _UNKNOWN_CALL.search(text, start, stop)
        if m:
            return Candidate(m.group(1).lower())
    return None


def _read_one(
    text: str, m: re.Match[str], stop: int, mode: str
) -> tuple[Candidate | ParseError, int]:
    """The call or bracket form starting at ``m``, and how far the text was read."""
    name, bracket = m.group(1).lower(), m.end() - 1
    if text[bracket] == "[":
        found = _read_brackets(text, name, bracket, stop, mode)
        return found, found.end if isinstance(found, Candidate) else bracket + 1
    end, state, depth = _scan_call(text, bracket, stop)
    if state == "string":
        message = f"A string in {name}(...) is not closed: end it with a matching quote."
    elif state == "long":
        message = f"The call {name}(...) is longer than {MAX_CALL_CHARS} characters; shorten it."
    else:
        read = _read_arguments(name + text[bracket:end] + ")" * depth)
        if not isinstance(read, str):
            return Candidate(name, read[0], read[1], end), end
        message = (
            f"Could not read the arguments of {name}(...): {read}. Arguments must be "
            "literals: strings in quotes and numbers."
        )
    return ParseError(f"{message} {_example_hint(mode, name)}".strip(), "syntax"), end


def _scan_call(text: str, i: int, stop: int) -> tuple[int, str, int]:
    """From the ``(`` at ``i``: (end, state, open brackets left). ``state`` is ``ok``,
    ``open`` (the region ended inside the brackets), ``string`` (a string is not closed)
    or ``long`` (the call runs past :data:`MAX_CALL_CHARS`)."""
    cap = i + MAX_CALL_CHARS
    stop_at = min(stop, cap)
    depth, quote = 0, ""
    while i < stop_at:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i, quote = i + len(quote), ""
                continue
            if c == "\n" and len(quote) == 1:
                return i, "string", depth
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote)
            continue
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1, "ok", 0
        i += 1
    if cap < stop:
        return stop_at, "long", depth
    return stop_at, ("string" if quote else "open"), depth


def _read_arguments(snippet: str) -> tuple[tuple[Any, ...], dict[str, Any]] | str:
    """Positional and keyword argument values of ``name(...)``, or why they cannot be read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(snippet, mode="eval")
    except SyntaxError as e:
        return f"invalid syntax ({e.msg})" if e.msg else "invalid syntax"
    except (ValueError, RecursionError, MemoryError, OverflowError):
        return "invalid syntax"
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return "expected a single call"
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return "*args and **kwargs are not allowed"
    positional = tuple(_literal(a, snippet) for a in call.args)
    return positional, {str(k.arg): _literal(k.value, snippet) for k in call.keywords}


def _literal(node: ast.expr, snippet: str) -> Any:
    if isinstance(node, ast.Name):
        return BareWord(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        source = ast.get_source_segment(snippet, node) or "?"
        return Unreadable(source[:60])


def _read_brackets(text: str, name: str, i: int, stop: int, mode: str) -> Candidate | ParseError:
    """``click [3]``, ``type [5] "text"``, ``type [5] [text]``, ``type [5] text to the line end``."""
    line_end = text.find("\n", i, stop)
    stop = min(stop if line_end < 0 else line_end, i + MAX_CALL_CHARS)
    args: list[str] = []
    while i < stop and len(args) < 8:
        while i < stop and text[i] in " \t":
            i += 1
        if i < stop and text[i] == "[":
            close = text.find("]", i + 1, stop)
            if close < 0:
                return ParseError(
                    f"A [ in {name} [...] is not closed. " + _example_hint(mode, name), "syntax"
                )
            args.append(text[i + 1 : close])
            i = close + 1
        elif i < stop and text[i] in "\"'":
            close = text.find(text[i], i + 1, stop)
            while close > 0 and text[close - 1] == "\\":
                close = text.find(text[i], close + 1, stop)
            if close < 0:
                return ParseError(
                    f"A string in {name} [...] is not closed. " + _example_hint(mode, name),
                    "syntax",
                )
            args.append(_unquote(text[i : close + 1]))
            i = close + 1
        else:
            break
    rest = text[i:stop].strip()
    spec = spec_for(mode, name)
    if rest and spec is not None and len(args) < len(spec.params):
        args.append(rest)
        i = stop
    return Candidate(name, tuple(args), {}, i)


def _unquote(quoted: str) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return quoted[1:-1]
    return value if isinstance(value, str) else quoted[1:-1]


def _example_hint(mode: str, name: str) -> str:
    spec = spec_for(mode, name)
    return f"Write e.g. {spec.example}" if spec else ""
