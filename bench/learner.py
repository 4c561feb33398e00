"""Learner throughput: GRPO train steps per second on CPU, against the matmul peak.

For each model config (the tiny default, and a ~50M-parameter one), one jitted
GRPO train step (forward, loss, backward, AdamW) runs on a packed batch of
synthetic groups; tokens per second are timed after compilation, and achieved
GFLOP/s = 6 x parameters x tokens / time (forward + backward, attention left
out). The matmul peak is a jitted 2048 x 2048 f32 matmul timed in the same run.

The long-context rows run the ~50M config on one group of 2 trajectories of
4,096 tokens (``--long-length``), blockwise vs dense attention and remat on
(``full``) vs off, with logprobs chunked by 512. Their FLOPs add the causal
attention's matmuls (6 x T^2 x heads x head_dim per layer and row: QK^T and PV,
forward and backward, over the causal half). Each variant is compiled first and
XLA's memory analysis read; one whose peak exceeds ``--max-gib`` is reported as
not run (``"skipped": "needs N GiB"``) rather than run out of memory.

With a KL term the reference model's forward pass runs either inside the step or as a
program of its own before it (``learner.reference_forward``): both are timed for each
model config, alternated on the same batch. A third place, ``on_arrival``, runs that
program on each group as it comes, while the learner waits for the rest: the
``arrival`` rows time what each of the three leaves between the last group's arrival
and the end of the step (packing, placing, the reference's part, the step), with the
groups arriving one by one and the learner idle between them, and the on-arrival
learner's compute in all (every chunk, then the step).

    python bench/learner.py [--steps 5] [--long-steps 2] [--long-length 4096] [--no-long]

Final line: {"bench": "learner", "configs": [{"name", "params", "tokens_per_s",
"achieved_gflops", "matmul_peak_gflops", "fraction_of_peak"}], "reference": [{"name",
"inside_tokens_per_s", "separate_tokens_per_s", "separate_over_inside"}], "arrival":
[{"name", "after_last_group_s": {"in_step", "separate", "on_arrival"}, "on_arrival_total_s",
"on_arrival_over_in_step", "on_arrival_over_separate"}], "long": [{"name",
"attention", "remat", "length", "tokens_per_s", "fraction_of_peak", "peak_gib",
"compile_s"}]}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from learner.model.config import tiny_config  # noqa: E402
from learner.model.params import Model, param_info  # noqa: E402
from learner.training.batching import pack  # noqa: E402
from learner.training.reference import ArrivalReference  # noqa: E402
from learner.training.sharding import make_mesh  # noqa: E402
from learner.training.step import (  # noqa: E402
    compile_reference,
    compile_step,
    new_state,
    place_batch,
)
from shared.config import LearnerConfig, MeshConfig  # noqa: E402
from shared.wire import Trajectory, TrajectoryGroup  # noqa: E402

CONFIGS = {
    "tiny": {},
    "50m": {
        "hidden_size": 640,
        "intermediate_size": 1728,
        "num_layers": 10,
        "num_heads": 10,
        "num_kv_heads": 5,
        "head_dim": 64,
    },
}


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def groups(n: int, g: int, length: int, vocab: int) -> list[TrajectoryGroup]:
    rng = np.random.default_rng(1)
    out = []
    for k in range(n):
        trajs = [
            Trajectory(
                f"t{k}",
                f"g{k}",
                i,
                rng.integers(3, vocab, length).astype(np.int32),
                (np.arange(length) >= length // 4).astype(np.uint8),
                -rng.random(length).astype(np.float32),
                np.zeros(length, np.int32),
                reward=float((i + k) % 2),
            )
            for i in range(g)
        ]
        out.append(TrajectoryGroup(f"g{k}", f"t{k}", trajs))
    return out


def compiled_peak_gib(compiled) -> float:
    """XLA's peak for a compiled step: argument + output + temp - alias, in GiB."""
    ma = compiled.memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
            - ma.alias_size_in_bytes) / 2**30  # fmt: skip


def seconds_per_step(step, state, batch, steps: int) -> tuple[float, dict]:
    """Mean wall time of ``steps`` steps after a first, untimed one (compilation, allocations),
    and the last step's metrics."""
    state, m = step(state, batch)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, batch)
    jax.block_until_ready(m)
    return (time.perf_counter() - t0) / steps, m


def short_batch(mesh, vocab: int) -> tuple[dict, float]:
    """The short rows' batch, placed on ``mesh``: 4 groups of 4 trajectories packed into
    16 rows of 256 tokens; (batch, its tokens)."""
    packed = pack(groups(4, 4, 256, vocab), rows=16, buckets=(256,))
    return place_batch(packed.arrays, mesh), float(np.asarray(packed.arrays["attn_bt"]).sum())


