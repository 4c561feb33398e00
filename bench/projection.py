"""The reference headline, projected: one GRPO step of 1,024 research trajectories.

The reference this project's design starts from: one GRPO step over 1,024 research
prompts in 8-12 minutes on 8 x H100. This script projects ours for the 7B config
(``configs/qwen2.5-7b-8xh100.toml``: its model, context and observation lengths) on a
learner node of 8 x H100, an inference node of G GPUs and N rollout nodes of 64 cores,
from measured inputs where there are measurements and stated assumptions where there
are none. Every input is printed with its source.

Per step: T trajectories of A actions each (1,024 x 30), each filling the config's
context (``inference.max_context_tokens``) with A x (generated + observation) tokens,
cut at the context.

- **rollout** (CPU): T x A environment steps in som mode. CPU seconds per step (all the
  processes of a sidecar's tree) and of the busiest single process per step (which caps
  one sidecar: it runs on one core) from ``bench/rollout.py``'s long-horizon som line
  (``--rollout-json``, or the figures measured here, stated below). Time = max(CPU bound
  over N x 64 cores at 80% efficiency, the S-sidecars-per-node cap).
- **inference**: the generated tokens at the engine's decode throughput per GPU (stated
  per engine, with its source), and the new prompt tokens (the observations; the prefix
  cache keeps each trajectory's earlier turns) at a prefill rate of 2 x parameters FLOPs
  per token at the stated MFU.
- **latency chain**: the A turns of one trajectory follow each other: A x (its decode
  at the per-sequence rate with T / G sequences per GPU + one environment step's
  latency, measured). A floor under rollout and inference, not added to them.
- **learner update**: model FLOPs of the step (6 x parameters x tokens plus causal
  attention, plus the reference forward's third when ``learner.kl_coef`` > 0) at the MFU
  ``bench/gpu.py`` measured on an H200 (``--mfu`` to change it) over 8 x H100's bf16 peak.
  Its memory per device is the dry run's estimate (``learner.training.dryrun.budget``).
- **weight sync**: the bf16 weights over the link between the nodes, plus the engine's
  reload (stated).

Two schedules: ``sync`` (each phase waits for the last: rollout and inference overlap
each other, the update and the sync follow) and ``async`` (the loop's default,
``learner.max_staleness`` >= 1: step k's update runs while step k+1's trajectories are
collected, so a step costs the slower of the two). The bottleneck is the largest phase.

    python bench/projection.py [--nodes 4] [--sidecars 6] [--inference-gpus 8]
        [--engine sglang|vllm] [--mfu 0.384] [--trajectories 1024] [--actions 30]
        [--generated 150] [--rollout-json FILE] [--set SECTION.KEY=VALUE ...]

Final line: {"bench": "projection", "inputs": {name: {"value", "source"}}, "phases_s",
"step_s": {"sync", "async"}, "step_min", "bottleneck", "rollout_s_by_nodes", "reference_min"}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu import step_flops as gpu_step_flops  # noqa: E402
from learner.training.dryrun import budget, estimate_total, model_config  # noqa: E402
from shared.config import load  # noqa: E402

CONFIG = REPO / "configs" / "qwen2.5-7b-8xh100.toml"
REFERENCE_MIN = (8, 12)  # one GRPO step of 1,024 research prompts on 8 x H100
H100_BF16 = 989.4e12  # dense bf16 FLOP/s, NVIDIA's data sheet (SXM)
CORES, EFFICIENCY = 64, 0.8  # a rollout node, and how well its cores are used

# bench/rollout.py's long-horizon som line (docs/results/environment.md, measured on 2 cores)
ROLLOUT = {
    "cpu_s_per_step": 0.0572,
    "busiest_cpu_s_per_step": 0.00624,  # Playwright's driver: one core caps one sidecar
    "step_latency_s": 1 / (1.43 * 25.75),  # one episode at a time: 1.43 episodes/s of 25.75 steps
    "source": "bench/rollout.py, long-horizon families in som mode (docs/results/environment.md)",
}
# Offline output throughput of an 8B model (Llama 3.1 8B Instruct, bf16) on one H100 80 GB,
# 1,000 ShareGPT prompts: AIMultiple's benchmark of inference engines
ENGINES = {
    "sglang": (16_215.0, "research.aimultiple.com/inference-engines: SGLang, Llama 3.1 8B, H100"),
    "vllm": (12_553.0, "research.aimultiple.com/inference-engines: vLLM (FlashInfer), Llama 3.1 8B, H100"),
}  # fmt: skip
MFU_MEASURED = (
    0.384,
    "bench/gpu.py on one H200, Qwen2.5-1.5B shape at 16k, remat full (2026-12-04)",
)
PREFILL_MFU = 0.5  # assumed: prefill is large matmuls, as the train step's forward
LINK_GB_S = 25.0  # assumed: 200 Gb/s between the learner node and the inference node
RELOAD_S = 5.0  # assumed: the engine loading 15 GB of new weights from host memory


def rollout_inputs(path: str | None) -> dict:
    if path is None:
        return dict(ROLLOUT)
    for line in Path(path).read_text().splitlines():
        r = json.loads(line) if line.startswith("{") else {}
        if r.get("tasks") == "long_horizon":
            levels = r["episodes_per_s"]
            one = levels.get("1") or levels[min(levels, key=int)]
            by_kind = r["cpu_s_per_step_by_kind"]
            return {
                "cpu_s_per_step": r["cpu_s_per_step"],
                "busiest_cpu_s_per_step": max(
                    by_kind[k] for k in ("sidecar", "playwright_driver", "web") if k in by_kind
                ),
                "step_latency_s": 1 / (one * r["steps_per_episode"]),
                "source": f"bench/rollout.py ({path})",
            }
    raise SystemExit(f'{path}: no line with "tasks": "long_horizon" (bench/rollout.py)')


def trajectory_tokens(context: int, actions: int, generated: int, observation: int) -> dict:
    """One trajectory's tokens: A turns of generated + observation tokens, cut at the
    context; the prompt's own tokens are counted in the observations' share."""
    whole = actions * (generated + observation)
    kept = min(context, whole)
    gen = kept * generated / (generated + observation)
    return {"tokens": kept, "generated": gen, "prefill": kept - gen, "cut": whole > context}


def step_flops(mc, params: float, rows: int, length: int, reference: bool) -> float:
    """Model FLOPs of one GRPO step over ``rows`` rows of ``length`` tokens, as
    ``bench/gpu.py`` counts them (6 x params per token plus causal attention), and the
    reference model's forward (a third of that) when there is a KL term."""
    train = gpu_step_flops(mc, params, rows, length, float(rows * length))
    return train * (4 / 3 if reference else 1)


