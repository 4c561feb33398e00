"""`python -m rollout.tasks --split train|dev|test --n N [--types qa,...] [--templates a,b]`.

Prints N tasks as JSONL on stdout (counts on stderr). URLs are absolute, on
``--base-url`` (default: web.url, else http://web.host:web.port). ``--list``
prints every template with its type, its task count per split and
``gold_steps=MEDIAN/MAX``, the actions on its gold paths (the answer not counted).
The long-horizon templates (``rollout.tasks.long_horizon``) are drawn only when named
in ``--templates`` (a family's name names all of its templates).

Tasks come from the configuration's ``rollout.task_source``: the generator over the
local web by default; with another source (``tools``: ``--config
configs/tiny-tools.toml``; ``file``; a plugin's) the N tasks are that source's, narrowed
by ``--templates`` when given (else ``rollout.task_templates``), and ``--list`` lists
the tool domain's templates (other sources have no template list).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import Counter

from rollout.registry import TaskRequest, task_sources
from rollout.tasks.generate import SPLITS, TYPES, all_candidates, gold_steps, split_of
from rollout.web.build import load
from shared.config import add_config_args, config_from_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout.tasks", description=__doc__)
    add_config_args(p)
    p.add_argument("--split", choices=sorted(SPLITS))
    p.add_argument("--n", type=int, help="number of tasks")
    p.add_argument("--types", default=",".join(TYPES), help=f"comma-separated of {TYPES}")
    p.add_argument("--templates", default="", help="comma-separated template names (--list)")
    p.add_argument("--list", action="store_true", help="list the templates and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-url", default=None, help="where the local web is served")
    args = p.parse_args(argv)
    run = config_from_args(args)
    source = run.rollout.task_source
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    templates = [t.strip() for t in args.templates.split(",") if t.strip()]
    unknown = sorted(set(types) - set(TYPES))
    if unknown:  # before the build is loaded and every candidate made
        print(f"error: unknown task types {unknown}; known: {', '.join(TYPES)}", file=sys.stderr)
        return 2
    if args.list:
        if source == "generated":
            _list_generated(run, types)
        elif source == "tools":
            _list_tools(templates)
        else:
            p.error(f"--list lists the generator's and the tool domain's templates; "
                    f"rollout.task_source = {source!r} has no template list")  # fmt: skip
        return 0
    if args.split is None or args.n is None:
        p.error("--split and --n are required (or --list)")
    if args.n < 1:
        p.error("--n must be at least 1")
    # the generator draws what --types and --templates name (every template when none);
    # another source its configured templates unless --templates names some
    if source == "generated":
        rollout = dataclasses.replace(run.rollout, task_types=types, task_templates=templates)
    else:
        rollout = dataclasses.replace(
            run.rollout, task_templates=templates or run.rollout.task_templates
        )
    run = dataclasses.replace(run, rollout=rollout)
    web = run.web
    base = args.base_url or web.url or f"http://{web.host}:{web.port or 8900}"
    try:
        tasks = task_sources.get(source)(TaskRequest(run, base, args.split, args.n, args.seed))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for t in tasks:
        sys.stdout.write(json.dumps(t, ensure_ascii=False) + "\n")
    counts = Counter(t["type"] for t in tasks)
    where = "" if source == "generated" else f" from {source}"
    print(
        f"{len(tasks)} {args.split} tasks{where}: {dict(sorted(counts.items()))}", file=sys.stderr
    )
    return 0


def _list_generated(run, types: list[str]) -> None:
    for name, cands in sorted(all_candidates(load(run.web.cache_dir), types).items()):
        per = Counter(split_of(c.subject) for c in cands)
        steps = [gold_steps(c) for c in cands]
        _print_template(name, cands[0].type, [per[s] for s in SPLITS], steps)


def _list_tools(templates: list[str]) -> None:
    from rollout.tools.tasks import candidates

    per_split = {s: candidates(s) for s in SPLITS}
    for name in sorted(per_split["train"]):
        if templates and name not in templates:
            continue
        steps = [len(t["gold_path"]) for s in SPLITS for t in per_split[s][name]]
        _print_template(name, "qa", [len(per_split[s][name]) for s in SPLITS], steps)


def _print_template(name: str, type_: str, counts: list[int], steps: list[int]) -> None:
    """One --list line: name, type, the count per split, ``gold_steps=MEDIAN/MAX``."""
    per = " ".join(f"{s}={n}" for s, n in zip(SPLITS, counts, strict=True))
    gold = f"gold_steps={statistics.median_low(steps)}/{max(steps)}" if steps else ""
    print(f"{name}\t{type_}\t{per}\t{gold}")


if __name__ == "__main__":
    sys.exit(main())
