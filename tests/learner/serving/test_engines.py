"""The real engines, SGLang and vLLM, on the CPU, driven by the rollout's own client.

Each engine is started the way ``learner.train`` starts it (``python -m learner.engines``
as a child of :class:`learner.embedded.children.Children`, from the project's ``.venv-sglang`` /
``.venv-vllm``, built by ``make engines``) on small policies exported by the learner: the
tiny model (head_dim 32) and one with head_dim 64, in float32. What is checked:

- the engine's logprob of every sampled token equals the learner's own (the train step's
  ``token_logprobs``) within 1e-4;
- a weight update through the client serves the new checkpoint's logprobs exactly as the
  learner computes them, with the new version on every token;
- generations running across an update all finish (none lost or cut short), and every
  token's recorded version is the one whose weights give its logprob;
- a wrong weight path is a loud error and leaves the served weights as they were;
- an engine killed with a generation in flight is an infrastructure error
  (``InferenceError``), and it is started again on the newest export, which the client
  then reaches.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from pathlib import Path

import aiohttp
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.embedded.children import Children
from learner.model import decoder
from learner.model.decoder import Options
from learner.model.hf import export_hf
from learner.model.logprobs import chunked_token_logprobs
from learner.model.params import Model, get_params, tiny_config
from learner.serving.engines import engine_python, untied_export
from rollout.sidecar.inference import InferenceClient, InferenceError, Sampling
from shared.config import InferenceConfig
from shared.lifeline import group_pids
from shared.tokenizer import TINY_TOKENIZER_DIR
from tests.learner.helpers import randomized, step_logprobs

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.engines]

BACKENDS = ("sglang", "vllm")
PROMPT = [1, 882, 198, 3920, 340, 1095, 30, 2, 198, 1, 3513, 198]
TOL_F32 = 1e-4
STOPS = (2, 0)
LONG = 1000  # new tokens of a generation that runs across an update (context 1,024)


def policy(seed: int, **shape) -> Model:
    return randomized(Model(tiny_config(**shape), rngs=nnx.Rngs(seed)), scale=0.05, seed=seed)


def learner_logprobs(model: Model, seq: list[int], temperature: float = 1.0) -> np.ndarray:
    """log p(seq[t] | seq[:t]) for t >= 1: the train step's own function at temperature
    1, its parts with the sampling temperature otherwise (the rollout logprobs' own)."""
    pad = 256 if len(seq) <= 256 else 1024  # two shapes: two compilations
    if temperature == 1.0:
        return step_logprobs(model, seq, pad_to=pad)
    params = get_params(model)
    tokens = np.zeros((1, pad), np.int32)
    targets = np.zeros((1, pad), np.int32)
    tokens[0, : len(seq) - 1] = seq[:-1]
    targets[0, : len(seq) - 1] = seq[1:]
    attn = jnp.asarray((np.arange(pad) < len(seq) - 1).astype(np.int32)[None])
    h, _ = decoder.hidden(
        model.cfg, params, jnp.asarray(tokens), jnp.arange(pad)[None], attn, Options()
    )
    logp, _ = chunked_token_logprobs(
        h, functools.partial(decoder.unembed, model.cfg, params), jnp.asarray(targets),
        chunk=0, temperature=temperature, with_entropy=False,
    )  # fmt: skip
    return np.asarray(logp)[0, : len(seq) - 1]


def gap(model: Model, prompt: list[int], gen, temperature: float = 1.0) -> float:
    """Largest |engine - learner| over a generation's tokens."""
    ours = learner_logprobs(model, prompt + gen.output_ids, temperature)[len(prompt) - 1 :]
    return float(np.max(np.abs(np.asarray(gen.logprobs) - ours)))


def available(backend: str) -> bool:
    return Path(engine_python(InferenceConfig(backend=backend))).exists()


class Engine:
    """One engine behind ``learner.engines``, its export root and the models it served."""

    def __init__(self, backend: str, root: Path, children: Children, url: str, models: dict):
        self.backend, self.root, self.children, self.url = backend, root, children, url
        self.models = models  # weight version -> the learner's model with those weights

    def export(self, version: int, model: Model) -> Path:
        self.models[str(version)] = model
        return export_hf(
            model, self.root / "hf" / str(version), tokenizer_dir=TINY_TOKENIZER_DIR,
            dtype="float32", untie=untied_export(self.backend),
        )  # fmt: skip

    def client(self, session: aiohttp.ClientSession, **kw) -> InferenceClient:
        return InferenceClient([self.url], session, timeout_s=300, backend=self.backend, **kw)


def start_engine(backend: str, tmp: Path, model: Model, name: str) -> Engine:
    if not available(backend):
        pytest.fail(f"{backend}: {engine_python(InferenceConfig(backend=backend))} is missing; "
                    "`make engines` builds it (make test does)")  # fmt: skip
    root = tmp / name
    children = Children(root / "logs")
    eng = Engine(backend, root, children, "", {})
    first = eng.export(0, model)
    try:
        eng.url = children.start(
            "inference",
            ["learner.engines", "--hf", str(first), "--set", f"inference.backend={backend}",
             "--set", "inference.max_context_tokens=1024"],
            timeout=900,
        )  # fmt: skip
    except Exception:
        children.stop()
        raise
    return eng


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, tmp_path_factory):
    eng = start_engine(request.param, tmp_path_factory.mktemp("engines"), policy(11), "tiny")
    yield eng
    eng.children.stop()


