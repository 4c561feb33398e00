"""Learner memory: the GRPO step of a run config, its resident peak and speed per setting.

Each variant (learner overrides on top of ``--config``, default
configs/tiny-two-hop.toml) runs in a fresh process: the config's model (random
weights, its real shapes) and mesh, one step's rows (``groups_per_step`` x
``group_size``, rounded as the trainer rounds them) of synthetic trajectories
as long as the config's largest length bucket, the KL reference when
``kl_coef`` > 0, and ``--steps`` timed steps after a first, untimed one. It
reports the process's resident peak (``VmHWM`` from /proc/self/status: what
the kernel saw, the runtime included), XLA's compiled peak for the step, and
seconds per step. Ratios are to the first variant (the config as written).

    python bench/learner_memory.py [--config configs/tiny-two-hop.toml] [--steps 3]

Final line: {"bench": "learner_memory", "config", "rows", "length", "variants":
[{"name", "overrides", "rss_peak_gib", "compiled_peak_gib", "s_per_step",
"rss_ratio", "time_ratio"}]}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = (
    ("as configured", []),
    ("chunk 128", ["learner.logprob_chunk=128"]),
    ("micro 2", ["learner.micro_batches=2"]),
    ("chunk 128, micro 2", ["learner.logprob_chunk=128", "learner.micro_batches=2"]),
    ("chunk 128, micro 4", ["learner.logprob_chunk=128", "learner.micro_batches=4"]),
    ("chunk 128, remat full", ["learner.logprob_chunk=128", "learner.remat=full"]),
)


def vm_hwm_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(config: str, overrides: list[str], steps: int) -> dict:
    """One variant, in this (fresh) process."""
    sys.path.insert(0, str(REPO))
    import importlib.util

    import numpy as np

    from learner.training.batching import pack
    from learner.training.loop import _round_up, build_model
    from learner.training.sharding import make_mesh
    from learner.training.step import compile_step, new_state, place_batch, rows_multiple
    from shared import config as config_mod

    # bench/learner.py's synthetic groups, timing and XLA peak (a file of the same name
    # as the learner package: loaded by path)
    spec = importlib.util.spec_from_file_location("bench_learner", REPO / "bench" / "learner.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    cfg = config_mod.load(config, overrides)
    lc = cfg.learner
    model, _ = build_model(cfg)
    mesh = make_mesh(cfg.mesh)
    g = cfg.rollout.group_size
    rows = _round_up(lc.groups_per_step * g, rows_multiple(mesh) * lc.micro_batches)
    length = max(lc.length_buckets)
    packed = pack(
        bench.groups(-(-rows // g), g, length + 1, model.cfg.vocab_size),
        rows=rows, buckets=lc.length_buckets, pad_id=0,
    )  # fmt: skip
    state, shardings = new_state(model, mesh, lc)
    batch = place_batch(packed.arrays, mesh)
    compiled = compile_step(model, mesh, lc, shardings).lower(state, batch).compile()
    peak = bench.compiled_peak_gib(compiled)
    dt, m = bench.seconds_per_step(compiled, state, batch, steps)
    return {
        "rows": rows,
        "length": length,
        "rss_peak_gib": round(vm_hwm_gib(), 3),
        "compiled_peak_gib": round(peak, 3),
        "s_per_step": round(dt, 3),
        "loss_finite": bool(np.isfinite(float(m["loss"]))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "tiny-two-hop.toml"))
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a JSON list of overrides
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.config, json.loads(args.child), args.steps)))
        return
    out = []
    for name, overrides in VARIANTS:
        cmd = [sys.executable, __file__, "--config", args.config, "--steps", str(args.steps),
               "--child", json.dumps(overrides)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            sys.exit(f"variant {name!r} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if not r.pop("loss_finite"):
            sys.exit(f"variant {name!r}: the loss is not finite")
        r = {"name": name, "overrides": overrides, **r}
        out.append(r)
        print(f"{name:>24}: resident peak {r['rss_peak_gib']:.2f} GiB, compiled peak "
              f"{r['compiled_peak_gib']:.2f} GiB, {r['s_per_step']:.2f} s/step", flush=True)  # fmt: skip
    base = out[0]
    for r in out:
        r["rss_ratio"] = round(r["rss_peak_gib"] / base["rss_peak_gib"], 3)
        r["time_ratio"] = round(r["s_per_step"] / base["s_per_step"], 3)
    print(json.dumps({"bench": "learner_memory", "config": args.config, "rows": base.pop("rows"),
                      "length": base.pop("length"),
                      "variants": [{k: v for k, v in r.items() if k not in ("rows", "length")}
                                   for r in out]}))  # fmt: skip


if __name__ == "__main__":
    main()
