"""`learner.train --dry-run [--compile] [--max-length]`: the estimate, and XLA's figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from learner.train import main
from learner.training import dryrun
from shared.config import load

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "qwen2.5-7b-8xh100.toml"
TINY = REPO / "configs" / "tiny.toml"
# The tiny model on 4 simulated devices (fsdp), bf16 compute, 2 rows of 1,024 tokens each.
TINY_4 = [
    "--config", str(TINY), "--set", "mesh.num_devices=4", "--set", "mesh.data=1",
    "--set", "mesh.fsdp=4", "--set", "learner.groups_per_step=1", "--set", "rollout.group_size=8",
    "--set", "learner.length_buckets=[1024]", "--set", "learner.compute_dtype=bfloat16",
    "--set", "learner.kl_coef=0",
]  # fmt: skip


def _report(capsys, key: str = "dry_run") -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])[key]


def _run(args: list[str], devices: int | None = None, timeout: int = 300) -> tuple[int, list[str]]:
    """``python -m learner.train *args`` in a fresh process (no simulated devices unless
    ``devices``); (exit status, stdout lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", dryrun.CHILD_ENV)}
    env["JAX_PLATFORMS"] = "cpu"
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    proc = subprocess.run(
        [sys.executable, "-m", "learner.train", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, proc.stdout.strip().splitlines()


# ----------------------------------------------------------------------------- the estimate


def test_dry_run_of_the_7b_config_fits_on_8x80gb(capsys):
    assert main(["--config", str(CONFIG), "--dry-run"]) == 0
    r = _report(capsys)
    # 7.62e9 f32 parameters over fsdp=8: 7.62e9 x 4 B / 8 = 3.81e9 B = 3.55 GiB; Adam 2x that
    assert 3.4 < r["params"] < 3.7 and 6.9 < r["optimizer"] < 7.3
    assert r["reference"] == 0  # kl_coef = 0 keeps no reference
    assert 5 < r["activations"] < 60 and r["total_gib"] < 80 and r["fits"]


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
    main(["--config", str(CONFIG), "--dry-run", "--set", "learner.micro_batches=1"])
    whole = _report(capsys)
    main(["--config", str(CONFIG), "--dry-run", "--set", "learner.micro_batches=4"])
    micro = _report(capsys)
    assert 3.5 < whole["activations"] / micro["activations"] < 4.5
    assert abs(micro["grads"] - 2 * whole["grads"]) < 0.01  # GiB, as reported (3 decimals)


def _budget(*overrides: str) -> dict[str, float]:
    """The estimate (GiB) of the 7B config at 8,192 tokens, one row per device."""
    cfg = load(CONFIG, ["learner.length_buckets=[8192]", *overrides])
    return {k: v / dryrun.GIB for k, v in dryrun.budget(cfg, 8).items() if k[0] != "_"}


def test_remat_dense_attention_and_whole_logits_cost_what_the_formulas_say():
    full = _budget("learner.remat=full")
    none = _budget("learner.remat=none")["activations"]
    assert full["activations"] < _budget("learner.remat=dots_no_batch")["activations"] < none
    # remat none at 8,192 tokens, one row: 28 layers x 8,192 x 2 B x (4 x 3,584 + (28 + 8) x 128
    # + 28 x 128 + 4 x 18,944) = 28 x 8,192 x 2 x 98,304 B = 42 GiB of saved activations
    assert 42 < none < 42.1
    # remat full keeps each block's input: 28 x 8,192 x 3,584 x 2 B = 1.53 GiB
    assert full["activations"] == pytest.approx(1.53, abs=0.01)
    # dense: + 28 heads x 8,192^2 x (4 + 2) B per layer = 10.5 GiB, for each of 28 layers
    dense = _budget("learner.remat=none", "learner.attention=dense")["activations"]
    assert dense - none == pytest.approx(28 * 10.5, abs=0.1)
    # unchunked: two f32 (8,192 x 152,064) logit arrays = 9.3 GiB in the unembedding phase,
    # instead of two of 1,024 positions (1.2 GiB)
    whole = _budget("learner.remat=full", "learner.logprob_chunk=0")["working"]
    assert whole - full["working"] == pytest.approx(9.28 - 1.16, abs=0.05)


def test_the_14b_preset_has_qwen25_14b_s_shape():
    cfg = load(CONFIG, ["learner.model=/models/Qwen2.5-14B-Instruct"])
    mc = dryrun.model_config(cfg)
    assert (mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads) == (48, 5120, 40, 8)
    # 48 x (5,120 x (40 + 2 x 8) x 128 + 40 x 128 x 5,120 + 3 x 5,120 x 13,824 + 7,168 + 10,240)
    # + 2 x 152,064 x 5,120 + 5,120 = 14.77e9 (Qwen's model card: 14.7B)
    assert dryrun.budget(cfg, 8)["_params_total"] == pytest.approx(14.77e9, rel=2e-3)


def test_max_length_by_the_estimate_is_the_longest_row_that_fits(capsys):
    assert main(["--config", str(CONFIG), "--dry-run", "--max-length"]) == 0
    r = _report(capsys, "max_length")
    assert r["by"] == "estimate" and r["length"] % dryrun.LENGTH_STEP == 0
    probes = {int(k): v for k, v in r["probes_gib"].items()}
    assert probes[r["length"]] <= 80 if r["length"] else True
    longer = [v for k, v in probes.items() if k > r["length"]]
    assert all(v > 80 for v in longer)


def test_the_abstract_batch_has_pack_s_keys_and_the_step_s_shapes():
    cfg = load(TINY, ["learner.packing=true"])
    batch = dryrun.abstract_batch(cfg, 16, 640, None)
    assert batch["tokens_bt"].shape == (16, 640) and batch["segment_bt"].dtype == "int32"
    assert batch["adv_bt"].shape == (16, 640)
    unpacked = dryrun.abstract_batch(load(TINY, ["learner.packing=false"]), 16, 640, None)
    assert unpacked["adv_b"].shape == (16,) and unpacked["mask_bt"].dtype == "float32"


def test_compile_and_max_length_need_dry_run():
    with pytest.raises(SystemExit):
        main(["--config", str(TINY), "--compile"])


# ----------------------------------------------------------------------------- the compiler


@pytest.mark.multiprocess
def test_compile_on_simulated_devices_prints_xla_s_figures():
    """A fresh process gets its 4 devices from ``jax_num_cpu_devices`` (no XLA_FLAGS)."""
    rc, lines = _run([*TINY_4, "--dry-run", "--compile"])
    assert rc == 0, lines
    r = json.loads(lines[-1])["dry_run"]
    c = r["compiled"]
    for key in ("argument_gib", "output_gib", "temp_gib", "peak_gib", "compile_s"):
        assert c[key] > 0, key
    assert c["peak_gib"] >= c["temp_gib"] and c["fits"]
    assert "re-running" not in "\n".join(lines)  # no child was needed
    assert any(line.startswith("compiled in") for line in lines)


@pytest.mark.multiprocess
def test_compile_reruns_itself_when_the_backend_already_has_too_few_devices(capsys):
    """Here the backend has started with fewer devices than asked for: the command runs
    again in a child with simulated ones, and its output comes through."""
    present = len(jax.devices("cpu"))  # starts the backend, as a long-lived process would have
    n = present + 1
    args = [*TINY_4, "--set", f"mesh.num_devices={n}", "--set", "mesh.fsdp=-1",
            "--dry-run", "--compile"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"re-running with {n} simulated CPU devices" in out
    r = json.loads(out.strip().splitlines()[-1])["dry_run"]
    assert r["compiled"]["peak_gib"] > 0
    assert len(jax.devices("cpu")) == present  # this process is untouched


@pytest.mark.multiprocess
def test_the_estimate_is_within_a_quarter_of_the_compiled_peak_on_a_small_config():
    """The tiny model, bf16, 2 rows x 1,024 tokens per device, no remat and dense attention
    (the shape where activations, not the state, dominate the step's memory)."""
    args = [*TINY_4, "--set", "learner.remat=none", "--set", "learner.attention=dense"]
    _, lines = _run([*args, "--dry-run", "--compile"])
    c = json.loads(lines[-1])["dry_run"]["compiled"]
    assert 0.75 < c["estimate_gib"] / c["peak_gib"] < 1.25, c


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("length", [1024, 8192, 32768])
def test_the_7b_estimate_is_within_a_quarter_of_the_compiled_peak(length):
    """The project's acceptance check: Qwen2.5-7B, fsdp over 8 simulated devices, bf16
    compute, f32 parameters and Adam, one row per device (the config's 32 rows in 4
    micro-batches)."""
    args = ["--config", str(CONFIG), "--set", f"learner.length_buckets=[{length}]",
            "--dry-run", "--compile"]  # fmt: skip
    _, lines = _run(args)
    c = json.loads(lines[-1])["dry_run"]["compiled"]
    assert 0.75 < c["estimate_gib"] / c["peak_gib"] < 1.25, c
    assert c["peak_gib"] <= 80, c  # one row of up to 32k tokens per device fits 8 x 80 GB


# XLA:GPU's compiled peak of the 7B config's step on one H200 (peak_memory_in_bytes), one
# row of L tokens per micro-batch as on its 8-device mesh, the state unsharded: `python
# bench/gpu.py --only dryrun`, 2026-12-04 (jax 0.11.2 for CUDA 13). GiB.
XLA_GPU_PEAK_7B_ONE_DEVICE = {8192: 141.21, 32768: 154.02}


@pytest.mark.parametrize("length", sorted(XLA_GPU_PEAK_7B_ONE_DEVICE))
def test_the_accelerator_estimate_is_within_a_quarter_of_xla_gpu_s_peak(length):
    """The estimate as an accelerator lays the step out (the figure the dry run prints
    first), against XLA:GPU's compiled peak of the same step measured on an H200; and the
    part that grows with the length (activations and working set, 8k -> 32k) within a
    quarter of XLA:GPU's growth too, so the state's size cannot hide an activation error."""
    sets = [f"learner.length_buckets=[{length}]", "mesh.num_devices=1", "mesh.fsdp=1",
            "mesh.data=1", "learner.micro_batches=32"]  # fmt: skip
    est = dryrun.estimate_total(dryrun.budget(load(CONFIG, sets), 1, backend="gpu")) / 2**30
    assert 0.75 < est / XLA_GPU_PEAK_7B_ONE_DEVICE[length] < 1.25, est
    if length == 32768:
        short = [x.replace("32768", "8192") for x in sets]
        est_8k = dryrun.estimate_total(dryrun.budget(load(CONFIG, short), 1, "gpu")) / 2**30
        xla = XLA_GPU_PEAK_7B_ONE_DEVICE[32768] - XLA_GPU_PEAK_7B_ONE_DEVICE[8192]
        assert 0.75 < (est - est_8k) / xla < 1.25, (est - est_8k, xla)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_qwen3_8b_config_compiles_and_fits_at_32k():
    """configs/qwen3-8b-8xh100.toml (the Qwen3-8B preset: q/k norms, no biases) at its
    research length: the real step compiled for 8 simulated devices fits 80 GB and the
    estimate is within a quarter of XLA's figure."""
    args = ["--config", str(REPO / "configs" / "qwen3-8b-8xh100.toml"), "--dry-run", "--compile"]
    _, lines = _run(args)
    r = json.loads(lines[-1])["dry_run"]
    c = r["compiled"]
    assert c["peak_gib"] <= 80 and r["fits"], r
    assert 0.75 < c["estimate_gib"] / c["peak_gib"] < 1.25, c
    assert any("32768 tokens per device" in line for line in lines)


@pytest.mark.multiprocess
def test_compile_as_two_processes_joined_by_jax_distributed():
    """``mesh.num_processes = 2`` and no coordinator: the dry run starts 2 processes of 2
    simulated devices each, joined on loopback; each compiles the step over all 4 devices
    (a mesh spanning both), and the per-device figures are those of the same step compiled
    in one process of 4 devices."""
    rc, lines = _run([*TINY_4, "--set", "mesh.num_processes=2", "--dry-run", "--compile"])
    assert rc == 0, lines
    assert "2 processes of 2 simulated CPU devices each" in "\n".join(lines)
    two = json.loads(lines[-1])["dry_run"]
    assert two["processes"] == 2
    rc, lines = _run([*TINY_4, "--dry-run", "--compile"])
    one = json.loads(lines[-1])["dry_run"]
    assert one["processes"] == 1
    for key in ("argument_gib", "output_gib"):  # the state and batch: sharded alike
        assert two["compiled"][key] == pytest.approx(one["compiled"][key], rel=0.02), key
    assert two["compiled"]["peak_gib"] == pytest.approx(one["compiled"]["peak_gib"], rel=0.1)


def test_processes_need_a_device_count_they_divide(capsys):
    args = [*TINY_4, "--set", "mesh.num_devices=3", "--set", "mesh.fsdp=-1",
            "--set", "mesh.num_processes=2", "--dry-run", "--compile"]  # fmt: skip
    with pytest.raises(SystemExit, match=r"multiple of mesh\.num_processes"):
        main(args)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_14b_config_compiles_in_two_processes_and_fits_at_32k():
    """configs/qwen2.5-14b-2x8xh100.toml: Qwen2.5-14B on 2 nodes of 8 GPUs, 32k tokens per
    row, compiled as 2 processes of 8 simulated devices joined by jax.distributed: XLA's
    per-device peak fits 80 GB and the estimate is within a quarter of it."""
    args = ["--config", str(REPO / "configs" / "qwen2.5-14b-2x8xh100.toml"), "--dry-run",
            "--compile"]  # fmt: skip
    _, lines = _run(args, timeout=1200)
    r = json.loads(lines[-1])["dry_run"]
    c = r["compiled"]
    assert r["processes"] == 2, r
    assert c["peak_gib"] <= 80 and r["fits"], r
    assert 0.75 < c["estimate_gib"] / c["peak_gib"] < 1.25, c
