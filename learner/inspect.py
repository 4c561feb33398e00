"""`python -m learner.inspect CKPT`: what a checkpoint holds, how two differ, and HF export.

    python -m learner.inspect CKPT [--step N] [--all] [--json]
    python -m learner.inspect CKPT --diff OTHER [--all] [--json]
    python -m learner.inspect CKPT --export-hf OUT [--dtype bfloat16|float32] [--untie]

``CKPT`` is a checkpoint root (its latest committed step) or one step directory.
The report lists the step, the model, the metrics and data cursor saved with it
(its group ids as counts per task type and the first and last few), and every
parameter with shape, dtype, size and the sharding it was saved with, then totals
(reading metadata only: no array is loaded). ``--diff`` loads both checkpoints and
reports the run-config and model-config keys that differ and, per tensor, both
norms, the norm of the difference and the largest absolute difference.
``--export-hf`` writes the directory SGLang's ``update_weights_from_disk`` loads (with
``--untie``, a tied LM head written untied, as vLLM's in-place reload needs).

Tables go to a terminal, with parameters whose names differ only in an index
folded into one row (``layers.{0..27}.mlp.up_proj  x28``, norms over all of them
in a diff); ``--all`` lists every one. ``--json`` prints one JSON object for
scripts, with every parameter and every group id.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from learner.model.loading import open_source, resolve_checkpoint, restore_checkpoint
from learner.training.checkpoint import Checkpointer, committed_steps


def describe_sharding(m: Any) -> str:
    """Orbax sharding metadata as a short string: ``P('tensor', 'fsdp') @ data=1,fsdp=4,...``."""
    spec = getattr(m, "partition_spec", None)
    if spec is not None:
        axes = getattr(m, "axis_names", None) or []
        sizes = [int(s) for s in getattr(m, "shape", [])]
        mesh = ",".join(f"{a}={s}" for a, s in zip(axes, sizes, strict=False))
        return f"P{tuple(spec)!r} @ {mesh}"
    device = getattr(m, "device_str", None)
    return f"{device} (single device)" if device else type(m).__name__ if m else "-"


def summary(path: str | Path, step: int | None = None) -> dict[str, Any]:
    """The report of one checkpoint, as plain data."""
    root, latest = resolve_checkpoint(path)
    step = latest if step is None else step
    ck = Checkpointer(root, read_only=True, async_save=False)
    try:
        meta, md, opt_md = ck.metadata(step)
    finally:
        ck.close()
    params = []
    for name, m in sorted(md.tree.items()):
        size = int(np.prod(m.shape, dtype=np.int64))
        nbytes = size * np.dtype(m.dtype).itemsize
        params.append(
            {
                "name": name,
                "shape": list(m.shape),
                "dtype": str(np.dtype(m.dtype)),
                "size": size,
                "bytes": nbytes,
                "sharding": describe_sharding(m.sharding),
            }
        )
    mc = meta.get("model_config") or {}
    return {
        "path": str(root / str(step)),
        "step": int(meta["step"]),
        "committed_steps": committed_steps(root),
        "model": mc.get("hf"),
        "metrics": meta.get("metrics") or {},
        "data_cursor": meta.get("data_cursor") or {},
        "params": params,
        "total_params": sum(p["size"] for p in params),
        "total_bytes": sum(p["bytes"] for p in params),
        "opt_state_bytes": _tree_bytes(opt_md),
    }


def _tree_bytes(md: Any) -> int:
    """Bytes of every array in an Orbax metadata tree (0 when absent)."""
    import jax

    leaves = jax.tree.leaves(getattr(md, "tree", md) or {}, is_leaf=lambda x: hasattr(x, "shape"))
    return sum(
        int(np.prod(m.shape, dtype=np.int64)) * np.dtype(m.dtype).itemsize
        for m in leaves
        if hasattr(m, "shape")
    )


def _flat(d: dict[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _dict_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    fa, fb = _flat(a), _flat(b)
    return [
        {"key": k, "a": fa.get(k), "b": fb.get(k)}
        for k in sorted(set(fa) | set(fb))
        if fa.get(k) != fb.get(k)
    ]


def diff(path_a: str | Path, path_b: str | Path) -> dict[str, Any]:
    """Config and per-tensor differences between two checkpoints (b - a)."""
    ra, rb = restore_checkpoint(path_a), restore_checkpoint(path_b)
    config_a = tomllib.loads(ra.config_toml) if ra.config_toml else {}
    config_b = tomllib.loads(rb.config_toml) if rb.config_toml else {}
    model_a = ra.model_config.to_hf_config() if ra.model_config else {}
    model_b = rb.model_config.to_hf_config() if rb.model_config else {}
    tensors = []
    for name in sorted(set(ra.params) | set(rb.params)):
        a, b = ra.params.get(name), rb.params.get(name)
        row: dict[str, Any] = {"name": name}
        if a is None or b is None or a.shape != b.shape:
            row["only_in"] = "b" if a is None else "a" if b is None else None
            row["shapes"] = [
                None if a is None else list(a.shape),
                None if b is None else list(b.shape),
            ]
        else:
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            row.update(
                norm_a=float(np.linalg.norm(a64)),
                norm_b=float(np.linalg.norm(b64)),
                diff_norm=float(np.linalg.norm(b64 - a64)),
                max_abs_diff=float(np.max(np.abs(b64 - a64))) if a64.size else 0.0,
                shape=list(a.shape),
            )
        tensors.append(row)
    return {
        "a": {"path": str(path_a), "step": ra.step},
        "b": {"path": str(path_b), "step": rb.step},
        "config_diff": _dict_diff(config_a, config_b),
        "model_config_diff": _dict_diff(model_a, model_b),
        "tensors": tensors,
    }


def export(path: str | Path, out: str | Path, dtype: str = "bfloat16", untie: bool = False) -> Path:
    """The checkpoint as an HF directory SGLang and vLLM load (``untie``: see ``export_hf``)."""
    from learner.model.hf import export_hf

    source = open_source(checkpoint=path)
    return export_hf(
        source.model, out, tokenizer_dir=source.tokenizer_dir, dtype=dtype, untie=untie
    )


# ----------------------------------------------------------------------------- folding

_SEPARATOR = re.compile(r"([./])")


def index_ranges(indices: Iterable[int]) -> str:
    """Sorted indices as runs: ``0..3,5..27``."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def fold_names(
    names: Iterable[str], key: Callable[[str], Hashable] = lambda _: None
) -> list[tuple[str, list[str]]]:
    """(label, names) rows: names that differ only in one index, ``.`` or ``/`` separated
    (``layers.3.mlp.up_proj``), folded into one (``layers.{0..27}.mlp.up_proj``).

    Names whose ``key`` differs (a shape, a dtype) stay apart, so the rest show a gap
    (``{0..3,5..27}``). Index positions fold right to left, so ``layers.N.experts.M.w``
    becomes ``layers.{...}.experts.{...}.w``. Rows come sorted by name with the
    indices blanked, then by their first index.
    """
    # a row: the name's parts, each index part the set of indices it stands for
    rows = [
        ([frozenset([int(p)]) if p.isdigit() and str(int(p)) == p else p for p in parts], [n])
        for n in names
        for parts in [_SEPARATOR.split(n)]
    ]
    depth = max((sum(isinstance(p, frozenset) for p in parts) for parts, _ in rows), default=0)
    for k in range(1, depth + 1):  # the k-th index from the right
        merged: dict[Hashable, tuple[list[Any], list[str]]] = {}
        for parts, members in rows:
            at = [i for i, p in enumerate(parts) if isinstance(p, frozenset)]
            if len(at) < k:
                merged[("kept", tuple(parts))] = (parts, members)
                continue
            i = at[-k]
            bucket = ("at", i, *parts[:i], None, *parts[i + 1 :], key(members[0]))
            if bucket in merged:
                held = merged[bucket]
                held[0][i] = held[0][i] | parts[i]
                held[1].extend(members)
            else:
                merged[bucket] = (list(parts), list(members))
        rows = list(merged.values())

    def order(row: tuple[list[Any], list[str]]) -> tuple[Any, ...]:
        parts = row[0]
        blanked = tuple("" if isinstance(p, frozenset) else p for p in parts)
        return blanked, tuple(min(p) for p in parts if isinstance(p, frozenset))

    def label(parts: list[Any]) -> str:
        sets = {i: index_ranges(p) for i, p in enumerate(parts) if isinstance(p, frozenset)}
        return "".join(
            p if i not in sets else sets[i] if len(p) == 1 else f"{{{sets[i]}}}"
            for i, p in enumerate(parts)
        )

    return [(label(parts), members) for parts, members in sorted(rows, key=order)]


