"""Question templates over the local web: each yields candidate tasks for its subjects.

A candidate's answer and evidence quotes are the very sentences the pages
render (``rollout.web.site``), so every answer is derived from the page as
rendered. ``subject`` is the entity the question names: splits are drawn by
subject, so no test subject is ever a train subject. Hops count the pages on
the gold path whose evidence the answer needs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rollout.web.build import LocalWeb
from rollout.web.data import Country
from rollout.web.site import number


@dataclass
class Candidate:
    template: str
    type: str  # qa | browse_comp | citation | multi_doc
    subject: str  # e.g. "country:FR"
    question: str
    answer: str
    evidence: list[tuple[str, str]]  # (path, quote), one per hop
    query: str  # the gold path's first search
    aliases: list[str] = field(default_factory=list)
    key_facts: list[str] = field(default_factory=list)
    start: str = "/"
    anchors: dict[str, str] = field(default_factory=dict)  # page -> #fragment to open it at
    # An explicit gold path, (action, args) with site-relative URLs; None: search, then
    # visit each evidence page (see ``rollout.tasks.generate.to_task``).
    path: list[tuple[str, dict]] | None = None
    derived: bool = False  # the answer is computed from the evidence (a count, a sum)
    tolerance: float | None = None  # relative tolerance of a numeric answer
    # The entity the first evidence leads to, when its quote does not end with its name
    # (the noisy oracle's "one hop short" answer; see ``rollout.agent.policies._bridge``)
    bridge: str | None = None

    @property
    def pages(self) -> list[str]:
        """Distinct evidence pages, in gold-path order."""
        return list(dict.fromkeys(path for path, _ in self.evidence))

    @property
    def hops(self) -> int:
        return len(self.pages)


Template = Callable[[LocalWeb], Iterator[Candidate]]
TEMPLATES: dict[str, Template] = {}


def template(fn: Template) -> Template:
    TEMPLATES[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------------- evidence helpers


def _country_ev(c: Country) -> tuple[str, str]:
    return f"/geo/country/{c.iso}", f"The capital of {c.name} is {c.capital}."


def _chief(c: Country) -> str | None:
    eb = (c.factbook or {}).get("Government", {}).get("Executive branch")
    text = eb.get("chief of state") if isinstance(eb, dict) else None
    if not isinstance(text, str):
        return None
    head = re.split(r" \(|;", text, maxsplit=1)[0].strip()
    return head if 3 <= len(head) <= 60 else None


FACTBOOK_CHIEF_ANCHOR = "government-executive-branch"
FACTBOOK_NAME_ANCHOR = "government-country-name"


def _chief_quote(c: Country) -> str:
    """The start of the Factbook line naming the chief of state, up to the name."""
    return f"chief of state: {_chief(c)}"


def _capital_city(lw: LocalWeb, c: Country):
    return lw.world.cities.get(c.capital_city) if c.capital_city else None


def _countries(lw: LocalWeb) -> list[Country]:
    return [c for c in lw.world.countries.values() if c.capital]


# ---------------------------------------------------------------------- one hop


@template
def geo_capital(lw: LocalWeb) -> Iterator[Candidate]:
    for c in _countries(lw):
        yield Candidate(
            "geo_capital", "qa", f"country:{c.iso}", f"What is the capital of {c.name}?",
            c.capital, [_country_ev(c)], f"{c.name} country profile",
        )  # fmt: skip


@template
def geo_currency(lw: LocalWeb) -> Iterator[Candidate]:
    for c in lw.world.countries.values():
        if c.currency_name:
            ev = (f"/geo/country/{c.iso}", f"The currency of {c.name} is the {c.currency_name}.")
            yield Candidate(
                "geo_currency", "qa", f"country:{c.iso}", f"What is the currency of {c.name}?",
                c.currency_name, [ev], f"{c.name} country profile", aliases=[c.currency_code],
            )  # fmt: skip


@template
def factbook_long_name(lw: LocalWeb) -> Iterator[Candidate]:
    for c in lw.world.countries.values():
        names = (c.factbook or {}).get("Government", {}).get("Country name")
        lf = names.get("conventional long form") if isinstance(names, dict) else None
        if isinstance(lf, str) and lf.lower() != "none" and len(lf) < 80:
            ev = (f"/factbook/{c.iso.lower()}", f"conventional long form: {lf}")
            yield Candidate(
                "factbook_long_name", "qa", f"country:{c.iso}",
                f"What is the conventional long-form name of {c.name}?", lf, [ev],
                f"{c.name} The World Factbook", anchors={ev[0]: FACTBOOK_NAME_ANCHOR},
            )  # fmt: skip


@template
def factbook_chief(lw: LocalWeb) -> Iterator[Candidate]:
    for c in lw.world.countries.values():
        chief = _chief(c)
        if chief:
            ev = (f"/factbook/{c.iso.lower()}", _chief_quote(c))
            yield Candidate(
                "factbook_chief", "qa", f"country:{c.iso}",
                f"Who is the chief of state of {c.name}, according to the World Factbook?",
                chief, [ev], f"{c.name} The World Factbook",
                anchors={ev[0]: FACTBOOK_CHIEF_ANCHOR},
            )  # fmt: skip


@template
def airport_city(lw: LocalWeb) -> Iterator[Candidate]:
    for a in lw.world.airports.values():
        if a.city_name:
            country = lw.world.countries[a.country].name
            ev = (f"/airports/{a.iata}", f"is an airport serving {a.city_name}, {country}.")
            yield Candidate(
                "airport_city", "qa", f"airport:{a.iata}",
                f"Which city is served by the airport with IATA code {a.iata}?", a.city_name,
                [ev], f"{a.iata} airport",
            )  # fmt: skip


@template
def element_year(lw: LocalWeb) -> Iterator[Candidate]:
    for e in lw.world.elements.values():
        if e.discovery_year:
            ev = (f"/elements/{e.symbol}", f"{e.name} was discovered in {e.discovery_year}")
            yield Candidate(
                "element_year", "qa", f"element:{e.number}", f"In what year was {e.name} discovered?",
                str(e.discovery_year), [ev], f"{e.name} chemical element",
            )  # fmt: skip


@template
def python_added(lw: LocalWeb) -> Iterator[Candidate]:
    for d in lw.doc_entries:
        yield Candidate(
            "python_added", "qa", f"doc:{d.qualname}",
            f"In which Python version was {d.qualname} added?", d.added,
            [(d.path, f"New in version {d.added}")], d.qualname,
            aliases=[f"Python {d.added}"], start="/docs/index.html",
            anchors={d.path: d.qualname},
        )  # fmt: skip


def _unique_cities(lw: LocalWeb):
    names = Counter((c.name, c.country) for c in lw.world.cities.values())
    return [c for c in lw.world.cities.values() if names[(c.name, c.country)] == 1]


@template
def city_population(lw: LocalWeb) -> Iterator[Candidate]:
    for city in _unique_cities(lw):
        country = lw.world.countries[city.country].name
        pop = number(city.population)
        ev = (f"/geo/city/{city.id}", f"The population of {city.name} is {pop}.")
        yield Candidate(
            "city_population", "qa", f"city:{city.id}",
            f"What is the population of {city.name}, {country}, according to the Atlas?", pop,
            [ev], f"{city.name} {country} city", aliases=[str(city.population)],
        )  # fmt: skip


@template
def city_timezone(lw: LocalWeb) -> Iterator[Candidate]:
    for city in _unique_cities(lw):
        country = lw.world.countries[city.country].name
        ev = (f"/geo/city/{city.id}", f"{city.name} is in the {city.timezone} time zone.")
        yield Candidate(
            "city_timezone", "qa", f"city:{city.id}",
            f"Which time zone is {city.name}, {country} in?", city.timezone, [ev],
            f"{city.name} {country} city",
        )  # fmt: skip
