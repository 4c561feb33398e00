"""The tool domain's actions and their table, in the call dialect of the browser modes.

The rows are :class:`~rollout.agent.actions.ActionSpec`, so the generic parser
(:mod:`rollout.agent.parser`, reading calls with :func:`rollout.agent.dialects.read_call`) and
:func:`~rollout.agent.actions.describe_actions` work for this mode unchanged once the
table is installed as ``ACTIONS["tools"]``. ``answer`` is the shared
:class:`~rollout.agent.actions.Answer`, which the environment handles itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rollout.agent.actions import Action, ActionSpec, Answer, Param

KIND = "tools"
NEEDS_BROWSER = False
DIALECT = "call"  # read by rollout.agent.dialects.read_call, like the playwright and som modes


@dataclass(frozen=True)
class Lookup(Action):
    """Read one indicator of a country, or of a list of countries ("A, B and C")."""

    name: ClassVar[str] = "lookup"
    country: str
    indicator: str


@dataclass(frozen=True)
class ListCountries(Action):
    """List the countries that match a filter (a continent, a name prefix, or both)."""

    name: ClassVar[str] = "list_countries"
    filter: str


@dataclass(frozen=True)
class Airport(Action):
    """Read an airport by its IATA code: its name, city and country."""

    name: ClassVar[str] = "airport"
    code: str


@dataclass(frozen=True)
class Calculate(Action):
    """Evaluate an arithmetic expression."""

    name: ClassVar[str] = "calculate"
    expression: str


INTRO = (
    "You have tools over a database of country figures, and no browser. Write your "
    "reasoning if you like, then exactly one action as a Python call, bare or in a "
    "```python block. Arguments must be literals (quoted strings, numbers), positional "
    "or by keyword; the call is read, never executed."
)
COMPACT_INTRO = "Reply with exactly one tool call as a Python call."


def table() -> tuple[ActionSpec, ...]:
    return (
        ActionSpec(
            Lookup,
            (
                Param(
                    "country",
                    "text",
                    "a country name or ISO code, e.g. France or FR, or a list of up to five: "
                    '"France, Spain and Italy"',
                ),
                Param("indicator", "text", "what to read; an unknown one lists them all"),
            ),
            "Read one figure of a country or of several (population, area_km2, gdp_official, ...).",
            'lookup("France", "population")',
            Lookup("France", "population"),
        ),
        ActionSpec(
            ListCountries,
            (
                Param(
                    "filter",
                    "text",
                    'a continent ("Europe"), a name prefix ("prefix:Ma"), both '
                    '("Africa prefix:Ma"), or "" for all',
                    allow_empty=True,
                ),
            ),
            "List the countries that match a filter.",
            'list_countries("South America")',
            ListCountries("South America"),
        ),
        ActionSpec(
            Airport,
            (Param("code", "text", "a three-letter IATA code, e.g. CDG"),),
            "Read an airport: its name, city and country.",
            'airport("CDG")',
            Airport("CDG"),
        ),
        ActionSpec(
            Calculate,
            (Param("expression", "text", "numbers, + - * / ** ( ), round, abs, min, max"),),
            "Compute an arithmetic expression exactly; write numbers without separators.",
            'calculate("3162000000000 / 66987244")',
            Calculate("3162000000000 / 66987244"),
        ),
        ActionSpec(
            Answer,
            (Param("text", "text", "the final answer"),),
            "Give the final answer and end the episode.",
            'answer("47,200")',
            Answer("47,200"),
        ),
    )
