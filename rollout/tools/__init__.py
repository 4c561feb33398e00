"""A second domain: tool calling over country figures, with no browser.

The agent calls ``lookup(country, indicator)``, ``list_countries(filter)``,
``airport(code)`` (an airport's city and country by IATA code) and
``calculate(expression)`` (a bounded arithmetic evaluator that walks the syntax
tree, never ``eval``) and ends with ``answer(text)``, in the call dialect of the
browser modes. The figures are the local web's (Atlas, World Factbook, AirportDB:
see :mod:`rollout.tools.data`), and the tasks ask for per-capita values, ratios,
sums, densities, "which of these has the highest ..." and a figure of an airport's
country (:mod:`rollout.tools.tasks`), scored by the ``qa`` verifier with a numeric
``tolerance``.

What a registration of the ``tools`` environment kind needs:

- :data:`KIND`, :data:`ACTIONS` (the action table, for ``rollout.actions.ACTIONS[KIND]``),
  :data:`NEEDS_BROWSER`, :data:`DIALECT` (the generic parser's reader: calls),
  :data:`INTRO` and :data:`COMPACT_INTRO` (the opening lines of the action description);
- :func:`make_backend`, :func:`make_oracle`, :func:`generate_tasks`.
"""

from __future__ import annotations

from rollout.actions import ActionSpec
from rollout.tools.actions import (
    COMPACT_INTRO,
    DIALECT,
    INTRO,
    KIND,
    NEEDS_BROWSER,
    Airport,
    Calculate,
    ListCountries,
    Lookup,
    table,
)
from rollout.tools.backend import DEFAULT_OBSERVATION_CHARS, ToolBackend
from rollout.tools.oracle import NoisyToolOracle, ToolOracle
from rollout.tools.tasks import START_URL, generate_tasks

ACTIONS: list[ActionSpec] = list(table())

__all__ = [
    "ACTIONS",
    "COMPACT_INTRO",
    "DIALECT",
    "INTRO",
    "KIND",
    "NEEDS_BROWSER",
    "START_URL",
    "Airport",
    "Calculate",
    "ListCountries",
    "Lookup",
    "NoisyToolOracle",
    "ToolBackend",
    "ToolOracle",
    "generate_tasks",
    "make_backend",
    "make_oracle",
]


def make_backend(observation_chars: int = DEFAULT_OBSERVATION_CHARS) -> ToolBackend:
    """A fresh backend for one episode (the figures are loaded once per process)."""
    return ToolBackend(observation_chars)


def make_oracle(
    task: dict,
    spaced_names: bool = False,
    batched: bool = False,
    *,
    noise: float | None = None,
    premature: float = 0.0,
    seed: int = 0,
) -> ToolOracle:
    """The scripted oracle for ``task``: ``.next(observation_text) -> model text``;
    ``spaced_names``: country names written with the question's leading space
    (``rollout.oracle_spaced_names``); ``batched``: consecutive lookups of one indicator
    as one call (``rollout.oracle_batched_lookups``). See :class:`ToolOracle`. With
    ``noise`` (``rollout.oracle_noise``, for ``rollout.policy = "noisy_oracle"``) it is a
    :class:`NoisyToolOracle`: that probability of a wrong indicator per lookup, and
    ``premature`` (``rollout.oracle_premature``) of answering one hop short."""
    if noise is None:
        return ToolOracle(task, spaced_names=spaced_names, batched=batched)
    return NoisyToolOracle(
        task, p=noise, premature=premature, seed=seed, spaced_names=spaced_names, batched=batched
    )
