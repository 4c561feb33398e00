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

from rollout.agent.actions import Action
from rollout.env.core import ToolError
from rollout.env.observation import Observation
from rollout.tools.actions import Airport, Calculate, ListCountries, Lookup
from rollout.tools.calculator import CalcError, evaluate, format_number
from rollout.tools.data import INDICATOR_ALIASES, INDICATORS, Atlas, atlas, fold, plain
from rollout.tracking.records import Step
from rollout.web.data import Country
from rollout.web.site import CONTINENTS

DEFAULT_OBSERVATION_CHARS = 2000
_PREFIX = re.compile(r"\b(?:prefix|starts?|name)\s{0,4}[:=]\s{0,4}(\S{1,40})", re.I)
_CONTINENT = re.compile(r"\bcontinent\s{0,4}[:=]\s{0,4}", re.I)
# Between the items of a list of countries: "A, B and C", "A; B", "A, and B"
_LIST_SEP = re.compile(r"(\s*[,;]\s*(?:and\s+)?|\s+and\s+)", re.I)
MAX_LOOKUP_COUNTRIES = 5  # countries one lookup reads
FIGURES = "tools://figures"  # where figures "are": evidence keys, FIGURES/ISO/indicator
AIRPORTS = "tools://airports"  # an airport's evidence key: AIRPORTS/IATA
_IATA = re.compile(r"[A-Za-z0-9]{3}")


def figure_url(iso: str, indicator: str) -> str:
    """The evidence key of one figure, ``tools://figures/NO/labor_force``: what a task's
    ``evidence`` names and a lookup that showed the figure reached (:func:`figures_read`)."""
    return f"{FIGURES}/{iso}/{indicator}"


