"""End to end over real sockets: local web + learner.serve (tiny random model) + the sidecar
in som mode with real browsers, 4 tasks x G=4."""

import json
import time

import aiohttp
import numpy as np
import pytest

from rollout.tasks.generate import generate
from rollout.tracking.tracker import iter_record_files, read_record
from rollout.verifiers import verify
from shared.wire import decode_groups
from tests.conftest import start_server, stop_server
from tests.learner.helpers import teacher_forced_logprobs
from tests.rollout.sidecar.test_metrics import scrape, value
from tests.rollout.sidecar.test_sidecar import sidecar_args

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
           "rollout.max_concurrent_episodes": 8, "env.screenshots": "true"},
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
            async with s.get(url + "/api/episodes") as r:  # the dashboard has marked views
                shown = [e for e in (await r.json())["episodes"] if e["has_screenshot"]]
            assert shown
            async with s.get(f"{url}/episode/{shown[0]['id']}/screenshot.png") as r:
                assert r.content_type == "image/png" and (await r.read())[:4] == b"\x89PNG"
            await _new_weights_reach_the_server(s, url, serve_url, tmp_path)
    finally:
        stop_server(sidecar)
        stop_server(serve)
    records = {}
    for path in iter_record_files(tmp_path / "episodes"):
        rec = read_record(path)
        records[rec.episode_id] = rec
    by_task = {t["id"]: t for t in tasks}
    model = _served_model()
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
            # ... and they are the model's: the learner's teacher-forced logprobs agree.
            learner_lp = teacher_forced_logprobs(model, t.tokens.tolist(), pad_to=1024)
            np.testing.assert_allclose(t.logprobs[gen], learner_lp[gen], atol=1e-4)
            # The reward is the verifier's on the recorded answer.
            rec = records[f"{g.group_id}-{t.sample_index}-0"]
            assert verify(by_task[g.task_id], rec.answer, rec).value == pytest.approx(t.reward)


async def _new_weights_reach_the_server(s, sidecar_url, serve_url, run_dir) -> None:
    """POST /weights: every inference server loads the checkpoint and reports its version."""
    from flax import nnx

    from learner.model.config import tiny_config
    from learner.model.params import Model, get_params
    from learner.training.checkpoint import Checkpointer
    from shared.tokenizer import load_tokenizer

    ckpt = Checkpointer(run_dir / "ckpt" / "run", async_save=False)
    model = Model(tiny_config(), rngs=nnx.Rngs(7))
    ckpt.save(1, params=get_params(model), model_config=tiny_config(),
              tokenizer_dir=load_tokenizer().path)  # fmt: skip
    ckpt.wait()
    ckpt.close()
    async with s.post(f"{sidecar_url}/weights", json={"version": 1, "path": "run"}) as r:
        assert r.status == 200 and (await r.json())["success"], await r.text()
    async with s.get(f"{serve_url}/get_model_info") as r:
        assert (await r.json())["weight_version"] == "1"
    async with s.get(f"{sidecar_url}/metrics") as r:
        assert value(scrape(await r.text()), "rollout_policy_version") == 1


def _served_model():
    """The weights `learner.serve --init tiny` serves (its default seed)."""
    from flax import nnx

    from learner.model.config import tiny_config
    from learner.model.params import Model

    return Model(tiny_config(), rngs=nnx.Rngs(0))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.reliability
async def test_an_inference_server_restart_mid_run_is_survived(web_url, tmp_path, fault):
    row = fault(
        "the inference server killed and restarted mid-episode",
        "the episodes it cut end as infra_error and are rerun; the run goes on",
    )
    import os
    import signal

    port = _free_port()
    cmd = ["learner.serve", "--init", "tiny", "--port", str(port)]
    serve, serve_url = start_server(cmd, "serving on")
    args = sidecar_args(
        web_url, tmp_path,
        **{"rollout.policy": "model", "inference.urls": f'["{serve_url}"]', "inference.retries": 1,
           "rollout.max_retries": 6, "env.max_steps": 2, "inference.max_new_tokens": 8},
    )  # fmt: skip
    sidecar, url = start_server(args, "serving on")
    try:
        async with aiohttp.ClientSession() as s:

            async def pull() -> list:
                async with s.get(f"{url}/batch", params={"groups": "2", "timeout": "60"}) as r:
                    return decode_groups(await r.read())

            assert await pull()
            os.kill(serve.pid, signal.SIGKILL)  # mid-run: episodes are generating
            serve.wait()
            serve.stdout.close()
            time.sleep(2.0)
            serve, _ = start_server(cmd, "serving on")
            got = []
            deadline = time.monotonic() + 120
            while len(got) < 3:
                assert time.monotonic() < deadline, "the run did not go on"
                got += await pull()
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
        fams = scrape(text)
        episodes = "rollout_episodes", "rollout_episodes_total"
        assert value(fams, *episodes, outcome="infra_error") >= 1  # episodes hit the outage
        assert value(fams, "rollout_reruns", "rollout_reruns_total") >= 1  # ... and were run again
        assert all(t.status != "infra_error" for g in got for t in g.trajectories)
    finally:
        stop_server(sidecar)
        stop_server(serve)
    row["observed"] = "reruns succeeded after the restart"
