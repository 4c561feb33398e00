"""One GPU check: what a single accelerator measures for the learner and the embedded server.

Prepared to run as one call on a machine with JAX for CUDA, Flax, Optax and Orbax and no
network (nothing is downloaded: the models are Qwen2-shaped with random weights):

- the GRPO train step (forward, loss, backward, AdamW; no KL term, so no reference
  forward) for a ~0.5B and a ~1.5B Qwen2-shaped config (Qwen2.5-0.5B's and -1.5B's
  shapes) at 4,096 and 16,384 tokens per row (one episode of that length per row, a
  group of four per step),
  parameters in float32 and compute in bfloat16, attention ``cudnn`` against
  ``blockwise`` and remat ``full``, ``dots_no_batch`` and ``none``: tokens/s, model FLOP/s
  and MFU (against the chip's bfloat16 dense peak), compile time and XLA's peak memory;
- the dry run's estimate (``learner.training.dryrun``) against XLA's compiled peak for
  the 7B config's step on one device at 8k and 32k tokens per row (``--only dryrun``);
- ``learner.serving.engine`` (the compute behind ``learner.serve``) on the 0.5B shape in
  bfloat16: decode tokens/s at 1, 32 and 128 concurrent sequences, prefill tokens/s,
  and each shape's first call (compilation included).

The cases run in order of importance (the 1.5B config at 16k first: the goal is >= 40%
MFU there; with remat ``dots_no_batch``, the fastest that fits an H200) until
``--budget-s`` is spent; a case that would not fit the device's memory (XLA's compiled peak) or the time left is reported as skipped, with the reason. Model
FLOPs per step: 6 x parameters x tokens (the tied embedding counted once, as the output
projection) plus the causal attention's 6 x layers x T^2 x heads x head_dim per row.

``--smoke`` runs the same code on the CPU with tiny shapes (lengths 128 and 256, three
serving widths), in a few seconds, so the script is exercised by the test suite before a
GPU is at hand; the peak is then the measured bfloat16 matmul rate, and ``cudnn`` cases
are skipped (no cuDNN on the CPU).

    python bench/gpu.py [--budget-s 450] [--peak-tflops X] [--steps 3] [--smoke] [--out F]

Final line: {"bench": "gpu", "backend", "device", "peak_tflops", "peak_source",
"train": [{"model", "params", "length", "rows", "attention", "remat", "compile_s",
"peak_gib", "step_s", "tokens_per_s", "model_tflops", "mfu"} or {..., "skipped"}],
"serve": [{"model", "rows", "prompt", "new", "first_call_s", "seconds", "tokens_per_s",
"kind": "decode" | "prefill"}], "elapsed_s", "budget_s"}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from learner.model.config import ModelConfig  # noqa: E402
from learner.model.params import Model, param_info  # noqa: E402
from learner.serving.engine import Engine, Request, SamplingParams  # noqa: E402
from learner.training.batching import pack  # noqa: E402
from learner.training.sharding import make_mesh  # noqa: E402
from learner.training.step import compile_step, new_state, place_batch  # noqa: E402
from shared.config import LearnerConfig, MeshConfig  # noqa: E402
from shared.wire import Trajectory, TrajectoryGroup  # noqa: E402

# Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes (their config.json), random weights
MODELS = {
    "qwen2-0.5b": dict(
        vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_layers=24,
        num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=True,
    ),
    "qwen2-1.5b": dict(
        vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=True,
    ),
}  # fmt: skip
SMOKE_MODELS = {
    "smoke-a": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
    ),
    "smoke-b": dict(
        vocab_size=512, hidden_size=96, intermediate_size=192, num_layers=3, num_heads=4,
        num_kv_heads=2, head_dim=24, tie_word_embeddings=True,
    ),
}  # fmt: skip
SMOKE_CASES = 5  # with --smoke: two compiled (blockwise), three skipped (cudnn) on a CPU
ROWS = 4  # rows per train step: one GRPO group of four episodes, one per row

# bfloat16 dense peaks (TFLOP/s) by device kind, from the vendors' data sheets (SXM parts)
PEAKS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "B200": 2250.0, "L40S": 362.1}


def model_config(shape: dict, max_len: int, param_dtype: str) -> ModelConfig:
    return ModelConfig(
        **shape, model_type="qwen2", max_position_embeddings=max_len, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, qkv_bias=True, eos_token_ids=(1,), pad_token_id=0,
        param_dtype=param_dtype, dtype="bfloat16",
    )  # fmt: skip


def train_cases(models: dict, lengths: tuple[int, int]) -> list[tuple[str, int, str, str]]:
    """(model, length, attention, remat), most important first: the large model at the long
    length (the MFU goal), the kernels side by side, then the rest."""
    small, large = models
    short, long = lengths
    first = [
        (large, long, "cudnn", "dots_no_batch"), (large, long, "cudnn", "full"),
        (large, long, "blockwise", "full"),
        (small, short, "cudnn", "none"), (small, short, "blockwise", "none"),
        (large, short, "cudnn", "full"), (small, long, "cudnn", "full"),
    ]  # fmt: skip
    rest = [
        (m, n, a, r)
        for m in (large, small)
        for n in (long, short)
        for a in ("cudnn", "blockwise")
        for r in ("full", "dots_no_batch", "none")
    ]
    return first + [c for c in rest if c not in first]


def synthetic_group(rows: int, length: int, vocab: int) -> TrajectoryGroup:
    """One GRPO group of ``rows`` trajectories, each a whole row (``length`` predictions:
    one research episode of that length), the first quarter prompt, rewards 0 and 1
    alternating (a group with no variance would be dropped)."""
    rng = np.random.default_rng(0)
    n = length + 1  # a row holds a trajectory's predictions: its tokens less the first
    trajs = [
        Trajectory(
            "t", "g", i,
            rng.integers(3, vocab, n).astype(np.int32),
            (np.arange(n) >= n // 4).astype(np.uint8),
            -rng.random(n).astype(np.float32),
            np.zeros(n, np.int32),
            reward=float(i % 2),
        )
        for i in range(rows)
    ]  # fmt: skip
    return TrajectoryGroup("g", "t", trajs)


def compiled_peak_gib(compiled) -> float:
    ma = compiled.memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
            - ma.alias_size_in_bytes) / 2**30  # fmt: skip


def device_memory_gib(smoke: bool) -> float:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] / 2**30
    return 8.0 if smoke else float("inf")


def step_flops(cfg: ModelConfig, params: int, rows: int, length: int, tokens: float) -> float:
    attention = 6 * cfg.num_layers * length**2 * cfg.num_heads * cfg.head_dim * rows
    return 6 * params * tokens + attention


def train_case(
    name: str, shape: dict, length: int, rows: int, attention: str, remat: str,
    steps: int, peak_flops: float, smoke: bool,
) -> dict:  # fmt: skip
    row = {"model": name, "length": length, "rows": rows, "attention": attention, "remat": remat}
    if attention == "cudnn" and jax.default_backend() != "gpu":
        return {**row, "skipped": "cudnn needs an NVIDIA GPU"}
    cfg_model = model_config(shape, length + 8, "float32")
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    params = sum(int(np.prod(p.shape)) for p in param_info(model))
    row["params"] = params
    cfg = LearnerConfig(
        length_buckets=(length,), warmup_steps=0, steps=100, attention=attention, remat=remat,
        logprob_chunk=min(1024, length), param_dtype="float32", compute_dtype="bfloat16",
    )  # fmt: skip
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    packed = pack([synthetic_group(rows, length, cfg_model.vocab_size)], rows=rows,
                  buckets=(length,))  # fmt: skip
    state, shardings = new_state(model, mesh, cfg)
    batch = place_batch(packed.arrays, mesh)
    t0 = time.perf_counter()
    compiled = compile_step(model, mesh, cfg, shardings).lower(state, batch).compile()
    del model  # the state holds its own copy of the parameters
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    need = compiled_peak_gib(compiled)
    row["peak_gib"] = round(need, 2)
    if need > device_memory_gib(smoke):
        return {**row, "skipped": f"needs {need:.1f} GiB"}
    state, m = compiled(state, batch)  # the first run: allocations
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = compiled(state, batch)
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t0) / steps
    tokens = float(np.asarray(packed.arrays["attn_bt"]).sum())
    flops = step_flops(cfg_model, params, rows, length, tokens)
    return {
        **row,
        "step_s": round(dt, 4),
        "tokens_per_s": round(tokens / dt, 1),
        "model_tflops": round(flops / dt / 1e12, 3),
        "mfu": round(flops / dt / peak_flops, 4),
    }


def generate(engine: Engine, rows: int, prompt: int, new: int, vocab: int, seed: int) -> float:
    prompts = np.random.default_rng(seed).integers(3, vocab, (rows, prompt))
    reqs = [
        Request(f"r{i}", prompts[i].tolist(),
                SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=i))
        for i in range(rows)
    ]  # fmt: skip
    t0 = time.perf_counter()
    engine.generate(reqs)
    elapsed = time.perf_counter() - t0
    assert all(len(r.output_ids) == new for r in reqs), "a request stopped early"
    return elapsed


def serve_cases(name: str, shape: dict, smoke: bool) -> list[dict]:
    """Decode at several widths and one prefill, each shape called twice: the first call
    compiles, the second is timed."""
    widths = (1, 4) if smoke else (1, 32, 128)
    prompt, new = (32, 16) if smoke else (256, 256)
    prefill_rows, prefill_len = (4, 64) if smoke else (32, 2048)
    cfg_model = model_config(shape, max(prompt + new, prefill_len + 1) + 8, "bfloat16")  # as served
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    out = []
    for rows, p, n, kind in [*((w, prompt, new, "decode") for w in widths),
                             (prefill_rows, prefill_len, 1, "prefill")]:  # fmt: skip
        row = {"model": name, "kind": kind, "rows": rows, "prompt": p, "new": n}
        try:
            engine = Engine(model, eos_ids=(), max_batch=rows, max_len=p + n + 8, decode_chunk=8)
            first = generate(engine, rows, p, n, cfg_model.vocab_size, seed=1)
            seconds = generate(engine, rows, p, n, cfg_model.vocab_size, seed=2)
        except Exception as e:  # reported like a train case's failure; the others still run
            row["error"] = _error(e)
        else:
            tokens = rows * (n if kind == "decode" else p)
            row.update(first_call_s=round(first, 2), seconds=round(seconds, 4),
                       tokens_per_s=round(tokens / seconds, 1))  # fmt: skip
        out.append(row)
        emit(row)
    return out


def _error(e: Exception) -> str:
    """A failed case's report: the exception's type and the first line of its message."""
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


_LOG: list[Path] = []  # --out: every result line is appended there as it is measured


def emit(row: dict) -> None:
    """Print one result line, and append it to ``--out`` (a run cut short keeps what it had)."""
    line = json.dumps(row)
    print(line, flush=True)
    for path in _LOG:
        with path.open("a") as f:
            f.write(line + "\n")


def matmul_peak_flops(dtype=jnp.bfloat16, n: int = 1024, repeats: int = 5) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def chip_peak(args) -> tuple[float, str]:
    """The chip's bfloat16 dense peak in FLOP/s, and where the figure comes from."""
    if args.peak_tflops:
        return args.peak_tflops * 1e12, "--peak-tflops"
    kind = jax.devices()[0].device_kind
    for name, tflops in PEAKS.items():
        if name in kind:
            return tflops * 1e12, f"data sheet ({name}, bfloat16 dense)"
    return matmul_peak_flops(), f"measured bfloat16 matmul on {kind}"


