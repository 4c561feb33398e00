"""The reference's logprobs computed as groups arrive (``learner.reference_forward =
"on_arrival"``): the same values as the reference's forward pass over the packed batch,
in either layout; chunks dispatched as soon as they fill, kept trajectories only; and the
sidecar client handing each pull's groups over as they come."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from aiohttp import web

from learner.model.params import get_params
from learner.training.batching import (
    MissingReference,
    kept_trajectories,
    pack,
    reference_rows,
    reference_values,
)
from learner.training.reference import ArrivalReference
from learner.training.source import GroupSource
from learner.training.step import compile_reference, place_batch
from shared.config import LearnerConfig
from shared.wire import TrajectoryGroup, encode_groups
from tests.learner.helpers import small_model
from tests.learner.helpers import trajectory as _traj
from tests.learner.step_child import groups as make_groups
from tests.learner.test_train import FixedSidecar

BUCKETS = (16, 32)
CFG = LearnerConfig(kl_coef=0.5, length_buckets=BUCKETS)


@pytest.fixture(scope="module")
def model_and_ref():
    model = small_model(seed=3)
    ref_fn = compile_reference(model, None, CFG)
    params = jax.device_put(get_params(model))
    return model, ref_fn, params


def _groups(per_turn: bool = False) -> list[TrajectoryGroup]:
    """Eight groups of 4 (10-30 tokens: both buckets), the first two forced to vary and
    one all-equal: kept and dropped ones. ``per_turn``: each group's rows are turns 0 and
    1 of two episodes (an episode's reward is its first row's)."""
    gs = make_groups(0, n=4, g=4) + make_groups(1, n=4, g=4)

    def rewarded(g, rewards=None):
        trajs = list(g.trajectories)
        if rewards is not None:
            trajs = [dataclasses.replace(t, reward=r) for t, r in zip(trajs, rewards, strict=True)]
        if per_turn:  # rows 2k and 2k + 1: turns 0 and 1 of episode k, with its reward
            trajs = [
                dataclasses.replace(
                    t, turn=i % 2, sample_index=i // 2, reward=trajs[i - i % 2].reward
                )
                for i, t in enumerate(trajs)
            ]
        return TrajectoryGroup(g.group_id, g.task_id, trajs)

    varied = [0.0, 0.0, 1.0, 1.0] if per_turn else [0.0, 1.0, 0.0, 1.0]
    gs[:2] = [rewarded(g, varied) for g in gs[:2]]  # kept
    gs[2] = rewarded(gs[2], [1.0] * 4)  # all agree: dropped
    gs[3:] = [rewarded(g) for g in gs[3:]]
    return gs


def _full_reference(ref_fn, params, arrays) -> np.ndarray:
    batch = place_batch({k: v for k, v in arrays.items() if k.endswith("_bt")}, None)
    return np.asarray(ref_fn(params, batch))


@pytest.mark.parametrize(
    "packing, per_turn",
    [(False, False), (True, False), (True, True)],
    ids=["one-per-row", "packed", "packed-per-turn"],
)
def test_logprobs_computed_on_arrival_equal_the_packed_batchs_reference(
    model_and_ref, packing, per_turn
):
    """Groups queued one, two and five at a time in chunks of 4 rows: the step's
    ``ref_logp_bt`` built from them equals the reference's forward pass over the packed
    batch on every trained position, and is 0 on padding."""
    _, ref_fn, params = model_and_ref
    groups = _groups(per_turn)
    assert (int(groups[0].turns.max()) == 1) == per_turn
    arrival = ArrivalReference(ref_fn, None, chunk_rows=4, buckets=BUCKETS)
    for part in (groups[:1], groups[1:3], groups[3:]):
        arrival.add(part, params)
    refs = arrival.finish(params)
    kept = kept_trajectories(groups)
    assert set(refs) == {key for key, _ in kept}
    assert ("group0-2", 0) not in refs  # the group whose rewards all agree: not computed
    rows = 20 if packing else 32  # packed: 24 trajectories of 462 positions in 20 rows
    packed = pack(groups, rows=rows, buckets=BUCKETS, packing=packing, ref_logprobs=refs)
    a = packed.arrays
    assert (a["segment_bt"].max(axis=1) > 1).any() == packing  # rows shared when packed
    expect = _full_reference(ref_fn, params, a)
    on = a["attn_bt"] > 0
    assert on.sum() > 100 and a["mask_bt"][on].sum() > 0
    np.testing.assert_allclose(a["ref_logp_bt"][on], expect[on], rtol=1e-5, atol=1e-5)
    assert (a["ref_logp_bt"][~on] == 0).all()
    assert np.isfinite(a["ref_logp_bt"]).all()


def test_pack_refuses_a_kept_trajectory_without_reference_logprobs(model_and_ref):
    _, ref_fn, params = model_and_ref
    groups = _groups()[:2]
    items = kept_trajectories(groups)
    arrays, runs = reference_rows(items, rows=8, buckets=BUCKETS)
    refs = reference_values(items, runs, _full_reference(ref_fn, params, arrays))
    assert pack(groups, rows=8, buckets=BUCKETS, ref_logprobs=refs).arrays["ref_logp_bt"].any()
    missing = dict(refs)
    del missing[("group0-1", 2)]
    with pytest.raises(MissingReference, match="trajectory 2 of group group0-1"):
        pack(groups, rows=8, buckets=BUCKETS, ref_logprobs=missing)
    short = {k: v[:3] for k, v in refs.items()}
    with pytest.raises(MissingReference, match="3 positions given"):
        pack(groups, rows=8, buckets=BUCKETS, ref_logprobs=short)


def test_reference_rows_lay_out_trajectories_as_pack_does():
    """One trajectory per row from column 0, positions the columns, the bucket of the
    longest, truncated to the largest bucket like :func:`pack`."""
    g = TrajectoryGroup(
        "g", "t",
        [_traj("g", 0, list(range(10, 15)), [0, 1, 1, 1, 1], [0] * 5, 1.0),
         _traj("g", 1, list(range(20, 60)), [1] * 40, [0] * 40, 0.0)],
    )  # fmt: skip
    items = kept_trajectories([g])
    arrays, runs = reference_rows(items, rows=4, buckets=BUCKETS)
    assert arrays["tokens_bt"].shape == (4, 32) and runs == [(0, 0, 4), (1, 0, 32)]
    assert arrays["tokens_bt"][0, :5].tolist() == [10, 11, 12, 13, 0]
    assert arrays["targets_bt"][0, :5].tolist() == [11, 12, 13, 14, 0]
    assert arrays["targets_bt"][1, -1] == 20 + 32  # truncated at 32 predictions
    assert arrays["attn_bt"].sum(axis=1).tolist() == [4, 32, 0, 0]
    assert (arrays["positions_bt"] == np.arange(32)).all()
    with pytest.raises(ValueError, match="do not fit in 1 rows"):
        reference_rows(items, rows=1, buckets=BUCKETS)
    packed = pack([g], rows=2, buckets=BUCKETS)
    for key in ("tokens_bt", "targets_bt", "attn_bt", "positions_bt"):
        assert (packed.arrays[key] == arrays[key][:2]).all(), key


def test_chunks_run_as_soon_as_they_fill_and_only_on_kept_trajectories(model_and_ref):
    _, ref_fn, params = model_and_ref
    calls = []

    def counting(p, batch):
        calls.append(int(np.asarray(batch["attn_bt"]).any(axis=1).sum()))
        return ref_fn(p, batch)

    groups = _groups()
    arrival = ArrivalReference(counting, None, chunk_rows=4, buckets=BUCKETS)
    arrival.add(groups[:1], params)
    assert calls == [4]  # a full chunk: dispatched before the rest arrives
    arrival.add(groups[2:3], params)  # rewards all agree: nothing to compute
    arrival.add(groups[:1], params)  # a group already queued: skipped
    assert calls == [4] and arrival.pending == []
    arrival.add(groups[1:2], params)
    assert calls == [4, 4]
    refs = arrival.finish(params)
    assert len(refs) == 8 and calls == [4, 4]
    assert arrival.last["ref_chunks"] == 2 and arrival.last["ref_padding_rows"] == 0
    assert arrival.last["ref_trajectories"] == 8 and arrival.last["ref_finish_s"] >= 0

    calls.clear()
    wide = ArrivalReference(counting, None, chunk_rows=8, buckets=BUCKETS)
    wide.add(groups[:1], params)
    assert calls == []  # half a chunk waits for more
    assert len(wide.finish(params)) == 4 and calls == [4]  # the remainder, padded
    assert wide.last["ref_padding_rows"] == 4
    assert wide.finish(params) == {} and wide.last["ref_chunks"] == 0  # emptied by finish
    with pytest.raises(ValueError, match="chunk_rows"):
        ArrivalReference(counting, None, chunk_rows=0, buckets=BUCKETS)


class OneAtATime(FixedSidecar):
    """The sidecar stand-in on loopback (``tests.learner.test_train``), serving the list in
    order, at most one group per ``GET /batch``, and a group listed twice twice."""

    served = 0

    async def batch(self, request):
        out = self.groups[self.served : self.served + 1]
        self.served += len(out)
        return web.Response(body=encode_groups(out), content_type="application/x-msgpack")


def test_the_sidecar_client_hands_each_pulls_new_groups_over_as_they_come():
    groups = make_groups(5, n=4, g=2)
    sidecar = OneAtATime([groups[0], groups[0], *groups[1:]])  # one served twice
    try:
        source = GroupSource([sidecar.url], poll_s=1.0)
        seen = []
        got = source.take(3, {groups[1].group_id}, on_arrival=lambda gs: seen.append(gs))
    finally:
        sidecar.loop.call_soon_threadsafe(sidecar.loop.stop)
    ids = [g.group_id for g in groups]
    assert [g.group_id for g in got] == [ids[0], ids[2], ids[3]]
    # one call per pull that brought something new, with those groups, before the next pull
    assert [[g.group_id for g in gs] for gs in seen] == [[ids[0]], [ids[2]], [ids[3]]]
    assert sidecar.served == 5  # the duplicate and the consumed group took pulls of their own
