"""Long-horizon task families: gold paths of 10-50 actions over the local web.

- ``aggregation``: counting over a country's paginated city list (the list is
  "largest first", so a count above or below a threshold is a walk to the first
  city past it, page after page for the smallest ones) and sums with a numeric
  tolerance (``Candidate.tolerance``, checked by the ``qa`` verifier).
- ``constraint``: BrowseComp-style, the one city that satisfies three facts
  spread over the Atlas's country and city pages and AirportDB's JavaScript
  panels; no single page gives it away, the gold path enumerates the candidates
  and checks each.
- ``join``: Atlas -> AirportDB joins whose deciding fact (an airport's elevation)
  is only in the JavaScript-rendered panel (in api mode, which runs no
  JavaScript, the gold path reads the panel's JSON source instead).
- ``walk``: a chain of hops where each page names the next: down a country's city
  list, city page by city page (each links the next one, "Next: ..."), to the first
  city whose page lists an airport. Every action is a local decision on the page in
  view (follow "Next", or answer with the name of the city whose page lists an
  airport), every name a copy, so a small policy can learn it at any length.

These templates register in ``TEMPLATES`` but are not part of the default draw
(``LONG_TEMPLATES``): ``generate`` gives them only when named in ``templates``.
Their candidates carry an explicit gold path (``Candidate.path``): ``visit`` (with
``data`` for a JavaScript panel's source) and ``next_page`` (follow the page's
"Next page" or "Next: ..." link, which the oracle clicks in the browser modes).

The members' area is not used: its login is a form POST, which api mode cannot send.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import Counter
from collections.abc import Iterator

from rollout.tasks.templates import Candidate, template
from rollout.web.build import LocalWeb
from rollout.web.data import City, Country
from rollout.web.site import PAGE_SIZE, number

FAMILIES: dict[str, tuple[str, ...]] = {
    "aggregation": (
        "agg_cities_above",
        "agg_cities_below",
        "agg_top_cities_sum",
        "agg_airport_elevation_range",
    ),
    "constraint": ("constraint_city", "constraint_airport"),
    "join": ("join_highest_airport", "join_city_airports_highest"),
    "walk": ("walk_city_airport",),
}
LONG_TEMPLATES = frozenset(t for ts in FAMILIES.values() for t in ts)
MIN_STEPS, MAX_STEPS = 10, 50  # gold-path actions (the answer not counted)
SUM_TOLERANCE = 0.005  # relative


def _pick(key: str, lo: int, hi: int) -> int:
    """A stable pseudo-random integer in [lo, hi]."""
    return lo + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % (hi - lo + 1)


def _search(c: Country) -> tuple[str, dict]:
    return ("search", {"query": f"{c.name} country profile"})


def _visit(path: str, data: str | None = None) -> tuple[str, dict]:
    return ("visit", {"url": path, **({"data": data} if data else {})})


def _pop_ev(city: City) -> tuple[str, str]:
    return f"/geo/city/{city.id}", f"The population of {city.name} is {number(city.population)}."


def _tz_ev(city: City) -> tuple[str, str]:
    return f"/geo/city/{city.id}", f"{city.name} is in the {city.timezone} time zone."


def _list_page(c: Country, page: int) -> str:
    return f"/geo/country/{c.iso}/cities?page={page}"


def _list_ev(c: Country) -> tuple[str, str]:
    return _list_page(c, 1), f"{c.name} has {len(c.cities)} cities in the Atlas, largest first."


def _elev_ev(a) -> tuple[str, str]:
    return f"/airports/{a.iata}", f"{a.elevation_ft:,} ft"


def _airport_visit(a) -> tuple[str, dict]:
    return _visit(f"/airports/{a.iata}", f"/airports/api/{a.iata}.json")


def _ok(path: list) -> bool:
    return MIN_STEPS <= len(path) <= MAX_STEPS


def _threshold(above: int, below: int) -> int:
    """A round number t with below <= t < above (the coarsest such), for "more than t"."""
    for step in (100_000, 10_000, 1000, 100, 10, 1):
        t = math.ceil(below / step) * step
        if below <= t < above:
            return t
    return below


# ---------------------------------------------------------------------- aggregation


@template
def agg_cities_above(lw: LocalWeb) -> Iterator[Candidate]:
    w = lw.world
    for c in w.countries.values():
        n = len(c.cities)
        if n < 10:
            continue
        cities = [w.cities[i] for i in c.cities]
        k = _pick(f"above|{c.iso}", 8, min(45, n - 1))  # cities above the threshold
        if cities[k - 1].population == cities[k].population:
            continue
        t = _threshold(cities[k - 1].population, cities[k].population)
        walk = cities[: k + 1]  # up to the first city at or below the threshold
        path = [_search(c), _visit(f"/geo/country/{c.iso}"), _visit(_list_page(c, 1))]
        path += [_visit(f"/geo/city/{x.id}") for x in walk]
        if not _ok(path):
            continue
        yield Candidate(
            "agg_cities_above", "qa", f"country:{c.iso}",
            f"How many cities of {c.name} have a population of more than {t:,}, according to "
            "the Atlas?", str(k), [_list_ev(c), *(_pop_ev(x) for x in walk)],
            path[0][1]["query"], path=path, derived=True,
        )  # fmt: skip


@template
def agg_cities_below(lw: LocalWeb) -> Iterator[Candidate]:
    """The smallest cities are on the list's last page: reached by "Next page", page by page."""
    w = lw.world
    for c in w.countries.values():
        n = len(c.cities)
        pages = math.ceil(n / PAGE_SIZE)
        if pages < 2:
            continue
        cities = [w.cities[i] for i in c.cities]
        room = MAX_STEPS - (2 + pages) - 1  # visits left for cities
        if room < 4:
            continue
        k = _pick(f"below|{c.iso}", max(3, MIN_STEPS - (2 + pages)), min(20, room - 1))
        edge = cities[n - k - 1]  # the smallest city not below the threshold
        if edge.population == cities[n - k].population:
            continue
        t = edge.population  # "less than t": the k smallest
        walk = cities[n - k - 1 :]
        path = [_search(c), _visit(f"/geo/country/{c.iso}"), _visit(_list_page(c, 1))]
        path += [("next_page", {"url": _list_page(c, p)}) for p in range(2, pages + 1)]
        path += [_visit(f"/geo/city/{x.id}") for x in walk]
        if not _ok(path):
            continue
        yield Candidate(
            "agg_cities_below", "qa", f"country:{c.iso}",
            f"How many cities of {c.name} have a population of less than {t:,}, according to "
            "the Atlas?", str(k), [_list_ev(c), *(_pop_ev(x) for x in walk)],
            path[0][1]["query"], path=path, derived=True,
        )  # fmt: skip


