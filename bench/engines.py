"""The inference engines side by side: ``learner.serve``, SGLang and vLLM, one run.

The same model (the tiny policy, random weights of a realistic scale, exported as HF
safetensors in float32) and the same requests, sent through the rollout's own client
(``rollout.sidecar.inference.InferenceClient``, each engine's protocol), one engine after the
other, each started as ``learner.train`` starts it (``learner.serve`` or
``python -m learner.engines``) and warmed up on every shape first:

- ``decode_tok_s``: generated tokens per second with 1, 8 and 32 concurrent
  sequences (32-token prompts, 128 new tokens each, eos ignored);
- ``prefill_tok_s``: prompt tokens per second, 8 concurrent 480-token prompts with
  one new token each (distinct prompts: no prefix cache hit);
- ``update_s``: one weight update through the client (each engine's own API: pause,
  load from the export, continue), median of 3;
- ``logprob_max_abs_diff``: the largest difference between the logprobs the engine
  returned for 8 sampled sequences (temperature 1) and the learner's (the train
  step's ``token_logprobs``) with the same weights.

    python bench/engines.py [--engines embedded,sglang,vllm] [--head-dim 32] [--dtype bfloat16]

``--dtype bfloat16`` exports and serves the policy in bf16 (``inference.dtype``); the gap is
then to the learner in float32 on the same bf16-rounded weights (``learner.serve`` computes
in float32 whatever it loads).

Final line: {"bench": "engines", "model", "engines": {name: {...}}, "ratios":
{"<engine>_over_embedded": {"decode_1", "decode_8", "decode_32", "prefill", "update"}}}
(ratios of throughput, or of time for ``update``: > 1 means the engine is faster).
SGLang and vLLM come from ``.venv-sglang`` / ``.venv-vllm`` (``make engines``); each
engine's log is ``.cache/bench-engines/<engine>.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flax import nnx  # noqa: E402

from learner.embedded.children import Children  # noqa: E402
from learner.model.hf import export_hf, load_hf  # noqa: E402
from learner.model.params import Model, get_params, set_params, tiny_config  # noqa: E402
from learner.serving.engines import untied_export  # noqa: E402
from learner.training.step import row_logprobs  # noqa: E402
from rollout.sidecar.inference import InferenceClient, Sampling  # noqa: E402
from shared.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402

NEW_TOKENS = 128
PROMPT_LEN = 32
PREFILL_LEN = 480
MAX_LEN = 1024
ENGINES = ("embedded", "sglang", "vllm")
LOGS = REPO / ".cache" / "bench-engines"  # each engine's log, <engine>.log, kept after the run


def make_model(seed: int, head_dim: int) -> Model:
    shape = {} if head_dim == 32 else {"head_dim": head_dim, "num_heads": 2, "num_kv_heads": 1}
    model = Model(tiny_config(**shape), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    set_params(
        model,
        {
            k: np.asarray(v) + 0.05 * rng.standard_normal(v.shape).astype(np.float32)
            for k, v in get_params(model).items()
        },
    )
    return model


def prompt(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 4096, n)]


def start(children: Children, engine: str, model_dir: Path, dtype: str) -> str:
    cfg = ["--set", f"inference.max_context_tokens={MAX_LEN}", "--set", f"inference.dtype={dtype}"]
    if engine == "embedded":
        return children.start(
            engine, ["learner.serve", "--hf", str(model_dir), "--port", "0", "--max-len",
                     str(MAX_LEN), "--max-batch", "32", *cfg, "--weight-version", "0"],
        )  # fmt: skip
    return children.start(
        engine,
        ["learner.engines", "--hf", str(model_dir), "--set", f"inference.backend={engine}", *cfg],
        timeout=1800,
    )


async def timed(client: InferenceClient, prompts: list[list[int]], s: Sampling, seed: int | None):
    t0 = time.monotonic()
    out = await asyncio.gather(
        *(
            client.generate(
                p, Sampling(**{**s.__dict__, "seed": None if seed is None else seed + i})
            )
            for i, p in enumerate(prompts)
        )
    )
    return time.monotonic() - t0, out


async def measure(url: str, engine: str, update_dirs: list[Path]) -> tuple[dict, list]:
    backend = "sglang" if engine == "embedded" else engine
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = InferenceClient([url], session, timeout_s=1800, backend=backend, retries=0)
        decode = Sampling(1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        out: dict = {"decode_tok_s": {}}
        for c in (1, 8, 32):
            prompts = [prompt(PROMPT_LEN, 100 * c + i) for i in range(c)]
            await timed(client, prompts, decode, 1)  # warm-up: every shape compiled
            wall, gens = await timed(client, prompts, decode, 2)
            out["decode_tok_s"][str(c)] = round(sum(len(g.output_ids) for g in gens) / wall, 1)
        # unseeded: vLLM 0.32's CPU worker fails on a seeded request whose prompt chunked
        # prefill splits ("CPU Generator does not use offset"), and the engine dies
        one = Sampling(1.0, max_new_tokens=1, ignore_eos=True)
        await timed(client, [prompt(PREFILL_LEN, 7 + i) for i in range(8)], one, None)
        long = [prompt(PREFILL_LEN, 70 + i) for i in range(8)]
        wall, _ = await timed(client, long, one, None)
        out["prefill_tok_s"] = round(len(long) * PREFILL_LEN / wall, 1)
        times = []
        for i, d in enumerate(update_dirs):  # alternate between two exports
            t0 = time.monotonic()
            await client.update_weights(str(d), str(i + 1))
            times.append(time.monotonic() - t0)
        out["update_s"] = round(statistics.median(times), 3)
        prompts = [prompt(PROMPT_LEN, 900 + i) for i in range(8)]
        _, sampled = await timed(client, prompts, Sampling(1.0, max_new_tokens=64), 3)
        out["final_version"] = sampled[0].weight_version
    return out, list(zip(prompts, sampled, strict=True))


def logprob_gap(model: Model, sampled: list) -> float:
    worst = 0.0
    for ids, g in sampled:
        ours = row_logprobs(model, ids + g.output_ids)[len(ids) - 1 :]
        worst = max(worst, float(np.max(np.abs(np.asarray(g.logprobs) - ours))))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    parser.add_argument("--head-dim", type=int, default=32, choices=(32, 64))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = sorted(set(engines) - set(ENGINES))
    if bad:
        parser.error(f"unknown engines {bad}; expected some of {', '.join(ENGINES)}")
    models = [make_model(seed, args.head_dim) for seed in (0, 1, 2)]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            dirs = [
                export_hf(m, Path(tmp) / engine / "hf" / str(i), tokenizer_dir=TINY_TOKENIZER_DIR,
                          dtype=args.dtype, untie=untied_export(engine))
                for i, m in enumerate(models)
            ]  # fmt: skip
            updates = [dirs[1], dirs[2], dirs[1]]  # the last one loaded is models[1]
            print(f"== {engine}", file=sys.stderr, flush=True)
            with Children(LOGS) as children:
                t0 = time.monotonic()
                url = start(children, engine, dirs[0], args.dtype)
                start_s = time.monotonic() - t0
                out, sampled = asyncio.run(measure(url, engine, updates))
            out["start_s"] = round(start_s, 1)
            served = load_hf(dirs[1]) if args.dtype != "float32" else models[1]  # as rounded
            out["logprob_max_abs_diff"] = logprob_gap(served, sampled)
            results[engine] = out
            print(f"   {json.dumps(out)}", file=sys.stderr, flush=True)
    ratios = {}
    base = results.get("embedded")
    for engine, r in results.items():
        if engine == "embedded" or base is None:
            continue
        ratios[f"{engine}_over_embedded"] = {
            **{f"decode_{c}": round(r["decode_tok_s"][c] / base["decode_tok_s"][c], 2)
               for c in base["decode_tok_s"]},
            "prefill": round(r["prefill_tok_s"] / base["prefill_tok_s"], 2),
            "update": round(base["update_s"] / r["update_s"], 2),
        }  # fmt: skip
    model = f"tiny (head_dim {args.head_dim}), {args.dtype}"
    print(json.dumps({"bench": "engines", "model": model, "engines": results, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