def measure(name: str, overrides: dict, steps: int, peak: float) -> dict:
    cfg_model = tiny_config(**overrides)
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    n_params = sum(int(np.prod(p.shape)) for p in param_info(model))
    cfg = LearnerConfig(length_buckets=(256,), warmup_steps=0, steps=100)
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    state, shardings = new_state(model, mesh, cfg)
    step = compile_step(model, mesh, cfg, shardings)
    batch, tokens = short_batch(mesh, cfg_model.vocab_size)
    dt, _ = seconds_per_step(step, state, batch, steps)
    gflops = 6 * n_params * tokens / dt / 1e9
    return {
        "name": name,
        "params": n_params,
        "tokens_per_s": round(tokens / dt, 1),
        "achieved_gflops": round(gflops, 2),
        "matmul_peak_gflops": round(peak, 2),
        "fraction_of_peak": round(gflops / peak, 3),
    }


def with_kl(overrides: dict) -> tuple:
    """A model config with a KL term (``kl_coef`` 0.1) on one device: (model config, mesh,
    state, the compiled step, the compiled reference program)."""
    cfg_model = tiny_config(**overrides)
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    cfg = LearnerConfig(length_buckets=(256,), warmup_steps=0, steps=100, kl_coef=0.1)
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    state, shardings = new_state(model, mesh, cfg)
    step = compile_step(model, mesh, cfg, shardings)
    return cfg_model, mesh, state, step, compile_reference(model, mesh, cfg, shardings)


def measure_reference(name: str, overrides: dict, steps: int) -> dict:
    """With a KL term (``kl_coef`` 0.1): the step running the reference's forward pass
    itself against the reference run as a program of its own and the step given its
    logprobs (``learner.reference_forward``), on the same batch, alternated."""
    cfg_model, mesh, state, step, ref = with_kl(overrides)
    batch, tokens = short_batch(mesh, cfg_model.vocab_size)

    def separate(state, batch):
        return step(state, {**batch, "ref_logp_bt": ref(state.ref_params, batch)})

    times: dict[str, list[float]] = {"inside": [], "separate": []}
    for fn in (step, separate):  # compiled and run once each, untimed
        state, m = fn(state, batch)
        jax.block_until_ready(m)
    for _ in range(steps):
        for key, fn in (("inside", step), ("separate", separate)):
            t0 = time.perf_counter()
            state, m = fn(state, batch)
            jax.block_until_ready(m)
            times[key].append(time.perf_counter() - t0)
    inside, apart = float(np.median(times["inside"])), float(np.median(times["separate"]))
    return {
        "name": name,
        "inside_tokens_per_s": round(tokens / inside, 1),
        "separate_tokens_per_s": round(tokens / apart, 1),
        "separate_over_inside": round(inside / apart, 3),
    }


def measure_arrival(name: str, overrides: dict, steps: int) -> dict:
    """With a KL term (``kl_coef`` 0.1), 4 groups of 4 trajectories of 256 tokens arriving
    one by one: the seconds from the last group's arrival to the end of the step for each
    ``learner.reference_forward`` (packing and placing included; on arrival, the first
    three groups' chunks have run while the learner waited, the last one's has not), and
    the on-arrival learner's compute in all. Medians over ``steps`` rounds, the three
    alternated."""
    cfg_model, mesh, state, step, ref = with_kl(overrides)
    arrival = ArrivalReference(ref, mesh, chunk_rows=4, buckets=(256,))
    data = groups(4, 4, 256, cfg_model.vocab_size)

    def packed(refs=None):
        return place_batch(pack(data, rows=16, buckets=(256,), ref_logprobs=refs).arrays, mesh)

    def in_step(state):
        return step(state, packed())

    def separate(state):
        batch = packed()
        return step(state, {**batch, "ref_logp_bt": ref(state.ref_params, batch)})

    def on_arrival(state):
        arrival.add(data[-1:], state.ref_params)
        return step(state, packed(arrival.finish(state.ref_params)))

    def waited(state):  # the groups before the last, each run while the learner waited
        for g in data[:-1]:
            arrival.add([g], state.ref_params)
            jax.block_until_ready([r for _, _, r in arrival.running])

    times: dict[str, list[float]] = {"in_step": [], "separate": [], "on_arrival": []}
    totals = []
    for round_ in range(steps + 1):  # the first round compiles and is not counted
        for key, fn in (("in_step", in_step), ("separate", separate), ("on_arrival", on_arrival)):
            t_all = time.perf_counter()
            if key == "on_arrival":
                waited(state)
            t0 = time.perf_counter()
            state, m = fn(state)
            jax.block_until_ready(m)
            t1 = time.perf_counter()
            if round_:
                times[key].append(t1 - t0)
                if key == "on_arrival":
                    totals.append(t1 - t_all)
    after = {k: round(float(np.median(v)), 4) for k, v in times.items()}
    return {
        "name": name,
        "after_last_group_s": after,
        "on_arrival_total_s": round(float(np.median(totals)), 4),
        "on_arrival_over_in_step": round(after["on_arrival"] / after["in_step"], 3),
        "on_arrival_over_separate": round(after["on_arrival"] / after["separate"], 3),
    }


