"""The embedded default's phases around GRPO: warm start, test evaluation, summary.

1. Warm start (``sft.demos`` > 0): a sidecar with the noisy-oracle policy runs
   ``sft.demos`` episodes through the real harness (environment, verifiers,
   progress tracker); their records are exported with ``rollout.sft_export``
   (``sft.min_reward``: 0 keeps the oracle's mistakes) and the policy is
   fine-tuned on them (``learner.sft``). GRPO starts from that checkpoint.
2. Test evaluation (``learner.test_tasks`` > 0): ``python -m rollout.eval
   --policy server --split test`` against the inference server, at the sampling
   temperature and greedily, before GRPO and after it.
3. With ``learner.train --control``, after the test evaluation of GRPO: the
   control, GRPO's wall time spent on more SFT from the same warm start instead
   (:func:`control_sft`), tested the same way (``control_*`` in the summary).
4. Summary: a table on stdout and in ``summary.txt``, ``summary.json``,
   ``curves.png`` (reward and success over steps, the test results beside them) in
   the run directory; with W&B or MLflow among ``logging.trackers``, the summary's
   numbers and these files go to the training's tracker run too.

Each phase leaves its result in the run directory and is skipped when a
restarted run finds it there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from learner.embedded.children import Children
from shared.config import RunConfig
from shared.progress import Progress

log = logging.getLogger("learner.train")
Z95 = 1.959963984540054
DEMO_GROUP = 2  # demonstrations per task: more distinct tasks than GRPO's group size gives


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- warm start


def collect_demos(
    cfg: RunConfig, cfg_args: list[str], run_dir: Path, web: str, children: Children
) -> Path:
    """``sft.demos`` noisy-oracle episodes through a sidecar; the directory of their records."""
    from learner.training.source import GroupSource

    demo_dir = run_dir / "demos"
    sidecar = children.start(
        "demo-sidecar",
        [
            "rollout.serve", *cfg_args, "--run-dir", str(demo_dir),
            "--set", "rollout.port=0", "--set", f"web.url={web}",
            "--set", "rollout.policy=noisy_oracle", "--set", "inference.urls=[]",
            "--set", f"rollout.group_size={DEMO_GROUP}",
        ],
    )  # fmt: skip
    source = GroupSource([sidecar], auth_token=cfg.rollout.auth_token)
    groups = -(-cfg.sft.demos // DEMO_GROUP)
    got: set[str] = set()
    with Progress("demos", groups * DEMO_GROUP, "episodes", enabled=cfg.logging.progress) as p:
        while len(got) < groups:
            for g in source.take(min(8, groups - len(got)), got):
                got.add(g.group_id)
            source.committed(sorted(got))
            p.update(len(got) * DEMO_GROUP)
    source.flush_acks()
    children.stop_one("demo-sidecar")
    return demo_dir / "episodes"


def warm_start(
    cfg: RunConfig, cfg_args: list[str], run_dir: Path, web: str, children: Children
) -> Path:
    """Demos, export, SFT; the SFT checkpoint directory (reused when already committed)."""
    from learner.embedded.sft import train_sft
    from learner.training.checkpoint import latest_committed_step

    sft_dir = run_dir / "sft"
    root = sft_dir / "checkpoints"
    if latest_committed_step(root) is not None:
        say(f"warm start: reusing {root}")
        return root
    t0 = time.monotonic()
    episodes = collect_demos(cfg, cfg_args, run_dir, web, children)
    data = sft_dir / "sft.jsonl"
    cmd = [
        sys.executable, "-m", "rollout.sft_export", str(episodes), "--out", str(data),
        "--min-reward", str(cfg.sft.min_reward),
    ]  # fmt: skip
    if cfg.rollout.trajectory == "per_turn":  # each turn an example, its prompt as GRPO's
        cmd.append("--per-turn")
        if cfg.env.history != "full":
            cmd += ["--keep-last", str(cfg.env.keep_last), "--history", cfg.env.history]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"sft_export failed: {out.stderr[-2000:]}")
    say(out.stderr.strip().splitlines()[-1])
    t_sft = time.monotonic()
    train_sft(cfg, data, sft_dir)
    done = {
        "minutes": (time.monotonic() - t0) / 60,
        "demos_minutes": (t_sft - t0) / 60,  # the demonstrations and their export
        "sft_minutes": (time.monotonic() - t_sft) / 60,
    }
    (sft_dir / "done.json").write_text(json.dumps(done))
    return root


def phase_minutes(run_dir: Path, phases: dict[str, float]) -> dict[str, float]:
    """Minutes of each phase of the run: the warm start's (``sft/done.json``: demos with
    their export, SFT) and ``phases`` (this invocation's test evaluations and GRPO)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        done = json.loads((run_dir / "sft" / "done.json").read_text())
        for key in ("demos", "sft"):
            if f"{key}_minutes" in done:
                out[key] = round(float(done[f"{key}_minutes"]), 2)
    return out | {k: round(v, 2) for k, v in phases.items()}


def sft_seconds_per_step(run_dir: Path) -> float:
    """The warm start's measured SFT seconds per step (its last ``sft_metrics.jsonl`` line)."""
    last = None
    path = run_dir / "sft" / "sft_metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                last = json.loads(line)
    if not last or not last.get("step"):
        raise RuntimeError(f"{path}: no SFT step timed; the control needs the warm start's pace")
    return float(last["elapsed_s"]) / int(last["step"])


def control_sft(cfg: RunConfig, run_dir: Path, grpo_minutes: float) -> tuple[Path, int]:
    """The control of ``learner.train --control``: GRPO's wall time spent on more SFT
    instead. From the warm start's checkpoint, SFT goes on over the same noisy-oracle
    demonstrations (its recipe: learning rate, warm-up and cosine decay, copy rows, now
    over the control's steps, in a fresh data order) for as many steps as the warm
    start's measured pace fits in ``grpo_minutes``. (checkpoint directory, steps);
    reused when already committed."""
    from learner.embedded.sft import train_sft
    from learner.training.checkpoint import latest_committed_step

    out = run_dir / "control"
    root = out / "checkpoints"
    done = latest_committed_step(root)
    if done is not None:
        say(f"control: reusing {root} ({done} SFT steps)")
        return root, done
    per_step = sft_seconds_per_step(run_dir)
    steps = max(1, round(grpo_minutes * 60 / per_step))
    say(
        f"control: {grpo_minutes:.1f} min of GRPO = {steps} more SFT steps at the warm "
        f"start's {per_step:.2f} s/step"
    )
    sft = replace(
        cfg.sft,
        init_checkpoint=str(run_dir / "sft" / "checkpoints"),
        steps=steps,
        copy_steps=0,
        warmup_steps=min(cfg.sft.warmup_steps, max(steps // 10, 1)),
        seed=cfg.sft.seed + 1,
    )
    t0 = time.monotonic()
    train_sft(replace(cfg, sft=sft), run_dir / "sft" / "sft.jsonl", out)
    minutes = (time.monotonic() - t0) / 60
    (out / "done.json").write_text(json.dumps({"steps": steps, "minutes": minutes}))
    say(f"control: {steps} SFT steps in {minutes:.1f} min (GRPO: {grpo_minutes:.1f} min)")
    return root, steps


# ----------------------------------------------------------------------------- evaluation


def eval_command(
    cfg_args: list[str], mode: str, split: str, n: int, web: str, *more: str
) -> list[str]:
    """``python -m rollout.eval`` on ``n`` tasks of ``split`` of the run's config, against the
    local web at ``web``; ``more`` arguments after."""
    return [
        sys.executable, "-m", "rollout.eval", *cfg_args, "--mode", mode, "--split", split,
        "--n", str(n), "--set", f"web.url={web}", *more,
    ]  # fmt: skip


def run_eval(
    cfg_args: list[str],
    mode: str,
    split: str,
    n: int,
    web: str,
    inference: list[str],
    out_dir: Path,
    sets: tuple[str, ...] | list[str] = (),
) -> dict:
    """``python -m rollout.eval --policy server`` in a child process (the same harness and
    sampling as training, against the running inference servers); its final JSON line."""
    urls = "[" + ",".join(f'"{u}"' for u in inference) + "]"
    cmd = eval_command(
        cfg_args, mode, split, n, web, "--policy", "server", "--set", f"inference.urls={urls}",
        *(a for s in sets for a in ("--set", s)), "--out", str(out_dir),
    )  # fmt: skip
    name = out_dir.name if out_dir.name.startswith(split) else f"{split}-step-{out_dir.name}"
    log_file = out_dir.parent.parent / "logs" / f"eval-{name}.log"
    out = run_with_progress(cmd, f"eval {name}", n, "episodes", log_file, timeout=3600)
    return json.loads(out.strip().splitlines()[-1])


def check_test_tasks(cfg: RunConfig, cfg_args: list[str], web: str) -> int:
    """Fail now, not after the warm start, when the test split cannot give
    ``learner.test_tasks`` tasks (``rollout.eval --check-tasks``: the evaluation's own
    task loading; no episode runs). A source that gives fewer without complaint (a
    tasks file) is warned about. Returns the number the test evaluations will run."""
    from learner.errors import RunConfigError

    asked = cfg.learner.test_tasks
    cmd = eval_command(cfg_args, cfg.env.mode, "test", asked, web, "--check-tasks")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        msg = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise RunConfigError(
            f"learner.test_tasks = {asked}: {msg} (lower learner.test_tasks, or 0 for no "
            "test evaluation)"
        )
    found = int(json.loads(out.stdout.strip().splitlines()[-1])["tasks"])
    if found < asked:
        log.warning(
            "learner.test_tasks = %d, but the test split gives %d: the test evaluations "
            "run %d tasks each", asked, found, found,
        )  # fmt: skip
    return found


def run_with_progress(
    cmd: list[str], phase: str, total: int, unit: str, log_file: Path, timeout: float
) -> str:
    """Run a child whose stderr carries ``[progress]`` lines (``shared.progress``) and show
    its progress as this process's own (a bar on a terminal, lines elsewhere); its stderr
    goes to ``log_file``. Returns its stdout; raises with the log's tail if it fails."""
    import os
    import threading

    from shared.progress import Progress, parse_line

    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROGRESS_EVERY_S": "2"}
    with (
        log_file.open("a") as sink,
        Progress(phase, total, unit) as progress,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        ) as proc,
    ):
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
        reader.start()
        watchdog = threading.Timer(timeout, proc.kill)  # a child that hangs is stopped
        watchdog.start()
        try:
            for line in proc.stderr:
                sink.write(line)
                sink.flush()
                got = parse_line(line)
                if got is not None:
                    progress.update(got[1], total=got[2])
            rc = proc.wait()
        except BaseException:
            # a stop (SIGTERM's SystemExit, Ctrl-C) ends the child too: leaving the ``with``
            # waits for it, which would otherwise sit out the child's whole run
            proc.kill()
            raise
        finally:
            watchdog.cancel()
        reader.join()
    if rc != 0:
        tail = log_file.read_text()[-2000:]
        raise RuntimeError(f"{phase} failed (exit {rc}; log {log_file}): {tail}")
    return "".join(stdout)


def tested_before(run_dir: Path) -> bool:
    """Whether the run saved its test results from before GRPO (both temperatures)."""
    found = list((run_dir / "eval").glob("test-before-*/result.json"))
    return len(found) >= 2


def evaluate_test(
    cfg: RunConfig,
    cfg_args: list[str],
    run_dir: Path,
    web: str,
    inference: list[str],
    tag: str,
    temperature: float,
) -> dict:
    """``rollout.eval`` on ``learner.test_tasks`` test tasks; its result plus the CI."""
    name = f"{tag}-greedy" if temperature == 0 else f"{tag}-t{temperature:g}"
    out_dir = run_dir / "eval" / f"test-{name}"
    result_file = out_dir / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    t0 = time.monotonic()
    result = run_eval(
        cfg_args, cfg.env.mode, "test", cfg.learner.test_tasks, web, inference, out_dir,
        [f"inference.temperature={temperature}"],
    )  # fmt: skip
    n = int(result["n"])
    k = round(float(result["success_rate"]) * n)
    result.update(temperature=temperature, successes=k, ci95=list(wilson(k, n)))
    result_file.write_text(json.dumps(result))
    say(
        f"test {name}: success {result['success_rate']:.3f} "
        f"[{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}] over {n} tasks, "
        f"mean reward {result['mean_reward']:.3f} ({time.monotonic() - t0:.0f} s)"
    )
    return result


# ----------------------------------------------------------------------------- summary

INVOCATIONS = "invocations.jsonl"  # one line per `learner.train` invocation of a run


def invocations(run_dir: Path) -> list[dict]:
    """The invocations of the run so far, finished or stopped, oldest first:
    ``{"started", "minutes", "first_step", "last_step"}`` each."""
    path = run_dir / INVOCATIONS
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill: the rest still count
            continue
    return out


def record_invocation(
    run_dir: Path, started: float, minutes: float, first_step: int, last_step: int,
    grpo_minutes: float = 0.0,
) -> None:  # fmt: skip
    """Add one invocation's wall time (and its GRPO phase's) to the run's ledger
    (``wall_minutes`` and :func:`grpo_minutes_of` sum them)."""
    row = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "minutes": round(minutes, 3), "first_step": first_step, "last_step": last_step,
        "grpo_minutes": round(grpo_minutes, 3),
    }  # fmt: skip
    path = run_dir / INVOCATIONS
    cut = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as fh:  # (after a line cut short by a kill, on a line of its own)
        fh.write(("\n" if cut else "") + json.dumps(row) + "\n")


def wall_minutes_of(run_dir: Path) -> float:
    """Minutes of every recorded invocation of the run, resumed ones included."""
    return sum(float(r.get("minutes", 0.0)) for r in invocations(run_dir))


def grpo_minutes_of(run_dir: Path, now: float = 0.0) -> float:
    """Minutes the run's GRPO phase took over its recorded invocations, plus ``now`` (the
    running invocation's, not yet recorded)."""
    return now + sum(float(r.get("grpo_minutes", 0.0)) for r in invocations(run_dir))


def summarize(
    cfg: RunConfig,
    run_dir: Path,
    results: dict[str, dict],
    wall_minutes: float,
    phases: dict[str, float] | None = None,
    config: str | None = None,
    overrides: list[str] | None = None,
) -> dict:
    """summary.json, the table on stdout, and curves.png. ``wall_minutes`` is the run's
    whole wall time: every invocation of a resumed run (``invocations.jsonl``);
    ``phase_minutes`` where the time went (:func:`phase_minutes`). ``config`` and
    ``overrides`` are what the run was started with (the config file, the ``--set``s);
    ``median_steps`` and ``median_steps_success`` the median actions per test episode
    (all of them, the successful ones) of each test evaluation (``before``, ``after``,
    ``before_greedy``, ``after_greedy``, and the control's when it ran)."""
    t = cfg.inference.temperature
    sft, grpo = results["before"], results["after"]
    summary = {
        "config": config,
        "overrides": list(overrides or []),
        "mode": cfg.env.mode,
        "n_test": int(sft["n"]),
        "temperature": t,
        "sft_success": sft["success_rate"],
        "sft_ci95": sft["ci95"],
        "sft_mean_reward": sft["mean_reward"],
        "grpo_success": grpo["success_rate"],
        "grpo_ci95": grpo["ci95"],
        "grpo_mean_reward": grpo["mean_reward"],
        "gain_points": round(100 * (grpo["success_rate"] - sft["success_rate"]), 2),
        "cis_overlap": not (grpo["ci95"][0] > sft["ci95"][1] or sft["ci95"][0] > grpo["ci95"][1]),
        "sft_greedy_success": results["before_greedy"]["success_rate"],
        "grpo_greedy_success": results["after_greedy"]["success_rate"],
        "sft_greedy_ci95": results["before_greedy"]["ci95"],
        "grpo_greedy_ci95": results["after_greedy"]["ci95"],
        "steps": cfg.learner.steps,
        "seed": cfg.learner.seed,
        **_control_keys(run_dir, results),
        "wall_minutes": round(wall_minutes, 2),
        "phase_minutes": phase_minutes(run_dir, phases or {}),
        "invocations": len(invocations(run_dir)),
        **episode_lengths(results),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "summary.txt").write_text(table(summary) + "\n")
    print(table(summary), flush=True)
    try:
        plot(run_dir, summary)
    except Exception as e:  # a missing plot must not lose the run's numbers
        log.warning("no plot: %s", e)
    track_summary(cfg, run_dir, summary)
    return summary


def episode_lengths(results: dict[str, dict]) -> dict:
    """The median actions per test episode of each evaluation in ``results`` (as
    ``rollout.eval`` measured them; an evaluation from before it did is left out)."""
    out: dict[str, dict[str, float]] = {"median_steps": {}, "median_steps_success": {}}
    for name, result in results.items():
        for key in out:
            if key in result:
                out[key][name] = result[key]
    return out


def _control_keys(run_dir: Path, results: dict[str, dict]) -> dict:
    """The control's keys (``learner.train --control``), when it ran."""
    if "control_greedy" not in results:
        return {}
    out = {
        "control_greedy_success": results["control_greedy"]["success_rate"],
        "control_greedy_ci95": results["control_greedy"]["ci95"],
    }
    if "control" in results:
        out.update(
            control_success=results["control"]["success_rate"],
            control_ci95=results["control"]["ci95"],
            control_mean_reward=results["control"]["mean_reward"],
        )
    done = run_dir / "control" / "done.json"
    if done.is_file():
        d = json.loads(done.read_text())
        out.update(control_sft_steps=d["steps"], control_minutes=round(d["minutes"], 2))
    return out


def track_summary(cfg: RunConfig, run_dir: Path, summary: dict) -> None:
    """The summary's numbers (``test/...``, at the last step) and its files, in the same
    W&B / MLflow run as the training's metrics (``logging.trackers``)."""
    from learner.training.trackers import open_trackers

    names = [n for n in cfg.logging.trackers if n in ("wandb", "mlflow")]
    if not names:
        return
    try:
        trackers = open_trackers(cfg, run_dir, names)
    except Exception as e:  # the run's numbers are on disk already
        log.warning("summary not sent to %s: %s", ", ".join(names), e)
        return
    try:
        trackers.log(cfg.learner.steps, {"test": summary})
        for name in ("summary.txt", "summary.json", "curves.png"):
            if (run_dir / name).is_file():
                trackers.artifact(run_dir / name)
    finally:
        trackers.close()


def table(s: dict) -> str:
    def ci(c):
        return f"[{c[0]:.3f}, {c[1]:.3f}]"

    rows = [
        f"test split, {s['mode']} mode, {s['n_test']} tasks, temperature {s['temperature']:g}",
        f"{'':12}{'success':>9}  {'95% CI (Wilson)':>16}  {'mean reward':>11}  {'greedy':>7}",
        f"{'SFT start':12}{s['sft_success']:>9.3f}  {ci(s['sft_ci95']):>16}  "
        f"{s['sft_mean_reward']:>11.3f}  {s['sft_greedy_success']:>7.3f}",
        f"{'after GRPO':12}{s['grpo_success']:>9.3f}  {ci(s['grpo_ci95']):>16}  "
        f"{s['grpo_mean_reward']:>11.3f}  {s['grpo_greedy_success']:>7.3f}",
    ]
    if "control_success" in s:
        rows.append(
            f"{'SFT control':12}{s['control_success']:>9.3f}  {ci(s['control_ci95']):>16}  "
            f"{s.get('control_mean_reward', float('nan')):>11.3f}  "
            f"{s['control_greedy_success']:>7.3f}"
        )
    rows.append(
        f"gain {s['gain_points']:+.1f} points; confidence intervals "
        f"{'overlap' if s['cis_overlap'] else 'do not overlap'}; {s['wall_minutes']:.1f} min"
    )
    greedy = f"greedy: SFT start {ci(s['sft_greedy_ci95'])}, after GRPO {ci(s['grpo_greedy_ci95'])}"
    if "control_greedy_ci95" in s:
        greedy += f", SFT control {ci(s['control_greedy_ci95'])}"
        greedy += f" ({s.get('control_sft_steps', '?')} more SFT steps in GRPO's time)"
    rows.append(greedy)
    return "\n".join(rows)


EPISODE_CURVES = {  # metrics.jsonl keys of the episodes panel, and their labels
    "episode_actions": "actions (mean)",
    "episode_actions_max": "actions (longest)",
    "turns_per_episode": "training sequences",
    "ended_budget": "ended at the budget",
    "ended_error": "ended on an error",
}


def window(ys: list[float]) -> int:
    return max(1, len(ys) // 10)


def moving_mean(ys: list[float]) -> list[float]:
    """The mean of each point and the ``window(ys) - 1`` before it."""
    k = window(ys)
    return [
        sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1])
        for i in range(len(ys))
    ]


