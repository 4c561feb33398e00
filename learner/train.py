"""`python -m learner.train [--config PATH] [--set k=v ...] [--dry-run [--compile] [--max-length]]`.

Reads the run config (default ``configs/tiny.toml``). With ``rollout.urls`` set it
pulls groups from those sidecars; with none (the embedded default) it starts the
local web, the embedded inference server and a sidecar as child processes on
loopback and stops them all when it ends, however it ends. The run directory is
``logging.run_dir/logging.run_name``; a run restarted with the same name resumes
from its latest committed checkpoint. ``--dry-run`` prints the per-device memory
budget of the configured model on the configured mesh and exits (1 if it does not
fit in ``mesh.device_memory_gib``); ``--compile`` adds XLA's figures for the real
train step compiled for that mesh, and they decide; ``--max-length`` searches the
longest row that fits (``learner.training.dryrun``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from shared.config import RunConfig, add_config_args, config_from_args, setup_logging

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
log = logging.getLogger("learner.train")


def run_dir_of(cfg: RunConfig) -> Path:
    name = cfg.logging.run_name or _timestamp()
    return Path(cfg.logging.run_dir) / name


def _timestamp() -> str:
    """The time as a run name; with several learner processes, process 0's."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    import jax

    if jax.process_count() == 1:
        return stamp
    import numpy as np
    from jax.experimental.multihost_utils import broadcast_one_to_all

    data = broadcast_one_to_all(np.frombuffer(stamp.encode(), np.uint8))
    return np.asarray(data).tobytes().decode()


def _raise_on_sigterm() -> None:
    def handler(signum, _frame):
        # A second SIGTERM (timeout(1) and a process-group kill both send one) must not
        # interrupt the cleanup the first one started: ignore the rest.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)  # unwinds through the children's cleanup

    signal.signal(signal.SIGTERM, handler)


class DevEvaluator:
    """Evaluates the served policy on the dev split with ``python -m rollout.eval --policy
    server`` (the same harness and sampling as training), in a child process."""

    def __init__(self, args: argparse.Namespace, web: str, inference: list[str], run_dir: Path):
        self.cfg_args = (["--config", str(args.config)] if args.config else []) + [
            a for o in (args.overrides or []) for a in ("--set", o)
        ]
        self.web, self.inference, self.run_dir = web, inference, run_dir

    def __call__(self, cfg: RunConfig, step: int) -> dict:
        from learner.embedded.pipeline import run_eval

        return run_eval(
            self.cfg_args, cfg.env.mode, "dev", cfg.learner.eval_tasks, self.web,
            self.inference, self.run_dir / "eval" / str(step),
        )  # fmt: skip


