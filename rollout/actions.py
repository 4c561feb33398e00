"""The agent's actions: one typed, frozen dataclass per action and one table per mode.

The table :data:`ACTIONS` is the single source of what a mode allows: a read-only
view, by environment kind, of the tables the kinds registered in
:data:`rollout.registry.envs` carry (the in-tree ones, :data:`BUILTIN_ACTIONS`, and
any a plugin adds). The parser reads action names, argument names, types and order
from it, and :func:`describe_actions` renders the text the model sees in its system prompt
from it, examples included, so what the model is told and what the parser
accepts cannot drift apart. Each example is written in its mode's dialect and
parses to the table's ``example_action`` (a test checks this).

The environment dispatches on the action's class (``match action: case Click(selector=s)``);
``Action.name`` is the word the model writes, which two classes may share across
modes (``click`` is :class:`Click` in playwright mode and :class:`SomClick` in som mode).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rollout.registry import envs

Mode = Literal["api", "playwright", "som"]
MODES: tuple[str, ...] = ("api", "playwright", "som")  # the in-tree kinds; envs.names(): all

# The site every example points at: the local web's default address.
EXAMPLE_SITE = "http://127.0.0.1:8900"


@dataclass(frozen=True)
class Action:
    """Base of every action. ``note`` carries a remark from the parser for the agent
    (e.g. that further actions in the same reply were ignored); it takes no part in
    equality, so ``Search("x") == Search("x", note="...")``."""

    name: ClassVar[str]
    note: str = field(default="", compare=False, repr=False, kw_only=True)

    def args(self) -> dict[str, Any]:
        """The action's arguments by name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "note"}

    def render(self, max_chars: int | None = None) -> str:
        """Python-call form, e.g. ``search("2024 US GDP")``, for logs and messages."""
        return render_call(self.name, self.args(), max_chars=max_chars)


# ----------------------------------------------------------------------------- api mode


@dataclass(frozen=True)
class Search(Action):
    """Query the search engine; the observation lists titles, URLs and snippets."""

    name: ClassVar[str] = "search"
    query: str


@dataclass(frozen=True)
class Visit(Action):
    """Fetch a page and read its text (api mode)."""

    name: ClassVar[str] = "visit"
    url: str


@dataclass(frozen=True)
class Answer(Action):
    """Give the final answer and end the episode (every mode)."""

    name: ClassVar[str] = "answer"
    text: str


# ----------------------------------------------------------------------------- browser modes


@dataclass(frozen=True)
class Goto(Action):
    """Navigate the browser to a URL (playwright and som modes)."""

    name: ClassVar[str] = "goto"
    url: str


@dataclass(frozen=True)
class Back(Action):
    """Go back one page in the browser's history (playwright and som modes)."""

    name: ClassVar[str] = "back"


@dataclass(frozen=True)
class Forward(Action):
    """Go forward one page in the browser's history (playwright and som modes)."""

    name: ClassVar[str] = "forward"


@dataclass(frozen=True)
class Observe(Action):
    """Read the page again without acting (playwright and som modes): for a page that
    changes by itself (a timer, content loaded later)."""

    name: ClassVar[str] = "observe"


@dataclass(frozen=True)
class Click(Action):
    """Click the element a Playwright selector matches."""

    name: ClassVar[str] = "click"
    selector: str


@dataclass(frozen=True)
class Fill(Action):
    """Type ``value`` into the input a selector matches, replacing its content."""

    name: ClassVar[str] = "fill"
    selector: str
    value: str


@dataclass(frozen=True)
class Scroll(Action):
    """Scroll the page by (dx, dy) pixels."""

    name: ClassVar[str] = "scroll"
    dx: int
    dy: int


@dataclass(frozen=True)
class ExtractText(Action):
    """Read the text of the elements a selector matches."""

    name: ClassVar[str] = "extract_text"
    selector: str


@dataclass(frozen=True)
class Screenshot(Action):
    """Take a screenshot of the viewport."""

    name: ClassVar[str] = "screenshot"


@dataclass(frozen=True)
class SomClick(Action):
    """Click the element numbered ``n`` in the Set-of-Mark view."""

    name: ClassVar[str] = "click"
    n: int


@dataclass(frozen=True)
class SomType(Action):
    """Type ``text`` into the element numbered ``n`` in the Set-of-Mark view."""

    name: ClassVar[str] = "type"
    n: int
    text: str


@dataclass(frozen=True)
class SomScroll(Action):
    """Scroll the page one screen up or down."""

    name: ClassVar[str] = "scroll"
    direction: str


# ----------------------------------------------------------------------------- the table

ArgKind = Literal["text", "int", "url", "choice"]
_TYPE_NAMES = {"text": "str", "int": "int", "url": "str"}


