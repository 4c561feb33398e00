"""`python -m learner.engines`: a real SGLang or vLLM server as one of the run's children.

    python -m learner.engines (--checkpoint ROOT/STEP | --hf DIR) [--port 0] [--config ...]

With ``inference.backend = "sglang"`` or ``"vllm"`` and no ``inference.urls``,
``learner.train`` starts this module where it would start ``learner.serve``. It

1. finds the policy as a Hugging Face safetensors directory: ``--hf DIR``, or the
   export of an Orbax checkpoint step (``ROOT/hf/STEP``, written here from
   ``ROOT/STEP`` when the loop has not already), in ``inference.dtype``;
2. starts the engine's own server with ``inference.engine_python`` (default: the
   repository's ``.venv-sglang`` / ``.venv-vllm``, built by ``make engines``) on a
   loopback port, its output in this process's stderr (the run's ``logs/``);
3. polls its health endpoint, sets its weight version to the step, and prints
   ``serving on http://HOST:PORT``, the line ``learner.embedded.children.Children`` waits for;
4. supervises it: an engine that dies is an infrastructure error for the requests
   it had (the rollout client retries or fails them), and it is started again on the
   same port from the newest complete export under ``ROOT/hf`` (each weight push
   writes one), with that step as its weight version.

It is the engine's process-group leader: ``Children.stop`` (SIGTERM, then SIGKILL to
the group) and the parent-death watch (:mod:`shared.lifeline`) stop the engine with it.
Tokens in, tokens out: the engines start without a tokenizer
(``--skip-tokenizer-init``); the chat template and stop tokens are the learner's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shared.config import (
    InferenceConfig,
    RunConfig,
    add_config_args,
    config_from_args,
    setup_logging,
)
from shared.lifeline import group_pids, watch_parent

log = logging.getLogger("learner.engines")
REPO = Path(__file__).resolve().parents[2]
HEALTH = "/health"  # both engines answer 200 here once they serve
# The policy is a local directory: nothing is fetched, and no usage report is sent (a
# path that does not exist would otherwise be looked up on the Hugging Face hub).
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class Launch:
    """One engine start: its command line, extra environment and where it answers."""

    argv: list[str]
    env: dict[str, str]
    url: str


def engine_python(inf: InferenceConfig) -> str:
    """The interpreter with the engine installed (``make engines`` builds the default)."""
    if inf.engine_python:
        return inf.engine_python
    return str(REPO / f".venv-{inf.backend}" / "bin" / "python")


def on_gpu() -> bool:
    """Whether an NVIDIA GPU is present (the engines then run with their own defaults)."""
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def launch(
    inf: InferenceConfig, model_dir: str | Path, port: int, dtype: str, *, gpu: bool | None = None
) -> Launch:
    """The command line that serves ``model_dir`` with ``inf.backend`` on ``port``.

    On a CPU the engines need flags a GPU install never uses (a torch-native attention
    backend, no CUDA graphs, a small KV budget); they are ours, ``inf.engine_args``
    come after them and win where the engine takes the last of a repeated flag."""
    gpu = on_gpu() if gpu is None else gpu
    host, py = "127.0.0.1", engine_python(inf)
    env = dict(OFFLINE)
    if inf.backend == "sglang":
        argv = [
            py, "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--host", host, "--port", str(port), "--skip-tokenizer-init", "--dtype", dtype,
            "--context-length", str(inf.max_context_tokens),
        ]  # fmt: skip
        if not gpu:
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            argv += [
                "--device", "cpu", "--attention-backend", "torch_native",
                "--sampling-backend", "pytorch", "--disable-cuda-graph",
                "--grammar-backend", "none", "--mem-fraction-static", "0.05",
                "--max-total-tokens", str(max(4 * inf.max_context_tokens, 8192)),
            ]  # fmt: skip
    elif inf.backend == "vllm":
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /resume, /collective_rpc, weight versions
        argv = [
            py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", host, "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(inf.max_context_tokens), "--skip-tokenizer-init",
            "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
        ]  # fmt: skip
        if not gpu:
            env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
            argv += ["--enforce-eager"]
    else:
        raise ValueError(f"inference.backend = {inf.backend!r}: no engine to start")
    return Launch([*argv, *inf.engine_args], env, f"http://{host}:{port}")


def served_dtype(inf: InferenceConfig, param_dtype: str) -> str:
    """``inference.dtype``, with ``auto`` as the policy's parameter dtype."""
    return param_dtype if inf.dtype == "auto" else inf.dtype


def untied_export(backend: str) -> bool:
    """Whether the engine's exports write a tied LM head untied (the same matrix twice).
    vLLM's in-place ``reload_weights`` reloads layer by layer and finds no weight of its
    own for a tied head, so it puts the head's old tensor back ("ParallelLMHead: Failed
    to load weights"): the served head keeps the first weights. Untied, it reloads."""
    return backend == "vllm"


# ----------------------------------------------------------------------------- weights


def newest_export(root: Path) -> tuple[Path, int] | None:
    """The newest complete HF export under ``ROOT/hf`` (exports are renamed into place
    whole, so a directory named by its step with a ``config.json`` is complete)."""
    hf_root = root / "hf"
    steps = [
        int(p.name)
        for p in hf_root.iterdir()
        if p.name.isdigit() and (p / "config.json").is_file()
    ] if hf_root.is_dir() else []  # fmt: skip
    if not steps:
        return None
    step = max(steps)
    return hf_root / str(step), step


