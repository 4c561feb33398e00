"""Generation with ``learner.serving.engine``: the default decode program against the one compiled
without XLA:CPU's YNNPACK fusions, side by side, at several batch widths.

The model is the tiny Qwen2 shape of the Tunix comparison (vocab 512, hidden 128, 4
blocks, 4 heads / 2 KV heads, random weights), or with ``--model tiny`` the project's
tiny model (``learner.model = "tiny"``, random weights). Each width runs ``--rows`` requests of
``--prompt`` random tokens and ``--new`` new tokens (temperature 1, eos ignored) through
three engines over the same model: decode chunks always with the default program,
always without the fusions, and with the engine's rule (without them from
``DECODE_WIDE_ROWS`` rows on). Each engine generates once to compile; then the three
take turns ``--repeats`` times and the medians are compared.

    python bench/decode.py [--rows 1 8 32 128] [--prompt 64] [--new 128] [--repeats 4]\
        [--model peer|tiny]

Final line: {"bench": "decode", "model", "wide_rows", "option_accepted", "rows": [{"rows",
"default_s", "no_ynn_s", "engine_s", "no_ynn_ratio", "ratio", "wide"}]}: medians;
ratio = engine / default (below 1: faster). ``option_accepted`` false: not the CPU
backend, or an XLA without the option, and the programs are the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flax import nnx  # noqa: E402

from learner.model.config import ModelConfig, tiny_config  # noqa: E402
from learner.model.params import Model  # noqa: E402
from learner.serving import engine as engine_mod  # noqa: E402
from learner.serving.engine import Engine, Request, SamplingParams  # noqa: E402


def model(name: str) -> Model:
    if name == "tiny":  # the project's tiny model (learner.model = "tiny")
        return Model(tiny_config(), rngs=nnx.Rngs(0))
    cfg = ModelConfig(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=32, model_type="qwen2", max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, qkv_bias=True, tie_word_embeddings=False,
        eos_token_ids=(1,), pad_token_id=0,
    )  # fmt: skip
    return Model(cfg, rngs=nnx.Rngs(0))


class DefaultProgram(Engine):
    """An engine whose decode chunks always take the default program."""

    def _decode_all(self, *args, **kw):
        self._decode_wide = self._decode
        return super()._decode_all(*args, **kw)


class WideProgram(Engine):
    """An engine whose decode chunks always take the program without the fusions."""

    def _decode_all(self, *args, **kw):
        self._decode = self._decode_wide
        return super()._decode_all(*args, **kw)


def generate(engine: Engine, rows: int, prompt: int, new: int, rng, vocab: int) -> float:
    prompts = rng.integers(3, vocab, (rows, prompt))
    reqs = [
        Request(f"r{i}", prompts[i].tolist(),
                SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=i))
        for i in range(rows)
    ]  # fmt: skip
    t = time.perf_counter()
    engine.generate(reqs)
    elapsed = time.perf_counter() - t
    assert all(len(r.output_ids) == new for r in reqs)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--model", choices=("peer", "tiny"), default="peer",
                    help="the Tunix comparison's shape, or the project's tiny model")  # fmt: skip
    args = ap.parse_args()
    m = model(args.model)
    vocab = m.cfg.vocab_size
    accepted = engine_mod.cpu_compiler_options(engine_mod.NO_YNN_FUSIONS) is not None
    rng = np.random.default_rng(0)
    out = []
    for rows in args.rows:
        kw = dict(eos_ids=(1,), max_batch=max(rows, 1), decode_chunk=8, seed=0)
        engines = {"default": DefaultProgram(m, **kw), "no_ynn": WideProgram(m, **kw),
                   "engine": Engine(m, **kw)}  # fmt: skip
        for e in engines.values():
            generate(e, rows, args.prompt, args.new, rng, vocab)  # compile
        times = {k: [] for k in engines}
        for _ in range(args.repeats):
            for k, e in engines.items():
                times[k].append(generate(e, rows, args.prompt, args.new, rng, vocab))
        med = {k: statistics.median(v) for k, v in times.items()}
        d = med["default"]
        row = {"rows": rows, **{f"{k}_s": round(v, 4) for k, v in med.items()},
               "no_ynn_ratio": round(med["no_ynn"] / d, 3), "ratio": round(med["engine"] / d, 3),
               "wide": rows >= engine_mod.DECODE_WIDE_ROWS}  # fmt: skip
        print(f"{rows:4d} rows: default {d:.3f} s, without YNNPACK fusions {med['no_ynn']:.3f} s, "
              f"the engine's rule {med['engine']:.3f} s", flush=True)  # fmt: skip
        out.append(row)
    print(json.dumps({"bench": "decode", "model": args.model, "wide_rows": engine_mod.DECODE_WIDE_ROWS,
                      "option_accepted": accepted, "prompt": args.prompt,
                      "new": args.new, "rows": out}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