@dataclass(frozen=True)
class Param:
    """One argument of an action: how the parser reads it and how the model is told."""

    name: str  # keyword name, equal to the action dataclass field
    kind: ArgKind  # text: any string; int: a whole number; url: checked against the URL policy
    doc: str  # what the argument means, shown to the model
    choices: tuple[str, ...] = ()  # allowed values of a `choice` argument (lowercase)
    allow_empty: bool = False  # an empty string is valid (and the value is kept unstripped)
    tag: str | None = None  # XML tag of the argument in the api dialect; defaults to `name`

    @property
    def xml_tag(self) -> str:
        return self.tag or self.name

    @property
    def type_name(self) -> str:
        if self.kind == "choice":
            return " | ".join(json.dumps(c) for c in self.choices)
        return _TYPE_NAMES[self.kind]


@dataclass(frozen=True)
class ActionSpec:
    """One row of a mode's table: the action, its arguments, what it does, an example."""

    cls: type[Action]
    params: tuple[Param, ...]
    doc: str  # one line, shown to the model
    example: str  # written in the mode's dialect
    example_action: Action  # what `example` parses to

    @property
    def name(self) -> str:
        return self.cls.name

    def signature(self) -> str:
        """``fill(selector: str, value: str)``: the form error messages quote."""
        args = ", ".join(f"{p.name}: {p.type_name}" for p in self.params)
        return f"{self.name}({args})"


_URL = Param("url", "url", "a full http:// or https:// URL (or a path such as /wiki/X)")
_SELECTOR = Param("selector", "text", 'a Playwright selector, e.g. "#id", "text=Next"')
_ANSWER_DOC = (
    "Give the final answer and end the episode. To cite sources, end the answer with "
    'one line per source: "[1] URL".'
)


def _api_table() -> tuple[ActionSpec, ...]:
    answer = Param("text", "text", "the final answer", tag="answer")
    return (
        ActionSpec(
            Search,
            (Param("query", "text", "what to search for"),),
            "Search the web; returns the top results with titles, URLs and snippets.",
            "<action>search</action><query>2024 US GDP</query>",
            Search("2024 US GDP"),
        ),
        ActionSpec(
            Visit,
            (_URL,),
            "Open a page and read its text.",
            f"<action>visit</action><url>{EXAMPLE_SITE}/wiki/Python</url>",
            Visit(f"{EXAMPLE_SITE}/wiki/Python"),
        ),
        ActionSpec(
            Answer,
            (answer,),
            _ANSWER_DOC,
            "<action>answer</action><answer>Paris</answer>",
            Answer("Paris"),
        ),
    )


def _playwright_table() -> tuple[ActionSpec, ...]:
    pixels = ("dx", "dy")
    return (
        ActionSpec(
            Goto,
            (_URL,),
            "Open a URL in the browser.",
            f'goto("{EXAMPLE_SITE}/wiki/Python")',
            Goto(f"{EXAMPLE_SITE}/wiki/Python"),
        ),
        ActionSpec(Click, (_SELECTOR,), "Click an element.", 'click("#next")', Click("#next")),
        ActionSpec(
            Fill,
            (_SELECTOR, Param("value", "text", "the text to enter", allow_empty=True)),
            "Replace the content of an input with text.",
            'fill("input[name=q]", "2024 US GDP")',
            Fill("input[name=q]", "2024 US GDP"),
        ),
        ActionSpec(
            Scroll,
            tuple(Param(p, "int", f"pixels along {p[1]} (negative: back)") for p in pixels),
            "Scroll the page by dx, dy pixels.",
            "scroll(0, 600)",
            Scroll(0, 600),
        ),
        ActionSpec(Back, (), "Go back to the previous page.", "back()", Back()),
        ActionSpec(Forward, (), "Go forward again after back().", "forward()", Forward()),
        ActionSpec(Observe, (), "Read the page again without acting.", "observe()", Observe()),
        ActionSpec(
            ExtractText,
            (_SELECTOR,),
            "Read the text of the elements a selector matches.",
            'extract_text("main")',
            ExtractText("main"),
        ),
        ActionSpec(Screenshot, (), "Take a screenshot.", "screenshot()", Screenshot()),
        ActionSpec(
            Answer,
            (Param("text", "text", "the final answer"),),
            _ANSWER_DOC,
            'answer("Paris")',
            Answer("Paris"),
        ),
    )


def _som_table() -> tuple[ActionSpec, ...]:
    mark = Param("n", "int", "the number of a marked element, as in [3]")
    return (
        ActionSpec(SomClick, (mark,), "Click the element marked [n].", "click(3)", SomClick(3)),
        ActionSpec(
            SomType,
            (mark, Param("text", "text", "the text to type", allow_empty=True)),
            "Type text into the input marked [n].",
            'type(5, "2024 US GDP")',
            SomType(5, "2024 US GDP"),
        ),
        ActionSpec(
            SomScroll,
            (Param("direction", "choice", "which way", choices=("up", "down")),),
            "Scroll one screen up or down.",
            'scroll("down")',
            SomScroll("down"),
        ),
        ActionSpec(Back, (), "Go back to the previous page.", "back()", Back()),
        ActionSpec(Forward, (), "Go forward again after back().", "forward()", Forward()),
        ActionSpec(Observe, (), "Read the page again without acting.", "observe()", Observe()),
        ActionSpec(
            Goto,
            (_URL,),
            "Open a URL.",
            f'goto("{EXAMPLE_SITE}/wiki/Python")',
            Goto(f"{EXAMPLE_SITE}/wiki/Python"),
        ),
        ActionSpec(
            Answer,
            (Param("text", "text", "the final answer"),),
            _ANSWER_DOC,
            'answer("Paris")',
            Answer("Paris"),
        ),
    )


