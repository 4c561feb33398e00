"""The sidecar with ``rollout.trajectory = "per_turn"``: groups of per-turn sequences,
and the dashboard's per-episode sequence counts."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from shared.wire import decode_groups
from tests.conftest import start_server, stop_server
from tests.rollout.sidecar.test_sidecar import sidecar_args

pytestmark = pytest.mark.multiprocess


async def test_per_turn_groups_hold_each_episodes_turns(web_url, tmp_path):
    args = sidecar_args(
        web_url, tmp_path, **{"rollout.trajectory": "per_turn", "env.history": "keep_last",
                              "env.keep_last": 1, "learner.packing": "true"}
    )  # fmt: skip
    proc, url = start_server(args, "serving on")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/batch", params={"groups": "2", "timeout": "60"}) as r:
                assert r.status == 200
                groups = decode_groups(await r.read())
            async with s.get(f"{url}/api/episodes") as r:
                shown = (await r.json())["episodes"]
    finally:
        stop_server(proc)
    assert groups
    for g in groups:
        assert g.num_episodes == 2 and (g.turns >= 0).all()
        episode_of_row, first = g.episodes
        for e, row in enumerate(first.tolist()):
            rows = np.flatnonzero(episode_of_row == e)
            assert g.turns[rows].tolist() == list(range(len(rows)))
            assert len(rows) == g.trajectories[row].num_steps  # one sequence per step
        for t in g.trajectories:  # a prompt (mask 0), then that turn's generated tokens
            gen = np.flatnonzero(t.loss_mask)
            assert gen.size and gen[-1] == t.length - 1 and (np.diff(gen) == 1).all()
    assert shown and all(e["trajectory"] == "per_turn" for e in shown)
    assert all(len(e["sequences"]) == e["num_steps"] for e in shown)  # one sequence per turn
