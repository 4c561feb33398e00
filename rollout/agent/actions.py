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

What an action and a table row are (:class:`Action`, :class:`Answer`, :class:`Param`,
:class:`ActionSpec`, :func:`render_call`) is :mod:`rollout.action_spec`, below the
registry; they are re-exported here, where plugins import them from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from rollout.action_spec import Action, ActionSpec, Answer, Param
from rollout.action_spec import ArgKind as ArgKind
from rollout.action_spec import render_call as render_call
from rollout.action_spec import render_value as render_value
from rollout.registry import envs

Mode = Literal["api", "playwright", "som"]
MODES: tuple[str, ...] = ("api", "playwright", "som")  # the in-tree kinds; envs.names(): all

# The site every example points at: the local web's default address.
EXAMPLE_SITE = "http://127.0.0.1:8900"


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
