"""Batch packing (hand-derived arrays) and the train step (same result on every mesh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from learner.training.batching import bucket_for, pack
from shared.wire import TrajectoryGroup, decode_groups, encode_groups
from tests.learner.helpers import trajectory as _traj

REPO = Path(__file__).resolve().parents[3]


def test_bucket_is_the_smallest_that_fits():
    assert bucket_for(3, (4, 8)) == 4
    assert bucket_for(4, (4, 8)) == 4
    assert bucket_for(5, (4, 8)) == 8
    assert bucket_for(50, (4, 8)) == 8  # longer rows are truncated to the largest bucket


def test_pack_shifts_for_next_token_and_drops_flat_groups():
    # group a: rewards (1, 0): mean 0.5, std 0.5 -> advantages (+1, -1) (eps 1e-6 aside)
    a = TrajectoryGroup(
        "a",
        "t",
        [
            _traj("a", 0, [5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -0.5, -0.25], 1.0),
            _traj("a", 1, [5, 6, 9], [0, 1, 1], [0, -1.0, -2.0], 0.0),
        ],
    )
    # group b: rewards (1, 1): no variance -> dropped, its rows become padding
    b = TrajectoryGroup(
        "b", "t", [_traj("b", i, [1, 2, 3], [0, 1, 1], [0, -1, -1], 1.0) for i in range(2)]
    )
    p = pack([b, a], rows=6, buckets=(2, 4, 8), adv_ddof=0)
    x = p.arrays
    # longest sequence has 4 tokens -> 3 prediction positions -> bucket 4
    assert p.shape == (6, 4)
    # row 0 = a/0: inputs 5 6 7 predict 6 7 8; mask/logprobs are those of the targets
    np.testing.assert_array_equal(x["tokens_bt"][0], [5, 6, 7, 0])
    np.testing.assert_array_equal(x["targets_bt"][0], [6, 7, 8, 0])
    np.testing.assert_array_equal(x["mask_bt"][0], [0, 1, 1, 0])
    np.testing.assert_allclose(x["rollout_logp_bt"][0], [0, -0.5, -0.25, 0])
    np.testing.assert_array_equal(x["attn_bt"][0], [1, 1, 1, 0])
    np.testing.assert_array_equal(x["positions_bt"][0], [0, 1, 2, 3])
    # row 1 = a/1: inputs 5 6 predict 6 9
    np.testing.assert_array_equal(x["tokens_bt"][1], [5, 6, 0, 0])
    np.testing.assert_array_equal(x["targets_bt"][1], [6, 9, 0, 0])
    np.testing.assert_array_equal(x["mask_bt"][1], [1, 1, 0, 0])
    np.testing.assert_allclose(x["rollout_logp_bt"][1], [-1.0, -2.0, 0, 0])
    np.testing.assert_allclose(x["adv_b"], [1, -1, 0, 0, 0, 0], atol=1e-5)
    # rows 2..5 are padding: nothing trained on
    assert x["mask_bt"][2:].sum() == 0 and x["attn_bt"][2:].sum() == 0
    assert p.group_ids == ["b", "a"]  # both consumed, though b is dropped
    assert p.stats["groups_kept"] == 1 and p.stats["loss_tokens"] == 4
    assert p.stats["reward"] == pytest.approx(3 / 4)  # (1 + 0 + 1 + 1) / 4
    assert "old_logp_bt" not in x
    assert "old_logp_bt" in pack([a], rows=2, buckets=(4,), with_old_logp=True).arrays


def test_pack_masks_stale_tokens_and_truncates():
    # rewards (2, 0): Dr. GRPO (no std division): advantages r - mean = (+1, -1)
    g = TrajectoryGroup(
        "g",
        "t",
        [
            _traj("g", 0, [1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 1, 1], [0] * 6, 2.0, [0, 3, 3, 1, 5, 5]),
            _traj("g", 1, [1, 2], [0, 1], [0, 0], 0.0, [0, 5]),
        ],
    )
    # policy 5, staleness 2: versions < 3 are stale -> the target at position 3 (version 1)
    p = pack([g], rows=2, buckets=(2, 4), scale_rewards=False, policy_version=5, max_staleness=2)
    assert p.shape == (2, 4)  # 5 prediction positions, truncated to the largest bucket
    np.testing.assert_array_equal(p.arrays["targets_bt"][0], [2, 3, 4, 5])
    np.testing.assert_array_equal(p.arrays["mask_bt"][0], [1, 1, 0, 1])
    np.testing.assert_allclose(p.arrays["adv_b"], [1, -1])
    assert p.stats["stale_tokens"] == 1


def test_pack_drops_groups_whose_values_went_bad_in_transit(caplog):
    def group(gid):
        return TrajectoryGroup(
            gid, "t", [_traj(gid, i, [1, 2, 3], [0, 1, 1], [0, -1, -2], float(i)) for i in range(2)]
        )

    msg = bytearray(encode_groups([group("good"), group("nan"), group("mask")]))
    base = np.frombuffer(msg, np.uint8).ctypes.data

    def offset_of(arr):  # where a decoded (zero-copy) column lies in the message
        return arr.__array_interface__["data"][0] - base

    # Decoding checks structure; the per-token values are the packer's to check.
    groups = decode_groups(msg)
    lp_at = offset_of(groups[1].columns["logprobs"]) + 4
    mask_at = offset_of(groups[2].columns["loss_mask"])
    msg2 = bytearray(msg)
    msg2[lp_at : lp_at + 4] = np.array([np.nan], np.float32).tobytes()
    msg2[mask_at] = 3
    bad = decode_groups(bytes(msg2))
    with caplog.at_level("WARNING", logger="learner.training.batching"):
        p = pack(bad, rows=6, buckets=(4,))
    assert p.stats["invalid_groups"] == 2 and p.stats["groups_kept"] == 1
    assert p.group_ids == ["good", "nan", "mask"]  # all consumed: not served again
    assert np.isfinite(p.arrays["rollout_logp_bt"]).all() and p.arrays["mask_bt"][2:].sum() == 0
    assert "nan" in caplog.text and "logprobs are not all finite" in caplog.text
    assert "loss_mask holds values" in caplog.text


def test_pack_refuses_more_trajectories_than_rows():
    g = TrajectoryGroup(
        "g", "t", [_traj("g", i, [1, 2], [0, 1], [0, 0], float(i)) for i in range(4)]
    )
    with pytest.raises(ValueError, match="do not fit"):
        pack([g], rows=2, buckets=(4,))


@pytest.mark.multiprocess
def test_one_step_is_the_same_on_every_mesh(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    subprocess.run(
        [sys.executable, "-m", "tests.learner.step_child", str(tmp_path)],
        cwd=REPO,
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
    )
    ref = np.load(tmp_path / "single.npz")
    params = [k for k in ref.files if k.startswith("p.")]
    assert len(params) > 10 and float(ref["m.grad_norm"]) > 0
    for name in ("data8", "fsdp8", "d2f2t2", "single_micro4", "data4_micro4"):
        got = np.load(tmp_path / f"{name}.npz")
        assert sorted(got.files) == sorted(ref.files)
        for k in [f for f in ref.files if f.startswith("m.")]:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")
        for k in params:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_process_of_eight(tmp_path):
    """jax.distributed on loopback: 2 learner processes x 4 CPU devices give the
    single-process 8-device result of the same step."""
    eight = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    subprocess.run(
        [sys.executable, "-m", "tests.learner.step_child", str(tmp_path)],
        cwd=REPO, env=eight, check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    four = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.learner.dist_child", coordinator, str(i), str(tmp_path)],
            cwd=REPO,
            env=four,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    ref = np.load(tmp_path / "d2f2t2.npz")
    got = np.load(tmp_path / "dist.npz")
    assert sorted(got.files) == sorted(ref.files)
    for k in ref.files:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_micro_batches_cut_the_compiled_steps_scratch_memory():
    """XLA's own accounting of the compiled step: with 4 micro-batches its temporaries
    (logits, their log-softmax and gradients, activations) are about a quarter."""
    import jax
    from flax import nnx

    from learner.model.params import Model, tiny_config
    from learner.training.sharding import make_mesh
    from learner.training.step import compile_step, new_state, place_batch
    from shared.config import LearnerConfig, MeshConfig

    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    model = Model(tiny_config(num_layers=2), rngs=nnx.Rngs(0))
    b, t = 16, 256
    rng = np.random.default_rng(0)
    batch = {
        "tokens_bt": rng.integers(0, 200, (b, t)).astype(np.int32),
        "targets_bt": rng.integers(0, 200, (b, t)).astype(np.int32),
        "positions_bt": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        "attn_bt": np.ones((b, t), np.int32),
        "mask_bt": np.ones((b, t), np.float32),
        "rollout_logp_bt": np.zeros((b, t), np.float32),
        "adv_b": np.ones(b, np.float32),
    }
    temp = {}
    for micro in (1, 4):
        cfg = LearnerConfig(kl_coef=0.1, micro_batches=micro)
        state, sh = new_state(model, mesh, cfg)
        lowered = compile_step(model, mesh, cfg, sh).lower(state, place_batch(batch, mesh))
        temp[micro] = lowered.compile().memory_analysis().temp_size_in_bytes
    assert temp[4] < 0.4 * temp[1], temp


def test_micro_batches_must_divide_the_rows():
    from learner.training.step import micro_batches

    x = {"adv_b": np.arange(12.0)}
    split = micro_batches(x, 4)["adv_b"]
    assert split.shape == (4, 3)
    np.testing.assert_array_equal(split[1], [1, 5, 9])  # strided: spread over devices
    with pytest.raises(ValueError, match="12 rows do not split into 5 micro-batches"):
        micro_batches(x, 5)


def test_reference_logprobs_given_with_the_batch_replace_the_reference_forward():
    """A batch carrying ``ref_logp_bt`` (the reference's logprobs, computed elsewhere) gives
    the update of the step that runs the reference itself, and its program has no second
    forward pass (fewer matmuls)."""
    import jax
    import jax.numpy as jnp

    from learner.model.params import get_params
    from learner.training.step import init_state, token_logprobs, train_step
    from shared.config import LearnerConfig
    from tests.learner.helpers import small_model

    model = small_model(seed=2)
    rng = np.random.default_rng(0)
    trajs = [
        _traj(
            "g", i, rng.integers(3, 4096, 24), rng.random(24) < 0.7, -rng.random(24), float(i % 2)
        )
        for i in range(4)
    ]
    arrays = pack([TrajectoryGroup("g", "t", trajs)], rows=4, buckets=(32,)).arrays
    batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    # The layer scan, as when this test was written: both programs then run one block body,
    # so their float rounding agrees to the tolerance below. Unrolled, XLA fuses the two
    # programs' blocks differently, and Adam's first step (g / (|g| + eps)) turns rounding
    # in the smallest embedding gradients into differences of up to ~1e-5.
    cfg = LearnerConfig(kl_coef=0.5, warmup_steps=0, learning_rate=1e-2, scan_layers=True)
    params = get_params(model)
    # the reference drifted from the policy: a KL term that matters
    ref = {k: v * 1.05 for k, v in params.items()}
    state = init_state(params, cfg)._replace(ref_params=ref)
    step = jax.jit(lambda s, b: train_step(s, b, model=model, cfg=cfg))
    s_inside, m_inside = step(state, batch)
    given = dict(batch, ref_logp_bt=token_logprobs(model, ref, batch, cfg)[0])
    s_given, m_given = step(init_state(params, cfg)._replace(ref_params=ref), given)
    assert float(m_inside["kl_ref"]) > 1e-3
    np.testing.assert_allclose(float(m_given["kl_ref"]), float(m_inside["kl_ref"]), rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(s_given.params[k], s_inside.params[k], atol=1e-6, err_msg=k)
    no_ref = init_state(params, cfg, with_ref=False)

    def dots(s, b):
        return step.lower(s, b).as_text().count("dot_general")

    assert dots(no_ref, given) < dots(state, batch)


def test_the_constant_schedule_holds_the_peak_after_the_warm_up():
    from learner.training.step import lr_schedule
    from shared.config import LearnerConfig

    const = lr_schedule(LearnerConfig(lr_schedule="constant", warmup_steps=4, learning_rate=1e-3))
    assert [float(const(s)) for s in (0, 2, 4, 100, 10_000)] == pytest.approx(
        [0.0, 5e-4, 1e-3, 1e-3, 1e-3]
    )
    flat = lr_schedule(LearnerConfig(lr_schedule="constant", warmup_steps=0, learning_rate=2e-4))
    assert float(flat(0)) == pytest.approx(2e-4) and float(flat(999)) == pytest.approx(2e-4)
    cosine = lr_schedule(LearnerConfig(warmup_steps=0, steps=100, learning_rate=1e-3))
    assert float(cosine(100)) == pytest.approx(1e-4)  # the default decays to 0.1 x the peak


def test_the_steps_logprobs_are_at_the_sampling_temperature():
    """learner.temperature = 0.5: the step's logprobs are log_softmax(logits / 0.5) of the
    model's logits (computed here by hand), so rollout logprobs an engine reported at 0.5
    give a ratio of exactly 1 on the first step; at 1 (the SFT's temperature) the same
    batch's ratio is far from 1. The config resolves an unset learner.temperature to
    inference.temperature (1 when that is greedy)."""
    import jax
    import jax.numpy as jnp

    from learner.model.params import get_params
    from learner.training.step import init_state, token_logprobs, train_step
    from shared.config import LearnerConfig, load
    from tests.learner.helpers import forward, small_model

    model = small_model(seed=3)
    rng = np.random.default_rng(1)
    trajs = [
        _traj("g", i, rng.integers(3, 4096, 20), rng.random(20) < 0.7, -rng.random(20), float(i))
        for i in range(4)
    ]
    arrays = pack([TrajectoryGroup("g", "t", trajs)], rows=4, buckets=(32,)).arrays
    batch = {k: jnp.asarray(v) for k, v in arrays.items()}
    cold = LearnerConfig(warmup_steps=0, learning_rate=1e-2, temperature=0.5)
    logits = np.asarray(forward(model, batch["tokens_bt"], batch["positions_bt"]), np.float64)
    z = logits / 0.5
    z -= z.max(-1, keepdims=True)
    by_hand = np.take_along_axis(z, np.asarray(batch["targets_bt"])[..., None], -1)[..., 0]
    by_hand -= np.log(np.exp(z).sum(-1))
    params = get_params(model)
    got = np.asarray(token_logprobs(model, params, batch, cold)[0])
    mask = np.asarray(batch["attn_bt"]) > 0
    np.testing.assert_allclose(got[mask], by_hand[mask], atol=2e-4)
    at_one = np.asarray(token_logprobs(model, params, batch, cold, temperature=1.0)[0])
    assert np.abs(at_one - got)[mask].mean() > 0.1  # the SFT's: another distribution

    sampled = dict(batch, old_logp_bt=jnp.asarray(got), rollout_logp_bt=jnp.asarray(got))
    for cfg, ratio_is_one in (
        (cold, True),
        (LearnerConfig(warmup_steps=0, temperature=1.0), False),
    ):
        _, m = jax.jit(lambda s, b, c=cfg: train_step(s, b, model=model, cfg=c))(
            init_state(params, cfg), sampled
        )
        spread = max(abs(float(m["ratio_max"]) - 1), abs(float(m["ratio_min"]) - 1))
        assert (spread < 1e-3) == ratio_is_one, (cfg.temperature, spread)

    assert load(None, ["inference.temperature=0.5"]).learner.temperature == 0.5
    assert load(None, ["inference.temperature=0"]).learner.temperature == 1.0
    both = ["inference.temperature=0.5", "learner.temperature=0.8"]
    assert load(None, both).learner.temperature == 0.8


@pytest.mark.parametrize("micro", [1, 2])
def test_the_reference_program_gives_the_whole_batch_s_logprobs_in_row_order(micro):
    """``compile_reference`` (the reference run before the step, micro-batch by
    micro-batch as the step runs its own) gives the logprobs of one forward pass over
    the whole batch, row for row; with no KL term it refuses."""
    import jax

    from learner.model.params import get_params
    from learner.training.sharding import make_mesh
    from learner.training.step import compile_reference, new_state, place_batch, token_logprobs
    from shared.config import LearnerConfig, MeshConfig
    from tests.learner.helpers import small_model

    model = small_model(seed=3)
    rng = np.random.default_rng(1)
    trajs = [
        _traj("g", i, rng.integers(3, 4096, 20 + 3 * i), rng.random(20 + 3 * i) < 0.7,
              -rng.random(20 + 3 * i), float(i % 2))
        for i in range(4)
    ]  # fmt: skip
    arrays = pack([TrajectoryGroup("g", "t", trajs)], rows=4, buckets=(32,)).arrays
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    cfg = LearnerConfig(kl_coef=0.1, micro_batches=micro)
    state, sh = new_state(model, mesh, cfg)
    got = compile_reference(model, mesh, cfg, sh)(state.ref_params, place_batch(arrays, mesh))
    want = token_logprobs(model, get_params(model), arrays, cfg)[0]
    assert got.shape == want.shape == arrays["tokens_bt"].shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    with pytest.raises(ValueError, match="kl_coef is 0"):
        compile_reference(model, mesh, LearnerConfig())


def test_the_trainer_runs_the_reference_where_the_config_says_with_the_same_updates(tmp_path):
    """``learner.reference_forward``: ``separate`` runs the reference as a program of its
    own before each step, ``on_arrival`` that program on each pull's groups as they come
    (one group per pull here), ``in_step`` inside the step; two steps of each give the
    same KL terms and losses."""
    from learner.training.loop import Trainer
    from shared.config import from_dict
    from tests.learner.helpers import ListSource
    from tests.learner.step_child import groups as make_groups

    metrics, sources = {}, {}
    for where in ("separate", "on_arrival", "in_step"):
        cfg = from_dict(
            {
                "rollout": {"urls": ["http://unused"], "group_size": 4},
                "learner": {"groups_per_step": 2, "steps": 2, "length_buckets": [16, 32],
                            "warmup_steps": 0, "kl_coef": 0.5, "reference_forward": where},
                "logging": {"trackers": ["jsonl"], "progress": False},
            }
        )  # fmt: skip
        trainer = Trainer(cfg, tmp_path / where)
        assert (trainer.ref_fn is not None) == (where != "in_step")
        assert (trainer.arrival is not None) == (where == "on_arrival")
        sources[where] = ListSource(make_groups(0, 4, 4), per_pull=1)
        trainer.run(sources[where])
        trainer.close()
        lines = (tmp_path / where / "metrics.jsonl").read_text().splitlines()
        metrics[where] = [json.loads(x) for x in lines if '"loss"' in x]
    assert [m["step"] for m in metrics["separate"]] == [1, 2]
    assert metrics["separate"][1]["kl_ref"] > 1e-5  # one update moved the policy: a KL term
    # on arrival: a pull per group, and the reference run on the kept ones in chunks of
    # the rows of a group (4, rounded up to the devices' multiple)
    assert sources["on_arrival"].pulls == [[f"group0-{k}"] for k in range(4)]
    for m in metrics["on_arrival"]:
        assert m["groups_kept"] >= 1 and m["ref_chunks"] >= 1
        assert m["ref_trajectories"] == 4 * m["groups_kept"]
    for where in ("separate", "on_arrival"):
        for a, b in zip(metrics[where], metrics["in_step"], strict=True):
            for key in ("loss", "kl_ref"):
                np.testing.assert_allclose(
                    a[key], b[key], rtol=1e-4, atol=1e-7, err_msg=f"{where} {key}"
                )