@template
def agg_top_cities_sum(lw: LocalWeb) -> Iterator[Candidate]:
    w = lw.world
    for c in w.countries.values():
        if len(c.cities) < 10:
            continue
        top = [w.cities[i] for i in c.cities[:10]]
        total = sum(x.population for x in top)
        path = [_search(c), _visit(f"/geo/country/{c.iso}")]
        path += [_visit(f"/geo/city/{x.id}") for x in top]
        yield Candidate(
            "agg_top_cities_sum", "qa", f"country:{c.iso}",
            f"What is the total population of the ten largest cities of {c.name}, according to "
            "the Atlas's city pages?", number(total), [_pop_ev(x) for x in top],
            path[0][1]["query"], aliases=[str(total)], path=path, derived=True,
            tolerance=SUM_TOLERANCE,
        )  # fmt: skip


def _country_airports(lw: LocalWeb, c: Country) -> list | None:
    """The country's airports when they fit on the first page of AirportDB's list."""
    airports = [lw.world.airports[i] for i in c.airports]
    return airports if 8 <= len(airports) <= PAGE_SIZE else None


def _airports_path(c: Country, airports: list) -> list[tuple[str, dict]]:
    path = [_search(c), _visit(f"/geo/country/{c.iso}")]
    path.append(_visit(f"/airports/country/{c.iso}?page=1"))
    return path + [_airport_visit(a) for a in airports]


@template
def agg_airport_elevation_range(lw: LocalWeb) -> Iterator[Candidate]:
    """A difference: the highest minus the lowest airport elevation of a country."""
    for c in lw.world.countries.values():
        airports = _country_airports(lw, c)
        if airports is None:
            continue
        els = [a.elevation_ft for a in airports]
        path = _airports_path(c, airports)
        if not _ok(path):
            continue
        span = max(els) - min(els)
        yield Candidate(
            "agg_airport_elevation_range", "qa", f"country:{c.iso}",
            f"What is the difference, in feet, between the highest and the lowest airport "
            f"elevations in {c.name}, among its airports listed in AirportDB?", f"{span:,} ft",
            [_elev_ev(a) for a in airports], path[0][1]["query"],
            aliases=[f"{span:,}", str(span)], path=path, derived=True, tolerance=0.0,
        )  # fmt: skip


