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

from rollout.tasks.generate import SPLITS, TYPES, all_candidates, generate, gold_steps, split_of
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
    if run.rollout.task_source != "generated":
        return _other_source(p, args, run)
    cfg = run.web
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    templates = [t.strip() for t in args.templates.split(",") if t.strip()]
    unknown = sorted(set(types) - set(TYPES))
    if unknown:  # before the build is loaded and every candidate made
        print(f"error: unknown task types {unknown}; known: {', '.join(TYPES)}", file=sys.stderr)
        return 2
    lw = load(cfg.cache_dir)
    if args.list:
        for name, cands in sorted(all_candidates(lw, types).items()):
            per = Counter(split_of(c.subject) for c in cands)
            counts = " ".join(f"{s}={per[s]}" for s in SPLITS)
            steps = [gold_steps(c) for c in cands]
            gold = f"gold_steps={statistics.median_low(steps)}/{max(steps)}"
            print(f"{name}\t{cands[0].type}\t{counts}\t{gold}")
        return 0
    if args.split is None or args.n is None:
        p.error("--split and --n are required (or --list)")
    if args.n < 1:
        p.error("--n must be at least 1")
    base = args.base_url or cfg.url or f"http://{cfg.host}:{cfg.port or 8900}"
    try:
        tasks = generate(lw, args.split, args.n, types, args.seed, base, templates)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = sys.stdout
    for t in tasks:
        out.write(json.dumps(t, ensure_ascii=False) + "\n")
    counts = Counter(t["type"] for t in tasks)
    print(f"{len(tasks)} {args.split} tasks: {dict(sorted(counts.items()))}", file=sys.stderr)
    return 0


def _other_source(p: argparse.ArgumentParser, args, run) -> int:
    """``--list`` / ``--split --n`` for a task source other than the web's generator."""
    from rollout.registry import TaskRequest, task_sources

    source = run.rollout.task_source
    templates = [t.strip() for t in args.templates.split(",") if t.strip()]
    if args.list:
        if source != "tools":
            p.error(f"--list lists the generator's and the tool domain's templates; "
                    f"rollout.task_source = {source!r} has no template list")  # fmt: skip
        from rollout.tools.tasks import candidates

        per_split = {s: candidates(s) for s in SPLITS}
        for name in sorted(per_split["train"]):
            if templates and name not in templates:
                continue
            counts = " ".join(f"{s}={len(per_split[s][name])}" for s in SPLITS)
            steps = [len(t["gold_path"]) for s in SPLITS for t in per_split[s][name]]
            gold = f"gold_steps={statistics.median_low(steps)}/{max(steps)}" if steps else ""
            print(f"{name}\tqa\t{counts}\t{gold}")
        return 0
    if args.split is None or args.n is None:
        p.error("--split and --n are required (or --list)")
    if args.n < 1:
        p.error("--n must be at least 1")
    if templates:
        run = dataclasses.replace(
            run, rollout=dataclasses.replace(run.rollout, task_templates=templates)
        )
    base = args.base_url or run.web.url or f"http://{run.web.host}:{run.web.port or 8900}"
    try:
        tasks = task_sources.get(source)(TaskRequest(run, base, args.split, args.n, args.seed))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for t in tasks:
        sys.stdout.write(json.dumps(t, ensure_ascii=False) + "\n")
    print(f"{len(tasks)} {args.split} tasks from {source}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
