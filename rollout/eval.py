"""`python -m rollout.eval [--config FILE] [--mode KIND] --policy oracle|server --split test --n N`.

Runs episodes of the config's environment (``env.kind``; ``--mode`` overrides it:
``api``, ``playwright``, ``som`` or any registered kind) on the tasks of its task
source (``rollout.task_source``: the generator's ``--split`` by default) through the
full harness (environment, parser, verifiers, progress tracker) and prints a final
JSON line:
``{"mode", "policy", "n", "success_rate", "mean_reward", "mean_steps", "median_steps",
"median_steps_success", "step_p50_ms", "step_p95_ms", "infra_errors"}`` (the medians:
actions per episode, of every episode and of the successful ones; 0 when there are none). With ``--out DIR`` every
episode's progress file and trajectory record land in DIR. ``--policy server``
evaluates the model behind ``inference.urls`` through the inference client, with
the same harness and the configured sampling. Episodes are scored by the run's
``[reward]`` section (format tier, process reward) as the sidecar scores them in
training, so ``mean_reward`` is the training reward. ``--archive record`` writes every
response the episodes get to a WARC archive (``OUT/archive`` or ``--archive-dir``),
``--archive replay`` answers them from it with nothing sent to the network (the
recorded web's address is mapped to this run's, so any run's archive replays). ``--tasks
FILE`` runs tasks from a JSONL file of the same schema instead (``rollout.task_source =
"file"``; their URLs must be allowed: extend ``env.allowed_hosts``). The local web is
started as a child process unless ``web.url`` names a running one. ``--check-tasks``
runs no episode: it loads the ``--n`` tasks of ``--split`` as an evaluation would and
prints ``{"split", "asked", "tasks"}``, or fails (exit status 2) with the task source's
message; ``learner.train`` checks its test split this way before it spends its SFT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from rollout.agent.policies import scripted_oracle
from rollout.env import browsers_for, episode_lease, make_env
from rollout.env.core import InfraError
from rollout.env.pool import BrowserLost
from rollout.registry import RegistryError, TaskRequest, envs, task_sources
from rollout.sidecar.procs import web_for
from rollout.verifiers import verifier_config
from shared.config import RunConfig, add_config_args, config_from_args
from shared.progress import Progress


async def run_episode(task, mode, web_url, cfg: RunConfig, pool, session, out, index) -> dict:
    """One episode (the oracle's, or the model's through the inference client); returns its
    outcome (reward, steps, status, step times)."""
    try:
        async with episode_lease(pool, f"{index:05d}-{task['id']}") as lease:
            env = make_env(
                mode, web_url, cfg.env, cfg.search, session=session, lease=lease,
                run_dir=out, episode_id=f"{index:05d}-{task['id']}",
                verifier=verifier_config(cfg.reward),  # scored as training scores it
            )  # fmt: skip
            if cfg.rollout.policy == "model":
                return await _model_episode(env, task, cfg, session)
            try:
                await env.reset(task)
                policy = scripted_oracle(mode, task, web_url, cfg.rollout)
                text, times = env.user_prompt(), []
                while True:
                    r = await env.step(policy.next(text))
                    times.append(r.info.get("step_ms", 0.0))
                    text = r.text
                    if r.terminated or r.truncated:
                        break
                status = r.info.get("status", "ok")
                return {"reward": r.reward, "steps": len(times), "status": status, "ms": times}
            finally:
                await env.close()
    except (BrowserLost, InfraError) as e:  # the browser died under this episode
        return {"reward": 0.0, "steps": 0, "status": "infra_error", "ms": [], "error": str(e)}


async def _model_episode(env, task: dict, cfg: RunConfig, session) -> dict:
    from rollout.sidecar.episode import Limits
    from rollout.sidecar.inference import InferenceClient, Sampling
    from shared.tokenizer import load_tokenizer

    inf = cfg.inference
    tok = load_tokenizer()
    client = InferenceClient(
        list(inf.urls), session, timeout_s=inf.timeout_s, retries=inf.retries, backend=inf.backend
    )
    sampling = Sampling(inf.temperature, inf.top_p, inf.top_k, inf.max_new_tokens, tok.stop_ids)
    limits = Limits(inf.max_context_tokens, inf.observation_tokens, inf.max_new_tokens)
    t = await play(env, task, tok, cfg, limits, client=client, sampling=sampling)
    ms = [s.ended * 1e3 - s.started * 1e3 for s in env.record.steps]
    return {"reward": t.reward, "steps": t.num_steps, "status": t.status, "ms": ms}


async def play(env, task: dict, tok, cfg: RunConfig, limits, **kw):
    """One episode played as training plays it (per turn under ``env.history``, or as one
    sequence: :func:`rollout.sidecar.episode.play_episode`); its last trajectory (the
    episode's reward, status and steps)."""
    from rollout.sidecar.episode import play_episode

    kw.update(group_id="eval", sample_index=0, limits=limits)
    return (await play_episode(env, task, tok, cfg, **kw))[-1]


def load_tasks(cfg: RunConfig, args: argparse.Namespace, web_url: str) -> list[dict]:
    """``args.n`` tasks of ``args.split`` from the config's task source (``rollout.task_source``)."""
    source = task_sources.get(cfg.rollout.task_source)
    tasks = list(source(TaskRequest(cfg, web_url, args.split, args.n, args.seed)))
    return tasks[: args.n]


@contextlib.asynccontextmanager
async def local_web(cfg: RunConfig):
    """The local web's URL: ``web.url``, or a child started here and stopped on leaving."""
    web_url, web = await web_for(cfg.web.cache_dir, cfg.web.url)
    try:
        yield web_url
    finally:
        if web is not None:
            await web.stop()


async def count_tasks(cfg: RunConfig, args: argparse.Namespace) -> int:
    """How many of the ``args.n`` tasks :func:`evaluate` would run (no episode runs)."""
    async with local_web(cfg) as web_url:
        return len(load_tasks(cfg, args, web_url))


async def evaluate(cfg: RunConfig, args: argparse.Namespace) -> dict:
    async with local_web(cfg) as web_url:
        tasks = load_tasks(cfg, args, web_url)
        async with browsers_for(args.mode, web_url, cfg.env, cfg.rollout) as pool:
            return await run_all(cfg, args, tasks, web_url, pool)


async def run_all(cfg: RunConfig, args, tasks: list[dict], web_url: str, pool) -> dict:
    """Every task's episode, ``args.parallel`` at a time."""
    out = Path(args.out) if args.out else None
    sem = asyncio.Semaphore(args.parallel)
    split = getattr(args, "split", None)
    phase = "eval" if cfg.rollout.task_source == "file" or not split else f"eval {split}"
    progress = Progress(phase, len(tasks), "episodes", enabled=cfg.logging.progress)
    ok = 0
    async with aiohttp.ClientSession() as session:

        async def one(i: int, task: dict) -> dict:
            nonlocal ok
            async with sem:
                r = await run_episode(task, args.mode, web_url, cfg, pool, session, out, i)
            ok += r["status"] != "infra_error" and r["reward"] >= 1.0
            progress.advance(1, f"success {ok}")
            return r

        t0 = time.monotonic()
        with progress:
            results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
        wall = time.monotonic() - t0
    return summarise(args, results, wall)


def _median(values) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else 0.0


def summarise(args: argparse.Namespace, results: list[dict], wall: float) -> dict:
    ms = sorted(m for r in results for m in r["ms"])
    ok = [r for r in results if r["status"] != "infra_error"]

    def pct(q: float) -> float:
        return round(ms[min(len(ms) - 1, int(q * len(ms)))], 1) if ms else 0.0

    return {
        "mode": args.mode,
        "policy": args.policy,
        "n": len(results),
        "success_rate": round(sum(r["reward"] >= 1.0 for r in ok) / max(1, len(ok)), 4),
        "mean_reward": round(statistics.fmean(r["reward"] for r in ok), 4) if ok else 0.0,
        "mean_steps": round(statistics.fmean(r["steps"] for r in ok), 2) if ok else 0.0,
        "median_steps": _median(r["steps"] for r in ok),
        "median_steps_success": _median(r["steps"] for r in ok if r["reward"] >= 1.0),
        "step_p50_ms": pct(0.5),
        "step_p95_ms": pct(0.95),
        "infra_errors": len(results) - len(ok),
        "episodes_per_s": round(len(results) / wall, 2) if wall else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout.eval", description=__doc__)
    add_config_args(p)
    p.add_argument(
        "--mode",
        help="the environment kind (default: the config's env.kind): api, playwright, som, "
        "or any registered one",
    )
    p.add_argument(
        "--policy",
        choices=("oracle", "server"),
        default="oracle",
        help="the scripted oracle, or the model behind inference.urls",
    )
    p.add_argument("--split", choices=("train", "dev", "test"), default="test")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", type=int, default=4, help="episodes at once")
    p.add_argument("--out", help="directory for progress files and trajectory records")
    p.add_argument(
        "--tasks",
        help="a JSONL file of tasks to run (rollout.task_source = 'file', rollout.tasks_file)",
    )
    p.add_argument(
        "--archive", choices=("off", "record", "replay"),
        help="record every response the episodes get, or replay them from the archive "
        "(env.archive)",
    )  # fmt: skip
    p.add_argument("--archive-dir", help="the archive (env.archive_dir; default OUT/archive)")
    p.add_argument(
        "--check-tasks", action="store_true",
        help="run no episode: load the --n tasks of --split from the task source, print "
        'their count ({"split", "asked", "tasks"}) and exit; exit status 2 with the '
        "source's message when it cannot give them",
    )  # fmt: skip
    p.add_argument(
        "--archive-fallback", choices=("none", "live"),
        help="in replay, what is not archived: an error observation, or fetched and recorded",
    )  # fmt: skip
    args = p.parse_args(argv)
    cfg = config_from_args(args)
    archive = {
        k: v
        for k, v in {
            "archive": args.archive,
            "archive_dir": args.archive_dir or cfg.env.archive_dir,
            "archive_fallback": args.archive_fallback,
        }.items()
        if v is not None
    }
    if archive.get("archive", cfg.env.archive) != "off" and "archive_dir" not in archive:
        if not args.out:
            p.error("--archive needs --archive-dir (or --out, whose archive/ it then uses)")
        archive["archive_dir"] = str(Path(args.out) / "archive")
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, **archive))
    cfg = _with_choices(p, cfg, args)
    if args.policy == "server" and not cfg.inference.urls:
        p.error('--policy server needs inference.urls (e.g. --set inference.urls=["http://..."])')
    policy = "model" if args.policy == "server" else "oracle"
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, policy=policy))
    if args.n < 1 or args.parallel < 1:
        p.error("--n and --parallel must be at least 1")
    if args.check_tasks:
        try:
            n = asyncio.run(count_tasks(cfg, args))
        except (ValueError, OSError) as e:  # what the source cannot give or read
            p.error(f"{args.split} tasks of task source {cfg.rollout.task_source!r}: {e}")
        print(json.dumps({"split": args.split, "asked": args.n, "tasks": n}))
        return 0
    if policy == "oracle" and envs.get(args.mode).oracle is None:
        p.error(f"environment kind {args.mode!r} has no scripted oracle; use --policy server")
    result = asyncio.run(evaluate(cfg, args))
    print(json.dumps(result))
    return 0


def _with_choices(p: argparse.ArgumentParser, cfg: RunConfig, args) -> RunConfig:
    """The config with ``--mode`` and ``--tasks`` applied; ``args.mode`` set to the kind run.
    A kind or task source nobody registered is an error naming the registered ones."""
    kind = args.mode or cfg.env.kind
    rollout = cfg.rollout
    if args.tasks:
        rollout = dataclasses.replace(rollout, task_source="file", tasks_file=args.tasks)
    try:
        envs.get(kind)
        task_sources.get(rollout.task_source)
    except RegistryError as e:
        p.error(str(e))
    env = dataclasses.replace(cfg.env, kind=kind, mode=kind)
    args.mode = kind
    return dataclasses.replace(cfg, env=env, rollout=rollout)


if __name__ == "__main__":
    sys.exit(main())