async def sample(eng: Engine, n: int, *, temperature=1.0, max_new=24, seed0=0, **kw) -> list:
    async with aiohttp.ClientSession() as session:
        client = eng.client(session, **kw)
        return await asyncio.gather(
            *(
                client.generate(
                    PROMPT[: 6 + i],
                    Sampling(
                        temperature, max_new_tokens=max_new, stop_token_ids=STOPS, seed=seed0 + i
                    ),
                )
                for i in range(n)
            )
        )


async def _post_ok(eng: Engine, session: aiohttp.ClientSession, path: str, body=None) -> None:
    async with session.post(eng.url + path, json=body) as r:
        assert r.status == 200, f"{path}: HTTP {r.status}: {await r.text()}"


async def hold(eng: Engine, session: aiohttp.ClientSession) -> None:
    """The engine paused with its requests kept (vLLM's pause mode=keep, SGLang's
    in_place): what it holds or receives does not end until :func:`resume` or a kill.
    Timing a test by a fixed wait alone is not enough for vLLM, whose CPU decode of LONG
    tokens takes 2-3 s: a starved test process sent a request after an update had
    begun, or woke after its generation had ended. (vLLM's ``num_requests_running``
    gauge cannot say when a request is decoding: it read 0 through the first 1.9 s of a
    decode.)"""
    path, body = ("/pause?mode=keep", None) if eng.backend == "vllm" else (
        "/pause_generation", {"mode": "in_place"})  # fmt: skip
    await _post_ok(eng, session, path, body)


async def resume(eng: Engine, session: aiohttp.ClientSession) -> None:
    await _post_ok(eng, session, "/resume" if eng.backend == "vllm" else "/continue_generation")


# ----------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_the_engines_logprobs_are_the_learners(engine, temperature):
    gens = await sample(engine, 3, temperature=temperature)
    current = max(engine.models, key=int)
    for i, g in enumerate(gens):
        assert g.output_ids and g.finish in ("stop", "length")
        assert set(g.token_versions()) == {current}
        assert gap(engine.models[current], PROMPT[: 6 + i], g, temperature) < TOL_F32


@pytest.mark.parametrize("backend", BACKENDS)
async def test_head_dim_64_logprobs_are_the_learners(backend, tmp_path):
    model = policy(5, head_dim=64, num_heads=2, num_kv_heads=1)
    eng = start_engine(backend, tmp_path, model, "hd64")
    try:
        gens = await sample(eng, 3)
    finally:
        eng.children.stop()
    for i, g in enumerate(gens):
        assert g.output_ids and g.token_versions() == ["0"] * len(g.output_ids)
        assert gap(model, PROMPT[: 6 + i], g) < TOL_F32


# ----------------------------------------------------------------------------- weights


async def test_a_weight_update_serves_the_new_checkpoint(engine):
    before = max(engine.models, key=int)
    new = str(int(before) + 1)
    path = engine.export(int(new), policy(int(new) + 100))
    async with aiohttp.ClientSession() as session:
        await engine.client(session).update_weights(str(path), new)
    gens = await sample(engine, 3, seed0=50)
    for i, g in enumerate(gens):
        assert set(g.token_versions()) == {new}
        assert gap(engine.models[new], PROMPT[: 6 + i], g) < TOL_F32
        # and not the old weights' (a client that loaded nothing would pass the version
        # check against a server that ignores the path, never this one)
        assert gap(engine.models[before], PROMPT[: 6 + i], g) > 1e-2


async def test_generations_across_an_update_finish_with_each_tokens_version(engine):
    old = max(engine.models, key=int)
    new = str(int(old) + 1)
    path = engine.export(int(new), policy(int(new) + 100))
    vllm = engine.backend == "vllm"
    sent = []  # the URLs of the generate requests whose body is on the wire
    trace = aiohttp.TraceConfig()

    async def on_sent(_session, _ctx, params):  # a generate body is one chunk
        if b"sampling_params" in params.chunk:
            sent.append(params.url)

    trace.on_request_chunk_sent.append(on_sent)
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        client = engine.client(session, retries=0)  # an abort would fail, not be retried
        if vllm:  # all four in the engine before the update, however slowly they are sent
            await hold(engine, session)  # (held, then resumed once all four bodies are sent)
        running = [
            asyncio.create_task(
                client.generate(PROMPT, Sampling(1.0, max_new_tokens=LONG, seed=i, ignore_eos=True))
            )
            for i in range(4)
        ]
        await asyncio.sleep(0.3)
        deadline = time.monotonic() + 60
        while vllm and len(sent) < len(running):
            assert time.monotonic() < deadline, f"{len(sent)} of {len(running)} requests sent"
            await asyncio.sleep(0.05)
        assert not any(t.done() for t in running), "the generations ended before the update"
        if vllm:  # they start together; the update's pause (mode=wait) comes while they decode
            await resume(engine, session)
        await client.update_weights(str(path), new)
        gens = await asyncio.gather(*running)
    spanning = [len(set(g.token_versions())) == 2 for g in gens]
    if engine.backend == "sglang":  # retracted, then recomputed and continued on the new
        assert any(spanning)
    else:  # vLLM's pause mode=wait: they end on the weights they began with
        assert not any(spanning) and {v for g in gens for v in g.token_versions()} == {old}
    for g in gens:
        assert g.finish == "length" and len(g.output_ids) == LONG
        versions = g.token_versions()
        assert set(versions) <= {old, new}
        assert versions == sorted(versions, key=int)  # old tokens, then new ones
        # each token's logprob is that of the weights its recorded version names
        seq = PROMPT + g.output_ids
        for v in set(versions):
            ours = learner_logprobs(engine.models[v], seq)[len(PROMPT) - 1 :]
            at = np.asarray(versions) == v
            assert np.max(np.abs(np.asarray(g.logprobs)[at] - ours[at])) < TOL_F32, v


