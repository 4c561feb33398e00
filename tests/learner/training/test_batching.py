"""Sequence packing: the layout (hand-derived), its invariants on random groups, and a GRPO
loss and gradient equal to the unpacked layout's for every aggregation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.training.batching import advantages, first_fit_decreasing, pack
from learner.training.grpo import grpo_loss
from shared.wire import TrajectoryGroup
from tests.learner.helpers import trajectory as _traj


def _small_groups() -> list[TrajectoryGroup]:
    # a: rewards (1, 0) -> advantages (+1, -1); b: rewards (0, 1) -> (-1, +1) (eps aside).
    # lengths 5, 3 | 3, 2 -> prediction positions 4, 2 | 2, 1 (9 in all)
    a = TrajectoryGroup(
        "a",
        "t",
        [
            _traj("a", 0, [10, 11, 12, 13, 14], [0, 1, 1, 0, 1], [0, -1, -2, -3, -4], 1.0),
            _traj("a", 1, [20, 21, 22], [0, 1, 1], [0, -5, -6], 0.0),
        ],
    )
    b = TrajectoryGroup(
        "b",
        "t",
        [
            _traj("b", 0, [30, 31, 32], [0, 0, 1], [0, -7, -8], 0.0),
            _traj("b", 1, [40, 41], [0, 1], [0, -9], 1.0),
        ],
    )
    return [a, b]


def test_first_fit_decreasing_places_longest_first():
    # sizes 2, 4, 1, 2 into 2 rows of 4: 4 -> row 0 (col 0); 2 -> row 1 (col 0);
    # 2 -> row 1 (col 2); 1 -> no room left anywhere -> None; empty items take no room
    assert first_fit_decreasing([2, 4, 1, 2], 2, 4) is None
    assert first_fit_decreasing([2, 4, 2, 0], 2, 4) == [(1, 0, 1), (0, 0, 1), (1, 2, 2), (-1, 0, 0)]


def test_packed_layout_by_hand():
    # sizes a0 4, a1 2, b0 2, b1 1 in 3 rows of bucket 4 (the longest, 4 positions, fits 4):
    # FFD: a0 -> row 0; a1 -> row 1 cols 0-1; b0 -> row 1 cols 2-3; b1 -> row 2
    p = pack(_small_groups(), rows=3, buckets=(4, 8), packing=True, adv_ddof=0)
    x = p.arrays
    assert p.shape == (3, 4)
    np.testing.assert_array_equal(
        x["tokens_bt"], [[10, 11, 12, 13], [20, 21, 30, 31], [40, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        x["targets_bt"], [[11, 12, 13, 14], [21, 22, 31, 32], [41, 0, 0, 0]]
    )
    np.testing.assert_array_equal(x["segment_bt"], [[1, 1, 1, 1], [1, 1, 2, 2], [1, 0, 0, 0]])
    np.testing.assert_array_equal(x["positions_bt"], [[0, 1, 2, 3], [0, 1, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(x["attn_bt"], [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    # masks and logprobs of the targets (shifted left by one)
    np.testing.assert_array_equal(x["mask_bt"], [[1, 1, 0, 1], [1, 1, 0, 1], [1, 0, 0, 0]])
    np.testing.assert_allclose(
        x["rollout_logp_bt"], [[-1, -2, -3, -4], [-5, -6, -7, -8], [-9, 0, 0, 0]]
    )
    np.testing.assert_allclose(
        x["adv_bt"], [[1, 1, 1, 1], [-1, -1, -1, -1], [1, 0, 0, 0]], atol=1e-5
    )
    assert "adv_b" not in x and "old_logp_bt" not in x
    # Dr. GRPO normaliser: 3 rows x bucket 4 in every row
    np.testing.assert_array_equal(x["loss_constant_b"], [12, 12, 12])
    # 9 real positions of 3 x 4 cells
    assert p.stats["packing_efficiency"] == pytest.approx(9 / 12)
    assert p.stats["rows_used"] == 3 and p.stats["bucket"] == 4


def test_falls_back_to_a_larger_bucket_then_refuses():
    # 2 rows of 4 hold a0 (row 0) and a1 + b0 (row 1) but not b1 -> bucket 8:
    # a0 cols 0-3, a1 cols 4-5, b0 cols 6-7 of row 0; b1 in row 1
    p = pack(_small_groups(), rows=2, buckets=(4, 8), packing=True)
    x = p.arrays
    assert p.shape == (2, 8)
    np.testing.assert_array_equal(x["segment_bt"], [[1, 1, 1, 1, 2, 2, 3, 3], [1] + [0] * 7])
    np.testing.assert_array_equal(x["positions_bt"][0], [0, 1, 2, 3, 0, 1, 0, 1])
    np.testing.assert_array_equal(x["tokens_bt"][0], [10, 11, 12, 13, 20, 21, 30, 31])
    # the normaliser stays that of the unpacked layout (bucket 4): 2 rows x 4
    np.testing.assert_array_equal(x["loss_constant_b"], [8, 8])
    assert p.stats["packing_efficiency"] == pytest.approx(9 / 16) and p.stats["rows_used"] == 2
    # one row of the largest bucket (8) holds 8 of the 9 positions: refused
    with pytest.raises(ValueError, match="do not fit"):
        pack(_small_groups(), rows=1, buckets=(4, 8), packing=True)
    # unpacked, 4 trajectories never fit in 2 rows
    with pytest.raises(ValueError, match="do not fit"):
        pack(_small_groups(), rows=2, buckets=(4, 8))


def test_unpacked_rows_get_one_segment_and_the_row_advantage():
    p = pack(_small_groups(), rows=5, buckets=(4, 8), adv_ddof=0)
    x = p.arrays
    np.testing.assert_array_equal(x["segment_bt"], x["attn_bt"])
    np.testing.assert_allclose(x["adv_b"], [1, -1, -1, 1, 0], atol=1e-5)
    assert "adv_bt" not in x
    np.testing.assert_array_equal(x["loss_constant_b"], [20] * 5)  # = mask_bt.size
    # 9 real positions of 5 x 4 cells, 4 rows holding a trajectory
    assert p.stats["packing_efficiency"] == pytest.approx(9 / 20) and p.stats["rows_used"] == 4


def test_packed_staleness_and_old_logprobs_are_per_token():
    # policy 5, staleness 2: versions < 3 are stale; a0's target 2 (version 1) is masked
    g = TrajectoryGroup(
        "g",
        "t",
        [
            _traj("g", 0, [1, 2, 3, 4], [0, 1, 1, 1], [0, -1, -2, -3], 1.0, [0, 5, 1, 5]),
            _traj("g", 1, [5, 6], [0, 1], [0, -4], 0.0, [0, 1]),  # its only target is stale
        ],
    )
    p = pack([g], rows=1, buckets=(4, 8), policy_version=5, max_staleness=2,
             with_old_logp=True, packing=True)  # fmt: skip
    x = p.arrays
    assert p.shape == (1, 4)  # 3 + 1 positions fill one row of 4
    np.testing.assert_array_equal(x["segment_bt"][0], [1, 1, 1, 2])
    np.testing.assert_array_equal(x["mask_bt"][0], [1, 0, 1, 0])
    np.testing.assert_array_equal(x["old_logp_bt"], x["rollout_logp_bt"])
    np.testing.assert_allclose(x["old_logp_bt"][0], [-1, -2, -3, -4])
    assert p.stats["stale_tokens"] == 2 and p.stats["loss_tokens"] == 2


# ----------------------------------------------------------------------------- random groups

ID = 1000  # a target's id: trajectory * ID + position, carried as its rollout logprob (-id)


def _random_groups(seed: int, n_groups: int = 8, g: int = 4, max_len: int = 60):
    """Random groups; each target's rollout logprob is -(its id), so a layout can be read back."""
    rng = np.random.default_rng(seed)
    groups, j = [], 0
    for k in range(n_groups):
        trajs = []
        rewards = rng.integers(0, 3, g).astype(float) if k % 4 else np.ones(g)  # some flat
        for i in range(g):
            n = int(rng.integers(1, max_len + 1))
            ids = -(j * ID + np.arange(n, dtype=np.float32))
            trajs.append(
                _traj(f"g{k}", i, rng.integers(3, 500, n), rng.random(n) < 0.6, ids, rewards[i])
            )
            j += 1
        groups.append(TrajectoryGroup(f"g{k}", "t", trajs))
    return groups


