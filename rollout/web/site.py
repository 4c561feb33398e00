"""The local web's pages, built from the world: every static page rendered once.

``Site`` holds each static page (path -> :class:`Page`, with its visible text)
and renders the dynamic ones on request (paginated lists, JSON data behind the
JavaScript-rendered panels). Page content is a pure function of the world, so
two builds from the same package versions are byte-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rollout.web.data import Airport, City, Country, Element, World
from rollout.web.templates import SITES, environment
from rollout.web.text import visible_text

CONTINENTS = {
    "AF": "Africa",
    "AN": "Antarctica",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "OC": "Oceania",
    "SA": "South America",
}
PAGE_SIZE = 50  # entries per page of a paginated list


@dataclass
class Page:
    path: str
    title: str
    site: str
    html: str
    text: str  # visible text of the whole page
    main_text: str  # visible text of its main region
    indexed: bool = True  # part of the search index


def number(x: float) -> str:
    """12345678 -> '12,345,678'; integral floats lose their '.0'."""
    return f"{round(x):,}" if float(x).is_integer() else f"{x:,}"


class Site:
    """Every page of the local web except the Python docs (see ``rollout.web.pydocs``)."""

    def __init__(self, world: World):
        self.world = world
        self.env = environment()
        self.pages: dict[str, Page] = {}
        # each city's place in its country's list (0: the largest)
        self.list_rank = {i: k for c in world.countries.values() for k, i in enumerate(c.cities)}
        self._build()

    def __getstate__(self) -> dict[str, Any]:  # the jinja environment is rebuilt, not pickled
        return {k: v for k, v in self.__dict__.items() if k != "env"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.env = environment()

    # ------------------------------------------------------------------ helpers

    def render(self, template: str, site: str, title: str, crumbs: list, **ctx: Any) -> str:
        return self.env.get_template(template).render(
            site=site, site_name=SITES[site], title=title, crumbs=crumbs, **ctx
        )

    def _add(self, path: str, site: str, title: str, html: str, indexed: bool = True) -> None:
        text, main = visible_text(html)
        self.pages[path] = Page(path, title, site, html, text, main, indexed)

    # ------------------------------------------------------------------ sentences

    def country_lead(self, c: Country) -> str:
        parts = [f"{c.name} is a country in {CONTINENTS.get(c.continent, c.continent)}."]
        if c.capital:
            parts.append(f"The capital of {c.name} is {c.capital}.")
        parts.append(
            f"{c.name} covers an area of {number(c.area_km2)} square kilometres "
            f"and has a population of {number(c.population)}."
        )
        if c.currency_name:
            parts.append(f"The currency of {c.name} is the {c.currency_name}.")
        return " ".join(parts)

    def largest_neighbour(self, c: Country) -> Country | None:
        ns = [self.world.countries[n] for n in c.neighbours]
        if not ns:
            return None
        top = max(ns, key=lambda n: n.area_km2)
        if sum(1 for n in ns if n.area_km2 == top.area_km2) > 1:
            return None  # a tie has no single answer
        return top

    def neighbour_sentence(self, c: Country) -> str:
        n = len(c.neighbours)
        s = f"{c.name} borders {n} {'country' if n == 1 else 'countries'}."
        top = self.largest_neighbour(c)
        if top is not None and n > 1:
            s += f" The largest neighbour of {c.name} by area is {top.name}."
        return s

    def city_lead(self, city: City) -> str:
        c = self.world.countries[city.country]
        s = (
            f"{city.name} is a city in {c.name}. The population of {city.name} is "
            f"{number(city.population)}. {city.name} is in the {city.timezone} time zone."
        )
        if c.capital_city == city.id:
            s += f" {city.name} is the capital of {c.name}."
        return s

    def airport_lead(self, a: Airport) -> str:
        country = self.world.countries[a.country].name
        s = f"{a.name} is an airport serving {a.city_name}, {country}. Its IATA code is {a.iata}"
        return s + (f" and its ICAO code is {a.icao}." if a.icao else ".")

    def element_discovery(self, e: Element) -> str:
        if not e.discovery_year:
            return f"{e.name} has been known since ancient times."
        where = f" in {e.discovery_location}" if e.discovery_location else ""
        return f"{e.name} was discovered in {e.discovery_year}{where} by {e.discoverers}."

    # ------------------------------------------------------------------ build

    def _build(self) -> None:
        self._add(
            "/",
            "search",
            "Seek",
            self.render("search_home", "search", "Seek", [("", "Seek")]),
            indexed=False,
        )
        self._build_geo()
        self._build_factbook()
        self._build_airports()
        self._build_elements()

    def _build_geo(self) -> None:
        w = self.world
        countries = sorted(w.countries.values(), key=lambda c: c.name)
        items = [(f"/geo/country/{c.iso}", c.name, c.continent) for c in countries]
        crumbs = [("/", "Seek"), ("", "Atlas")]
        html = self.render(
            "index",
            "geo",
            "Atlas",
            crumbs,
            heading="Atlas of the world",
            intro=f"Profiles of {len(items)} countries and {len(w.cities):,} cities.",
            filters=sorted(CONTINENTS),
            items=items,
            list_class="countries",
        )
        self._add("/geo/", "geo", "Atlas", html)
        for code, name in CONTINENTS.items():
            members = [(h, label, t) for h, label, t in items if t == code]
            html = self.render(
                "index",
                "geo",
                name,
                [("/", "Seek"), ("/geo/", "Atlas"), ("", name)],
                heading=f"Countries of {name}",
                intro=f"{name} has {len(members)} countries in the Atlas.",
                filters=[],
                items=members,
                list_class="countries",
            )
            self._add(f"/geo/continent/{code}", "geo", name, html)
        for c in countries:
            self._add(
                f"/geo/country/{c.iso}", "geo", f"{c.name} - country profile", self._geo_country(c)
            )
        for city in w.cities.values():
            country = w.countries[city.country].name
            self._add(
                f"/geo/city/{city.id}",
                "geo",
                f"{city.name}, {country} - city",
                self._geo_city(city),
            )

    def _geo_country(self, c: Country) -> str:
        w = self.world
        neighbours = sorted((w.countries[n] for n in c.neighbours), key=lambda n: n.name)
        return self.render(
            "geo_country",
            "geo",
            c.name,
            [
                ("/", "Seek"),
                ("/geo/", "Atlas"),
                (f"/geo/continent/{c.continent}", CONTINENTS.get(c.continent, c.continent)),
                ("", c.name),
            ],
            c=c,
            lead=self.country_lead(c),
            capital=w.cities.get(c.capital_city) if c.capital_city else None,
            continent=CONTINENTS.get(c.continent, c.continent),
            area=number(c.area_km2),
            population=number(c.population),
            neighbours=[(n, number(n.area_km2)) for n in neighbours],
            neighbour_sentence=self.neighbour_sentence(c),
            cities=[w.cities[i] for i in c.cities[:10]],
            n_cities=len(c.cities),
            elements=[w.elements[n] for n in c.elements],
        )

    def _geo_city(self, city: City) -> str:
        w = self.world
        country = w.countries[city.country]
        return self.render(
            "geo_city",
            "geo",
            city.name,
            [
                ("/", "Seek"),
                ("/geo/", "Atlas"),
                (f"/geo/country/{country.iso}", country.name),
                ("", city.name),
            ],
            city=city,
            country=country,
            lead=self.city_lead(city),
            population=number(city.population),
            airports=[w.airports[i] for i in city.airports],
            prev=self.list_neighbour(city, -1),
            next=self.list_neighbour(city, +1),
        )

    def list_neighbour(self, city: City, step: int) -> City | None:
        """The city before (``step`` -1) or after (+1) ``city`` in its country's Atlas list
        (largest first), as the city page's "Previous" and "Next" links name them."""
        c = self.world.countries[city.country]
        k = self.list_rank[city.id] + step
        return self.world.cities[c.cities[k]] if 0 <= k < len(c.cities) else None

    def _build_factbook(self) -> None:
        w = self.world
        countries = sorted((c for c in w.countries.values() if c.factbook), key=lambda c: c.name)
        items = [(f"/factbook/{c.iso.lower()}", c.name, c.name[0]) for c in countries]
        html = self.render(
            "index",
            "factbook",
            "World Factbook",
            [("/", "Seek"), ("", "World Factbook")],
            heading="The World Factbook",
            intro=f"Entries for {len(items)} countries and territories, A to Z.",
            filters=sorted({t for _, _, t in items}),
            items=items,
            list_class="countries",
        )
        self._add("/factbook/", "factbook", "World Factbook", html)
        for c in countries:
            sections = [(name, _fields(body)) for name, body in c.factbook.items()]
            html = self.render(
                "factbook_country",
                "factbook",
                c.name,
                [("/", "Seek"), ("/factbook/", "World Factbook"), ("", c.name)],
                c=c,
                sections=sections,
            )
            self._add(
                f"/factbook/{c.iso.lower()}", "factbook", f"{c.name} - The World Factbook", html
            )

    def _build_airports(self) -> None:
        w = self.world
        countries = sorted((c for c in w.countries.values() if c.airports), key=lambda c: c.name)
        items = [
            (f"/airports/country/{c.iso}?page=1", f"{c.name} ({len(c.airports)})", c.continent)
            for c in countries
        ]
        html = self.render(
            "index",
            "airports",
            "AirportDB",
            [("/", "Seek"), ("", "AirportDB")],
            heading="AirportDB",
            intro=f"{len(w.airports):,} airports with IATA codes, by country.",
            filters=sorted(CONTINENTS),
            items=items,
            list_class="countries",
        )
        self._add("/airports/", "airports", "AirportDB", html)
        for a in w.airports.values():
            country = w.countries[a.country]
            html = self.render(
                "airport",
                "airports",
                f"{a.name} ({a.iata})",
                [
                    ("/", "Seek"),
                    ("/airports/", "AirportDB"),
                    (f"/airports/country/{country.iso}?page=1", country.name),
                    ("", a.iata),
                ],
                a=a,
                country=country,
                city=w.cities.get(a.city) if a.city else None,
                lead=self.airport_lead(a),
            )
            self._add(f"/airports/{a.iata}", "airports", f"{a.name} ({a.iata}) - airport", html)

    def _build_elements(self) -> None:
        w = self.world
        els = list(w.elements.values())
        items = [(f"/elements/{e.symbol}", f"{e.number} {e.symbol} {e.name}", e.block) for e in els]
        html = self.render(
            "index",
            "elements",
            "Elements",
            [("/", "Seek"), ("", "Elements")],
            heading="Periodic table of the elements",
            intro=f"All {len(els)} chemical elements, with their discovery and uses.",
            filters=sorted({e.block for e in els}),
            items=items,
            list_class="table",
        )
        self._add("/elements/", "elements", "Elements", html)
        for i, e in enumerate(els):
            country = w.countries.get(e.country) if e.country else None
            html = self.render(
                "element",
                "elements",
                f"{e.name} ({e.symbol})",
                [("/", "Seek"), ("/elements/", "Elements"), ("", e.name)],
                e=e,
                country=country,
                lead=f"{e.name} is the chemical element with symbol {e.symbol} and atomic number {e.number}.",
                discovery=self.element_discovery(e),
                weight=f"{e.atomic_weight:g}",
                prev=els[i - 1],
                next=els[(i + 1) % len(els)],
            )
            self._add(
                f"/elements/{e.symbol}",
                "elements",
                f"{e.name} ({e.symbol}) - chemical element",
                html,
            )

    # ------------------------------------------------------------------ dynamic pages

    def paginated(self, kind: str, iso: str, page: int) -> str | None:
        """A page of a country's cities or airports; None when there is no such page."""
        c = self.world.countries.get(iso)
        if c is None:
            return None
        if kind == "cities":
            entries = [(f"/geo/city/{i}", self.world.cities[i].name) for i in c.cities]
            site, base, heading = "geo", f"/geo/country/{iso}/cities", f"Cities of {c.name}"
            intro = f"{c.name} has {len(entries)} cities in the Atlas, largest first."
        else:
            entries = [
                (f"/airports/{i}", f"{self.world.airports[i].name} ({i})") for i in c.airports
            ]
            site, base, heading = "airports", f"/airports/country/{iso}", f"Airports in {c.name}"
            intro = f"{c.name} has {len(entries)} airports with IATA codes, by code."
        pages = max(1, math.ceil(len(entries) / PAGE_SIZE))
        if not 1 <= page <= pages:
            return None
        root = ("/geo/", "Atlas") if site == "geo" else ("/airports/", "AirportDB")
        return self.render(
            "list",
            site,
            f"{heading} - page {page}",
            [("/", "Seek"), root, ("", heading)],
            heading=heading,
            intro=intro,
            items=entries[(page - 1) * PAGE_SIZE : page * PAGE_SIZE],
            start=(page - 1) * PAGE_SIZE + 1,
            page=page,
            pages=pages,
            prev=f"{base}?page={page - 1}" if page > 1 else None,
            next=f"{base}?page={page + 1}" if page < pages else None,
        )

    def airport_details(self, iata: str) -> dict[str, Any] | None:
        a = self.world.airports.get(iata)
        if a is None:
            return None
        return {
            "Elevation": f"{a.elevation_ft:,} ft",
            "Time zone": a.timezone,
            "Region": a.subdivision or "-",
            "Coordinates": f"{a.latitude:.4f}, {a.longitude:.4f}",
        }

    def element_details(self, symbol: str) -> dict[str, Any] | None:
        e = next((e for e in self.world.elements.values() if e.symbol == symbol), None)
        if e is None:
            return None
        density = f"{e.density:g} g/cm³" if e.density is not None else "unknown"
        return {"Density": density, "Block": e.block, "Period": e.period}


def _fields(body: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """A Factbook section as (subsection, [(label, value)]) for the template."""
    out = []
    for sub, value in body.items() if isinstance(body, dict) else []:
        if isinstance(value, str):
            out.append((sub, [("", value)]))
        elif isinstance(value, dict):
            out.append((sub, list(_leaves(value))))
    return out


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        label = f"{prefix}{k}"
        if isinstance(v, str):
            yield (label if label != "text" else "", v)
        elif isinstance(v, dict):
            yield from _leaves(v, f"{label} - ")
