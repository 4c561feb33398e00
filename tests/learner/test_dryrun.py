"""`learner.train --dry-run`: a plausible per-device budget for the 7B config on 8 x 80 GB."""

from __future__ import annotations

import json
from pathlib import Path

from learner.train import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-7b-8xh100.toml"


def _report(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["dry_run"]


def test_dry_run_of_the_7b_config_fits_on_8x80gb(capsys):
    assert main(["--config", str(CONFIG), "--dry-run"]) == 0
    r = _report(capsys)
    # 7.62e9 f32 parameters over fsdp=8: 7.62e9 x 4 B / 8 = 3.81e9 B = 3.55 GiB; Adam 2x that
    assert 3.4 < r["params"] < 3.7 and 6.9 < r["optimizer"] < 7.3
    assert r["reference"] == 0  # kl_coef = 0 keeps no reference
    assert 10 < r["activations"] < 60 and r["total_gib"] < 80 and r["fits"]


def test_dry_run_fails_when_it_does_not_fit(capsys):
    args = ["--config", str(CONFIG), "--dry-run", "--set", "mesh.device_memory_gib=16"]
    assert main(args) == 1
    assert not _report(capsys)["fits"]


def test_kl_adds_a_reference_copy(capsys):
    args = ["--config", str(CONFIG), "--dry-run", "--set", "learner.kl_coef=0.01"]
    main(args)
    r = _report(capsys)
    assert r["reference"] == r["params"]


def test_micro_batches_divide_the_activations_and_add_a_gradient_accumulator(capsys):
    main(["--config", str(CONFIG), "--dry-run"])
    whole = _report(capsys)
    main(["--config", str(CONFIG), "--dry-run", "--set", "learner.micro_batches=4"])
    micro = _report(capsys)
    assert 3.5 < whole["activations"] / micro["activations"] < 4.5
    assert abs(micro["grads"] - 2 * whole["grads"]) < 0.01  # GiB, as reported (3 decimals)
