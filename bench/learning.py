"""The embedded default's learning result, checked: `make train` with a seed, then the targets.

Runs ``python -m learner.train`` (the embedded default, ``configs/tiny.toml`` unless
``--config``) as a child with ``learner.seed``, ``sft.seed`` and ``rollout.seed`` set
to ``--seed`` (another SFT data order, sampling, task order and other noisy-oracle
mistakes), reads the run's ``summary.json`` and checks what the learning run must
show in api mode: test success at the training temperature after GRPO at least
``--min-gain`` (15) points above the SFT start, the two 95% Wilson intervals apart,
the whole run within ``--max-minutes`` (40). ~20 minutes on 2 CPU cores.

The time check is made meaningful on a machine faster than the slowest one the run
must fit: before the run it measures this machine's float32 matmul peak (``jit(x @ x)``
on 2048 x 2048, as ``bench/learner.py``) and projects the run's minutes onto a machine
of ``--reference-gflops`` (150 GFLOP/s: the slowest 2-core machine measured, where the
default once took 36.4 minutes), assuming every phase slows down as the matmul peak
does (the learner's phases do; the browser and HTTP phases roughly follow the CPU).
The projection must keep ``--headroom`` (25 %) of ``--max-minutes``: <= 30 minutes.

    python bench/learning.py [--seed 0] [--config configs/tiny.toml] [--set k=v ...]

For RL at research length (``configs/tiny-long.toml``) the checks the issue of that
run asks for: ``--metric greedy`` checks the gain in greedy success (its two intervals
apart) instead of the T=1 one, ``--control`` runs the same-time SFT control and checks
that the trained policy is above it (greedy, intervals apart), ``--min-median-steps``
checks that the trained policy's successful greedy test episodes keep at least that
many actions at the median (no shortcut), ``--headroom 0`` leaves the projection out:

    python bench/learning.py --config configs/tiny-long.toml --metric greedy --min-gain 10 \
        --control --min-median-steps 10 --max-minutes 90 --headroom 0

Final line: {"bench": "learning", "seed", "mode", "n_test", "sft_success",
"sft_ci95", "grpo_success", "grpo_ci95", "gain_points", "sft_greedy_success",
"grpo_greedy_success", "wall_minutes", "phase_minutes", "process_minutes",
"matmul_peak_gflops", "reference_gflops", "projected_minutes", "run_dir",
"checks": {...}, "ok"}; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.learner import matmul_peak_gflops  # noqa: E402
from learner.train import DEFAULT_CONFIG, run_dir_of  # noqa: E402
from shared.config import load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=None, help="run config (default: the embedded one)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--min-gain", type=float, default=15.0, help="points")
    ap.add_argument("--max-minutes", type=float, default=40.0)
    ap.add_argument(
        "--reference-gflops", type=float, default=150.0,
        help="matmul peak of the slowest machine the run must fit (GFLOP/s)",
    )  # fmt: skip
    ap.add_argument("--headroom", type=float, default=0.25, help="of --max-minutes; 0: no check")
    ap.add_argument("--metric", choices=("t1", "greedy"), default="t1", help="the gain checked")
    ap.add_argument("--control", action="store_true", help="run and beat the SFT control")
    ap.add_argument("--min-median-steps", type=float, default=0.0,
                    help="least median actions of the trained policy's successful episodes")  # fmt: skip
    args = ap.parse_args()
    peak = matmul_peak_gflops()  # before the run: nothing else on the cores
    name = f"bench-learning-seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    sets = [
        f"learner.seed={args.seed}", f"sft.seed={args.seed}", f"rollout.seed={args.seed}",
        f"logging.run_name={name}", *args.set,
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "learner.train"]
    if args.config:
        cmd += ["--config", args.config]
    if args.control:
        cmd.append("--control")
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO)  # its progress and table go to this terminal
    minutes = (time.perf_counter() - t0) / 60
    if rc != 0:
        print(json.dumps({"bench": "learning", "seed": args.seed, "error": f"exit {rc}"}))
        return 1
    # Where learner.train put it: the same config and overrides, relative to the repo.
    run_dir = REPO / run_dir_of(load(args.config or DEFAULT_CONFIG, sets))
    summary = json.loads((run_dir / "summary.json").read_text())
    keys = (
        "mode", "n_test", "sft_success", "sft_ci95", "grpo_success", "grpo_ci95",
        "gain_points", "sft_greedy_success", "grpo_greedy_success", "wall_minutes",
        "phase_minutes",
    )  # fmt: skip
    # on a slower machine than the reference, its own minutes are the projection
    projected = minutes * max(1.0, peak / args.reference_gflops)
    checks = learning_checks(summary, args, minutes, projected)
    keys += ("control_success", "control_greedy_success", "control_greedy_ci95",
             "median_steps", "median_steps_success")  # fmt: skip
    out = {"bench": "learning", "seed": args.seed, **{k: summary.get(k) for k in keys}}
    out |= {
        "process_minutes": round(minutes, 2),
        "matmul_peak_gflops": round(peak, 1),
        "reference_gflops": args.reference_gflops,
        "projected_minutes": round(projected, 2),
        "run_dir": str(run_dir),
    }
    out |= {"checks": checks, "ok": all(checks.values())}
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def learning_checks(summary: dict, args, minutes: float, projected: float) -> dict[str, bool]:
    """The checks of a run's ``summary.json`` (see the module's docstring)."""
    if args.metric == "greedy":
        after, before = summary["grpo_greedy_ci95"], summary["sft_greedy_ci95"]
        gain = 100 * (summary["grpo_greedy_success"] - summary["sft_greedy_success"])
    else:
        after, before, gain = summary["grpo_ci95"], summary["sft_ci95"], summary["gain_points"]
    checks = {
        "gain_at_least_min": gain >= args.min_gain,
        "cis_apart": after[0] > before[1],
        "within_max_minutes": minutes <= args.max_minutes,
    }
    if args.headroom > 0:
        checks["projected_within_headroom"] = projected <= args.max_minutes * (1 - args.headroom)
    if args.control:
        control = summary.get("control_greedy_ci95")
        checks["above_control"] = (
            control is not None and summary["grpo_greedy_ci95"][0] > control[1]
        )
    if args.min_median_steps:
        median = summary.get("median_steps_success", {}).get("after_greedy", 0.0)
        checks["median_steps_of_successes"] = median >= args.min_median_steps
    return checks


if __name__ == "__main__":
    sys.exit(main())