def train(cfg: RunConfig, args: argparse.Namespace) -> int:
    from learner.training.distributed import initialize

    primary = not initialize(cfg.mesh) or _process_index() == 0
    from learner.embedded.children import Children, start_embedded, start_inference, start_sidecar
    from learner.embedded.pipeline import (
        check_test_tasks,
        control_sft,
        evaluate_test,
        grpo_minutes_of,
        record_invocation,
        summarize,
        tested_before,
        wall_minutes_of,
        warm_start,
    )
    from learner.training.loop import Trainer
    from learner.training.source import GroupSource

    t_start, started_at = time.monotonic(), time.time()
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if primary:
        _link_latest(run_dir)
    print(f"run dir {run_dir}", flush=True)
    if primary:
        print(logs_line(cfg, run_dir), flush=True)
    overrides = list(args.overrides or [])
    cfg_args = (["--config", str(args.config)] if args.config else []) + [
        a for o in overrides for a in ("--set", o)
    ]
    embedded = not cfg.rollout.urls
    trainer = None
    results: dict[str, dict] = {}
    first_step = -1
    grpo_s = 0.0  # this invocation's GRPO phase (the control spends the run's total)
    phases: dict[str, float] = {}  # this invocation's phases after the warm start, minutes
    try:
        with Children(run_dir / "logs") as children:
            web, inference, urls = cfg.web.url, list(cfg.inference.urls), list(cfg.rollout.urls)
            if embedded:
                if not web:  # web.url names a running local web, else start one
                    web = start_web(children, cfg_args, run_dir)
                if primary and cfg.learner.test_tasks > 0 and not tested_before(run_dir):
                    check_test_tasks(cfg, cfg_args, web)  # before the warm start's minutes
                if cfg.sft.demos and not cfg.learner.init_checkpoint:
                    # (a resumed run reuses the committed SFT checkpoint: its KL reference)
                    root = warm_start(cfg, cfg_args, run_dir, web, children)
                    cfg = replace(cfg, learner=replace(cfg.learner, init_checkpoint=str(root)))
            trainer = Trainer(cfg, run_dir)
            if embedded:
                started = start_embedded(
                    children,
                    config_path=str(args.config) if args.config else None,
                    overrides=overrides,
                    checkpoint_root=trainer.ckpt_root,
                    initial_step=int(trainer.state.step),
                    run_dir=run_dir,
                    web=web,
                    sidecar=False,
                    backend=cfg.inference.backend,
                )
                inference = [started["inference"]]
            testing = primary and cfg.learner.test_tasks > 0 and bool(web and inference)

            def test(tag: str) -> None:
                t0 = time.monotonic()
                for key, temp in ((tag, cfg.inference.temperature), (f"{tag}_greedy", 0.0)):
                    results[key] = evaluate_test(cfg, cfg_args, run_dir, web, inference, tag, temp)
                phases[f"test_{tag}"] = (time.monotonic() - t0) / 60

            first_step = int(trainer.state.step)
            if testing and (first_step == 0 or tested_before(run_dir)):
                test("before")  # (a resumed run reads the results it saved at step 0)
            if embedded:
                urls = [
                    start_sidecar(children, cfg_args, trainer.ckpt_root, run_dir, web, inference[0])
                ]
            source = GroupSource(urls, auth_token=cfg.rollout.auth_token)
            if web and inference:
                trainer.evaluator = DevEvaluator(args, web, inference, run_dir)
            t_grpo = time.monotonic()
            trainer.run(source)
            grpo_s = time.monotonic() - t_grpo
            phases["grpo"] = grpo_s / 60
            if embedded:
                children.stop_one("sidecar")  # its rollouts would compete with the evaluation
            if testing and trainer.version == int(trainer.state.step):
                test("after")
                if args.control:
                    root, steps = control_sft(cfg, run_dir, grpo_minutes_of(run_dir, grpo_s / 60))
                    children.stop_one("inference")  # the control's own server, on its weights
                    inference = [
                        start_inference(
                            children,
                            cfg_args,
                            root,
                            steps,
                            "control-inference",
                            backend=cfg.inference.backend,
                        )
                    ]
                    test("control")
    finally:
        if trainer is not None:
            trainer.close()
        if primary:  # every invocation counts in the run's wall time, a failed one too
            last = int(trainer.state.step) if trainer is not None else -1
            record_invocation(
                run_dir, started_at, (time.monotonic() - t_start) / 60,
                first_step, last, grpo_s / 60,
            )  # fmt: skip
    step = int(trainer.state.step)
    print(f"trained to step {step}; run dir {run_dir}", flush=True)
    if {"before", "before_greedy", "after", "after_greedy"} <= set(results):
        summarize(
            cfg, run_dir, results, wall_minutes_of(run_dir), phases,
            config=config_name(args.config), overrides=overrides,
        )  # fmt: skip
        print(f"summary: {run_dir / 'summary.json'}; plot: {run_dir / 'curves.png'}", flush=True)
    return 0


def config_name(path: str | Path | None) -> str | None:
    """The config file a run was started with, as the summary names it: relative to the
    repository when it lies inside it (``configs/tiny.toml``), else as given."""
    if not path:
        return None
    full = Path(path).resolve()
    repo = DEFAULT_CONFIG.parents[1]
    return str(full.relative_to(repo)) if full.is_relative_to(repo) else str(path)


WEB_PORT_FILE = "web_port"  # the embedded web's port, kept for a resumed run


