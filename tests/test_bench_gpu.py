"""``bench/gpu.py``, the one prepared GPU check: its ``--smoke`` run on the CPU goes
through the same code (the train step of two Qwen2-shaped configs at two lengths, the
serving engine at several widths) so the script cannot rot before a GPU is at hand; its
case order and FLOP count by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_bench


def _bench():
    return load_bench("gpu")


def test_the_cases_run_the_goal_first_and_each_once():
    bench = _bench()
    cases = bench.train_cases(("small", "large"), (4096, 16384))
    assert cases[0] == ("large", 16384, "cudnn", "dots_no_batch")  # the >= 40% MFU goal
    assert cases[1:3] == [("large", 16384, "cudnn", "full"), ("large", 16384, "blockwise", "full")]
    assert len(cases) == len(set(cases)) == 2 * 2 * 2 * 3


def test_model_flops_by_hand():
    """6 x params x tokens, plus 6 x layers x T^2 x heads x head_dim per row: for 1,000
    parameters, 2 rows of 8 tokens (16 tokens), 2 layers, 4 heads of 16: 96,000 + 6 x 2 x
    64 x 4 x 16 x 2 = 96,000 + 98,304."""
    bench = _bench()
    cfg = bench.model_config(bench.SMOKE_MODELS["smoke-a"] | {"num_layers": 2}, 16, "float32")
    assert (cfg.num_heads, cfg.head_dim) == (4, 16)
    assert bench.step_flops(cfg, 1000, rows=2, length=8, tokens=16.0) == 96_000 + 98_304


@pytest.mark.slow
def test_the_smoke_run_measures_every_part_on_the_cpu():
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["bench"] == "gpu" and r["smoke"] is True and r["backend"] == "cpu"
    assert r["peak_tflops"] > 0 and r["peak_source"].startswith("measured")
    assert len(r["train"]) == _bench().SMOKE_CASES
    for case in r["train"]:
        if case["attention"] == "cudnn":  # no cuDNN on the CPU: said, not hidden
            assert case["skipped"] == "cudnn needs an NVIDIA GPU"
            continue
        assert "error" not in case and "skipped" not in case, case
        assert case["rows"] == 4 and case["params"] > 0 and case["compile_s"] > 0
        assert case["tokens_per_s"] > 0 and 0 < case["mfu"] < 2
        assert case["tokens_per_s"] == pytest.approx(4 * case["length"] / case["step_s"], rel=0.01)
    assert {c["remat"] for c in r["train"] if "mfu" in c} == {"full", "none"}
    kinds = [(s["kind"], s["rows"]) for s in r["serve"]]
    assert kinds == [("decode", 1), ("decode", 4), ("prefill", 4)]
    assert all(s["tokens_per_s"] > 0 and s["first_call_s"] >= s["seconds"] for s in r["serve"])
    (d,) = r["dryrun"]  # the dry run's estimate against XLA's peak, the tiny model here
    assert d["peak_gib"] > 0 and 0.75 < d["ratio"] < 1.25 and d["layout"] == "cpu", d