def _ids(x: dict[str, np.ndarray]) -> np.ndarray:
    """Each cell's target id (0 on padding: a real target is never position 0)."""
    return np.where(x["attn_bt"] > 0, -x["rollout_logp_bt"], 0).astype(np.int64)


def _kept_targets(groups, t: int) -> list[int]:
    """The id of every prediction target of every kept trajectory (truncated to t)."""
    _, keep = advantages(groups)
    out, j = [], 0
    for grp, k in zip(groups, keep, strict=True):
        for length in grp.lengths:
            if k:
                out.extend(j * ID + p for p in range(1, min(int(length) - 1, t) + 1))
            j += 1
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_target_lands_once_in_contiguous_restarting_segments(seed):
    groups = _random_groups(seed)
    p = pack(groups, rows=16, buckets=(16, 32, 64), packing=True)
    x = p.arrays
    b, t = p.shape
    want = _kept_targets(groups, t)
    ids = _ids(x)
    got = ids[ids > 0]
    assert sorted(got.tolist()) == sorted(want)  # each exactly once, none else
    for r in range(b):
        seg = x["segment_bt"][r]
        real = x["attn_bt"][r] > 0
        np.testing.assert_array_equal(seg > 0, real)
        k = int(seg.max())
        assert sorted(set(seg[real].tolist())) == list(range(1, k + 1))
        for s in range(1, k + 1):
            cols = np.flatnonzero(seg == s)
            assert cols[-1] - cols[0] + 1 == len(cols)  # contiguous
            traj = set((ids[r, cols] // ID).tolist())
            assert len(traj) == 1  # one trajectory per segment
            np.testing.assert_array_equal(ids[r, cols] % ID, np.arange(1, len(cols) + 1))
            np.testing.assert_array_equal(x["positions_bt"][r, cols], np.arange(len(cols)))
            # targets are the next inputs within the segment
            np.testing.assert_array_equal(
                x["targets_bt"][r, cols[:-1]], x["tokens_bt"][r, cols[1:]]
            )
            assert len(set(x["adv_bt"][r, cols].tolist())) == 1
    # a trajectory never straddles rows (every id of it in one row)
    rows_of = {}
    for r in range(b):
        for i in ids[r][ids[r] > 0] // ID:
            rows_of.setdefault(int(i), set()).add(r)
    assert all(len(v) == 1 for v in rows_of.values())
    assert p.stats["packing_efficiency"] == pytest.approx(len(want) / (b * t))
    assert p.stats["rows_used"] == float((x["attn_bt"].sum(1) > 0).sum())
    unpacked = pack(groups, rows=32, buckets=(16, 32, 64))
    assert unpacked.shape[1] == t
    assert unpacked.stats["packing_efficiency"] == pytest.approx(len(want) / (32 * t))
    assert p.stats["packing_efficiency"] > unpacked.stats["packing_efficiency"]


def _layout_index(x: dict[str, np.ndarray], universe: np.ndarray) -> np.ndarray:
    """(B, T) indices into a per-target vector laid out as ``universe`` (index 0: padding)."""
    ids = _ids(x)
    idx = np.searchsorted(universe, ids)
    assert (universe[idx] == ids).all()
    return idx


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_loss_and_gradient_equal_the_unpacked(seed):
    groups = _random_groups(seed, n_groups=12)
    slots = 48
    unpacked = pack(groups, rows=slots, buckets=(16, 32, 64))
    t = unpacked.shape[1]
    real = int(unpacked.arrays["attn_bt"].sum())
    few = -(-real // t) + 2  # a few rows more than the positions need
    layouts = {
        "unpacked": (unpacked, False),
        "unpacked+segments": (unpacked, True),
        "packed": (pack(groups, rows=few, buckets=(16, 32, 64), packing=True, slots=slots), True),
        "packed, same rows": (pack(groups, rows=slots, buckets=(16, 32, 64), packing=True), True),
    }
    assert layouts["packed"][0].stats["rows_used"] < slots / 2
    universe = np.unique(np.concatenate([[0], _ids(unpacked.arrays).ravel()]))
    rng = np.random.default_rng(seed)
    n = len(universe)
    logp = jnp.asarray(-rng.random(n) * 3, jnp.float32)  # the policy's, per target
    old = logp + jnp.asarray(rng.normal(0, 0.3, n), jnp.float32)  # ratios around the clip
    rollout = old + jnp.asarray(rng.normal(0, 0.2, n), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(0, 0.2, n), jnp.float32)

    def loss_fn(logp, x, idx, agg, segments):
        adv = x["adv_bt"] if "adv_bt" in x else x["adv_b"]
        seg = x["segment_bt"] if segments else None
        constant = x["loss_constant_b"][0] if segments else None  # unpacked: the default
        loss, _ = grpo_loss(
            logp[idx], old[idx], adv, x["mask_bt"], clip_low=0.2, clip_high=0.28, agg=agg,
            constant=constant, ref_logp_bt=ref[idx], kl_coef=0.1,
            rollout_logp_bt=rollout[idx], tis_cap=2.0, segment_bt=seg,
        )  # fmt: skip
        return loss

    grad = jax.jit(jax.value_and_grad(loss_fn), static_argnames=("agg", "segments"))
    for agg in ("token_mean", "seq_mean_token_mean", "constant"):
        results = {}
        for name, (p, segments) in layouts.items():
            x = {k: jnp.asarray(v) for k, v in p.arrays.items()}
            idx = jnp.asarray(_layout_index(p.arrays, universe))
            results[name] = grad(logp, x, idx, agg=agg, segments=segments)
        want_loss, want_grad = results["unpacked"]
        assert abs(float(want_loss)) > 1e-3 and float(jnp.abs(want_grad).max()) > 1e-4
        for name, (loss, g) in results.items():
            np.testing.assert_allclose(loss, want_loss, rtol=0, atol=1e-6, err_msg=f"{agg} {name}")
            np.testing.assert_allclose(g, want_grad, rtol=0, atol=1e-6, err_msg=f"{agg} {name}")


def test_the_loop_packs_into_packed_rows_and_falls_back_when_they_do_not_fit():
    """learner.training.loop.Trainer._pack: with packing on, a step's trajectories go into
    ``packed_rows`` rows; a step whose trajectories do not fit there is packed into
    twice, four times ... as many rows, at most one row per trajectory (logged), never
    dropped."""
    from types import SimpleNamespace

    from learner.training.loop import Trainer
    from shared.config import LearnerConfig

    def trainer(packed_rows: int, packing: bool = True):
        lc = LearnerConfig(packing=packing, packed_rows=packed_rows, length_buckets=(64,))
        return SimpleNamespace(
            cfg=SimpleNamespace(learner=lc), rows=8, packed_rows=packed_rows or 8, version=0,
            model=SimpleNamespace(cfg=SimpleNamespace(pad_token_id=0)), multiple=2,
        )  # fmt: skip

    def group(k: int, n: int):
        rng = np.random.default_rng(k)
        trajs = [
            _traj(f"g{k}", i, rng.integers(3, 500, n), np.ones(n), -np.ones(n), float(i % 2))
            for i in range(4)
        ]
        return TrajectoryGroup(f"g{k}", "t", trajs)

    short = [group(0, 10), group(1, 12)]  # 8 trajectories of <= 12 tokens
    p = Trainer._pack(trainer(2), short)
    assert p.shape == (2, 64) and "adv_bt" in p.arrays and p.stats["rows_used"] == 2
    long = [group(0, 60), group(1, 60)]  # 8 x 59 predictions: 2 rows of 64 cannot hold them
    p = Trainer._pack(trainer(2), long)
    assert p.shape == (8, 64) and p.stats["rows_used"] == 8
    p = Trainer._pack(trainer(0, packing=False), short)
    assert p.shape == (8, 64) and "adv_b" in p.arrays
    # per-turn groups: 4 episodes of 3 turns each, 12 sequences of 60 tokens for a step of
    # 8 episode rows: one row per sequence (12, a multiple of the mesh's 2), none dropped
    rng = np.random.default_rng(3)

    def per_turn(gid: str, turns: int, n: int) -> TrajectoryGroup:
        """4 episodes of ``turns`` turns, each a sequence of ``n`` tokens."""
        seqs = [
            dataclasses.replace(
                _traj(gid, i, rng.integers(3, 500, n), np.ones(n), -np.ones(n), float(i % 2)),
                turn=k,
            )
            for i in range(4)
            for k in range(turns)
        ]
        return TrajectoryGroup(gid, "t", seqs)

    p = Trainer._pack(trainer(2), [per_turn("p", 3, 60)])
    assert p.shape == (12, 64) and p.stats["rows_used"] == 12
    # 4 episodes of 6 turns, 24 sequences of 29 predictions, two to a row of 64: 2, 4 and 8
    # rows cannot hold them, 16 can (12 used), where one row per sequence was 24; with a
    # flat group beside them (no advantage, not trained on) still 16, where it was 32
    short_turns = per_turn("q", 6, 30)
    flat = TrajectoryGroup(
        "f",
        "t",
        [_traj("f", i, rng.integers(3, 500, 30), np.ones(30), -np.ones(30), 1.0) for i in range(8)],
    )
    for groups in ([short_turns], [short_turns, flat]):
        p = Trainer._pack(trainer(2), groups)
        assert p.shape == (16, 64) and p.stats["rows_used"] == 12


def test_per_episode_figures_of_a_batch_by_hand():
    """Group p: 2 episodes trained turn by turn, 3 turns (12 actions, answered) and 2
    turns (20 actions, out of budget); group w: 2 whole episodes, 4 actions answered and
    1 action cut by an infrastructure error. Per episode: actions (12 + 20 + 4 + 1) / 4
    = 9.25, longest 20; sequences 7 over 4 episodes = 1.75; ended: answered 2/4, budget
    1/4, error 1/4. Every turn of an episode carries the episode's figures."""

    def seq(gid, i, reward, turn, steps, status):
        t = _traj(gid, i, [5, 6, 7], [0, 1, 1], [0, -1, -1], reward)
        return dataclasses.replace(t, turn=turn, num_steps=steps, status=status)

    p = TrajectoryGroup("p", "t", [
        seq("p", 0, 1.0, 0, 12, "ok"), seq("p", 0, 1.0, 1, 12, "ok"), seq("p", 0, 1.0, 2, 12, "ok"),
        seq("p", 1, 0.0, 0, 20, "truncated"), seq("p", 1, 0.0, 1, 20, "truncated"),
    ])  # fmt: skip
    w = TrajectoryGroup(
        "w", "t", [seq("w", 0, 1.0, -1, 4, "ok"), seq("w", 1, 0.0, -1, 1, "infra_error")]
    )
    s = pack([p, w], rows=8, buckets=[8]).stats
    assert s["episode_actions"] == pytest.approx(9.25) and s["episode_actions_max"] == 20
    assert s["turns_per_episode"] == pytest.approx(1.75) and s["trajectories"] == 4
    assert (s["ended_answered"], s["ended_budget"], s["ended_error"]) == (0.5, 0.25, 0.25)
    whole = pack([w], rows=8, buckets=[8]).stats
    assert whole["turns_per_episode"] == 1.0 and whole["episode_actions"] == pytest.approx(2.5)


def test_the_grpo_line_stays_one_line_and_shows_the_episodes():
    from learner.training.loop import grpo_line

    r = {"step": 3, "reward": 0.5, "success": 0.25, "approx_kl": 0.0, "entropy": 0.3,
         "tokens_per_s": 800.0, "step_s": 50.0, "wait_s": 0.1, "policy_lag": 1.0}  # fmt: skip
    assert "actions" not in grpo_line(r, 24)  # a batch from before the figures
    whole = {**r, "episode_actions": 3.0, "turns_per_episode": 1.0, "ended_budget": 0.0,
             "ended_error": 0.0}  # fmt: skip
    assert grpo_line(whole, 24).endswith("lag 1.0  actions 3.0  budget 0.00")
    long = {**whole, "episode_actions": 14.25, "turns_per_episode": 14.25, "ended_budget": 0.125,
            "ended_error": 0.0625}  # fmt: skip
    line = grpo_line(long, 24)
    assert line.endswith("actions 14.2 (14.2 turns)  budget 0.12  errors 0.06") and "\n" not in line
