"""Tasks of the tool domain: questions that need several lookups and usually arithmetic.

Each template yields candidates from the same figures ``lookup`` returns; a
numeric answer is the gold path's own ``calculate`` expression, which rounds as the
question asks (``round(a / b, -2)``), evaluated by the calculator, and carries a relative
``tolerance`` of half the rounding step (the ``qa`` verifier accepts a number
within it). "Which of ...?" answers are a country's name, with no tolerance and a
clear winner (5% ahead). Tasks use the harness's schema (``id, question, answer,
aliases, type, hops, start_url, evidence, gold_path, template, subject``; the
evidence is the figures the gold path reads, ``{"url": "tools://figures/NO/population",
"quote": "5550203"}``, which the evidence process reward counts) plus
``mode: "tools"`` and what the oracle needs to answer from its observations:
``formula`` (the expression with ``{i}`` for the i-th lookup's value, its rounding included),
``decimals`` (the rounding), or ``pick`` (``highest`` / ``lowest``).

Splits follow :func:`rollout.tasks.generate.split_of` on the countries, keyed as
the web's tasks key them (``country:FR``): a task about several countries draws
them all from one split, so no test country ever appears in a training task,
here or on the web. The country-group template is split by its group's key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache

from rollout.tasks.generate import SPLITS, split_of
from rollout.tools.backend import airport_url, figure_url
from rollout.tools.calculator import evaluate
from rollout.tools.data import INDICATORS, Atlas, atlas, fold, plain
from rollout.web.data import Country
from rollout.web.site import CONTINENTS

START_URL = "tools://local"  # the tools need no page; the harness wants a start_url
MAX_COMBOS = 300  # pair and triple candidates per template, indicator and split
MARGIN = 0.05  # a "which has the highest" winner leads the runner-up by this fraction


@dataclass
class ToolCandidate:
    template: str
    subject: str  # the split key: "country:FR", "country:FR+DE", "group:EU:M:population"
    question: str
    lookups: list[tuple[str, str]]  # (country name, indicator), in gold-path order
    formula: str | None = None  # calculate(formula.format(*values)); None: no arithmetic
    decimals: int | None = None  # the answer's rounding (-2: to the nearest hundred)
    pick: str | None = None  # "highest" | "lowest": the answer is a country's name
    answer: str = ""
    list_filter: str | None = None  # a list_countries step before the lookups
    airport: str | None = None  # an airport(code) step before the lookups (the first hop)
    min_abs: float = 0.0  # smallest |answer| asked (keeps tolerances small)
    max_abs: float = float("inf")
    aliases: list[str] = field(default_factory=list)


def format_answer(value: float, decimals: int) -> str:
    """``47203.0167, -2`` -> ``"47,200"``; ``3.1416, 2`` -> ``"3.14"``."""
    rounded = round(value, decimals)
    if decimals <= 0:
        return f"{int(rounded):,}"
    return f"{rounded:,.{decimals}f}"


def tolerance(answer: float, decimals: int) -> float:
    """Half the rounding step, relative to the answer (with 1% to spare, 3 digits)."""
    return float(f"{0.5 * 10.0**-decimals / abs(answer) * 1.01:.3g}")


# ----------------------------------------------------------------------------- eligibility


def _usable(data: Atlas, c: Country, *indicators: str) -> bool:
    return "," not in data.name(c) and all(data.value(c, i) is not None for i in indicators)


def _short_name(data: Atlas, c: Country) -> bool:
    """A name an answer can be without restating the question (the anti-cheat's
    ``restated_question`` fires on answers of 3+ words all taken from the question)."""
    return len(fold(data.name(c)).split()) <= 2


@cache
def _by_split(split: str) -> tuple[Country, ...]:
    return tuple(c for c in atlas().countries if split_of(f"country:{c.iso}") == split)


def _combos(split: str, k: int, key: str, keep: Callable[[tuple[Country, ...]], bool]):
    """Up to MAX_COMBOS k-country combinations of one split, drawn deterministically."""
    pool = _by_split(split)
    if len(pool) < k:
        return []
    rng = random.Random(f"{key}|{split}")
    seen: set[tuple[str, ...]] = set()
    out = []
    for _ in range(MAX_COMBOS * 10):
        combo = tuple(rng.sample(pool, k))
        ident = tuple(sorted(c.iso for c in combo))
        if ident in seen:
            continue
        seen.add(ident)
        if keep(combo):
            out.append(combo)
            if len(out) == MAX_COMBOS:
                break
    return out


# ----------------------------------------------------------------------------- templates

Template = Callable[[Atlas, str], Iterator[ToolCandidate]]
TEMPLATES: dict[str, Template] = {}


def template(fn: Template) -> Template:
    TEMPLATES[f"tools_{fn.__name__}"] = fn
    return fn


@template
def per_capita(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for ind in ("gdp_official", "gdp_ppp"):
        label = INDICATORS[ind].label
        for c in _by_split(split):
            if _usable(data, c, ind, "population"):
                yield ToolCandidate(
                    "tools_per_capita", f"country:{c.iso}|{ind}",
                    f"What is the {label} per person of {data.name(c)}, in US dollars, "
                    "to the nearest hundred?",
                    [(data.name(c), ind), (data.name(c), "population")], "{0} / {1}", -2,
                    min_abs=1000,
                )  # fmt: skip


@template
def ratio(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for ind in ("population", "area_km2", "gdp_official", "exports"):
        label = INDICATORS[ind].label

        def keep(pair, ind=ind):
            return all(_usable(data, c, ind) for c in pair)

        for a, b in _combos(split, 2, f"ratio|{ind}", keep):
            if data.value(a, ind).number < data.value(b, ind).number:
                a, b = b, a
            yield ToolCandidate(
                "tools_ratio", f"country:{a.iso}+{b.iso}|{ind}",
                f"What is the {label} of {data.name(a)} divided by the {label} of "
                f"{data.name(b)}, to two decimal places?",
                [(data.name(a), ind), (data.name(b), ind)], "{0} / {1}", 2,
                min_abs=1.1, max_abs=1000,
            )  # fmt: skip


_PICK_INDICATORS = (
    "population", "area_km2", "gdp_ppp", "gdp_official", "unemployment_rate",
    "public_debt", "airports", "labor_force", "exports",
)  # fmt: skip


@template
def which_of_three(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for ind, pick in itertools.product(_PICK_INDICATORS, ("highest", "lowest")):
        label = INDICATORS[ind].label

        def keep(trio, ind=ind):
            return all(_usable(data, c, ind) and _short_name(data, c) for c in trio)

        for trio in _combos(split, 3, f"which|{ind}|{pick}", keep):
            winner = _clear_winner(data, list(trio), ind, pick)
            if winner is None:
                continue
            names = [data.name(c) for c in trio]
            yield ToolCandidate(
                "tools_which_of_three",
                "country:" + "+".join(sorted(c.iso for c in trio)) + f"|{ind}|{pick}",
                f"Which of {names[0]}, {names[1]} and {names[2]} has the {pick} {label}?",
                [(n, ind) for n in names],
                pick=pick,
                answer=data.name(winner),
            )


def _clear_winner(data: Atlas, cs: list[Country], ind: str, pick: str) -> Country | None:
    sign = 1 if pick == "highest" else -1
    ranked = sorted(cs, key=lambda c: sign * data.value(c, ind).number, reverse=True)
    best, second = (data.value(c, ind).number for c in ranked[:2])
    if abs(best - second) < MARGIN * max(abs(best), abs(second)) or best == second:
        return None
    return ranked[0]


@template
def combined_population(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    def keep(pair):
        return all(_usable(data, c, "population") for c in pair)

    for a, b in _combos(split, 2, "combined", keep):
        yield ToolCandidate(
            "tools_combined_population", f"country:{a.iso}+{b.iso}",
            f"What is the combined population of {data.name(a)} and {data.name(b)}, "
            "in millions, to one decimal place?",
            [(data.name(a), "population"), (data.name(b), "population")],
            "({0} + {1}) / 1000000", 1, min_abs=1.0,
        )  # fmt: skip


@template
def density(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for c in _by_split(split):
        if _usable(data, c, "population", "area_km2"):
            yield ToolCandidate(
                "tools_density", f"country:{c.iso}",
                f"What is the population density of {data.name(c)} in people per square "
                "kilometre, to the nearest whole number?",
                [(data.name(c), "population"), (data.name(c), "area_km2")], "{0} / {1}", 0,
                min_abs=10,
            )  # fmt: skip


@template
def airports_per_million(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for c in _by_split(split):
        if _usable(data, c, "airports", "population"):
            yield ToolCandidate(
                "tools_airports_per_million", f"country:{c.iso}",
                f"How many airports with an IATA code does {data.name(c)} have per million "
                "inhabitants, to one decimal place?",
                [(data.name(c), "airports"), (data.name(c), "population")],
                "{0} / ({1} / 1000000)", 1, min_abs=1.0,
            )  # fmt: skip


@template
def largest_city_share(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for c in _by_split(split):
        if _usable(data, c, "largest_city_population", "population"):
            yield ToolCandidate(
                "tools_largest_city_share", f"country:{c.iso}",
                f"What percentage of the population of {data.name(c)} lives in its largest "
                "city, to one decimal place?",
                [(data.name(c), "largest_city_population"), (data.name(c), "population")],
                "{0} / {1} * 100", 1, min_abs=1.0, max_abs=100,
            )  # fmt: skip


@template
def gdp_gap(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for ind in ("gdp_ppp", "gdp_official"):
        label = INDICATORS[ind].label

        def keep(pair, ind=ind):
            return all(_usable(data, c, ind) for c in pair)

        for a, b in _combos(split, 2, f"gap|{ind}", keep):
            if data.value(a, ind).number < data.value(b, ind).number:
                a, b = b, a
            yield ToolCandidate(
                "tools_gdp_gap", f"country:{a.iso}+{b.iso}|{ind}",
                f"By how many billion US dollars does the {label} of {data.name(a)} exceed "
                f"that of {data.name(b)}, to the nearest billion?",
                [(data.name(a), ind), (data.name(b), ind)], "({0} - {1}) / 1000000000", 0,
                min_abs=10,
            )  # fmt: skip


@template
def trade_balance(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    for c in _by_split(split):
        if _usable(data, c, "exports", "imports"):
            yield ToolCandidate(
                "tools_trade_balance", f"country:{c.iso}",
                f"What is the trade balance (exports minus imports) of {data.name(c)}, in "
                "billions of US dollars, to one decimal place?",
                [(data.name(c), "exports"), (data.name(c), "imports")],
                "({0} - {1}) / 1000000000", 1, min_abs=1.0,
            )  # fmt: skip


@template
def largest_in_group(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    """List a continent's countries by initial, then compare them: list_countries + lookups."""
    for code, ind in itertools.product(sorted(CONTINENTS), ("population", "area_km2")):
        groups: dict[str, list[Country]] = {}
        for c in data.countries:
            if c.continent == code and fold(data.name(c)):
                groups.setdefault(fold(data.name(c))[0], []).append(c)
        for letter, members in sorted(groups.items()):
            subject = f"group:{code}:{letter}|{ind}"
            if split_of(subject) != split or not 2 <= len(members) <= 6:
                continue
            if not all(data.value(c, ind) is not None for c in members):
                continue
            winner = _clear_winner(data, members, ind, "highest")
            if winner is None:
                continue
            label = "population" if ind == "population" else "area"
            yield ToolCandidate(
                "tools_largest_in_group", subject,
                f"Which country of {CONTINENTS[code]} whose name starts with "
                f"{letter.upper()} has the largest {label}?",
                [(data.name(c), ind) for c in members], pick="highest",
                answer=data.name(winner), list_filter=f"{CONTINENTS[code]} prefix:{letter}",
            )  # fmt: skip


