"""The embedded default's child processes: local web, inference server, rollout sidecar.

Each is ``python -m <module> --port 0 ...`` in its own process group; it is ready
when it prints ``serving on http://HOST:PORT``. :class:`Children` is a context
manager: leaving it (normal exit, an error, Ctrl-C or SIGTERM) stops every
child's whole process group, SIGTERM then SIGKILL, so nothing is orphaned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared import lifeline

READY = "serving on "
log = logging.getLogger("learner.train")
REPO = Path(__file__).resolve().parents[2]


class ChildError(RuntimeError):
    pass


class Children:
    """Started children, stopped in reverse order on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, module_args: list[str], timeout: float = 300.0) -> str:
        """Start ``python -m module_args`` and return the URL it announces."""
        sink = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", *module_args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=sink,
            start_new_session=True,  # its own process group: stopped as a whole
            env={**os.environ, lifeline.ENV: str(os.getpid())},  # it ends if this is killed
        )
        sink.close()
        self.procs.append((name, proc))
        with (self.log_dir / "children.pids").open("a") as fh:  # for operators and tests
            fh.write(f"{name} {proc.pid}\n")
        found: list[str] = []

        def read() -> None:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith(READY) and not found:
                    found.append(line[len(READY) :])
            # keep draining so the child never blocks on a full pipe

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found:
            if proc.poll() is not None:
                raise ChildError(
                    f"{name} exited with code {proc.returncode}; see {self.log_dir / name}.log"
                )
            if time.monotonic() > deadline:
                raise ChildError(f"{name} did not start within {timeout:.0f} s")
            time.sleep(0.05)
        log.info("%s started at %s (log %s)", name, found[0], self.log_dir / f"{name}.log")
        return found[0]

    def stop_one(self, name: str, timeout: float = 10.0) -> None:
        """Stop the child started as ``name`` (its whole process group)."""
        for entry in [e for e in self.procs if e[0] == name]:
            _signal_group(entry[1], signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                entry[1].wait(timeout)
            _signal_group(entry[1], signal.SIGKILL)
            entry[1].wait()
            self.procs.remove(entry)

    def stop(self, timeout: float = 10.0) -> None:
        for _name, proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _name, proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(proc, signal.SIGKILL)  # the child if it lingers, and any grandchild
            proc.wait()
        self.procs.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def start_embedded(
    children: Children,
    *,
    config_path: str | None,
    overrides: list[str],
    checkpoint_root: Path,
    initial_step: int,
    run_dir: Path,
    web: str | None = None,
    sidecar: bool = True,
    backend: str = "embedded",
) -> dict[str, str]:
    """Web (unless ``web`` names a running one), inference server (on the checkpoint of
    ``initial_step``) and sidecar (with ``sidecar``); their URLs (keys ``web``,
    ``inference``, ``sidecar``)."""
    cfg_args = (["--config", config_path] if config_path else []) + [
        a for o in overrides for a in ("--set", o)
    ]
    if web is None:
        web = children.start("web", ["rollout.web", "--port", "0", *cfg_args])
    inference = start_inference(children, cfg_args, checkpoint_root, initial_step, backend=backend)
    urls = {"web": web, "inference": inference}
    if sidecar:
        urls["sidecar"] = start_sidecar(
            children, cfg_args, checkpoint_root, run_dir, web, inference
        )
    return urls


def start_inference(
    children: Children,
    cfg_args: list[str],
    checkpoint_root: Path,
    step: int,
    name: str = "inference",
    *,
    backend: str = "embedded",
) -> str:
    """An inference server on the checkpoint of ``step``, its weight version ``step``; its
    URL. ``learner.serve`` for the embedded backend; for ``sglang`` and ``vllm``,
    ``learner.engines``, which serves the step's HF export with the real engine."""
    module = "learner.serve" if backend == "embedded" else "learner.engines"
    return children.start(
        name,
        [module, "--checkpoint", str(checkpoint_root / str(step)), "--port", "0",
         *cfg_args, "--weight-version", str(step)],
        timeout=300.0 if backend == "embedded" else 1800.0,
    )  # fmt: skip


def start_sidecar(
    children: Children,
    cfg_args: list[str],
    checkpoint_root: Path,
    run_dir: Path,
    web: str,
    inference: str,
) -> str:
    return children.start(
        "sidecar",
        [
            "rollout.serve", *cfg_args, "--run-dir", str(run_dir / "sidecar"),
            "--set", "rollout.port=0", "--set", f"web.url={web}",
            "--set", f'inference.urls=["{inference}"]',
            "--set", f"checkpoint.dir={checkpoint_root}",
        ],
    )  # fmt: skip
