"""`python -m learner.base [--out DIR] [--max-steps N] [--target-loss X] [--seed S]`.

Pretrains the embedded default's *base* model, the one ``make train`` fine-tunes.
A real run starts from a pretrained LLM; the embedded default starts from the tiny
architecture pretrained on one synthetic task only, the copy exercise of
:func:`learner.embedded.sft.copy_exercise`: rows of random token ids in which spans recur
after a random gap, with the loss on the recurrences. No task, page or web text is
involved (the rows are random ids), so the base knows nothing of the questions or
their answers; what it learns is an induction mechanism — continue as the context
continued after the last occurrence of the current token — which a policy needs
to copy names, URLs and answers from what it reads, and which the demonstrations
alone are too few to teach (measured: a randomly initialised tiny policy after
400 SFT steps copies nothing).

The loss stays at chance (ln 4096 = 8.3) for hundreds of steps and then drops
within ~75 steps to near 0; the step of the drop varies with the seed (450 to over
600 at 2e-3), so this runs until the copy loss is under ``--target-loss`` (checked
every 25 steps) or ``--max-steps``, and fails if the drop never came. ~1.4 s per
step on 2 CPU cores. The result is an HF directory (float32 safetensors, the
tokenizer, ``base.json`` with the steps and the final copy loss) that
``sft.init_checkpoint`` loads; ``shared/assets/tiny_base`` is the one shipped, built
by ``make base``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from shared.config import RunConfig, add_config_args, config_from_args, setup_logging

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "shared" / "assets" / "tiny_base"


def build_base(
    cfg: RunConfig,
    out: str | Path,
    *,
    max_steps: int = 1500,
    target_loss: float = 0.3,
    learning_rate: float = 2e-3,
    seed: int = 0,
) -> dict:
    """Run the copy exercise from a fresh ``cfg.learner.model`` until the copy loss is under
    ``target_loss``; write the HF directory ``out``. Returns what ``base.json`` records.

    Raises ``RuntimeError`` (and writes nothing) when ``max_steps`` pass without the drop."""
    from learner.embedded.sft import copy_exercise
    from learner.model.hf import export_hf
    from learner.training.loop import build_model
    from learner.training.sharding import make_mesh

    cfg = dataclasses.replace(
        cfg,
        learner=dataclasses.replace(cfg.learner, seed=seed),
        sft=dataclasses.replace(
            cfg.sft, copy_steps=max_steps, learning_rate=learning_rate, seed=seed
        ),
    )
    model, tokenizer_dir = build_model(cfg)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        loss, steps = copy_exercise(
            cfg, model, make_mesh(cfg.mesh), Path(tmp), stop_below=target_loss
        )
        curve = [json.loads(x) for x in (Path(tmp) / "copy_metrics.jsonl").read_text().splitlines()]
    if not loss < target_loss:
        raise RuntimeError(
            f"the copy loss is {loss:.3f} after {steps} steps, not under {target_loss}: "
            "the drop has not come; try more --max-steps or another --seed"
        )
    out = export_hf(model, out, tokenizer_dir=tokenizer_dir, dtype="float32")
    info = {
        "model": cfg.learner.model,
        "exercise": "copy",
        "steps": steps,
        "copy_loss": round(loss, 4),
        "learning_rate": learning_rate,
        "seed": seed,
        "minutes": round((time.perf_counter() - t0) / 60, 1),
        "curve": [[r["step"], round(r["copy_loss"], 3)] for r in curve],
    }
    (out / "base.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.base", description=__doc__)
    add_config_args(parser)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="HF directory to write")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--target-loss", type=float, default=0.3)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    setup_logging(cfg)
    try:
        info = build_base(
            cfg, args.out, max_steps=args.max_steps, target_loss=args.target_loss,
            learning_rate=args.learning_rate, seed=args.seed,
        )  # fmt: skip
    except RuntimeError as e:
        print(f"learner.base: {e}", file=sys.stderr)
        return 1
    print(f"base model: {args.out} ({info['steps']} steps, copy loss {info['copy_loss']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
