"""`python -m rollout.tasks --split train|dev|test --n N [--types qa,...] [--templates a,b]`.

Prints N tasks as JSONL on stdout (counts on stderr). URLs are absolute, on
``--base-url`` (default: web.url, else http://web.host:web.port). ``--list``
prints every template with its type, its task count per split and
``gold_steps=MEDIAN/MAX``, the actions on its gold paths (the answer not counted).
The long-horizon templates (``rollout.tasks.long_horizon``) are drawn only when named
in ``--templates`` (a family's name names all of its templates).
"""

from __future__ import annotations

import argparse
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
    cfg = config_from_args(args).web
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    templates = [t.strip() for t in args.templates.split(",") if t.strip()]
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


if __name__ == "__main__":
    sys.exit(main())