BUILTIN_ACTIONS: Mapping[str, tuple[ActionSpec, ...]] = {
    "api": _api_table(),
    "playwright": _playwright_table(),
    "som": _som_table(),
}


class _Tables(Mapping[str, tuple[ActionSpec, ...]]):
    """Every registered environment kind's action table, by kind name."""

    def __getitem__(self, mode: str) -> tuple[ActionSpec, ...]:
        return envs.get(mode).actions

    def __contains__(self, mode: object) -> bool:
        return mode in envs

    def __iter__(self) -> Iterator[str]:
        return iter(envs.names())

    def __len__(self) -> int:
        return len(envs.names())


ACTIONS: Mapping[str, tuple[ActionSpec, ...]] = _Tables()

# How each dialect is introduced in the system prompt (a kind may bring its own).
DIALECT_INTROS = {
    "xml": (
        "Write your reasoning if you like, then exactly one action as XML tags: "
        "<action>NAME</action> followed by one tag per argument."
    ),
    "call": (
        "Write your reasoning if you like, then exactly one action as a Python call, "
        "bare or in a ```python block. Arguments must be literals (quoted strings, "
        "numbers), positional or by keyword; the call is read, never executed."
    ),
    "som": (
        "The page's interactive elements are numbered inline, like [3]. Write your "
        "reasoning if you like, then exactly one action as a call, e.g. click(3); the "
        'bracket form click [3] and type [5] "text" also works.'
    ),
}
API_INTRO = DIALECT_INTROS["xml"] + (
    " The short forms <search>...</search>, <visit>...</visit> and <answer>...</answer> also work."
)
COMPACT_DIALECT_INTROS = {
    "xml": "Reply with exactly one action as XML tags.",
    "call": "Reply with exactly one action as a Python call.",
    "som": (
        "The page's interactive elements are numbered inline, like [3]. "
        "Reply with exactly one action as a call."
    ),
}


def spec_for(mode: str, name: str) -> ActionSpec | None:
    """The table row of action ``name`` (lowercase) in ``mode``, or None."""
    for spec in ACTIONS[mode]:
        if spec.name == name:
            return spec
    return None


def action_names(mode: str) -> tuple[str, ...]:
    return tuple(spec.name for spec in ACTIONS[mode])


def describe_actions(
    mode: str, allowed_hosts: tuple[str, ...] = (), *, compact: bool = False
) -> str:
    """The action description for the system prompt, rendered from the mode's table.

    ``compact``: one line per action (signature and example), no documentation: a
    quarter of the tokens, for policies with a short context.
    """
    kind = envs.get(mode)  # an unknown mode: ValueError naming the registered ones
    if compact:
        lines = [kind.compact_intro or COMPACT_DIALECT_INTROS[kind.dialect], "Actions:"]
        lines += [f"- {spec.signature()}, e.g. {spec.example}" for spec in kind.actions]
    else:
        lines = [kind.intro or DIALECT_INTROS[kind.dialect], "", "Actions:"]
        for spec in kind.actions:
            lines.append(f"- {spec.signature()}: {spec.doc}")
            lines.extend(f"    {p.name}: {p.doc}" for p in spec.params)
            lines.append(f"    Example: {spec.example}")
        lines.append("")
        lines.append("Only the first action of a reply is run.")
    if allowed_hosts:
        lines.append(f"URLs must use http or https on these sites: {', '.join(allowed_hosts)}.")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- rendering


def render_call(name: str, args: Mapping[str, Any], *, max_chars: int | None = None) -> str:
    """``name("text", 3)``: positional arguments with double-quoted, escaped strings, on one line.

    Strings longer than ``max_chars`` are cut with an ellipsis inside the quotes.
    """
    return f"{name}({', '.join(render_value(v, max_chars) for v in args.values())})"


_LINE_BREAKS = {"\u0085": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def render_value(value: Any, max_chars: int | None = None) -> str:
    """One argument as a literal: strings JSON-quoted (escapes keep it on one line)."""
    if isinstance(value, str):
        if max_chars is not None and len(value) > max_chars:
            value = value[:max_chars] + "…"
        text = json.dumps(value, ensure_ascii=False)
        for char, escape in _LINE_BREAKS.items():
            text = text.replace(char, escape)
        return text
    return repr(value)
