"""What an action is: the base class, the answer that ends every episode, and a table row.

An environment kind's action table (:class:`rollout.registry.EnvKind`) is a tuple of
:class:`ActionSpec` rows, each naming an :class:`Action` subclass, its :class:`Param`
arguments, a line of documentation and an example; every table has an
:class:`Answer`. The registry checks a kind's table against these classes, so they
live here, below the registry, with nothing else: the in-tree actions and tables
are :mod:`rollout.agent.actions` (which re-exports every name here, the names plugins use).
This module imports no other module of the project.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

__all__ = ["Action", "ActionSpec", "Answer", "ArgKind", "Param", "render_call", "render_value"]


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


@dataclass(frozen=True)
class Answer(Action):
    """Give the final answer and end the episode (every mode)."""

    name: ClassVar[str] = "answer"
    text: str


# ----------------------------------------------------------------------------- a table row

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
