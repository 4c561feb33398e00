"""End to end over real sockets: local web + learner.serve (tiny random model) + the sidecar
in som mode with real browsers, 4 tasks x G=4."""

import json
import time

import aiohttp
import numpy as np
import pytest

from rollout.tasks.generate import generate
from rollout.tracker import iter_record_files, read_record
from rollout.verifiers import verify
from shared.wire import decode_groups
from tests.conftest import start_server, stop_server
from tests.rollout.test_sidecar import sidecar_args

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.browser]


async def test_model_groups_in_som_mode_are_well_formed(web_url, local_web, tmp_path):
    tasks = generate(local_web, "train", 4, types=["qa"], seed=11, base_url=web_url)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    serve, serve_url = start_server(
        ["learner.serve", "--init", "tiny", "--port", "0"], "serving on"
    )
    args = sidecar_args(
        web_url, tmp_path,
        **{"env.mode": "som", "rollout.policy": "model", "inference.urls": f'["{serve_url}"]',
           "rollout.group_size": 4, "env.max_steps": 2, "inference.max_new_tokens": 12,
           "rollout.browsers": 1, "rollout.contexts_per_browser": 4,
           "rollout.max_concurrent_episodes": 8},
    )  # fmt: skip
    args += ["--tasks", str(tmp_path / "tasks.jsonl")]
    sidecar, url = start_server(args, "serving on")
    groups = []
    try:
        deadline = time.monotonic() + 400
        async with aiohttp.ClientSession() as s:
            while len({g.task_id for g in groups}) < 4:
                assert time.monotonic() < deadline, "groups did not arrive in time"
                params = {
                    "groups": "4",
                    "timeout": "30",
                    "ack": ",".join(g.group_id for g in groups),
                }
                async with s.get(f"{url}/batch", params=params) as r:
                    groups += decode_groups(await r.read())
    finally:
        stop_server(sidecar)
        stop_server(serve)
    records = {}
    for path in iter_record_files(tmp_path / "episodes"):
        rec = read_record(path)
        records[rec.episode_id] = rec
    by_task = {t["id"]: t for t in tasks}
    for g in groups:
        assert len(g) == 4 and g.task_id in by_task
        for t in g.trajectories:
            gen = t.loss_mask == 1
            assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs) == len(t.versions)
            assert gen.any() and t.status in ("ok", "truncated")
            # Generated tokens carry the server's logprobs and version; the rest carry none.
            assert (t.logprobs[gen] < 0).all() and np.isfinite(t.logprobs).all()
            assert (t.logprobs[~gen] == 0).all() and (t.versions[~gen] == -1).all()
            assert (t.versions[gen] == 0).all()
            # The reward is the verifier's on the recorded answer.
            rec = records[f"{g.group_id}-{t.sample_index}-0"]
            assert verify(by_task[g.task_id], rec.answer, rec).value == pytest.approx(t.reward)