LONG_VARIANTS = (("blockwise", "full"), ("blockwise", "none"), ("dense", "full"), ("dense", "none"))


def measure_long(
    attention: str, remat: str, length: int, steps: int, peak: float, max_gib: float
) -> dict:
    """One long-context variant of the ~50M config: 2 rows of ``length`` tokens."""
    cfg_model = tiny_config(**CONFIGS["50m"], max_position_embeddings=length)
    model = Model(cfg_model, rngs=nnx.Rngs(0))
    n_params = sum(int(np.prod(p.shape)) for p in param_info(model))
    cfg = LearnerConfig(
        length_buckets=(length,), warmup_steps=0, steps=100, attention=attention,
        remat=remat, logprob_chunk=512,
    )  # fmt: skip
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    packed = pack(groups(1, 2, length + 1, cfg_model.vocab_size), rows=2, buckets=(length,))
    state, shardings = new_state(model, mesh, cfg)
    batch = place_batch(packed.arrays, mesh)
    t0 = time.perf_counter()
    step = compile_step(model, mesh, cfg, shardings).lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    need = compiled_peak_gib(step)
    row = {"name": "50m-long", "attention": attention, "remat": remat, "length": length,
           "peak_gib": round(need, 2), "compile_s": round(compile_s, 1)}  # fmt: skip
    if need > max_gib:
        return {**row, "skipped": f"needs {need:.1f} GiB"}
    tokens = float(np.asarray(packed.arrays["attn_bt"]).sum())
    dt, _ = seconds_per_step(step, state, batch, steps)
    c = cfg_model
    attn_flops = 6 * c.num_layers * 2 * length**2 * c.num_heads * c.head_dim / 2  # causal
    gflops = (6 * n_params * tokens + attn_flops) / dt / 1e9
    return {
        **row,
        "tokens_per_s": round(tokens / dt, 1),
        "fraction_of_peak": round(gflops / peak, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per config")
    ap.add_argument("--long-steps", type=int, default=2, help="timed steps per long variant")
    ap.add_argument("--long-length", type=int, default=4096, help="tokens per long row")
    ap.add_argument("--max-gib", type=float, default=16.0, help="skip variants needing more")
    ap.add_argument("--no-long", action="store_true", help="only the short rows")
    args = ap.parse_args()
    peak = matmul_peak_gflops()
    configs = [measure(name, o, args.steps, peak) for name, o in CONFIGS.items()]
    for c in configs:
        print(
            f"{c['name']:>6}: {c['tokens_per_s']:>9,.1f} tokens/s, {c['fraction_of_peak']:.3f} of peak"
        )
    reference = [measure_reference(name, o, args.steps) for name, o in CONFIGS.items()]
    for r in reference:
        print(
            f"{r['name']:>6} with KL: reference inside the step {r['inside_tokens_per_s']:,.1f}"
            f" tokens/s, a program of its own {r['separate_tokens_per_s']:,.1f}"
            f" ({r['separate_over_inside']:.2f}x)"
        )
    arrival = [measure_arrival(name, o, args.steps) for name, o in CONFIGS.items()]
    for r in arrival:
        a = r["after_last_group_s"]
        print(
            f"{r['name']:>6} with KL, last group to the step's end: in the step "
            f"{a['in_step']:.3f} s, separate {a['separate']:.3f} s, on arrival "
            f"{a['on_arrival']:.3f} s ({r['on_arrival_over_in_step']:.2f}x, "
            f"{r['on_arrival_over_separate']:.2f}x; its compute in all "
            f"{r['on_arrival_total_s']:.3f} s)"
        )
    long = []
    if not args.no_long:
        for attention, remat in LONG_VARIANTS:
            r = measure_long(
                attention, remat, args.long_length, args.long_steps, peak, args.max_gib
            )
            long.append(r)
            print(json.dumps(r))
    print(
        json.dumps(
            {
                "bench": "learner",
                "configs": configs,
                "reference": reference,
                "arrival": arrival,
                "long": long,
            }
        )
    )


if __name__ == "__main__":
    main()