# ---------------------------------------------------------------------- constraint search


@template
def constraint_airport(lw: LocalWeb) -> Iterator[Candidate]:
    """The one airport of X above E ft whose page links to an Atlas city in time zone T of
    more than P people: every airport's panel (AirportDB), then the Atlas page of the
    city each high airport links to (an airport without one cannot qualify)."""
    w = lw.world
    for c in w.countries.values():
        airports = _country_airports(lw, c)
        if airports is None or len({a.name for a in airports}) < len(airports):
            continue
        ranked = sorted(airports, key=lambda a: -a.elevation_ft)
        found = None
        for m in range(3, min(8, len(ranked) - 1) + 1):
            if ranked[m - 1].elevation_ft == ranked[m].elevation_ft:
                continue
            high = [a for a in ranked[:m] if a.city is not None]  # linked to an Atlas city
            for t in high:
                city = w.cities[t.city]
                rivals = [
                    a for a in high if a is not t and w.cities[a.city].timezone == city.timezone
                ]
                lower = [w.cities[a.city].population for a in rivals]
                if not rivals or max(lower) >= city.population:
                    continue  # the time zone alone decides, or the population cannot
                p = _threshold(city.population, max(lower))
                found = (t, city, high, ranked[m].elevation_ft, p)
                break
            if found:
                break
        if found is None:
            continue
        t, city, high, e, p = found
        path = _airports_path(c, airports)
        cities = list(dict.fromkeys(a.city for a in high))
        path += [_visit(f"/geo/city/{i}") for i in cities]
        if not _ok(path):
            continue
        ev = [_elev_ev(a) for a in airports]
        ev += [x for i in cities for x in (_tz_ev(w.cities[i]), _pop_ev(w.cities[i]))]
        yield Candidate(
            "constraint_airport", "browse_comp", f"country:{c.iso}",
            f"Which airport in {c.name}, listed in AirportDB, is at an elevation above {e:,} ft "
            f"and links to an Atlas city in the {city.timezone} time zone with a population "
            f"of more than {p:,}?", t.name, ev, path[0][1]["query"],
            aliases=[t.iata], path=path,
        )  # fmt: skip


def _top_elevation(lw: LocalWeb, city: City) -> int | None:
    els = [lw.world.airports[i].elevation_ft for i in city.airports]
    return max(els) if els else None


@template
def constraint_city(lw: LocalWeb) -> Iterator[Candidate]:
    """Among the ten largest cities of X, the one in time zone T served by an airport above E ft.

    Several of the ten are in T, at least two of those have airports, and exactly one
    has an airport above E: the time zone, the airports and their elevations (a
    JavaScript panel on another site) are all needed, and every candidate is checked."""
    w = lw.world
    for c in w.countries.values():
        if len(c.cities) < 10:
            continue
        top = [w.cities[i] for i in c.cities[:10]]
        if len({x.name for x in top}) < 10:
            continue
        best = None
        for t in top:
            same = [x for x in top if x.timezone == t.timezone]
            flying = [x for x in same if x.airports]
            if len(same) < 3 or len(flying) < 2 or t not in flying:
                continue
            others = [_top_elevation(lw, x) for x in flying if x is not t]
            e = max(others)
            if _top_elevation(lw, t) > e:
                best = (t, same, flying, e)
                break
        if best is None:
            continue
        t, same, flying, e = best
        path = [_search(c), _visit(f"/geo/country/{c.iso}")]
        path += [_visit(f"/geo/city/{x.id}") for x in top]
        airports = [w.airports[i] for x in flying for i in x.airports]
        path += [_airport_visit(a) for a in airports]
        if not _ok(path):
            continue
        ev = [_tz_ev(x) for x in top] + [_elev_ev(a) for a in airports]
        yield Candidate(
            "constraint_city", "browse_comp", f"country:{c.iso}",
            f"Which of the ten largest cities of {c.name} is in the {t.timezone} time zone and "
            f"is served by an airport, listed in AirportDB, at an elevation above {e:,} ft?",
            t.name, ev, path[0][1]["query"], path=path,
        )  # fmt: skip


# ---------------------------------------------------------------------- cross-site joins