AIRPORTS_PER_COUNTRY = 10  # airports of one country that the airport_figure template asks about


@template
def airport_figure(data: Atlas, split: str) -> Iterator[ToolCandidate]:
    """Two hops and a copy: ``airport(code)`` names the country, ``lookup`` reads a small
    count of it (airports, cities), the answer is that figure."""
    for ind in ("airports", "cities"):
        label = INDICATORS[ind].label
        for c in _by_split(split):
            if not _usable(data, c, ind) or data.value(c, ind).number < 1:
                continue
            codes = sorted(code for code in c.airports if code.isalpha() and code.isupper())
            rng = random.Random(f"airport|{ind}|{c.iso}")
            for code in sorted(rng.sample(codes, min(AIRPORTS_PER_COUNTRY, len(codes)))):
                yield ToolCandidate(
                    "tools_airport_figure", f"country:{c.iso}|{ind}|{code}",
                    f"What is the {label} of the country of the airport with IATA code "
                    f"{code}?",
                    [(data.name(c), ind)], airport=code,
                )  # fmt: skip


# ----------------------------------------------------------------------------- tasks


def to_task(c: ToolCandidate, split: str, data: Atlas) -> dict | None:
    """The task dict, or None when the numeric answer falls outside the template's range."""
    found = [(data.find(name), ind) for name, ind in c.lookups]
    values = [plain(data.value(country, ind).number) for country, ind in found]
    path = []
    if c.airport is not None:
        path.append({"action": "airport", "args": {"code": c.airport}})
    if c.list_filter is not None:
        path.append({"action": "list_countries", "args": {"filter": c.list_filter}})
    path += [{"action": "lookup", "args": {"country": n, "indicator": i}} for n, i in c.lookups]
    answer, tol = c.answer, None
    formula = None if c.formula is None else f"round({c.formula}, {c.decimals})"
    if formula is not None:
        expression = formula.format(*values)
        path.append({"action": "calculate", "args": {"expression": expression}})
        value = float(evaluate(expression))
        if not c.min_abs <= abs(value) <= c.max_abs:
            return None
        answer, tol = format_answer(value, c.decimals), tolerance(value, c.decimals)
    elif c.pick is None:  # the answer is the last figure looked up, as it is
        value = float(values[-1])
        answer, tol = format_answer(value, 0), tolerance(value, 0)
    number = int(hashlib.sha256(f"{c.template}|{c.subject}".encode()).hexdigest()[:12], 16)
    task = {
        "id": f"{split}-qa-{number % 10**10:010d}",
        "question": c.question,
        "answer": answer,
        "aliases": list(c.aliases),
        "type": "qa",
        "hops": len(path) - (c.formula is not None),
        "start_url": START_URL,
        "evidence": [  # the figures the gold path reads (rollout.verifiers.process)
            *(
                [{"url": airport_url(c.airport), "quote": data.name(found[0][0])}]
                if c.airport
                else []
            ),
            *(
                {"url": figure_url(country.iso, ind), "quote": value}
                for (country, ind), value in zip(found, values, strict=True)
            ),
        ],
        "gold_path": path,
        "template": c.template,
        "subject": c.subject,
        "mode": "tools",
    }
    if c.formula is not None:
        task.update(derived=True, tolerance=tol, formula=formula, decimals=c.decimals)
    elif c.pick is None:
        task.update(derived=True, tolerance=tol, decimals=0)
    else:
        task["pick"] = c.pick
    return task


