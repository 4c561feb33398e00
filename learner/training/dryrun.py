"""`learner.train --dry-run [--compile] [--max-length]`: the per-device memory of a run.

Without devices, an estimate. The state's shapes come from ``jax.eval_shape``
(nothing is allocated); each array's per-device size follows from its partition
spec under the mesh rules on a mesh of ``mesh.num_devices`` (default: the devices
present). Parameters (``param_dtype``), their gradients (twice with
``learner.micro_batches`` > 1: the micro-batch's and the running sum), Adam's two
moments and the KL reference are exact. The rest models the step as written, for
the ``b`` rows of one micro-batch on one device, ``T`` tokens, ``L`` layers of
hidden size ``E``, MLP width ``M``, ``H`` query and ``K`` KV heads of size ``D``,
vocabulary ``V``, ``c`` bytes per compute-dtype value, with head, MLP and
vocabulary dimensions divided by the tensor axis. Two parts:

``activations``: what the layers save for the backward pass, live from the
first block's forward to its backward.

- One decoder block's activations per token: the per-layer count of Korthikanti
  et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
  sec. 4.1: ``sbh(34 + 5as/h)`` bytes for GPT with 2-byte values) redone for this
  block (pre-norm RMSNorm, grouped-query attention, SwiGLU, no dropout):
  ``c (4E + (H + 2K) D + H D + 4M)`` (the block input and the attention residual,
  both norms' outputs, q / k / v, the attention output, gate, up, silu(gate) and
  their product); with dense attention (``learner.attention = dense``, or
  ``auto`` at or below 64 tokens but for unpacked rows on a GPU,
  which take cuDNN: ``learner.model.attention.resolve``) plus the float32
  probabilities and their compute-dtype copy, ``H T (4 + c)`` (their ``5as/h``);
  blockwise or cuDNN attention (Dao et al. 2022, FlashAttention) keeps only the
  output, counted above, and the float32 log-sum-exp, ``4H``.
- ``learner.remat``: ``none`` saves all of it in every layer; ``full`` saves the
  block's input, ``c E`` per token and layer (Korthikanti's full recomputation,
  ``2sbh``); ``dots_no_batch`` saves the matmul outputs without a batch
  dimension and the input, ``c (3E + (H + 2K) D + 2M)``.

``working``: the larger of the two phases that run while those are held.

- A block's backward pass: its activations (and, under remat, their
  recomputation: twice that), the attention's scratch (a (b, T, T) boolean mask
  dense and cuDNN, one float32 (b, H, block, block) score tile blockwise), and its weights
  all-gathered for FSDP in float32 and the compute dtype, ``(4 + c)`` x the
  block's parameters.
- The token logprobs: the unembedding's (E, V) weight gathered in float32 and
  the compute dtype and its float32 gradient before the reduce-scatter,
  ``(8 + c) E V``, and two float32 (b, chunk, V) logit blocks, chunk =
  ``learner.logprob_chunk`` evened out as ``learner.model.logprobs`` does (T when it
  is 0 or at least T).

The printed estimate is an accelerator's. XLA:CPU runs 16-bit matmuls in float32
and keeps the float32 results of the values it saves as well (remat none / full:
(c + 4) / c times the bytes; the dense attention's probabilities, saved without remat,
8 / (4 + c)) or instead (dots_no_batch: 4 / c); ``--compile`` on
CPU devices compares XLA's figures with the estimate laid out that way.
Calibrated on the Qwen2.5-7B and 14B shapes, fsdp over 8 simulated devices, one
row per device, 1k to 32k tokens, every remat policy, dense and blockwise
attention, chunked and whole logprobs: within 0.91-1.11 of the compiled peak
(the step keeps the residual stream batch-sharded, FSDP's layout:
``learner.model.decoder.rows_sharded``); the tiny model with dense attention and no
remat at 1k tokens: 0.92.

``--compile`` asks the compiler: the real train step (``learner.training.step.compile_step``)
lowered on abstract, sharded shapes for the configured mesh (simulated CPU
devices when fewer are present: ``jax_num_cpu_devices``, set by
``learner.train`` before the backend starts, or a re-run of the command with
``XLA_FLAGS=--xla_force_host_platform_device_count``) and compiled;
With ``mesh.num_processes`` > 1 the step is compiled as a multi-node run compiles it:
joined by ``jax.distributed`` (``learner.training.distributed``: the config's coordinator,
the environment's or SLURM's), or, with none, as that many processes started here on
loopback, each with its share of ``mesh.num_devices`` simulated devices (gloo collectives);
process 0 prints the report.
``memory_analysis()`` gives XLA's per-device argument, output, temporary and
aliased bytes, and then the compiled peak decides whether the run fits.
``--max-length`` searches the longest row (a multiple of ``LENGTH_STEP``, up to
the model's ``max_position_embeddings``) whose figure, the compiled one with
``--compile``, fits ``mesh.device_memory_gib``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model.attention import DENSE_UP_TO, block_for
from learner.model.config import ModelConfig, tiny_config
from learner.model.params import Model, param_info
from learner.training.sharding import MESH_AXES, spec_for
from learner.training.step import optimizer
from shared.config import RunConfig

GIB = 1024**3
LENGTH_STEP = 1024  # --max-length tries multiples of this
CHILD_ENV = "LEARNER_DRYRUN_CHILD"  # set in a re-run with simulated devices (no second re-run)
# Architectures the dry run knows by name, for planning a run on a machine without the weights
# (the figures of each model's Hugging Face config.json).
PRESETS = {
    "qwen2.5-7b": dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, model_type="qwen2",
        max_position_embeddings=32768, rope_theta=1_000_000.0, qkv_bias=True,
        tie_word_embeddings=False, eos_token_ids=(151645, 151643), pad_token_id=151643,
    ),
    "qwen2.5-14b": dict(
        vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
        num_heads=40, num_kv_heads=8, head_dim=128, model_type="qwen2",
        max_position_embeddings=32768, rope_theta=1_000_000.0, qkv_bias=True,
        tie_word_embeddings=False, eos_token_ids=(151645, 151643), pad_token_id=151643,
    ),
    "qwen2.5-32b": dict(
        vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_layers=64,
        num_heads=40, num_kv_heads=8, head_dim=128, model_type="qwen2",
        max_position_embeddings=32768, rope_theta=1_000_000.0, qkv_bias=True,
        tie_word_embeddings=False, eos_token_ids=(151645, 151643), pad_token_id=151643,
    ),
    "qwen3-8b": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, model_type="qwen3",
        max_position_embeddings=40960, rope_theta=1_000_000.0, qkv_bias=False, qk_norm=True,
        tie_word_embeddings=False, eos_token_ids=(151645,), pad_token_id=151643,
        bos_token_id=151643,
    ),
}  # fmt: skip


def model_config(cfg: RunConfig) -> ModelConfig:
    lc = cfg.learner
    dtypes = {"param_dtype": lc.param_dtype, "dtype": lc.compute_dtype}
    if lc.model == "tiny":
        return tiny_config(**dtypes)
    if (Path(lc.model) / "config.json").is_file():
        from learner.model.hf import load_config

        return load_config(lc.model, **dtypes)
    for name, arch in sorted(PRESETS.items(), key=lambda kv: -len(kv[0])):  # longest name first
        if name in Path(lc.model).name.lower():
            return ModelConfig(**arch, **dtypes)
    raise SystemExit(f"learner.model = {lc.model!r}: no config.json there and no known preset")


def mesh_shape(cfg: RunConfig, n: int | None = None) -> dict[str, int]:
    n = n or cfg.mesh.num_devices or jax.device_count()
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise SystemExit(f"mesh {sizes} does not cover {n} devices")
    return dict(zip(MESH_AXES, sizes, strict=True))


def step_rows(cfg: RunConfig, shape: dict[str, int]) -> int:
    """Rows of one step's batch, as ``learner.training.loop`` sizes it: groups x samples rounded up
    to a multiple of micro-batches x the data x fsdp ways."""
    rows = cfg.learner.groups_per_step * cfg.rollout.group_size
    multiple = shape["data"] * shape["fsdp"] * cfg.learner.micro_batches
    return -(-rows // multiple) * multiple


def with_length(cfg: RunConfig, length: int) -> RunConfig:
    """``cfg`` with one length bucket of ``length`` tokens."""
    return dataclasses.replace(
        cfg, learner=dataclasses.replace(cfg.learner, length_buckets=(int(length),))
    )


def abstract_model(mc: ModelConfig) -> Model:
    """The model with abstract parameters; other variables (rotary tables...) concrete, as
    the step reads them while tracing: computed by a jitted init whose parameters XLA drops."""
    model = nnx.eval_shape(lambda: Model(mc, rngs=nnx.Rngs(0)))
    if not jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))):
        return model
    rest = jax.jit(lambda: nnx.state(Model(mc, rngs=nnx.Rngs(0)), nnx.Not(nnx.Param)))()
    nnx.update(model, rest)
    return model


# ----------------------------------------------------------------------------- the estimate


def _saved_copies(cfg: RunConfig, c: int, backend: str) -> float:
    """How many compute-dtype bytes' worth XLA keeps per saved 16-bit value: 1 on an
    accelerator; XLA:CPU runs 16-bit matmuls in float32 and keeps the float32 results
    too (remat ``none`` / ``full``: both copies, (c + 4) / c) or instead (the matmul
    outputs of ``dots_no_batch``: 4 / c)."""
    if backend != "cpu" or c >= 4:
        return 1.0
    return 4 / c if cfg.learner.remat == "dots_no_batch" else (c + 4) / c


def _activations(
    cfg: RunConfig, mc: ModelConfig, b: int, t: int, tp: int, layer_params: float, backend: str
) -> dict[str, float]:
    """Bytes per device, for ``b`` rows of ``t`` tokens: what the layers save for the
    backward pass, and the larger of the two phases that run beside it (docstring)."""
    lc = cfg.learner
    c = jnp.dtype(mc.dtype).itemsize
    e, m, v, n_layers = mc.hidden_size, mc.intermediate_size / tp, mc.vocab_size / tp, mc.num_layers
    h, k, d = mc.num_heads / tp, mc.num_kv_heads / tp, mc.head_dim
    cudnn = lc.attention == "cudnn" or (
        lc.attention == "auto" and backend == "gpu" and not lc.packing
    )  # learner.model.attention.resolve's choice
    dense = lc.attention == "dense" or (lc.attention == "auto" and not cudnn and t <= DENSE_UP_TO)
    lin = c * (4 * e + (h + 2 * k) * d + h * d + 4 * m) * b * t  # one block's activations
    if dense:
        probs = (4 + c) * h * t * t * b  # float32 probabilities and their 16-bit copy
        scratch = t * t * b  # the boolean mask
    else:
        probs = 4 * h * b * t  # the log-sum-exp
        scratch = 4 * h * b * min(block_for(t, lc.attention_block), t) ** 2  # one score tile
        if cudnn:
            scratch = t * t * b  # the segment mask, (b, 1, T, T) booleans
    block = lin + probs
    per_layer = {
        "none": lin,
        "full": c * e * b * t,
        "dots_no_batch": c * (3 * e + (h + 2 * k) * d + 2 * m) * b * t,
    }[lc.remat]
    # the probabilities are saved without remat only; XLA:CPU keeps their 16-bit copy in
    # float32 as well (8 bytes a value where an accelerator keeps 4 + c)
    kept_probs = probs if lc.remat == "none" else 0.0
    if dense and backend == "cpu" and c < 4:
        kept_probs *= 8 / (4 + c)
    saved = n_layers * (per_layer * _saved_copies(cfg, c, backend) + kept_probs)
    # one block's backward: its activations (recomputed under remat) and their gradients,
    # with its weights gathered (float32 and the compute dtype)
    blocks = (1 if lc.remat == "none" else 2) * block + scratch + (4 + c) * layer_params / tp
    chunk = t  # learner.model.logprobs: ceil(T / chunk) equal chunks
    if 0 < lc.logprob_chunk < t:
        chunk = -(-t // -(-t // lc.logprob_chunk))
    # the unembedding: (E, V) gathered in float32 and the compute dtype, its float32
    # gradient before the reduce-scatter, and two float32 (b, chunk, V) logit blocks
    unembed = (8 + c) * e * v + 2 * 4 * b * chunk * v
    return {"activations": saved, "working": max(blocks, unembed),
            "_blocks": blocks, "_unembed": unembed}  # fmt: skip


def budget(cfg: RunConfig, n_devices: int | None = None, backend: str = "gpu") -> dict[str, float]:
    """Per-device bytes of params, gradients, optimiser state, reference and activations,
    as ``backend`` (``gpu``: an accelerator; ``cpu``: XLA:CPU) would lay the step out."""
    mc = model_config(cfg)
    model = nnx.eval_shape(lambda: Model(mc, rngs=nnx.Rngs(0)))
    mesh = SimpleNamespace(shape=mesh_shape(cfg, n_devices))  # spec_for only reads the sizes
    infos = {p.path: p for p in param_info(model)}

    def per_device(path: str | None, shape, dtype) -> float:
        size = float(np.prod(shape)) * jnp.dtype(dtype).itemsize
        if path in infos and tuple(shape) == infos[path].shape:
            spec = spec_for(infos[path].axes, shape, mesh)
            for axis in spec:
                for name in (axis,) if isinstance(axis, str) else axis or ():
                    size /= mesh.shape[name]
        return size

    abstract = {k: jax.ShapeDtypeStruct(p.shape, jnp.dtype(p.dtype)) for k, p in infos.items()}
    params = sum(per_device(k, a.shape, a.dtype) for k, a in abstract.items())
    opt = jax.eval_shape(optimizer(cfg.learner).init, abstract)
    opt_bytes = 0.0
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt)[0]:
        key = getattr(path[-1], "key", None)
        opt_bytes += per_device(key if isinstance(key, str) else None, leaf.shape, leaf.dtype)
    micro = cfg.learner.micro_batches
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    b = step_rows(cfg, mesh.shape) // (ways * micro)  # rows per device in one micro-batch
    t = max(cfg.learner.length_buckets)
    in_layers = sum(float(np.prod(p.shape)) for k, p in infos.items() if k.startswith("layers."))
    acts = _activations(cfg, mc, b, t, mesh.shape["tensor"], in_layers / mc.num_layers, backend)
    return {
        "params": params,
        "grads": params * (2 if micro > 1 else 1),  # + the accumulator
        "optimizer": opt_bytes,
        "reference": params if cfg.learner.kl_coef > 0 else 0.0,
        **acts,
        "_params_total": float(sum(np.prod(p.shape) for p in infos.values())),
        "_rows_per_device": float(b),
        "_length": float(t),
    }


def estimate_total(parts: dict[str, float]) -> float:
    return sum(v for k, v in parts.items() if not k.startswith("_"))


# ----------------------------------------------------------------------------- the compiler


def devices_for(n: int) -> list[jax.Device] | None:
    """``n`` devices of the default backend, else ``n`` CPU devices, else None (too few
    exist in this process: re-run it with simulated ones). ``n`` = 0: all devices."""
    present = jax.devices()
    if not n:
        return present
    if len(present) >= n:
        return present[:n]
    cpu = jax.devices("cpu")
    return cpu[:n] if len(cpu) >= n else None


def rerun_with_devices(n: int, argv: list[str]) -> int:
    """``python -m learner.train *argv`` in a child with ``n`` simulated CPU devices; its
    output is relayed line by line and its exit status returned."""
    if os.environ.get(CHILD_ENV):
        raise SystemExit(f"dry run: {n} devices asked for, {len(jax.devices('cpu'))} simulated")
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    env = {
        **os.environ,
        "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={n}"]),
        "JAX_PLATFORMS": "cpu",
        CHILD_ENV: "1",
    }
    print(f"dry run: {n} devices asked for, {jax.device_count()} here; re-running with "
          f"{n} simulated CPU devices", flush=True)  # fmt: skip
    return relay([sys.executable, "-m", "learner.train", *argv], env)


def rerun_as_processes(cfg: RunConfig, argv: list[str]) -> int:
    """``python -m learner.train *argv`` as ``mesh.num_processes`` processes on this machine,
    joined by ``jax.distributed`` through a coordinator on loopback, each with its share
    of ``mesh.num_devices`` simulated CPU devices (cross-process collectives: gloo): the
    multi-node step compiled as each node compiles it. Process 0's output is relayed;
    the others' goes to stderr. The exit status is the worst of theirs."""
    m = cfg.mesh
    if os.environ.get(CHILD_ENV):
        raise SystemExit(f"dry run: {m.num_processes} processes asked for, none joined")
    if not m.num_devices or m.num_devices % m.num_processes:
        raise SystemExit(f"dry run: mesh.num_devices ({m.num_devices}) must be a multiple "
                         f"of mesh.num_processes ({m.num_processes})")  # fmt: skip
    per = m.num_devices // m.num_processes
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    env = {
        **os.environ,
        "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={per}"]),
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{_free_port()}",
        "JAX_NUM_PROCESSES": str(m.num_processes),
        CHILD_ENV: "1",
    }
    print(f"dry run: {m.num_processes} processes of {per} simulated CPU devices each, "
          f"joined on {env['JAX_COORDINATOR_ADDRESS']}", flush=True)  # fmt: skip
    cmd = [sys.executable, "-m", "learner.train", *argv]
    others = [
        subprocess.Popen(cmd, env={**env, "JAX_PROCESS_ID": str(i)}, stdout=sys.stderr)
        for i in range(1, m.num_processes)
    ]
    try:
        rc = relay(cmd, {**env, "JAX_PROCESS_ID": "0"})
        codes = [rc, *(p.wait() for p in others)]
    finally:
        for p in others:
            if p.poll() is None:
                p.kill()
                p.wait()
    return max(codes, key=abs)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd``, print its stdout line by line, return its exit status. A stop of this
    process (SIGTERM's SystemExit, Ctrl-C) kills the child first: leaving the ``with``
    waits for it, which would otherwise sit out its whole compile."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as child:
        try:
            for line in child.stdout:
                print(line, end="", flush=True)
        except BaseException:
            child.kill()
            raise
    return child.returncode


def _fake_groups() -> list:
    """Two trajectories of one group with different rewards (kept by GRPO's filter)."""
    from shared.wire import Trajectory, TrajectoryGroup

    def traj(i: int, n: int) -> Trajectory:
        return Trajectory(
            task_id="t", group_id="g", sample_index=i, tokens=np.arange(1, n + 1, dtype=np.int32),
            loss_mask=np.ones(n, np.uint8), logprobs=np.zeros(n, np.float32),
            versions=np.zeros(n, np.int32), reward=float(i),
        )  # fmt: skip

    return [TrajectoryGroup("g", "t", [traj(0, 5), traj(1, 4)])]


def abstract_batch(cfg: RunConfig, rows: int, length: int, sharding: Any) -> dict[str, Any]:
    """The step's batch as sharded shapes: the keys and dtypes of a real
    ``learner.training.batching.pack`` of a tiny group (packed when ``learner.packing`` is on),
    its (r, t) arrays stretched to (rows, length) and its (r,) ones to (rows,)."""
    from learner.training.batching import pack

    r, t = 3, 8  # distinct sizes: each dimension's role follows from its size
    extra = {}
    if "packing" in inspect.signature(pack).parameters:
        extra["packing"] = cfg.learner.packing
    arrays = pack(_fake_groups(), rows=r, buckets=[t], **extra).arrays
    size = {r: rows, t: length}
    return {
        k: jax.ShapeDtypeStruct(tuple(size[n] for n in a.shape), a.dtype, sharding=sharding)
        for k, a in arrays.items()
    }


def compiled_memory(cfg: RunConfig, devices: list[jax.Device]) -> dict[str, Any]:
    """XLA's per-device bytes of the real train step, compiled on abstract shapes."""
    from learner.training.sharding import make_mesh
    from learner.training.step import abstract_state, batch_sharding, compile_step, state_shardings

    t0 = time.perf_counter()
    model = abstract_model(model_config(cfg))
    mesh = make_mesh(cfg.mesh, devices)
    state = abstract_state(model, cfg.learner)
    state_sh = state_shardings(model, mesh, cfg.learner, state)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, state_sh
    )
    rows = step_rows(cfg, dict(mesh.shape))
    batch = abstract_batch(cfg, rows, max(cfg.learner.length_buckets), batch_sharding(mesh))
    step = compile_step(model, mesh, cfg.learner, state_sh)
    mem = step.lower(state, batch).compile().memory_analysis()
    out = {
        k: float(getattr(mem, f"{k}_size_in_bytes"))
        for k in ("argument", "output", "temp", "alias")
    }
    summed = out["argument"] + out["output"] + out["temp"] - out["alias"]
    xla_peak = float(getattr(mem, "peak_memory_in_bytes", 0) or 0)
    # CPU's peak_memory_in_bytes can be below its own temp buffer: then it is not the peak
    if xla_peak >= max(out["temp"], summed * 0.5):
        out["peak"], out["peak_source"] = xla_peak, "peak_memory_in_bytes"
    else:
        out["peak"], out["peak_source"] = summed, "argument + output + temp - alias"
    out["compile_s"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- reports


def _compiled_report(c: dict[str, Any]) -> dict[str, Any]:
    r = {f"{k}_gib": round(c[k] / GIB, 3) for k in ("argument", "output", "temp", "alias", "peak")}
    return {**r, "peak_source": c["peak_source"], "compile_s": round(c["compile_s"], 1)}


def _print_estimate(cfg: RunConfig, parts: dict[str, float], shape: dict[str, int]) -> None:
    lc = cfg.learner
    print(
        f"model {lc.model}: {parts['_params_total'] / 1e6:,.1f} M parameters; mesh "
        f"{shape}; {int(parts['_rows_per_device'])} rows x {int(parts['_length'])} tokens "
        f"per device{' per micro-batch' if lc.micro_batches > 1 else ''}; remat {lc.remat}, "
        f"attention {lc.attention}, logprob_chunk {lc.logprob_chunk}"
    )
    for name, v in parts.items():
        if not name.startswith("_"):
            print(f"  {name:<12} {v / GIB:8.2f} GiB per device")
    print(f"    (working: a block's backward {parts['_blocks'] / GIB:.2f}, "
          f"the unembedding {parts['_unembed'] / GIB:.2f})")  # fmt: skip
    limit = cfg.mesh.device_memory_gib
    print(f"  {'total':<12} {estimate_total(parts) / GIB:8.2f} GiB per device "
          f"(estimate; device: {limit:.0f} GiB)")  # fmt: skip


def _backend(devices: list[jax.Device]) -> str:
    return "cpu" if devices[0].platform == "cpu" else "gpu"


def _print_compiled(c: dict[str, Any], estimate: float, backend: str) -> None:
    print(f"compiled in {c['compile_s']:.1f} s; XLA per device: argument "
          f"{c['argument'] / GIB:.2f} GiB, output {c['output'] / GIB:.2f}, temp "
          f"{c['temp'] / GIB:.2f}, alias {c['alias'] / GIB:.2f}; peak {c['peak'] / GIB:.2f} GiB "
          f"({c['peak_source']})")  # fmt: skip
    print(f"estimate as XLA:{backend.upper()} lays the step out: {estimate / GIB:.2f} GiB "
          f"= {estimate / c['peak']:.2f} x the compiled peak")  # fmt: skip


def max_length(cfg: RunConfig, figure, top: int) -> tuple[int, dict[int, float]]:
    """The longest multiple of ``LENGTH_STEP`` up to ``top`` whose ``figure(cfg)`` (bytes)
    fits the device (0 if none does), by bisection: memory grows with the length."""
    limit = cfg.mesh.device_memory_gib * GIB
    probes: dict[int, float] = {}

    def fits(n: int) -> bool:
        length = n * LENGTH_STEP
        probes[length] = figure(with_length(cfg, length))
        print(f"  {length:>7} tokens: {probes[length] / GIB:8.2f} GiB", flush=True)
        return probes[length] <= limit

    lo, hi = 0, top // LENGTH_STEP  # fits(lo) (0: trivially), the answer is <= hi
    if fits(hi):
        return hi * LENGTH_STEP, probes
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo * LENGTH_STEP, probes


def main(
    cfg: RunConfig, *, compile: bool = False, longest: bool = False, argv: list[str] | None = None
) -> int:
    devices = None
    if compile:
        if cfg.mesh.num_processes > 1:
            from learner.training.distributed import initialize

            if not initialize(cfg.mesh):  # no coordinator anywhere: simulate the processes
                return rerun_as_processes(cfg, list(argv or sys.argv[1:]))
        devices = devices_for(cfg.mesh.num_devices)
        if devices is None:
            return rerun_with_devices(cfg.mesh.num_devices, list(argv or sys.argv[1:]))
    n = len(devices) if devices else None
    if longest:
        return _main_max_length(cfg, devices, n)
    limit = cfg.mesh.device_memory_gib
    parts = budget(cfg, n)
    total = estimate_total(parts)
    _print_estimate(cfg, parts, mesh_shape(cfg, n))
    report: dict[str, Any] = {k: round(v / GIB, 3) for k, v in parts.items() if k[0] != "_"}
    report |= {"total_gib": round(total / GIB, 3), "device_memory_gib": limit,
               "fits": total <= limit * GIB}  # fmt: skip
    fits = report["fits"]
    if compile:
        c = compiled_memory(cfg, devices)
        backend = _backend(devices)
        like = total if backend == "gpu" else estimate_total(budget(cfg, n, backend))
        _print_compiled(c, like, backend)
        report["processes"] = jax.process_count()
        report["compiled"] = _compiled_report(c) | {
            "estimate_gib": round(like / GIB, 3),  # the estimate as this backend lays it out
            "fits": c["peak"] <= limit * GIB,
        }
        fits = report["compiled"]["fits"]  # the compiler's figure decides
    if not fits:
        print("does not fit: lower the batch or the length, add devices, or turn on remat")
    print(json.dumps({"dry_run": report}))
    return 0 if fits else 1


def _main_max_length(cfg: RunConfig, devices: list[jax.Device] | None, n: int | None) -> int:
    limit = cfg.mesh.device_memory_gib
    top = model_config(cfg).max_position_embeddings
    by = "compiled" if devices else "estimate"
    print(f"longest row that fits {limit:.0f} GiB per device, by the {by} figure:")
    if devices:
        length, probes = max_length(cfg, lambda c: compiled_memory(c, devices)["peak"], top)
    else:
        length, probes = max_length(cfg, lambda c: estimate_total(budget(c, n)), top)
    print(f"longest row: {length} tokens ({by}; up to max_position_embeddings {top})")
    report = {"length": length, "by": by, "device_memory_gib": limit,
              "probes_gib": {str(k): round(v / GIB, 3) for k, v in probes.items()}}  # fmt: skip
    print(json.dumps({"max_length": report}))
    return 0 if length else 1