def project(args) -> dict:
    cfg = load(args.config, args.set)
    mc = model_config(cfg)
    parts = budget(cfg, 8, backend="gpu")
    params = parts["_params_total"]
    inputs: dict[str, dict] = {}

    def given(name: str, value, source: str):
        inputs[name] = {"value": value, "source": source}
        return value

    t = given("trajectories", args.trajectories, "the reference headline")
    a = given("actions", args.actions, "the reference headline's research trajectories")
    gen = given("generated_per_action", args.generated, "assumed: a thought and an action")
    obs = given("observation_tokens", cfg.inference.observation_tokens, _shown(args.config))
    ctx = given("context_tokens", cfg.inference.max_context_tokens, _shown(args.config))
    given("params", params, f"{mc.num_layers} layers, {_shown(args.config)}")
    traj = trajectory_tokens(ctx, a, gen, obs)
    ro = rollout_inputs(args.rollout_json)
    given("cpu_s_per_step", ro["cpu_s_per_step"], ro["source"])
    given("busiest_cpu_s_per_step", ro["busiest_cpu_s_per_step"], ro["source"])
    given("step_latency_s", round(ro["step_latency_s"], 4), ro["source"])
    decode_tps, engine_source = ENGINES[args.engine]
    given("decode_tokens_per_s_per_gpu", decode_tps, engine_source)
    mfu = given("mfu", args.mfu, MFU_MEASURED[1] if args.mfu == MFU_MEASURED[0] else "--mfu")
    given("prefill_mfu", PREFILL_MFU, "assumed")
    given("link_gb_s", LINK_GB_S, "assumed: 200 Gb/s between nodes")
    given("reload_s", RELOAD_S, "assumed")
    g = given("inference_gpus", args.inference_gpus, "--inference-gpus (H100)")

    steps = t * a
    env_cpu = steps * ro["cpu_s_per_step"]

    def rollout_s(nodes: int, sidecars: int) -> float:
        cpu_bound = env_cpu / (nodes * CORES * EFFICIENCY)
        cap_bound = steps * ro["busiest_cpu_s_per_step"] / (nodes * sidecars)
        return max(cpu_bound, cap_bound)

    prefill_tps = H100_BF16 * PREFILL_MFU / (2 * params)
    inference = t * (traj["generated"] / decode_tps + traj["prefill"] / prefill_tps) / g
    per_gpu = t / g  # sequences decoding at once on one GPU
    chain = a * (gen * per_gpu / decode_tps + ro["step_latency_s"])
    flops = step_flops(mc, params, t, traj["tokens"], cfg.learner.kl_coef > 0)
    learner = flops / (8 * H100_BF16 * mfu)
    sync = 2 * params / (LINK_GB_S * 1e9) + RELOAD_S
    phases = {
        "rollout": rollout_s(args.nodes, args.sidecars),
        "inference": inference,
        "latency_chain": chain,
        "learner_update": learner,
        "weight_sync": sync,
    }
    collect = max(phases["rollout"], phases["inference"], phases["latency_chain"])
    step = {"sync": collect + learner + sync, "async": max(collect, learner + sync)}
    table = {  # the rollout phase's seconds by rollout nodes and sidecars per node
        f"{n} nodes": {f"{s} sidecars": round(rollout_s(n, s), 1) for s in (1, 2, 4, 6, 8)}
        for n in (1, 2, 4, 8)
    }
    return {
        "bench": "projection",
        "config": _shown(args.config),
        "overrides": list(args.set),
        "engine": args.engine,
        "nodes": args.nodes,
        "sidecars_per_node": args.sidecars,
        "inputs": inputs,
        "trajectory": {k: round(v) if isinstance(v, float) else v for k, v in traj.items()},
        "step_tflop": round(flops / 1e12),
        "learner_gib_per_device": round(estimate_total(parts) / 2**30, 1),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "step_s": {k: round(v, 1) for k, v in step.items()},
        "step_min": {k: round(v / 60, 2) for k, v in step.items()},
        "bottleneck": max(phases, key=phases.get),
        "rollout_s_by_nodes": table,
        "reference_min": list(REFERENCE_MIN),
    }


