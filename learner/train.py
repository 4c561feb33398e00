"""`python -m learner.train [--config PATH] [--set k=v ...] [--dry-run]`: GRPO training.

Reads the run config (default ``configs/tiny.toml``). With ``rollout.urls`` set it
pulls groups from those sidecars; with none (the embedded default) it starts the
local web, the embedded inference server and a sidecar as child processes on
loopback and stops them all when it ends, however it ends. The run directory is
``logging.run_dir/logging.run_name``; a run restarted with the same name resumes
from its latest committed checkpoint. ``--dry-run`` prints the per-device memory
budget of the configured model on the configured mesh and exits (1 if it does not
fit in ``mesh.device_memory_gib``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from shared.config import RunConfig, add_config_args, config_from_args

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def run_dir_of(cfg: RunConfig) -> Path:
    name = cfg.logging.run_name or time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.logging.run_dir) / name


def _raise_on_sigterm() -> None:
    def handler(signum, _frame):
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
        import json
        import subprocess

        urls = "[" + ",".join(f'"{u}"' for u in self.inference) + "]"
        cmd = [
            sys.executable, "-m", "rollout.eval", *self.cfg_args, "--mode", cfg.env.mode,
            "--policy", "server", "--split", "dev", "--n", str(cfg.learner.eval_tasks),
            "--set", f"web.url={self.web}", "--set", f"inference.urls={urls}",
            "--out", str(self.run_dir / "eval" / str(step)),
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"dev evaluation failed: {out.stderr[-1000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def train(cfg: RunConfig, args: argparse.Namespace) -> int:
    from learner.distributed import initialize

    initialize(cfg.mesh)
    from learner.embedded import Children, start_embedded
    from learner.loop import Trainer
    from learner.source import GroupSource

    run_dir = run_dir_of(cfg)
    trainer = Trainer(cfg, run_dir)
    try:
        with Children(run_dir / "logs") as children:
            urls = list(cfg.rollout.urls)
            web, inference = cfg.web.url, list(cfg.inference.urls)
            if not urls:
                overrides = list(args.overrides or [])
                started = start_embedded(
                    children,
                    config_path=str(args.config) if args.config else None,
                    overrides=overrides,
                    checkpoint_root=trainer.ckpt_root,
                    initial_step=int(trainer.state.step),
                    run_dir=run_dir,
                )
                urls, web, inference = [started["sidecar"]], started["web"], [started["inference"]]
            source = GroupSource(urls, auth_token=cfg.rollout.auth_token)
            if web and inference:
                trainer.evaluator = DevEvaluator(args, web, inference, run_dir)
            trainer.run(source)
    finally:
        trainer.close()
    print(f"trained to step {int(trainer.state.step)}; run dir {run_dir}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.train", description=__doc__)
    add_config_args(parser, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the per-device memory budget and exit"
    )
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    logging.basicConfig(
        level=cfg.logging.level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("absl").setLevel(logging.ERROR)
    if args.dry_run:
        from learner.dryrun import main as dry_run

        return dry_run(cfg)
    _raise_on_sigterm()
    try:
        return train(cfg, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
