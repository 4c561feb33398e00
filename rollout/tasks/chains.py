"""Templates that chain across sites (2-4 hops), BrowseComp-style inverted questions,
and multi-document questions with key facts. Registered in ``TEMPLATES`` on import."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from rollout.tasks.templates import (
    FACTBOOK_CHIEF_ANCHOR,
    Candidate,
    _capital_city,
    _chief,
    _chief_quote,
    _countries,
    _country_ev,
    template,
)
from rollout.web.build import LocalWeb
from rollout.web.site import number


def _element_ev(e) -> tuple[str, str]:
    return (
        f"/elements/{e.symbol}",
        f"{e.name} was discovered in {e.discovery_year} in {e.discovery_location}",
    )


def _airport_ev(lw: LocalWeb, a) -> tuple[str, str]:
    country = lw.world.countries[a.country].name
    return f"/airports/{a.iata}", f"is an airport serving {a.city_name}, {country}."


def _city_pop_ev(city) -> tuple[str, str]:
    return f"/geo/city/{city.id}", f"The population of {city.name} is {number(city.population)}."


def _city_tz_ev(city) -> tuple[str, str]:
    return f"/geo/city/{city.id}", f"{city.name} is in the {city.timezone} time zone."


def _discovered(lw: LocalWeb):
    for e in lw.world.elements.values():
        c = lw.world.countries.get(e.country) if e.country else None
        if c is not None and e.discovery_year and c.capital:
            yield e, c


def _located(lw: LocalWeb):
    for a in lw.world.airports.values():
        c = lw.world.countries[a.country]
        if a.city_name and c.capital:
            yield a, c


# ---------------------------------------------------------------------- chains


@template
def element_capital(lw: LocalWeb) -> Iterator[Candidate]:
    for e, c in _discovered(lw):
        yield Candidate(
            "element_capital", "qa", f"element:{e.number}",
            f"What is the capital of the country where {e.name} was discovered?", c.capital,
            [_element_ev(e), _country_ev(c)], f"{e.name} chemical element",
        )  # fmt: skip


@template
def airport_capital(lw: LocalWeb) -> Iterator[Candidate]:
    for a, c in _located(lw):
        yield Candidate(
            "airport_capital", "qa", f"airport:{a.iata}",
            f"What is the capital of the country where the airport with IATA code {a.iata} is located?",
            c.capital, [_airport_ev(lw, a), _country_ev(c)], f"{a.iata} airport",
        )  # fmt: skip


@template
def capital_timezone(lw: LocalWeb) -> Iterator[Candidate]:
    for c in _countries(lw):
        city = _capital_city(lw, c)
        if city is not None:
            yield Candidate(
                "capital_timezone", "qa", f"country:{c.iso}",
                f"Which time zone is the capital of {c.name} in?", city.timezone,
                [_country_ev(c), _city_tz_ev(city)], f"{c.name} country profile",
            )  # fmt: skip


@template
def neighbour_currency(lw: LocalWeb) -> Iterator[Candidate]:
    for c in lw.world.countries.values():
        n = lw.site.largest_neighbour(c) if len(c.neighbours) > 1 else None
        if n is not None and n.currency_name:
            ev1 = (
                f"/geo/country/{c.iso}",
                f"The largest neighbour of {c.name} by area is {n.name}.",
            )
            ev2 = (f"/geo/country/{n.iso}", f"The currency of {n.name} is the {n.currency_name}.")
            yield Candidate(
                "neighbour_currency", "qa", f"country:{c.iso}",
                f"What is the currency of the largest neighbour, by area, of {c.name}?",
                n.currency_name, [ev1, ev2], f"{c.name} country profile", aliases=[n.currency_code],
            )  # fmt: skip


@template
def element_capital_population(lw: LocalWeb) -> Iterator[Candidate]:
    for e, c in _discovered(lw):
        city = _capital_city(lw, c)
        if city is not None:
            yield Candidate(
                "element_capital_population", "qa", f"element:{e.number}",
                f"What is the population of the capital of the country where {e.name} was "
                "discovered, according to the Atlas?", number(city.population),
                [_element_ev(e), _country_ev(c), _city_pop_ev(city)], f"{e.name} chemical element",
                aliases=[str(city.population)],
            )  # fmt: skip


@template
def airport_capital_timezone(lw: LocalWeb) -> Iterator[Candidate]:
    for a, c in _located(lw):
        city = _capital_city(lw, c)
        if city is not None:
            yield Candidate(
                "airport_capital_timezone", "qa", f"airport:{a.iata}",
                f"Which time zone is the capital of the country where the airport with IATA code "
                f"{a.iata} is located in?", city.timezone,
                [_airport_ev(lw, a), _country_ev(c), _city_tz_ev(city)], f"{a.iata} airport",
            )  # fmt: skip


@template
def airport_chief(lw: LocalWeb) -> Iterator[Candidate]:
    for a, c in _located(lw):
        chief = _chief(c)
        if chief:
            fb = (f"/factbook/{c.iso.lower()}", _chief_quote(c))
            yield Candidate(
                "airport_chief", "qa", f"airport:{a.iata}",
                f"According to the World Factbook, who is the chief of state of the country where "
                f"the airport with IATA code {a.iata} is located?", chief,
                [_airport_ev(lw, a), _country_ev(c), fb], f"{a.iata} airport",
                anchors={fb[0]: FACTBOOK_CHIEF_ANCHOR},
            )  # fmt: skip


@template
def airport_neighbour_capital_population(lw: LocalWeb) -> Iterator[Candidate]:
    for a, c in _located(lw):
        n = lw.site.largest_neighbour(c) if len(c.neighbours) > 1 else None
        city = _capital_city(lw, n) if n is not None else None
        if city is None:
            continue
        ev2 = (f"/geo/country/{c.iso}", f"The largest neighbour of {c.name} by area is {n.name}.")
        yield Candidate(
            "airport_neighbour_capital_population", "qa", f"airport:{a.iata}",
            f"What is the population of the capital of the largest neighbour, by area, of the "
            f"country where the airport with IATA code {a.iata} is located?",
            number(city.population),
            [_airport_ev(lw, a), ev2, _country_ev(n), _city_pop_ev(city)], f"{a.iata} airport",
            aliases=[str(city.population)],
        )  # fmt: skip


# ---------------------------------------------------------------------- inverted (BrowseComp)


@template
def element_by_discovery(lw: LocalWeb) -> Iterator[Candidate]:
    els = [e for e in lw.world.elements.values() if e.discovery_year and e.discoverers != "unknown"]
    seen = Counter((e.discovery_year, e.discoverers) for e in els)
    for e in els:
        if seen[(e.discovery_year, e.discoverers)] == 1:
            ev = (f"/elements/{e.symbol}", f"{e.name} was discovered in {e.discovery_year}")
            yield Candidate(
                "element_by_discovery", "browse_comp", f"element:{e.number}",
                f"Which chemical element was discovered in {e.discovery_year} by {e.discoverers}?",
                e.name, [ev], f"discovered {e.discovery_year} {e.discoverers}", aliases=[e.symbol],
            )  # fmt: skip


@template
def country_by_capital_currency(lw: LocalWeb) -> Iterator[Candidate]:
    cs = [c for c in _countries(lw) if c.currency_name]
    seen = Counter((c.capital, c.currency_name) for c in cs)
    for c in cs:
        if seen[(c.capital, c.currency_name)] == 1:
            yield Candidate(
                "country_by_capital_currency", "browse_comp", f"country:{c.iso}",
                f"Which country has {c.capital} as its capital and the {c.currency_name} as its currency?",
                c.name, [_country_ev(c)], f"capital {c.capital} currency {c.currency_name}",
            )  # fmt: skip


@template
def airport_by_icao(lw: LocalWeb) -> Iterator[Candidate]:
    names = Counter(a.name for a in lw.world.airports.values())
    for a in lw.world.airports.values():
        if a.icao and names[a.name] == 1:
            ev = (f"/airports/{a.iata}", f"its ICAO code is {a.icao}.")
            yield Candidate(
                "airport_by_icao", "browse_comp", f"airport:{a.iata}",
                f"Which airport has the ICAO code {a.icao}?", a.name, [ev],
                f"ICAO code {a.icao} airport", aliases=[a.iata],
            )  # fmt: skip


# ---------------------------------------------------------------------- multi-document


@template
def element_discovery_summary(lw: LocalWeb) -> Iterator[Candidate]:
    for e, c in _discovered(lw):
        facts = [str(e.discovery_year), e.discovery_location, c.capital]
        yield Candidate(
            "element_discovery_summary", "multi_doc", f"element:{e.number}",
            f"When and where was {e.name} discovered, and what is the capital of that country?",
            f"{e.name} was discovered in {e.discovery_year} in {e.discovery_location}; "
            f"the capital of {c.name} is {c.capital}.",
            [_element_ev(e), _country_ev(c)], f"{e.name} chemical element", key_facts=facts,
        )  # fmt: skip


@template
def airport_country_profile(lw: LocalWeb) -> Iterator[Candidate]:
    for a, c in _located(lw):
        if not c.currency_name:
            continue
        cur = (f"/geo/country/{c.iso}", f"The currency of {c.name} is the {c.currency_name}.")
        yield Candidate(
            "airport_country_profile", "multi_doc", f"airport:{a.iata}",
            f"Which city does the airport with IATA code {a.iata} serve, and what are the capital "
            "and the currency of its country?",
            f"{a.city_name}; the capital is {c.capital} and the currency is the {c.currency_name}.",
            [_airport_ev(lw, a), _country_ev(c), cur], f"{a.iata} airport",
            key_facts=[a.city_name, c.capital, c.currency_name],
        )  # fmt: skip
