"""The figures the tools return: country indicators read from the local web's world.

Every value comes from the same :class:`~rollout.web.data.World` the local web
renders, one source per indicator, so a lookup agrees with the page that shows
the same fact: population, area, city counts and the largest city from the Atlas
(GeoNames), economic figures from the World Factbook's Economy section (its
latest figure, as the page's first line shows it: ``$3.162 trillion (2024 est.)``
becomes 3162000000000), airport counts from AirportDB (``airportsdata``).

Values are ints when whole (exact: the Factbook's decimals are read with
:class:`~decimal.Decimal`) and floats otherwise, written as plain digits so the
agent can copy them into ``calculate``.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache

from rollout.web.data import Country, World
from rollout.web.site import CONTINENTS


@dataclass(frozen=True)
class Indicator:
    """One figure ``lookup`` knows: its name, what it measures, its unit and source."""

    name: str  # what the agent writes, e.g. "gdp_official"
    label: str  # shown in observations and questions
    unit: str  # "people", "US dollars", "%", ...
    source: str  # the local-web site that shows the same figure
    factbook_field: str = ""  # Economy field, for Factbook indicators


INDICATORS: dict[str, Indicator] = {
    i.name: i
    for i in (
        Indicator("population", "population", "people", "Atlas"),
        Indicator("area_km2", "area", "square kilometres", "Atlas"),
        Indicator(
            "gdp_ppp",
            "GDP (purchasing power parity)",
            "US dollars",
            "World Factbook",
            "Real GDP (purchasing power parity)",
        ),
        Indicator(
            "gdp_official",
            "GDP (official exchange rate)",
            "US dollars",
            "World Factbook",
            "GDP (official exchange rate)",
        ),
        Indicator("exports", "exports", "US dollars", "World Factbook", "Exports"),
        Indicator("imports", "imports", "US dollars", "World Factbook", "Imports"),
        Indicator("labor_force", "labor force", "people", "World Factbook", "Labor force"),
        Indicator(
            "unemployment_rate", "unemployment rate", "%", "World Factbook", "Unemployment rate"
        ),
        Indicator(
            "inflation_rate",
            "inflation rate",
            "%",
            "World Factbook",
            "Inflation rate (consumer prices)",
        ),
        Indicator("public_debt", "public debt", "% of GDP", "World Factbook", "Public debt"),
        Indicator("airports", "number of airports with an IATA code", "airports", "AirportDB"),
        Indicator("cities", "number of cities of 15,000 people or more", "cities", "Atlas"),
        Indicator("largest_city_population", "population of the largest city", "people", "Atlas"),
    )
}

# Other spellings an agent may use for an indicator (normalised: lowercase, underscores).
INDICATOR_ALIASES = {
    "area": "area_km2",
    "gdp_official_exchange_rate": "gdp_official",
    "gdp_purchasing_power_parity": "gdp_ppp",
    "unemployment": "unemployment_rate",
    "inflation": "inflation_rate",
    "debt": "public_debt",
    "largest_city": "largest_city_population",
}

_FIGURE = re.compile(
    r"^(-?)\$?(-?\d[\d,]*(?:\.\d+)?)\s*(trillion|billion|million)?\s*(%)?"
    r"(?: of GDP)?\s*(?:\((\d{4})(?: est\.)?\))?"
)
_SCALE = {"trillion": 10**12, "billion": 10**9, "million": 10**6, None: 1}


@dataclass(frozen=True)
class Value:
    """A looked-up figure: the number, the text it was read from, and a detail (a city)."""

    number: int | float
    source_text: str  # as the page shows it, e.g. "$3.162 trillion (2024 est.)" or "66,987,244"
    detail: str = ""  # e.g. the largest city's name


def parse_figure(text: str) -> int | float | None:
    """``"$3.162 trillion (2024 est.)"`` -> 3162000000000; ``"7.4% (2024 est.)"`` -> 7.4."""
    m = _FIGURE.match(text.strip())
    if m is None:
        return None
    try:
        number = Decimal(m.group(2).replace(",", "")) * _SCALE[m.group(3)]
    except InvalidOperation:
        return None
    if m.group(1):
        number = -number
    return int(number) if number == number.to_integral_value() else float(number)


def factbook_text(c: Country, field_name: str) -> str | None:
    """The latest figure of an Economy field, as the Factbook page's first line for it."""
    value = ((c.factbook or {}).get("Economy") or {}).get(field_name)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        firsts = [v for k, v in value.items() if k != "note" and isinstance(v, str)]
        return firsts[0] if firsts else None
    return value if isinstance(value, str) else None


def number_text(x: float) -> str:
    """As the local web writes a count: 12345678 -> '12,345,678' (``rollout.web.site.number``)."""
    return f"{round(x):,}" if float(x).is_integer() else f"{x:,}"


def plain(x: int | float) -> str:
    """A number as the agent should copy it into ``calculate``: digits, no separators."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def fold(text: str) -> str:
    """A name for matching: accents, case, punctuation and a leading "the" dropped."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = re.sub(r"[^\w\s]", " ", text)
    text = re.sub(r"^\s*the\s+", "", text)
    return " ".join(text.split())


class Atlas:
    """Countries by name and code, and their indicators; built once per process."""

    def __init__(self, world: World):
        self.world = world
        self.countries = sorted(world.countries.values(), key=lambda c: c.name.strip())
        self._by_key: dict[str, Country] = {}
        for c in self.countries:
            for key in (c.iso, c.iso3):
                self._by_key.setdefault(fold(key), c)
        for c in self.countries:  # names win over codes ("ago" is Angola's code only)
            self._by_key[fold(c.name)] = c

    @staticmethod
    def name(c: Country) -> str:
        return c.name.strip()

    def find(self, query: str) -> Country | None:
        """The country named (or ISO-coded) by ``query``, or None."""
        return self._by_key.get(fold(query))

    def suggest(self, query: str, n: int = 5) -> list[str]:
        """Country names close to ``query``, for an error message."""
        key = fold(query)
        names = {fold(self.name(c)): self.name(c) for c in self.countries}
        close = difflib.get_close_matches(key, list(names), n=n, cutoff=0.5)
        starts = [v for k, v in names.items() if key and k.startswith(key[:3])]
        return list(dict.fromkeys([names[k] for k in close] + starts))[:n]

    def value(self, c: Country, indicator: str) -> Value | None:
        """The figure, or None when the source has none for this country."""
        ind = INDICATORS[indicator]
        if ind.factbook_field:
            text = factbook_text(c, ind.factbook_field)
            number = parse_figure(text) if text else None
            return Value(number, text) if number is not None and text else None
        if indicator == "population":
            return Value(c.population, number_text(c.population)) if c.population > 0 else None
        if indicator == "area_km2":
            area = int(c.area_km2) if c.area_km2.is_integer() else c.area_km2
            return Value(area, number_text(c.area_km2)) if area > 0 else None
        if indicator == "airports":
            return Value(len(c.airports), str(len(c.airports)))
        if indicator == "cities":
            return Value(len(c.cities), str(len(c.cities)))
        if indicator == "largest_city_population" and c.cities:
            city = self.world.cities[c.cities[0]]
            return Value(city.population, number_text(city.population), city.name)
        return None

    def continent_code(self, text: str) -> str | None:
        """``"Europe"``, ``"europe"`` or ``"EU"`` -> ``"EU"``."""
        key = fold(text)
        for code, name in CONTINENTS.items():
            if key in (code.lower(), fold(name)):
                return code
        return None


@cache
def atlas() -> Atlas:
    """The process's atlas, loaded on first use (about a second) and shared."""
    return Atlas(World())