def fold_rows(
    rows: list[dict[str, Any]],
    key: Callable[[dict[str, Any]], Hashable],
    merge: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Rows (dicts with a ``name``) folded by :func:`fold_names` on ``key``: each the
    ``merge`` of the rows it stands for, with the folded name and their ``count``."""
    by_name = {r["name"]: r for r in rows}
    return [
        {**merge([by_name[n] for n in names]), "name": label, "count": len(names)}
        for label, names in fold_names(by_name, lambda n: key(by_name[n]))
    ]


def _param_key(p: dict[str, Any]) -> Hashable:
    return tuple(p["shape"]), p["dtype"], p["sharding"]


def _summed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {**rows[0], "size": sum(r["size"] for r in rows), "bytes": sum(r["bytes"] for r in rows)}


def _tensor_key(t: dict[str, Any]) -> Hashable:
    if "norm_a" in t:
        return "compared", tuple(t.get("shape") or ())
    return "unequal", t.get("only_in"), repr(t.get("shapes"))


def _joint_norms(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The norms of the folded tensors taken together (the root of the summed squares)
    and their largest difference."""
    out = dict(rows[0])
    if "norm_a" in out:
        for k in ("norm_a", "norm_b", "diff_norm"):
            out[k] = math.sqrt(sum(r[k] ** 2 for r in rows))
        out["max_abs_diff"] = max(r["max_abs_diff"] for r in rows)
    return out


# ----------------------------------------------------------------------------- printing


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_GROUP_ID = re.compile(r"^(?P<task>(?P<type>.+)-\d+)\.[^.]+\.\d+$")  # split-type-hash.inst.n


def cursor_lines(cursor: dict[str, Any], few: int = 3) -> list[str]:
    """The data cursor as a few lines: scalars as ``k=v``; a list (the consumed
    ``group_ids``) as its count, per task type (``train-qa``) where the rollout's
    ids (``train-qa-5167943732.7b41a5ef.0``) tell it, and its first and last ``few``."""
    scalars = {k: v for k, v in cursor.items() if not isinstance(v, list)}
    lists = {k: v for k, v in cursor.items() if isinstance(v, list)}
    head = [f"{k}={v}" for k, v in scalars.items()] + [f"{len(v)} {k}" for k, v in lists.items()]
    lines = ["data_cursor: " + ", ".join(head)]
    for k, items in lists.items():
        ids = [str(x) for x in items]
        parsed = [_GROUP_ID.match(x) for x in ids]
        if ids and any(parsed):
            types = Counter(m["type"] if m else "other" for m in parsed)
            tasks = len({m["task"] for m in parsed if m})
            by_type = ", ".join(f"{t} {n}" for t, n in types.most_common())
            lines.append(f"  {k} by task type: {by_type} ({tasks} distinct tasks)")
        if len(ids) <= 2 * few:
            lines += [f"  {k}: {', '.join(ids)}"] if ids else []
        else:
            lines.append(f"  {k} first: {', '.join(ids[:few])}")
            lines.append(f"  {k} last: {', '.join(ids[-few:])}  (all {len(ids)}: --json)")
    return lines


def print_summary(s: dict[str, Any], console: Any, *, fold: bool = True) -> None:
    from rich.table import Column, Table

    console.print(
        f"[bold]{s['path']}[/bold]  step {s['step']}  (committed: {s['committed_steps']})"
    )
    if s["model"]:
        m = s["model"]
        console.print(
            f"model: {m['model_type']}, {m['num_hidden_layers']} layers, d_model "
            f"{m['hidden_size']}, {m['num_attention_heads']} heads / {m['num_key_value_heads']} kv, "
            f"vocab {m['vocab_size']}"
        )
    if s["metrics"]:
        console.print("metrics: " + ", ".join(f"{k}={v}" for k, v in s["metrics"].items()))
    for line in cursor_lines(s["data_cursor"]) if s["data_cursor"] else []:
        console.print(line, markup=False, highlight=False)
    rows = s["params"]
    rows = fold_rows(rows, _param_key, _summed) if fold else [{**p, "count": 1} for p in rows]
    table = Table("shape", "dtype", "count", "size", "bytes", "sharding")
    table.columns.insert(0, Column("parameter", no_wrap=True))
    for p in rows:
        table.add_row(
            p["name"],
            "x".join(map(str, p["shape"])),
            p["dtype"],
            f"x{p['count']}" if p["count"] > 1 else "",
            f"{p['size']:,}",
            _human(p["bytes"]),
            p["sharding"],
        )
    console.print(table)
    console.print(f"total: {s['total_params']:,} parameters, {_human(s['total_bytes'])}")
    if s["opt_state_bytes"]:
        console.print(f"optimizer state: {_human(s['opt_state_bytes'])}")


def print_diff(d: dict[str, Any], console: Any, *, fold: bool = True) -> None:
    from rich.table import Column, Table

    console.print(f"a: {d['a']['path']} (step {d['a']['step']})")
    console.print(f"b: {d['b']['path']} (step {d['b']['step']})")
    for title in ("config_diff", "model_config_diff"):
        rows = d[title]
        console.print(f"{title}: " + ("none" if not rows else ""))
        for r in rows:
            console.print(f"  {r['key']}: {r['a']!r} -> {r['b']!r}")
    table = Table(
        Column("tensor", no_wrap=True), "count", "norm a", "norm b", "|b - a|", "max |b - a|"
    )
    rows = d["tensors"]
    rows = fold_rows(rows, _tensor_key, _joint_norms) if fold else [{**t, "count": 1} for t in rows]
    for t in rows:
        count = f"x{t['count']}" if t["count"] > 1 else ""
        if "norm_a" in t:
            table.add_row(
                t["name"],
                count,
                f"{t['norm_a']:.6g}",
                f"{t['norm_b']:.6g}",
                f"{t['diff_norm']:.6g}",
                f"{t['max_abs_diff']:.6g}",
            )
        else:
            table.add_row(t["name"], count, "-", "-", f"shapes {t['shapes']}", "-")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m learner.inspect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="a checkpoint root or step directory")
    parser.add_argument("--step", type=int, help="the step to read (default: latest committed)")
    parser.add_argument("--diff", metavar="OTHER", help="compare with another checkpoint")
    parser.add_argument("--export-hf", metavar="OUT", help="write an HF (SGLang) directory")
    parser.add_argument(
        "--untie",
        action="store_true",
        help="with --export-hf: write a tied LM head untied (the same matrix twice), for vLLM",
    )
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="dtype of the exported weights (default bfloat16)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="list every parameter (default: those differing only in a layer index folded)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    from rich.console import Console

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's notes on read-only opens
    console = Console() if sys.stdout.isatty() else Console(width=160)
    path = args.checkpoint
    if args.step is not None:
        root, _ = resolve_checkpoint(path)
        path = str(root / str(args.step))
    try:
        result: dict[str, Any] = {}
        if args.export_hf:
            out = export(path, args.export_hf, args.dtype, args.untie)
            result["exported"] = str(out)
            if not args.json:
                console.print(f"exported {path} to {out} ({args.dtype})")
        if args.diff:
            result["diff"] = diff(path, args.diff)
            if not args.json:
                print_diff(result["diff"], console, fold=not args.all)
        if args.json or not (args.diff or args.export_hf):
            result["summary"] = summary(path)
            if not args.json:
                print_summary(result["summary"], console, fold=not args.all)
    except FileNotFoundError as e:
        print(f"learner.inspect: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
