"""`python -m learner.train` against a real HTTP sidecar stand-in: crash and exact resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from learner.training.checkpoint import Checkpointer
from shared.wire import encode_groups
from tests.learner.step_child import groups as make_groups

REPO = Path(__file__).resolve().parents[2]
STEPS, GROUPS_PER_STEP, G = 6, 2, 4


class FixedSidecar:
    """Serves a fixed list of groups like the sidecar's buffer: in order, each leased until
    acknowledged; :meth:`restart` forgets the leases (they are served again), not the acks."""

    def __init__(self, groups):
        self.groups = groups
        self.acked: set[str] = set()
        self.leased: set[str] = set()
        self.weights: list[dict] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait(10)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/batch", self.batch)
        app.router.add_post("/weights", self.post_weights)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        started.set()
        self.loop.run_forever()

    async def batch(self, request: web.Request) -> web.Response:
        n = int(request.query["groups"])
        acks = [a for a in request.query.get("ack", "").split(",") if a]
        self.acked.update(acks)
        self.leased -= set(acks)
        out = [g for g in self.groups if g.group_id not in self.acked | self.leased][:n]
        self.leased.update(g.group_id for g in out)
        return web.Response(body=encode_groups(out), content_type="application/x-msgpack")

    async def post_weights(self, request: web.Request) -> web.Response:
        self.weights.append(await request.json())
        return web.json_response({"success": True})

    def restart(self) -> None:
        self.leased.clear()


def _warm_start(root: Path) -> Path:
    """A checkpoint of the tiny model with moved weights: the runs' initial policy, which
    their KL term must keep as its reference across a restart too."""
    from flax import nnx

    from learner.model.params import Model, get_params, tiny_config
    from tests.learner.helpers import randomized

    params = get_params(randomized(Model(tiny_config(), rngs=nnx.Rngs(0)), scale=0.05, seed=7))
    with Checkpointer(root, async_save=False) as ck:
        ck.save(0, params=params)
        ck.wait()
    return root


def _args(url: str, run_dir: Path, name: str, warm: Path | None = None) -> list[str]:
    """The run's command line; with ``warm``, it starts from that checkpoint with KL to it."""
    sets = [] if warm is None else [f"learner.init_checkpoint={warm}", "learner.kl_coef=0.5"]
    sets += [
        f'rollout.urls=["{url}"]', f"rollout.group_size={G}",
        f"learner.groups_per_step={GROUPS_PER_STEP}", f"learner.steps={STEPS}",
        "learner.warmup_steps=0", "learner.learning_rate=1e-3", "learner.length_buckets=[16, 32]",
        "checkpoint.every_steps=2", "checkpoint.max_to_keep=5", "logging.progress=false",
        f"logging.run_dir={run_dir}", f"logging.run_name={name}",
    ]  # fmt: skip
    return [sys.executable, "-m", "learner.train", *[a for s in sets for a in ("--set", s)]]


def _final(run: Path):
    with Checkpointer(run / "checkpoints", read_only=True) as ck:
        r = ck.restore(STEPS)
    return {k: np.asarray(v) for k, v in r.params.items()}, r.data_cursor


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.reliability
def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path, fault):
    row = fault(
        "the learner killed with SIGKILL and resumed",
        "the resumed run ends with the parameters of an uninterrupted one; every group trained on exactly once",
    )
    data = [g for seed in range(4) for g in make_groups(seed, n=4, g=G)]  # 16 >= 6 x 2 groups
    warm = _warm_start(tmp_path / "warm")  # with a KL reference a restart must restore
    # the same batches for both runs: every group has reward variance, none is dropped
    one = FixedSidecar(data)
    out = subprocess.run(
        _args(one.url, tmp_path, "straight", warm), cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    _check_log(out, tmp_path / "straight")

    two = FixedSidecar(data)
    proc = subprocess.Popen(_args(two.url, tmp_path, "crashed", warm), cwd=REPO)
    metrics = tmp_path / "crashed" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines())
    assert killed_at < STEPS
    two.restart()  # a sidecar restart: unacknowledged groups are served again
    subprocess.run(_args(two.url, tmp_path, "crashed", warm), cwd=REPO, check=True, timeout=300)

    want, want_cursor = _final(tmp_path / "straight")
    got, got_cursor = _final(tmp_path / "crashed")
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    ids = got_cursor["group_ids"]
    assert ids == want_cursor["group_ids"] and len(ids) == len(set(ids)) == STEPS * GROUPS_PER_STEP
    assert one.acked == set(ids) == two.acked  # everything trained on is acknowledged
    assert [w["version"] for w in one.weights] == [2, 4, 6]
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in lines][-1] == STEPS
    row["observed"] = "identical parameters and data cursor; every group acknowledged"


def _check_log(out: subprocess.CompletedProcess, run: Path) -> None:
    """Output to a pipe (a cluster's log file): the logs named first, one line per GRPO
    step with every field, no backend-probe noise."""
    head = out.stdout.splitlines()[:2]
    assert head[0] == f"run dir {run}" and head[1].startswith("logs: learner: this output")
    assert str(run / "metrics.jsonl") in head[1]
    steps = [x for x in out.stderr.splitlines() if "grpo step " in x]
    assert [x.split("grpo step ")[1].split()[0] for x in steps] == [
        f"{i}/{STEPS}" for i in range(1, STEPS + 1)
    ], out.stderr[-3000:]
    for field in ("reward ", "success ", "KL ", "entropy ", " tok/s", "s (wait ", "lag "):
        assert all(field in x for x in steps), (field, steps[0])
    assert "n/a" not in steps[-1].split("lag")[0]  # KL and entropy are measured every step
    assert "[progress] GRPO: 0/6 steps" in out.stderr and "GRPO: 6/6 steps" in out.stderr
    assert "Unable to initialize backend" not in out.stderr


def test_a_port_in_time_wait_is_free_to_the_web_and_a_listener_is_not():
    import socket

    from learner.train import port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's listener
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not port_free(port)  # a listener holds it
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server's side closes first: its end lingers in TIME_WAIT
    client.close()
    server.close()
    time.sleep(0.1)
    assert port_free(port)  # as a restarted web can bind it (SO_REUSEADDR)
