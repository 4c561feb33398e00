"""The in-tree task sources (``rollout.task_source``), registered in :data:`rollout.registry.task_sources`.

- ``generated``: the task generator over the local web (:func:`rollout.tasks.generate.generate`),
  narrowed by ``rollout.task_types`` and ``rollout.task_templates``.
- ``file``: the tasks of a JSONL file (``rollout.tasks_file``; ``--tasks FILE``), one task per
  line, in the generator's schema.

The tool-calling domain registers its own source, ``tools`` (:func:`rollout.tools.task_source`).

A source is called with a :class:`~rollout.registry.TaskRequest` and returns a list of
task dicts; a plugin's source has the same signature (see README, "Extending").
"""

from __future__ import annotations

import json

from rollout.registry import TaskRequest, task_sources

# tasks the sidecar draws from when the request names no number (all when there are fewer:
# a narrow rollout.task_templates)
GENERATED_DEFAULT_N = 2000


def generated(request: TaskRequest) -> list[dict]:
    """The generator's ``request.split``, ``request.n`` tasks (when None: 2000, or all of
    them when fewer exist)."""
    from rollout.tasks.generate import generate
    from rollout.web.build import load

    r = request.rollout
    n = request.n if request.n is not None else GENERATED_DEFAULT_N
    return generate(
        load(request.cfg.web.cache_dir), request.split, n, r.task_types, request.seed,
        request.web_url, r.task_templates, up_to=request.n is None,
    )  # fmt: skip


def from_file(request: TaskRequest) -> list[dict]:
    """The tasks of ``rollout.tasks_file`` (JSONL), the first ``request.n`` when given."""
    path = request.rollout.tasks_file
    if not path:
        raise ValueError("rollout.task_source = 'file' needs rollout.tasks_file (or --tasks FILE)")
    with open(path, encoding="utf-8") as fh:
        tasks = [json.loads(line) for line in fh if line.strip()]
    return tasks if request.n is None else tasks[: request.n]


def register_sources() -> None:
    """Register ``generated`` and ``file`` in :data:`rollout.registry.task_sources`; the
    registry calls this on its first lookup (it names it among its in-tree entries)."""
    task_sources.register("generated", generated)
    task_sources.register("file", from_file)