async def test_a_wrong_weight_path_fails_loudly_and_changes_nothing(engine):
    current = max(engine.models, key=int)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(InferenceError, match="weight update to 999 failed"):
            await engine.client(session).update_weights(str(engine.root / "no-such-dir"), "999")
    gens = await sample(engine, 2, seed0=70)
    for i, g in enumerate(gens):
        assert set(g.token_versions()) == {current}
        assert gap(engine.models[current], PROMPT[: 6 + i], g) < TOL_F32


# ----------------------------------------------------------------------------- failures


def engine_pids(children: Children) -> list[int]:
    """The engine's processes: the wrapper's group, less the wrapper."""
    ((_, wrapper),) = children.procs
    return [pid for pid in group_pids(wrapper.pid) if pid != wrapper.pid]


async def test_an_engine_killed_mid_run_is_an_infra_error_then_restarted(engine):
    current = max(engine.models, key=int)
    async with aiohttp.ClientSession() as session:
        client = engine.client(session, retries=1)
        await hold(engine, session)  # the generation cannot end before the kill, however slow
        running = asyncio.create_task(  # this process is to send it and to kill
            client.generate(PROMPT, Sampling(1.0, max_new_tokens=LONG, ignore_eos=True))
        )
        await asyncio.sleep(0.3)
        assert not running.done()
        killed = engine_pids(engine.children)
        assert killed, "the engine has no process to kill"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            g = await running
        except InferenceError:
            pass
        else:  # what came back, to tell a missed kill from a reply the kill did not stop
            log = (engine.root / "logs" / "inference.log").read_text(errors="replace")
            events = [ln for ln in log.splitlines() if "learner.engines" in ln or "restart" in ln]
            pytest.fail(
                f"a generation ended normally {time.monotonic() - t_kill:.1f} s after its "
                f"engine was killed: {len(g.output_ids)} tokens, finish {g.finish!r}, versions "
                f"{sorted(set(g.token_versions()))}; killed {killed}, "
                f"alive {[p for p in killed if os.path.exists(f'/proc/{p}')]}; "
                f"the wrapper's log: {events[-6:]}"
            )
        deadline = time.monotonic() + 600
        while not (await client.health())[engine.url]:
            assert time.monotonic() < deadline, "the engine was not restarted"
            assert engine.children.procs[0][1].poll() is None, "the wrapper gave up"
            await asyncio.sleep(2)
    gens = await sample(engine, 2, seed0=90)
    for i, g in enumerate(gens):  # restarted on the newest export, as its version
        assert set(g.token_versions()) == {current}
        assert gap(engine.models[current], PROMPT[: 6 + i], g) < TOL_F32


PARENT = """
import sys, time
from pathlib import Path
from learner.embedded.children import Children
children = Children(Path(sys.argv[1]))
print(children.start("inference", ["learner.engines", "--hf", sys.argv[2],
                                   "--set", "inference.backend=" + sys.argv[3]],
                     timeout=900), flush=True)
time.sleep(900)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_engine_ends_when_the_run_that_started_it_is_killed(backend, tmp_path):
    """SIGKILL leaves learner.train no way to stop its children: the engine's wrapper
    watches it (shared.lifeline) and stops its group, the engine's every process with it
    (vLLM's EngineCore and Worker outlive a SIGKILLed API server otherwise)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    if not available(backend):
        pytest.fail(f"{backend}: not installed; `make engines` builds it")
    hf = export_hf(
        policy(3), tmp_path / "hf" / "0", tokenizer_dir=TINY_TOKENIZER_DIR, dtype="float32",
        untie=untied_export(backend),
    )  # fmt: skip
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "logs"), str(hf), backend],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout.readline().startswith("http://127.0.0.1:")
        pgid = int((tmp_path / "logs" / "children.pids").read_text().split()[1])
        assert len(group_pids(pgid)) >= 3  # the wrapper, the server and its workers
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_pids(pgid) == []
    finally:
        parent.kill()