@cache
def candidates(split: str) -> dict[str, tuple[dict, ...]]:
    """Every task of a split by template, sorted by subject; computed once per process."""
    data = atlas()
    out = {}
    for name, make in TEMPLATES.items():
        tasks = (to_task(c, split, data) for c in make(data, split))
        out[name] = tuple(sorted((t for t in tasks if t), key=lambda t: t["subject"]))
    return out


def generate_tasks(
    split: str, n: int, seed: int = 0, templates: Sequence[str] = (), up_to: bool = False
) -> list[dict]:
    """``n`` tasks of ``split``, drawn evenly across ``templates`` (all when empty),
    deterministic in ``seed``; with ``up_to``, ``n`` is a cap (every task when fewer exist)
    instead of a number that must be met."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    unknown = sorted(set(templates) - set(TEMPLATES))
    if unknown:
        raise ValueError(
            f"unknown tool template(s) {', '.join(unknown)}; known: {', '.join(sorted(TEMPLATES))}"
        )
    rng = random.Random(f"{seed}|{split}|tools")
    pools = []
    for name, tasks in sorted(candidates(split).items()):
        if templates and name not in templates:
            continue
        pool = list(tasks)
        rng.shuffle(pool)
        if pool:
            pools.append(pool)
    available = sum(len(p) for p in pools)
    if n > available and up_to:
        n = available
    if n > available:
        raise ValueError(f"only {available} {split} tool tasks exist; asked {n}")
    chosen: list[dict] = []
    depth = 0
    while len(chosen) < n:  # round-robin over templates: each contributes evenly
        order = [p for p in pools if depth < len(p)]
        rng.shuffle(order)
        chosen.extend(p[depth] for p in order[: n - len(chosen)])
        depth += 1
    return [copy.deepcopy(t) for t in chosen]