def start_web(children, cfg_args: list[str], run_dir: Path) -> str:
    """Start the embedded local web on a free port, or on the port an earlier invocation
    of this run had (``<run>/web_port``), and return its URL. A small policy learns the
    port its demonstrations were recorded on (README, "Process reward"), so a resumed
    run keeps it; when that port is taken the web gets a new one, with a warning."""
    from urllib.parse import urlsplit

    saved, port = run_dir / WEB_PORT_FILE, 0
    if saved.is_file():
        with contextlib.suppress(ValueError):
            port = int(saved.read_text().strip())
        if port and not port_free(port):
            log.warning("the run's web port %d is taken: the web gets a new one", port)
            port = 0
    url = children.start("web", ["rollout.web", "--port", str(port), *cfg_args])
    saved.write_text(f"{urlsplit(url).port}\n")
    return url


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``port`` now. The probe binds as the server does
    (aiohttp sets SO_REUSEADDR), so a port whose last connections linger in TIME_WAIT
    after a stop counts as free; only a listener takes it."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def logs_line(cfg: RunConfig, run_dir: Path) -> str:
    """Where each process of the run writes its log, for the run's first lines."""
    logs = run_dir / "logs"
    names = []
    if not cfg.rollout.urls:  # the embedded default starts its own children
        names = (
            ["web"] * (not cfg.web.url)
            + ["demo-sidecar"] * bool(cfg.sft.demos and not cfg.learner.init_checkpoint)
            + ["inference", "sidecar"]
        )
    parts = ["learner: this output", f"metrics: {run_dir / 'metrics.jsonl'}"]
    parts += [f"{n}: {logs / n}.log" for n in names]
    if cfg.learner.test_tasks:
        parts.append(f"test evaluations: {logs}/eval-test-*.log")
    return "logs: " + "; ".join(parts)


def _process_index() -> int:
    import jax

    return jax.process_index()


def _link_latest(run_dir: Path) -> None:
    """``<run_dir parent>/latest`` -> this run."""
    link = run_dir.parent / "latest"
    try:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(run_dir.name)
    except OSError as e:
        logging.getLogger("learner.train").warning("could not link %s: %s", link, e)


def _simulate_cpu_devices(n: int) -> None:
    """Give the CPU backend ``n`` devices, if it has not started yet (it cannot change
    once started; ``learner.training.dryrun`` then re-runs the command with simulated devices)."""
    import jax

    if n:
        with contextlib.suppress(RuntimeError):  # raised when the backend is already up
            jax.config.update("jax_num_cpu_devices", n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.train", description=__doc__)
    add_config_args(parser, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the per-device memory budget and exit"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="with --dry-run: also compile the real train step on abstract shapes for the "
        "configured mesh (simulated CPU devices when fewer are present) and print XLA's figures",
    )
    parser.add_argument(
        "--max-length",
        action="store_true",
        help="with --dry-run: search the longest row that fits mesh.device_memory_gib "
        "(by the compiled figure with --compile, else by the estimate)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="after GRPO and its test evaluation, spend GRPO's wall time on more SFT from "
        "the same warm start instead and test that too (control_* in summary.json); "
        "embedded runs with a warm start (sft.demos) and learner.test_tasks only",
    )
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    if args.control and not (cfg.sft.demos and cfg.learner.test_tasks and not cfg.rollout.urls):
        parser.error("--control needs an embedded run with a warm start (sft.demos > 0) "
                     "and a test evaluation (learner.test_tasks > 0)")  # fmt: skip
    setup_logging(cfg)
    if args.dry_run:
        if args.compile:  # each process's share of the devices (learner.training.dryrun)
            _simulate_cpu_devices(cfg.mesh.num_devices // cfg.mesh.num_processes)
        from learner.training.dryrun import main as dry_run

        argv = list(sys.argv[1:] if argv is None else argv)
        return dry_run(cfg, compile=args.compile, longest=args.max_length, argv=argv)
    if args.compile or args.max_length:
        parser.error("--compile and --max-length go with --dry-run")
    _raise_on_sigterm()
    from learner.errors import CheckpointSaveError, RunConfigError
    from learner.training.sharding import split_cpu

    split_cpu(cfg.mesh.cpu_devices)  # before anything starts JAX's backend

    try:
        return train(cfg, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except CheckpointSaveError as e:
        print(f"learner.train: stopped: {e}", file=sys.stderr)
        return 1
    except RunConfigError as e:
        print(f"learner.train: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from learner.training.host_memory import restart_with_huge_pages

    restart_with_huge_pages()  # before JAX is imported (learner.training.host_memory)
    sys.exit(main())