def _shown(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG), help="the run config (its model, lengths)")
    ap.add_argument("--nodes", type=int, default=4, help="rollout nodes of 64 cores")
    ap.add_argument("--sidecars", type=int, default=6, help="rollout sidecars per node")
    ap.add_argument("--inference-gpus", type=int, default=8, help="H100s serving the policy")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="sglang")
    ap.add_argument("--mfu", type=float, default=MFU_MEASURED[0], help="the update's MFU")
    ap.add_argument("--trajectories", type=int, default=1024)
    ap.add_argument("--actions", type=int, default=30)
    ap.add_argument("--generated", type=int, default=150, help="generated tokens per action")
    ap.add_argument("--rollout-json", help="bench/rollout.py's output (its long-horizon line)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config value, e.g. learner.kl_coef=0")  # fmt: skip
    r = project(ap.parse_args(argv))
    for name, v in r["inputs"].items():
        print(f"  {name:<30} {v['value']!s:<12} {v['source']}", flush=True)
    print("  phases (s): " + ", ".join(f"{k} {v}" for k, v in r["phases_s"].items()))
    print(f"  one step: {r['step_min']['async']} min async, {r['step_min']['sync']} min sync "
          f"(reference {REFERENCE_MIN[0]}-{REFERENCE_MIN[1]}); bottleneck {r['bottleneck']}")  # fmt: skip
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
