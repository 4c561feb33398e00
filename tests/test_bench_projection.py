"""``bench/projection.py``: one GRPO step of 1,024 research trajectories projected from
measured inputs and stated assumptions; its arithmetic by hand, its JSON line, and that
every input says where it comes from."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.conftest import load_bench


def _bench():
    return load_bench("projection")


def test_trajectory_tokens_and_step_flops_by_hand():
    bench = _bench()
    # 30 actions of 150 + 1,536 tokens = 50,580, cut at 32,768: 150/1,686 of it generated
    t = bench.trajectory_tokens(32_768, 30, 150, 1536)
    assert t["tokens"] == 32_768 and t["cut"]
    assert t["generated"] == pytest.approx(32_768 * 150 / 1686)
    assert bench.trajectory_tokens(10_000, 2, 100, 400) == {
        "tokens": 1000, "generated": 200.0, "prefill": 800.0, "cut": False,
    }  # fmt: skip
    # 2 rows of 8 tokens, 1,000 parameters, 2 layers of 4 heads of 16: 2 x (6 x 1,000 x 8 +
    # 6 x 2 x 64 x 4 x 16) = 96,000 + 98,304; with a reference forward, 4/3 of that
    mc = SimpleNamespace(num_layers=2, num_heads=4, head_dim=16)
    assert bench.step_flops(mc, 1000, rows=2, length=8, reference=False) == 194_304
    assert bench.step_flops(mc, 1000, rows=2, length=8, reference=True) == pytest.approx(
        194_304 * 4 / 3
    )


def test_the_projection_prints_phases_sources_and_the_bottleneck(capsys, tmp_path):
    bench = _bench()
    line = {"bench": "rollout", "tasks": "long_horizon", "episodes_per_s": {"1": 2.0, "8": 1.0},
            "steps_per_episode": 25.0, "cpu_s_per_step": 0.05,
            "cpu_s_per_step_by_kind": {"sidecar": 0.004, "playwright_driver": 0.006,
                                       "renderer": 0.03, "web": 0.001}}  # fmt: skip
    (tmp_path / "rollout.jsonl").write_text('{"tasks": "qa"}\n' + json.dumps(line) + "\n")
    assert bench.main(["--rollout-json", str(tmp_path / "rollout.jsonl"), "--nodes", "2"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["bench"] == "projection" and r["config"] == "configs/qwen2.5-7b-8xh100.toml"
    assert all(v["source"] for v in r["inputs"].values())
    ins = {k: v["value"] for k, v in r["inputs"].items()}
    assert ins["cpu_s_per_step"] == 0.05 and ins["busiest_cpu_s_per_step"] == 0.006
    assert ins["step_latency_s"] == round(1 / (2.0 * 25.0), 4)
    phases = r["phases_s"]
    assert r["bottleneck"] == max(phases, key=phases.get)
    # rollout on 2 nodes x 6 sidecars: max(30,720 x 0.05 / (2 x 64 x 0.8), 30,720 x 0.006 / 12)
    assert phases["rollout"] == pytest.approx(max(1536 / 102.4, 184.32 / 12), abs=0.05)
    assert r["step_s"]["async"] <= r["step_s"]["sync"]
    collect = max(phases["rollout"], phases["inference"], phases["latency_chain"])
    upd = phases["learner_update"] + phases["weight_sync"]
    assert r["step_s"]["sync"] == pytest.approx(collect + upd, abs=0.2)
    assert r["step_s"]["async"] == pytest.approx(max(collect, upd), abs=0.2)
    table = r["rollout_s_by_nodes"]  # more nodes or sidecars never slow the rollout
    assert table["1 nodes"]["1 sidecars"] >= table["2 nodes"]["1 sidecars"]
    assert table["8 nodes"]["1 sidecars"] >= table["8 nodes"]["8 sidecars"]
    assert r["learner_gib_per_device"] > 0 and r["reference_min"] == [8, 12]