def plot(run_dir: Path, summary: dict) -> Path:
    """Training reward and success per step (and a moving average), test results as bars;
    with the batches' per-episode figures in ``metrics.jsonl``, a panel of the episodes'
    length (actions, mean and longest; training sequences per episode) and where they
    ended (at the budget, on an error)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, reward, success = [], [], []
    episodes: dict[str, list[float]] = {k: [] for k in EPISODE_CURVES}
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        r = json.loads(line)
        if "reward" in r and "eval" not in r:
            steps.append(r["step"])
            reward.append(r["reward"])
            success.append(r["success"])
            for k, ys in episodes.items():
                ys.append(r.get(k, float("nan")))
    has_episodes = any(v == v for v in episodes["episode_actions"])  # not all NaN
    if has_episodes:  # a third panel: the episodes' length and where they ended
        fig, (ax, cx, bx) = plt.subplots(
            1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [3, 3, 1]}
        )
    else:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    for ys, label in ((reward, "train reward"), (success, "train success")):
        ax.plot(steps, ys, alpha=0.3, lw=1)
        ax.plot(steps, moving_mean(ys), lw=2, label=f"{label} (moving mean of {window(ys)})")
    if has_episodes:
        for key, label in EPISODE_CURVES.items():
            if key.startswith("ended"):
                continue
            cx.plot(steps, episodes[key], lw=1.5, label=label)
        cx.set_xlabel("GRPO step")
        cx.set_ylabel("per episode")
        cx.set_ylim(bottom=0)
        fx = cx.twinx()
        for key, label in EPISODE_CURVES.items():
            if key.startswith("ended"):
                color = "tab:red" if key == "ended_budget" else "tab:purple"
                fx.plot(steps, episodes[key], lw=1, ls="--", color=color, label=label)
        fx.set_ylim(0, 1)
        fx.set_ylabel("fraction of episodes")
        lines = cx.get_legend_handles_labels()
        more = fx.get_legend_handles_labels()
        cx.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
        cx.set_title("training episodes: length and where they ended")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title(f"training ({summary['mode']} mode, temperature {summary['temperature']:g})")
    names = ["SFT start", "after GRPO"]
    vals = [summary["sft_success"], summary["grpo_success"]]
    cis = [summary["sft_ci95"], summary["grpo_ci95"]]
    err = [
        [max(0.0, v - c[0]) for v, c in zip(vals, cis, strict=True)],  # rounding at 0 and 1
        [max(0.0, c[1] - v) for v, c in zip(vals, cis, strict=True)],
    ]
    bx.bar(names, vals, yerr=err, capsize=6, color=["#999999", "#3b7dd8"])
    bx.set_ylim(0, 1)
    bx.set_title(f"test success (n={summary['n_test']}, 95% CI)")
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