def export_step(checkpoint: Path, dtype: str, untie: bool = False) -> tuple[Path, int]:
    """``ROOT/STEP`` (Orbax) as ``ROOT/hf/STEP`` (HF safetensors), written when missing."""
    from learner.model.loading import resolve_checkpoint

    root, step = resolve_checkpoint(checkpoint)
    out = root / "hf" / str(step)
    if not (out / "config.json").is_file():
        from learner.inspect import export

        export(root / str(step), out, dtype, untie)
    return out, step


# ----------------------------------------------------------------------------- the server


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 10.0) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
        return r.status


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    """Until ``url`` answers 200; raises if the engine exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with code {proc.returncode} while starting")
        try:
            if _request(url, timeout=5) == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine did not answer {url} within {timeout:.0f} s")
        time.sleep(0.5)


def set_version(backend: str, url: str, version: str) -> None:
    """The engine's weight version (SGLang takes it at start-up; vLLM after)."""
    if backend == "vllm":
        _request(f"{url}/update_weight_version", {"new_version": version})


def kill_rest_of_group() -> int:
    """SIGKILL every other process of this process's group (the engine's leftovers: it
    is started in this group, so ``Children.stop`` reaches it); how many."""
    me = os.getpid()
    if os.getpgrp() != me:  # not the leader of a group of its own: not the engine's group
        return 0
    n = 0
    for pid in group_pids(me):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                n += 1
    return n


class Supervisor:
    """Starts the engine, and starts it again, on the newest weights, when it dies."""

    def __init__(self, cfg: RunConfig, port: int, dtype: str, root: Path | None) -> None:
        self.cfg, self.port, self.dtype, self.root = cfg, port, dtype, root
        self.proc: subprocess.Popen | None = None
        self.stopping = False
        self.restarts = 0

    def start(self, model_dir: Path, version: str) -> str:
        inf = self.cfg.inference
        spec = launch(inf, model_dir, self.port, self.dtype)
        if inf.backend == "sglang":
            spec.argv.extend(["--weight-version", version])
        log.info("starting %s: %s", inf.backend, " ".join(spec.argv))
        self.proc = subprocess.Popen(
            spec.argv, env={**os.environ, **spec.env}, stdout=sys.stderr, stderr=sys.stderr
        )
        wait_healthy(self.proc, spec.url + HEALTH, inf.engine_start_timeout_s)
        set_version(inf.backend, spec.url, version)
        return spec.url

    def watch(self, url: str) -> None:
        """Restart the engine whenever it exits, until :meth:`stop`."""
        while not self.stopping:
            assert self.proc is not None
            code = self.proc.wait()
            if self.stopping:
                return
            kill_rest_of_group()  # what the dead engine left: its scheduler, its workers
            found = newest_export(self.root) if self.root is not None else None
            if found is None:
                log.error("the engine exited (code %s) and there is no export to restart", code)
                os._exit(1)
            model_dir, step = found
            self.restarts += 1
            log.warning(
                "the engine exited (code %s): restart %d on %s (weight version %d)",
                code, self.restarts, model_dir, step,
            )  # fmt: skip
            try:
                self.start(model_dir, str(step))
            except RuntimeError as e:
                log.error("restart failed: %s", e)
                os._exit(1)
            log.info("the engine answers again at %s", url)

    def stop(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.engines", description=__doc__)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="an Orbax checkpoint step directory (ROOT/STEP)")
    src.add_argument("--hf", help="an HF safetensors directory")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free loopback port")
    parser.add_argument("--weight-version", help="the initial weight version (default: the step)")
    add_config_args(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    setup_logging(cfg)
    watch_parent()  # started by learner.train: end with it (this process leads the group)
    inf = cfg.inference
    if inf.backend == "embedded":
        parser.error("inference.backend = 'embedded': start `python -m learner.serve` instead")
    py = engine_python(inf)
    if not Path(py).exists():
        print(
            f"learner.engines: {py} does not exist: `make engines` builds the {inf.backend} "
            "environment (or set inference.engine_python)",
            file=sys.stderr,
        )
        return 2
    dtype = served_dtype(inf, cfg.learner.param_dtype)
    if args.checkpoint:
        model_dir, step = export_step(Path(args.checkpoint), dtype, untied_export(inf.backend))
        root: Path | None = model_dir.parent.parent
        version = args.weight_version or str(step)
    else:  # an export of the loop's (ROOT/hf/STEP): restarts take the newest under ROOT/hf
        model_dir = Path(args.hf).absolute()
        step_dir = model_dir.parent.name == "hf" and model_dir.name.isdigit()
        root = model_dir.parent.parent if step_dir else None
        version = args.weight_version or (model_dir.name if step_dir else "0")
    sup = Supervisor(cfg, args.port or free_port(), dtype, root)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = sup.start(model_dir, version)
    except RuntimeError as e:
        sup.stop()
        print(f"learner.engines: {inf.backend}: {e}", file=sys.stderr)
        return 1
    print(f"serving on {url}", flush=True)
    threading.Thread(target=sup.watch, args=(url,), daemon=True).start()
    stop.wait()
    sup.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
