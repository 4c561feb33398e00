"""The tool domain's backend: lookups, country lists and a calculator, no browser, no network.

It implements :class:`~rollout.env.core.Backend`, so :class:`~rollout.env.core.Environment`
runs it like any mode. Observations are short lines of text; an action that
cannot be carried out (an unknown country or indicator, a figure the source
lacks, an expression the calculator refuses) raises
:class:`~rollout.env.core.ToolError`, which the environment shows the agent as an
error it can correct: unknown countries come with suggestions, unknown
indicators with the list of indicators. Everything is a pure function of the
data packages, so two runs give the same observations.
"""

from __future__ import annotations

import re

from rollout.actions import Action
from rollout.env.core import ToolError
from rollout.env.observation import Observation
from rollout.tools.actions import Calculate, ListCountries, Lookup
from rollout.tools.calculator import CalcError, evaluate, format_number
from rollout.tools.data import INDICATOR_ALIASES, INDICATORS, Atlas, atlas, fold, plain
from rollout.web.site import CONTINENTS

DEFAULT_OBSERVATION_CHARS = 2000
_PREFIX = re.compile(r"\b(?:prefix|starts?|name)\s{0,4}[:=]\s{0,4}(\S{1,40})", re.I)
_CONTINENT = re.compile(r"\bcontinent\s{0,4}[:=]\s{0,4}", re.I)


class ToolBackend:
    """The :class:`~rollout.env.core.Backend` of the ``tools`` mode."""

    def __init__(
        self, observation_chars: int = DEFAULT_OBSERVATION_CHARS, data: Atlas | None = None
    ):
        self.observation_chars = observation_chars
        self.data = data or atlas()
        self.calls = 0

    @property
    def url(self) -> str | None:
        return None

    async def start(self, start_url: str) -> Observation:
        return Observation(welcome(), summary="tools ready")

    async def act(self, action: Action) -> Observation:
        self.calls += 1
        match action:
            case Lookup(country=country, indicator=indicator):
                return self.lookup(country, indicator)
            case ListCountries(filter=text):
                return self.list_countries(text)
            case Calculate(expression=expression):
                return self.calculate(expression)
        raise ToolError(
            f"{action.name} is not one of the tools; use lookup, list_countries, "
            "calculate or answer"
        )

    async def recover(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------------ the tools

    def lookup(self, country: str, indicator: str) -> Observation:
        c = self.data.find(country)
        if c is None:
            close = self.data.suggest(country)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ToolError(
                f"Unknown country {country[:60]!r}.{hint} "
                'list_countries("prefix:XY") lists the names that start with XY.'
            )
        key = resolve_indicator(indicator)
        if key is None:
            raise ToolError(
                f"Unknown indicator {indicator[:60]!r}. Indicators: {indicator_list()}."
            )
        ind, name = INDICATORS[key], self.data.name(c)
        value = self.data.value(c, key)
        if value is None:
            raise ToolError(f"The {ind.source} has no {key} figure for {name}.")
        detail = f"{value.detail}; " if value.detail else ""
        text = (
            f"{name}: {key} = {plain(value.number)} {ind.unit} "
            f"({detail}{ind.label}, {ind.source}: {value.source_text})"
        )
        return Observation(text, summary=f"{name} {key} = {plain(value.number)}")

    def list_countries(self, text: str) -> Observation:
        continent, prefix = parse_filter(text, self.data)
        names = [
            self.data.name(c)
            for c in self.data.countries
            if (continent is None or c.continent == continent)
            and (not prefix or fold(self.data.name(c)).startswith(prefix))
        ]
        where = f" in {CONTINENTS[continent]}" if continent else ""
        starting = f" whose names start with {prefix!r}" if prefix else ""
        if not names:
            return Observation(
                f"No country{where}{starting}. Continents: {continent_list()}.",
                summary="no countries",
            )
        head = f"{len(names)} countr{'y' if len(names) == 1 else 'ies'}{where}{starting}: "
        shown, budget = [], self.observation_chars - len(head) - 80
        for n in names:
            budget -= len(n) + 2
            if budget < 0:
                break
            shown.append(n)
        body = head + "; ".join(shown)
        if len(shown) < len(names):
            body += (
                f"; ... and {len(names) - len(shown)} more (narrow the filter: a continent "
                'and/or "prefix:XY")'
            )
        return Observation(body, summary=f"{len(names)} countries")

    def calculate(self, expression: str) -> Observation:
        try:
            value = evaluate(expression)
        except CalcError as e:
            raise ToolError(f"calculate: {e}") from None
        shown = " ".join(expression.split())
        return Observation(f"{shown} = {format_number(value)}", summary=f"= {format_number(value)}")


def resolve_indicator(text: str) -> str | None:
    key = re.sub(r"[\s\-]+", "_", text.strip().lower())
    return key if key in INDICATORS else INDICATOR_ALIASES.get(key)


def indicator_list() -> str:
    return "; ".join(f"{i.name} ({i.unit})" for i in INDICATORS.values())


def continent_list() -> str:
    """The continents, ";"-separated as every list a tool shows: in the prompt a comma
    then stands only between the question's names ("Which of A, B and C ..."), so a
    small policy that copies the name after a comma finds the question's."""
    return "; ".join(CONTINENTS.values())


def parse_filter(text: str, data: Atlas) -> tuple[str | None, str]:
    """``"Africa prefix:Ma"`` -> ("AF", "ma"); a bare word that is no continent is a prefix.

    Raises ToolError when a named continent is unknown."""
    prefix = ""
    m = _PREFIX.search(text)
    if m:
        prefix = fold(m.group(1))
        text = text[: m.start()] + text[m.end() :]
    explicit = bool(_CONTINENT.search(text))
    rest = _CONTINENT.sub(" ", text).strip()
    if not rest:
        return None, prefix
    continent = data.continent_code(rest)
    if continent is None and (explicit or prefix):
        raise ToolError(
            f"Unknown continent {rest[:40]!r}. Continents: "
            + "; ".join(f"{v} ({k})" for k, v in CONTINENTS.items())
        )
    if continent is None:
        return None, fold(rest)
    return continent, prefix


def welcome() -> str:
    """The first observation: what the tools read, so the agent need not guess names."""
    return (
        "Tools ready (no browser). lookup(country, indicator) reads one figure. "
        f"Indicators: {indicator_list()}. "
        f"list_countries(filter) lists country names. Continents: {continent_list()}. "
        "calculate(expression) does exact arithmetic."
    )