DRYRUN_CONFIG = REPO / "configs" / "qwen2.5-7b-8xh100.toml"


def dryrun_case(length: int, smoke: bool) -> dict:
    """The dry run's estimate against XLA's compiled peak on this device: the 7B config's
    train step (``configs/qwen2.5-7b-8xh100.toml``) on one device at ``length`` tokens per
    row, one row per micro-batch as on its 8-device mesh (the activations per device are
    the same; the state is not sharded, so it is 8 times larger). Compiled on abstract
    shapes: nothing is allocated. ``--smoke``: the tiny model."""
    from learner.training.dryrun import budget, compiled_memory, estimate_total
    from shared.config import load

    sets = [f"learner.length_buckets=[{length}]", "mesh.num_devices=1", "mesh.fsdp=1",
            "mesh.data=1", "learner.micro_batches=32"]  # fmt: skip
    if smoke:
        sets += ["learner.model=tiny", "learner.groups_per_step=1", "learner.micro_batches=8"]
    cfg = load(DRYRUN_CONFIG, sets)
    row = {"config": DRYRUN_CONFIG.name, "length": length, "devices": 1}
    try:
        c = compiled_memory(cfg, jax.devices()[:1])
    except Exception as e:
        return {**row, "error": _error(e)}
    backend = "gpu" if jax.default_backend() == "gpu" else "cpu"
    est = estimate_total(budget(cfg, 1, backend=backend))
    return {**row, "peak_gib": round(c["peak"] / 2**30, 2), "peak_source": c["peak_source"],
            "estimate_gib": round(est / 2**30, 2), "ratio": round(est / c["peak"], 3),
            "layout": backend, "compile_s": round(c["compile_s"], 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting cases after")
    ap.add_argument("--peak-tflops", type=float, help="the chip's bf16 peak (default: by kind)")
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per case")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any backend")
    ap.add_argument("--out", type=Path, help="also append every result line to this file")
    ap.add_argument("--only", choices=("all", "dryrun"), default="all",
                    help="dryrun: only the dry run's estimate against XLA's peak")  # fmt: skip
    args = ap.parse_args(argv)
    _LOG[:] = [args.out] if args.out else []
    # XLA takes 75% of a GPU's memory by default (read when its backend starts, below): the
    # goal case with remat dots_no_batch needs 107.5 GiB of an H200's 139 (measured), so the
    # check takes 95% unless told otherwise. Set here, not on import (bench/projection.py
    # imports this module).
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    t_start = time.monotonic()
    models = SMOKE_MODELS if args.smoke else MODELS
    lengths = (128, 256) if args.smoke else (4096, 16_384)
    steps = 1 if args.smoke else args.steps
    peak, source = chip_peak(args)
    device = jax.devices()[0].device_kind
    print(f"{device} ({jax.default_backend()}): peak {peak / 1e12:.1f} TFLOP/s, {source}",
          flush=True)  # fmt: skip

    def left() -> float:
        return args.budget_s - (time.monotonic() - t_start)

    train, serve, dryrun = [], [], []
    cases = train_cases(tuple(models), lengths)
    if args.only == "dryrun":
        cases = []
    if args.smoke:  # the code paths, not the matrix: the first cases only
        cases = cases[:SMOKE_CASES]
    for i, (name, length, attention, remat) in enumerate(cases):
        if i == 4 or (args.smoke and i == len(cases) - 1):  # after the most important ones
            serve = serve_cases(next(iter(models)), next(iter(models.values())), args.smoke)
        rows = ROWS
        base = {"model": name, "length": length, "rows": rows, "attention": attention,
                "remat": remat}  # fmt: skip
        if not args.smoke and left() < 60:
            train.append({**base, "skipped": "time budget"})
            continue
        try:
            r = train_case(name, models[name], length, rows, attention, remat, steps, peak,
                           args.smoke)  # fmt: skip
        except Exception as e:  # one case's failure (out of memory, a kernel) is a result
            r = {**base, "error": _error(e)}
        train.append(r)
        emit(r)
    if not serve and args.only == "all":
        serve = serve_cases(next(iter(models)), next(iter(models.values())), args.smoke)
    for length in (128,) if args.smoke else (8192, 32_768):
        if args.only == "all" and not args.smoke and left() < 60:
            dryrun.append({"length": length, "skipped": "time budget"})
            continue
        dryrun.append(dryrun_case(length, args.smoke))
        emit(dryrun[-1])
    emit({
        "bench": "gpu", "backend": jax.default_backend(), "device": device,
        "jax": jax.__version__, "flax": flax.__version__,
        "peak_tflops": round(peak / 1e12, 2), "peak_source": source, "smoke": args.smoke,
        "train": train, "serve": serve, "dryrun": dryrun,
        "elapsed_s": round(time.monotonic() - t_start, 1), "budget_s": args.budget_s,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
