"""The embedded inference server: decode and prefill throughput, and logprob agreement.

Writes a checkpoint of the tiny model (random weights of a realistic scale),
starts ``python -m learner.serve --checkpoint`` on a free loopback port and,
after compiling every shape it uses, measures over HTTP:

- ``decode_tok_s``: generated tokens per second with 1, 8 and 32 concurrent
  sequences (32-token prompts, 128 new tokens each, eos ignored);
- ``prefill_tok_s``: prompt tokens per second, 8 concurrent 480-token prompts
  with one new token each;
- ``logprob_max_abs_diff``: the largest difference between the logprobs the
  server returned for 8 sampled sequences (temperature 1) and the learner's
  teacher-forced recomputation with the same weights.

    python bench/serve.py

Final line: {"bench": "serve", "decode_tok_s": {"1", "8", "32"}, "prefill_tok_s",
"logprob_max_abs_diff"}

``--episode`` instead plays one 40-turn episode over HTTP against
``python -m learner.serve --init tiny --max-len 16384``, with the prefix cache
(``inference.prefix_cache_tokens=65536``) and with ``--disable-radix-cache``, one server after the other: turn 1 sends a
200-token prompt; each later turn sends the previous input + output + a 100-300
token observation; every turn generates 30 tokens (seeded, eos ignored). Each
server first plays the same episode once to compile every shape it uses, then the
cache is flushed (``/flush_cache``) and the episode is measured. Per turn it prints
the context length, ``cached_tokens`` and the server's ``e2e_latency`` of both.

    python bench/serve.py --episode

Final line: {"bench": "serve_episode", "turns", "context_tokens": {"first", "last"},
"cache" / "no_cache": {"first_s", "last_s", "last_over_first"}, "tokens_identical",
"flops_model"}. ``flops_model`` is the same episode's arithmetic, last turn over first
(the tokens each turn runs x (2 x matmul parameters + attention over the context)), for
the tiny model and for the Qwen2.5-7B shape: with the cache a turn runs only its new
tokens, but each of them attends to the whole context, and in a 1.3M-parameter model
that attention outweighs the weights from ~1,300 tokens of context on (9,000 tokens:
~7x the weights' FLOPs), so its turns cannot stay flat; in the 7B they do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flax import nnx  # noqa: E402

from learner.model.params import Model, get_params, sequence_logprobs, set_params, tiny_config  # noqa: E402
from learner.training.checkpoint import Checkpointer  # noqa: E402
from shared.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402

NEW_TOKENS = 128
PROMPT_LEN = 32
PREFILL_LEN = 480


def make_model() -> Model:
    model = Model(tiny_config(), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    set_params(
        model,
        {
            k: np.asarray(v) + 0.05 * rng.standard_normal(v.shape).astype(np.float32)
            for k, v in get_params(model).items()
        },
    )
    return model


def start(checkpoint: Path | None, *extra: str) -> tuple[subprocess.Popen, str]:
    src = ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
    cmd = [sys.executable, "-m", "learner.serve", *src, "--port", "0", *extra]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    url: list[str] = []
    reader = threading.Thread(target=lambda: url.append(proc.stdout.readline().split()[-1]))
    reader.start()
    reader.join(300)
    if not url:
        proc.kill()
        raise SystemExit("learner.serve did not start")
    return proc, url[0]


def prompt(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 4096, n)]


async def generate(session: aiohttp.ClientSession, url: str, ids: list[int], **sampling) -> dict:
    body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
    async with session.post(url + "/generate", json=body) as r:
        r.raise_for_status()
        return await r.json()


async def concurrent(session, url, prompts, **sampling) -> tuple[float, list[dict]]:
    t0 = time.monotonic()
    out = await asyncio.gather(*(generate(session, url, p, **sampling) for p in prompts))
    return time.monotonic() - t0, out


async def measure(url: str) -> tuple[dict[str, float], float, list[tuple[list[int], dict]]]:
    decode = dict(temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        decode_tok_s = {}
        for c in (1, 8, 32):
            prompts = [prompt(PROMPT_LEN, 100 * c + i) for i in range(c)]
            await concurrent(s, url, prompts, **decode, seed=1)  # compile
            wall, out = await concurrent(s, url, prompts, **decode, seed=2)
            tokens = sum(len(o["output_ids"]) for o in out)
            decode_tok_s[str(c)] = round(tokens / wall, 1)
        long = [prompt(PREFILL_LEN, 7 + i) for i in range(8)]
        await concurrent(s, url, long, max_new_tokens=1)  # compile
        wall, _ = await concurrent(s, url, long, max_new_tokens=1)
        prefill_tok_s = len(long) * PREFILL_LEN / wall
        prompts = [prompt(PROMPT_LEN, 900 + i) for i in range(8)]
        _, sampled = await concurrent(s, url, prompts, temperature=1.0, max_new_tokens=64, seed=3)
    return decode_tok_s, prefill_tok_s, list(zip(prompts, sampled, strict=True))


def logprob_diff(model: Model, sampled: list[tuple[list[int], dict]]) -> float:
    worst = 0.0
    for ids, item in sampled:
        seq = ids + item["output_ids"]
        ref = np.asarray(sequence_logprobs(model, np.asarray([seq])))[0, len(ids) :]
        served = np.array([lp for lp, _, _ in item["meta_info"]["output_token_logprobs"]])
        worst = max(worst, float(np.abs(served - ref).max()))
    return worst


EPISODE_TURNS = 40
EPISODE_NEW = 30
EPISODE_MAX_LEN = 16384


async def play_episode(url: str) -> list[dict]:
    """One episode: per turn the context length, cached tokens, server latency, output."""
    rng = np.random.default_rng(0)
    ids = prompt(200, 1)
    turns = []
    sampling = dict(temperature=1.0, max_new_tokens=EPISODE_NEW, ignore_eos=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for turn in range(EPISODE_TURNS):
            t0 = time.monotonic()
            out = await generate(s, url, ids, **sampling, seed=turn)
            wall = time.monotonic() - t0
            meta = out["meta_info"]
            turns.append(
                {
                    "context": len(ids),
                    "cached": meta["cached_tokens"],
                    "server_s": meta["e2e_latency"],
                    "wall_s": wall,
                    "output_ids": out["output_ids"],
                }
            )
            observation = prompt(int(rng.integers(100, 301)), 1000 + turn)
            ids = ids + out["output_ids"] + observation
    return turns


async def measured_episode(url: str) -> list[dict]:
    await play_episode(url)  # compiles every bucket the episode reaches
    async with aiohttp.ClientSession() as s, s.post(url + "/flush_cache") as r:
        r.raise_for_status()
    return await play_episode(url)


EPISODE_CACHE_TOKENS = 65536  # the prefix cache (off by default): 7 such episodes


def token_flops(cfg, position: int) -> float:
    """FLOPs of one token at ``position`` through the model: 2 x its matmul parameters
    (projections, MLP, unembedding) plus causal attention over ``position + 1`` keys
    (QK^T and AV: 4 x layers x heads x head_dim per key)."""
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.intermediate_size
    matmul = cfg.num_layers * per_layer + cfg.vocab_size * d
    return 2.0 * matmul + 4.0 * cfg.num_layers * q * (position + 1)


def turn_flops(cfg, turns: list[dict], cached: bool) -> list[float]:
    """Each turn's arithmetic: the prompt positions the server runs (after the cached
    prefix, or all of them), then one decode step per generated token but the last."""
    out = []
    for t in turns:
        first = t["cached"] if cached else 0
        n_out = len(t["output_ids"])
        positions = range(first, t["context"] + n_out - 1)
        out.append(sum(token_flops(cfg, p) for p in positions))
    return out


def arithmetic(turns: list[dict]) -> dict:
    """The episode's last turn over its first, in FLOPs, with the prefix cache, for the
    served tiny model and for the Qwen2.5-7B shape: the floor of ``last_over_first``
    (a server cannot do less work than this; fixed per-request costs only flatten it)."""
    from learner.model.config import ModelConfig
    from learner.training.dryrun import PRESETS

    shapes = {"tiny": tiny_config(), "qwen2.5-7b": ModelConfig(**PRESETS["qwen2.5-7b"])}
    out = {}
    for name, cfg in shapes.items():
        with_cache, without = turn_flops(cfg, turns, True), turn_flops(cfg, turns, False)
        out[name] = {
            "cache_last_over_first": round(with_cache[-1] / with_cache[0], 2),
            "no_cache_last_over_first": round(without[-1] / without[0], 2),
        }
    return out


def episode_main(modes: list[str]) -> int:
    runs = {}
    on = ("--set", f"inference.prefix_cache_tokens={EPISODE_CACHE_TOKENS}")
    for name, extra in (("cache", on), ("no_cache", ("--disable-radix-cache",))):
        if name not in modes:
            continue
        proc, url = start(None, "--init", "tiny", "--max-len", str(EPISODE_MAX_LEN), *extra)
        try:
            runs[name] = asyncio.run(measured_episode(url))
        finally:
            proc.terminate()
            proc.wait(30)
        ms = [round(1000 * t["server_s"], 1) for t in runs[name]]
        ctx = [t["context"] for t in runs[name]]
        print(json.dumps({"mode": name, "context": ctx, "server_ms": ms}), flush=True)
    if len(runs) < 2:
        return 0
    cache, plain = runs["cache"], runs["no_cache"]
    print("turn  context  cached  cache_ms  no_cache_ms")
    for i, (a, b) in enumerate(zip(cache, plain, strict=True)):
        print(
            f"{i + 1:4d}  {a['context']:7d}  {a['cached']:6d}  "
            f"{1000 * a['server_s']:8.1f}  {1000 * b['server_s']:11.1f}"
        )

    def summary(turns: list[dict]) -> dict:
        first, last = turns[0]["server_s"], turns[-1]["server_s"]
        return {
            "first_s": round(first, 4),
            "last_s": round(last, 4),
            "last_over_first": round(last / first, 2),
            "server_ms": [round(1000 * t["server_s"], 1) for t in turns],
        }

    same = all(a["output_ids"] == b["output_ids"] for a, b in zip(cache, plain, strict=True))
    print(
        json.dumps(
            {
                "bench": "serve_episode",
                "turns": EPISODE_TURNS,
                "context_tokens": {"first": cache[0]["context"], "last": cache[-1]["context"]},
                "cached_tokens": [t["cached"] for t in cache],
                "cache": summary(cache),
                "no_cache": summary(plain),
                "tokens_identical": same,
                "flops_model": arithmetic(cache),
            }
        )
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episode", action="store_true", help="the 40-turn episode instead")
    parser.add_argument("--modes", default="cache,no_cache", help="episode: servers to run")
    args = parser.parse_args()
    if args.episode:
        return episode_main(args.modes.split(","))
    model = make_model()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        with Checkpointer(ckpt) as ck:
            ck.save(
                1,
                params=get_params(model),
                model_config=model.cfg,
                tokenizer_dir=TINY_TOKENIZER_DIR,
            )
        proc, url = start(ckpt)
        try:
            decode_tok_s, prefill_tok_s, sampled = asyncio.run(measure(url))
        finally:
            proc.terminate()
            proc.wait(30)
    diff = logprob_diff(model, sampled)
    print(
        json.dumps(
            {
                "bench": "serve",
                "decode_tok_s": decode_tok_s,
                "prefill_tok_s": round(prefill_tok_s, 1),
                "logprob_max_abs_diff": diff,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
