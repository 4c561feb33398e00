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

The domain registers itself as a plugin would: :func:`register_kind` (the ``tools``
environment kind) and :func:`register_task_source` (the ``tools`` task source), which
the registries name among their in-tree entries and call on their first lookup. The
pieces a registration takes:

- :data:`KIND`, :data:`ACTIONS` (the action table, for ``rollout.agent.actions.ACTIONS[KIND]``),
  :data:`NEEDS_BROWSER`, :data:`DIALECT` (the generic parser's reader: calls),
  :data:`INTRO` and :data:`COMPACT_INTRO` (the opening lines of the action description);
- :func:`make_backend`, :func:`make_oracle`, :func:`generate_tasks`, :func:`task_source`.

What it may import: the registry, what the environment is built from
(:mod:`rollout.agent`: the actions; :mod:`rollout.tracking`: the records), :mod:`rollout.env` (the backend's errors and observations),
:mod:`rollout.tasks` (the split rule, the default number of tasks) and
:mod:`rollout.web` (the figures). Nothing below it knows this domain: neither the
environment nor the task generator imports it (``tests/test_import_boundaries.py``).
"""

from __future__ import annotations

from rollout.agent.actions import ActionSpec
from rollout.registry import BackendContext, EnvKind, TaskRequest, envs, task_sources
from rollout.tasks.sources import GENERATED_DEFAULT_N
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
from rollout.tools.backend import DEFAULT_OBSERVATION_CHARS, ToolBackend, figures_read
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
    "register_kind",
    "register_task_source",
    "task_source",
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


# ----------------------------------------------------------------------------- registration


def _backend(ctx: BackendContext) -> ToolBackend:
    return make_backend(ctx.env.observation_chars)


def _oracle(task, _web_url=None, rollout=None, *, noisy=False, seed=0, **_kwargs) -> ToolOracle:
    if rollout is None:
        return make_oracle(task)
    how = {
        "spaced_names": rollout.oracle_spaced_names,
        "batched": rollout.oracle_batched_lookups,
    }
    if noisy:  # the noisy oracle's habits: wrong indicators, one hop short
        if rollout.oracle_give_up:
            raise ValueError(
                "rollout.oracle_give_up: the tools kind's noisy oracle has no such habit"
            )
        how.update(noise=rollout.oracle_noise, premature=rollout.oracle_premature, seed=seed)
    return make_oracle(task, **how)


def register_kind() -> None:
    """Register the ``tools`` environment kind in :data:`rollout.registry.envs`: tool
    calls over country figures, no browser and no page. The registry calls this on its
    first lookup, after the browser's modes (:func:`rollout.env.register_kinds`)."""
    envs.register(
        KIND,
        EnvKind(
            KIND, tuple(table()), _backend, dialect=DIALECT, browser=NEEDS_BROWSER,
            opens_page=False, oracle=_oracle, intro=INTRO, compact_intro=COMPACT_INTRO,
            doc="Tool calling over country figures: lookup, list_countries, airport, calculate, answer.",
            reached=figures_read,
        ),
    )  # fmt: skip


def task_source(request: TaskRequest) -> list[dict]:
    """The ``tools`` task source: the domain's ``request.split``, ``request.n`` tasks (when
    None: 2000, or all of them when fewer exist), narrowed to ``rollout.task_templates``
    (``tools_per_capita``, ...) when it names any."""
    n = request.n if request.n is not None else GENERATED_DEFAULT_N
    templates = request.rollout.task_templates
    return generate_tasks(request.split, n, request.seed, templates, up_to=request.n is None)


def register_task_source() -> None:
    """Register :func:`task_source` as ``tools`` in :data:`rollout.registry.task_sources`;
    the registry calls this on its first lookup, after the in-tree sources of
    :mod:`rollout.tasks.sources`."""
    task_sources.register("tools", task_source)