def airport_url(iata: str) -> str:
    """The evidence key of one airport's record, ``tools://airports/CDG``."""
    return f"{AIRPORTS}/{iata.upper()}"


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
            case Airport(code=code):
                return self.airport(code)
            case Calculate(expression=expression):
                return self.calculate(expression)
        raise ToolError(
            f"{action.name} is not one of the tools; use lookup, list_countries, "
            "airport, calculate or answer"
        )

    async def recover(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------------ the tools

    def lookup(self, country: str, indicator: str) -> Observation:
        countries = self.countries_named(country)
        key = resolve_indicator(indicator)
        if key is None:
            raise ToolError(
                f"Unknown indicator {indicator[:60]!r}. Indicators: {indicator_list()}."
            )
        ind = INDICATORS[key]
        lines, summaries = [], []
        for c in countries:
            name, value = self.data.name(c), self.data.value(c, key)
            if value is None:
                missing = f"The {ind.source} has no {key} figure for {name}."
                if len(countries) == 1:
                    raise ToolError(missing)
                lines.append(f"{name}: {missing}")
                summaries.append(f"{name} {key} = none")
                continue
            detail = f"{value.detail}; " if value.detail else ""
            lines.append(
                f"{name}: {key} = {plain(value.number)} {ind.unit} "
                f"({detail}{ind.label}, {ind.source}: {value.source_text})"
            )
            summaries.append(f"{name} {key} = {plain(value.number)}")
        return Observation("\n".join(lines), summary="; ".join(summaries))

    def countries_named(self, text: str) -> list[Country]:
        """The countries ``text`` names: one name (or ISO code), or a list of up to
        ``MAX_LOOKUP_COUNTRIES`` as a question writes them ("Peru, Chile and Bolivia",
        "Peru; Chile"). A list is read left to right, each time the longest run of its
        items that is one name, so "Trinidad and Tobago" stays whole.

        Raises ToolError naming the first item that is no country."""
        whole = self.data.find(text)
        if whole is not None:
            return [whole]
        parts = _LIST_SEP.split(text.strip())
        items, seps = parts[0::2], parts[1::2]
        found: list[Country] = []
        i = 0
        while i < len(items):
            if not items[i].strip():
                i += 1
                continue
            for j in range(len(items), i, -1):  # the longest run first
                span = items[i] + "".join(seps[k] + items[k + 1] for k in range(i, j - 1))
                c = self.data.find(span)
                if c is not None:
                    if c not in found:
                        found.append(c)
                    i = j
                    break
            else:
                raise self._unknown_country(items[i] if found else text)
        if not found:
            raise self._unknown_country(text)
        if len(found) > MAX_LOOKUP_COUNTRIES:
            raise ToolError(
                f"{len(found)} countries in one lookup; at most {MAX_LOOKUP_COUNTRIES}."
            )
        return found

    def _unknown_country(self, name: str) -> ToolError:
        close = self.data.suggest(name)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return ToolError(
            f"Unknown country {name[:60]!r}.{hint} "
            'list_countries("prefix:XY") lists the names that start with XY.'
        )

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

    def airport(self, code: str) -> Observation:
        """``FAG: Fagurholsmyri Airport, Fagurholsmyri, in Iceland; lookup("Iceland",
        indicator) reads its figures.``: an airport of AirportDB by IATA code, its country
        by the name ``lookup`` takes, and the call that reads that country's figures (as an
        error's hint names the call that would work)."""
        found = self.find_airport(code)
        country = self.data.world.countries.get(found.country)
        where = self.data.name(country) if country is not None else found.country
        city = f", {found.city_name}" if found.city_name else ""
        return Observation(
            f"{found.iata}: {found.name}{city}, in {where}; "
            f'lookup("{where}", indicator) reads its figures.',
            summary=f"{found.iata} in {where}",
        )

    def find_airport(self, code: str):
        """The AirportDB airport of an IATA code (case and surrounding space ignored).

        Raises ToolError for anything else, saying what a code looks like."""
        key = code.strip().strip(".").upper()
        found = self.data.world.airports.get(key) if _IATA.fullmatch(key) else None
        if found is None:
            raise ToolError(
                f"Unknown airport code {code[:40]!r}. airport() takes a three-letter IATA "
                'code, e.g. airport("CDG").'
            )
        return found

    def calculate(self, expression: str) -> Observation:
        try:
            value = evaluate(expression)
        except CalcError as e:
            raise ToolError(f"calculate: {e}") from None
        shown = " ".join(expression.split())
        return Observation(f"{shown} = {format_number(value)}", summary=f"= {format_number(value)}")


def figures_read(step: Step) -> list[str]:
    """The figures a successful ``lookup`` step showed, as :func:`figure_url` keys (every
    country of a list lookup; none for a country without the figure, or another tool),
    and the airport an ``airport`` step showed (:func:`airport_url`): the ``tools`` kind's
    ``reached`` (``rollout.registry.EnvKind``), which the evidence process reward compares
    with a task's evidence."""
    if step.action == "airport" and step.error is None:
        code = step.args.get("code")
        if not isinstance(code, str):
            return []
        try:
            return [airport_url(ToolBackend(data=atlas()).find_airport(code).iata)]
        except ToolError:
            return []
    if step.action != "lookup" or step.error is not None:
        return []
    country, indicator = step.args.get("country"), step.args.get("indicator")
    if not isinstance(country, str) or not isinstance(indicator, str):
        return []
    key = resolve_indicator(indicator)
    if key is None:
        return []
    data = atlas()
    try:
        countries = ToolBackend(data=data).countries_named(country)
    except ToolError:
        return []
    return [figure_url(c.iso, key) for c in countries if data.value(c, key) is not None]


def resolve_indicator(text: str) -> str | None:
    key = re.sub(r"[\s\-]+", "_", text.strip().lower())
    return key if key in INDICATORS else INDICATOR_ALIASES.get(key)


def indicator_list() -> str:
    return ", ".join(f"{i.name} ({i.unit})" for i in INDICATORS.values())


def continent_list() -> str:
    return ", ".join(CONTINENTS.values())


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
            + ", ".join(f"{v} ({k})" for k, v in CONTINENTS.items())
        )
    if continent is None:
        return None, fold(rest)
    return continent, prefix


def welcome() -> str:
    """The first observation: what the tools read, so the agent need not guess names."""
    return (
        "Tools ready (no browser). lookup(country, indicator) reads one figure; "
        f"indicators: {indicator_list()}. "
        f"list_countries(filter) lists country names; continents: {continent_list()}. "
        "airport(code) reads an airport's city and country. "
        "calculate(expression) does exact arithmetic."
    )