@template
def join_highest_airport(lw: LocalWeb) -> Iterator[Candidate]:
    """Atlas profile -> AirportDB's list of the country's airports -> every airport's panel."""
    for c in lw.world.countries.values():
        airports = _country_airports(lw, c)
        if airports is None:
            continue
        top = max(airports, key=lambda a: a.elevation_ft)
        if sum(a.elevation_ft == top.elevation_ft for a in airports) > 1:
            continue
        if sum(a.name == top.name for a in airports) > 1:
            continue
        path = [
            _search(c),
            _visit(f"/geo/country/{c.iso}"),
            _visit(f"/airports/country/{c.iso}?page=1"),
        ]
        path += [_airport_visit(a) for a in airports]
        if not _ok(path):
            continue
        yield Candidate(
            "join_highest_airport", "qa", f"country:{c.iso}",
            f"Which airport in {c.name} listed in AirportDB is at the highest elevation?",
            top.name, [_elev_ev(a) for a in airports], path[0][1]["query"],
            aliases=[top.iata], path=path,
        )  # fmt: skip


@template
def join_city_airports_highest(lw: LocalWeb) -> Iterator[Candidate]:
    """Atlas country -> its ten largest cities -> their airports in AirportDB: the highest
    elevation among them (a number, from the JavaScript panels)."""
    w = lw.world
    for c in w.countries.values():
        if len(c.cities) < 10:
            continue
        top = [w.cities[i] for i in c.cities[:10]]
        airports = [w.airports[i] for x in top for i in x.airports]
        if len(airports) < 2:
            continue
        high = max(a.elevation_ft for a in airports)
        path = [_search(c), _visit(f"/geo/country/{c.iso}")]
        path += [_visit(f"/geo/city/{x.id}") for x in top]
        path += [_airport_visit(a) for a in airports]
        if not _ok(path):
            continue
        ev = [_pop_ev(x) for x in top] + [_elev_ev(a) for a in airports]
        yield Candidate(
            "join_city_airports_highest", "qa", f"country:{c.iso}",
            f"What is the highest elevation, in feet, of an airport in AirportDB serving one of "
            f"the ten largest cities of {c.name}?", f"{high:,} ft", ev, path[0][1]["query"],
            aliases=[f"{high:,}", str(high), f"{high} ft"], path=path,
        )  # fmt: skip


# ---------------------------------------------------------------------- walks

WALK_HOPS = (9, 20)  # "Next" links followed: gold paths of 10 to 21 actions


@template
def walk_city_airport(lw: LocalWeb) -> Iterator[Candidate]:
    """From city X down its country's list (largest first) to the first city after X whose
    Atlas page lists an airport. The episode starts at X's page (the task's ``start_url``,
    which api mode shows as a URL to open): open it, then follow each city page's "Next:
    ..." link until a page has an "Airports" section, and answer with that city. (Found by
    search, "<X> <country> city" as ``query``, the first action asks a 1.3M-parameter policy
    to pick two names out of the question, which it did not learn from 1,500 examples.)

    The tasks whose walk is 9 to 20 hops, where X's name and the answer's are each unique in
    their country. ``bridge`` is the name X's page links as "Next": the city right after X,
    the answer of one who reads "the first city after X" and stops there."""
    w = lw.world
    lo, hi = WALK_HOPS
    for c in w.countries.values():
        ids = c.cities
        names = Counter(w.cities[i].name for i in ids)
        airports = [k for k, i in enumerate(ids) if w.cities[i].airports]
        for k, i in enumerate(ids):
            x = w.cities[i]
            after = bisect.bisect_right(airports, k)  # the first city past k with an airport
            end = airports[after] if after < len(airports) else None
            if end is None or not lo <= end - k <= hi:
                continue
            y, z = w.cities[ids[k + 1]], w.cities[ids[end]]
            if names[x.name] > 1 or names[z.name] > 1:
                continue
            query = f"{x.name} {c.name} city"
            path = [_visit(f"/geo/city/{x.id}")]  # the start page: X's, by the URL given
            path += [("next_page", {"url": f"/geo/city/{j}"}) for j in ids[k + 1 : end + 1]]
            a = w.airports[z.airports[0]]
            yield Candidate(
                "walk_city_airport", "qa", f"city:{x.id}",
                f"Going down the Atlas's list of the cities of {c.name}, largest first, which "
                f"is the first city after {x.name} whose Atlas page lists an airport?", z.name,
                [(f"/geo/city/{x.id}", f"Next: {y.name}"),
                 (f"/geo/city/{z.id}", f"{a.name} ({a.iata})")],
                query, start=f"/geo/city/{x.id}", path=path, bridge=y.name,
            )  # fmt: skip
