"""The generation engine in process: logprobs, greedy decoding, stops, prompt scoring."""

import numpy as np
import pytest

from learner.serving.engine import Engine, Request, SamplingParams, bucket
from tests.learner.helpers import greedy_reference, small_model, teacher_forced_logprobs


@pytest.fixture(scope="module")
def setup():
    model = small_model()
    return model, Engine(model, eos_ids=(2,), max_batch=8, max_len=256, decode_chunk=4)


def _prompt(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(3, 4096, n)]


def test_buckets():
    assert [bucket(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError):
        bucket(9, (1, 2, 4, 8))


def test_sampled_logprobs_equal_teacher_forced_logprobs(setup):
    model, engine = setup
    reqs = [
        Request(f"r{i}", _prompt(n, i), SamplingParams(temperature=t, max_new_tokens=m, seed=i))
        for i, (n, t, m) in enumerate([(3, 1.0, 11), (40, 1.0, 9), (70, 0.7, 6)])
    ]
    engine.generate(reqs)
    for r in reqs:
        assert len(r.output_ids) == r.params.max_new_tokens  # no eos (id 2) drawn here
        ref = teacher_forced_logprobs(model, r.input_ids + r.output_ids, r.params.temperature)
        np.testing.assert_allclose(r.output_logprobs, ref[len(r.input_ids) :], atol=1e-5, rtol=0)


def test_greedy_matches_argmax_decoding_and_stops_on_a_stop_token(setup):
    model, engine = setup
    prompt = _prompt(10, 7)
    expected = greedy_reference(model, prompt, 12)
    r = Request("g", prompt, SamplingParams(temperature=0.0, max_new_tokens=12))
    engine.generate([r])
    assert r.output_ids == expected and r.finish_reason == {"type": "length", "length": 12}
    stop = expected[5]
    first = expected.index(stop)
    r = Request(
        "s", prompt, SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,))
    )
    engine.generate([r])
    assert r.output_ids == expected[: first + 1]  # the matched stop token is kept
    assert r.finish_reason == {"type": "stop", "matched": stop}


def test_prompt_scoring_with_zero_new_tokens(setup):
    model, engine = setup
    prompt = _prompt(20, 3)
    r = Request("p", prompt, SamplingParams(temperature=1.0, max_new_tokens=0), logprob_start_len=5)
    engine.generate([r])
    assert r.output_ids == [] and r.finish_reason == {"type": "length", "length": 0}
    ref = teacher_forced_logprobs(model, prompt)
    assert len(r.input_logprobs) == 15
    np.testing.assert_allclose(r.input_logprobs, ref[5:], atol=1e-5, rtol=0)
    r0 = Request("q", prompt, SamplingParams(max_new_tokens=0), logprob_start_len=0)
    engine.generate([r0])
    assert r0.input_logprobs[0] is None  # the first token has no context
    # a start at the prompt's end asks for output logprobs only (the rollout client's idiom)
    r1 = Request("o", prompt, SamplingParams(max_new_tokens=2, seed=0), logprob_start_len=20)
    engine.generate([r1])
    assert r1.input_logprobs == [] and len(r1.output_logprobs) == 2


def test_requests_never_run_past_the_context(setup):
    _, engine = setup
    r = Request(
        "long",
        _prompt(250, 4),
        SamplingParams(temperature=0.0, max_new_tokens=100, ignore_eos=True),
    )
    engine.generate([r])
    assert len(r.output_ids) == 6 and r.finish_reason["type"] == "length"  # 256 - 250
    assert engine.check(Request("x", _prompt(256, 5), SamplingParams())) is not None
    assert engine.check(Request("y", [4096], SamplingParams())) is not None


def test_weights_straight_from_a_train_state_reuse_the_compiled_programs():
    """Weights handed over from a train state (arrays on the learner's mesh, later donated)
    are served without compiling prefill and decode again, and stay alive after the state
    is donated to the next step."""
    import jax
    from flax import nnx

    from learner.model.params import Model
    from learner.training.batching import pack
    from learner.training.step import compile_step, new_state, place_batch
    from shared.config import LearnerConfig
    from shared.wire import Trajectory, TrajectoryGroup

    model = small_model(seed=9)
    served = Model(model.cfg, rngs=nnx.Rngs(1))
    engine = Engine(served, eos_ids=(2,), max_batch=2, max_len=128, decode_chunk=4)

    def run():
        r = Request("r", _prompt(10, 1), SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
        engine.generate([r])
        return r

    run()
    sizes = (engine._prefill._cache_size(), engine._decode._cache_size())
    cfg = LearnerConfig(warmup_steps=0, learning_rate=1e-2, length_buckets=(32,))
    state, sh = new_state(model, None, cfg)  # no mesh: one device
    step = compile_step(model, None, cfg, sh)
    rng = np.random.default_rng(0)
    trajs = [
        Trajectory("t", "g", i, rng.integers(3, 4096, 20).astype(np.int32),
                   np.ones(20, np.uint8), -np.ones(20, np.float32), np.zeros(20, np.int32),
                   reward=float(i))
        for i in range(2)
    ]  # fmt: skip
    batch = place_batch(
        pack([TrajectoryGroup("g", "t", trajs)], rows=2, buckets=(32,)).arrays, None
    )
    state, _ = step(state, batch)
    engine.set_params(state.params)
    r = run()
    assert (engine._prefill._cache_size(), engine._decode._cache_size()) == sizes
    trained = Model(model.cfg, rngs=nnx.Rngs(0))
    from learner.model.params import set_params

    set_params(trained, {k: np.asarray(v) for k, v in state.params.items()})
    ref = teacher_forced_logprobs(trained, r.input_ids + r.output_ids)
    np.testing.assert_allclose(r.output_logprobs, ref[len(r.input_ids) :], atol=1e-5, rtol=0)
    state, _ = step(state, batch)  # donates the state the weights came from
    jax.block_until_ready(state.params)
    again = run()
    assert again.output_ids == r.output_ids  # same seed, same weights: still served
    assert all(not v.is_deleted() for v in jax.tree.leaves(engine.state))
    model_params = jax.tree.leaves(nnx.state(model))
    assert all(not v.is_deleted() for v in model_params)  # new_state copied them


def test_the_decode_tile_is_a_quarter_of_the_cache_within_bounds():
    """A decode step's key tile follows the cache: a batch whose contexts fill part of
    their bucket skips the tiles past them (learner.serving.extend.decode_block)."""
    from learner.serving.extend import DECODE_BLOCK, DECODE_BLOCK_MIN, decode_block, key_block

    assert [decode_block(n) for n in (32, 256, 512, 2048, 4096, 32768)] == [
        64, 64, 128, 512, 1024, 1024,
    ]  # fmt: skip
    assert DECODE_BLOCK_MIN == 64 and DECODE_BLOCK == 1024
    assert key_block(32, decode_block(32)) == 32  # never a tile longer than the cache
    assert key_block(96, decode_block(96)) == 32  # a bucket that is no power of two


def test_wide_batches_decode_without_ynn_fusions_and_as_the_default_program():
    """From DECODE_WIDE_ROWS rows on, decode chunks run the program compiled without
    XLA:CPU's YNNPACK fusions; it samples what the default one does (teacher-forced
    logprobs, as the narrow batches' test above)."""
    import jax
    import jax.numpy as jnp

    from learner.serving import engine as engine_mod

    opts = engine_mod.cpu_compiler_options(engine_mod.NO_YNN_FUSIONS)
    if opts is None:
        pytest.skip("not the CPU backend, or an XLA without the YNN fusion option")

    def f(a, b):
        return jnp.tanh(a @ b).sum(-1)

    def ynn_fusions(**jit_kw):
        text = jax.jit(f, **jit_kw).lower(jnp.ones((64, 128)), jnp.ones((128, 384))).compile()
        return text.as_text().count('"kind":"__ynn_fusion"')

    assert ynn_fusions() > 0  # the option matters here
    assert ynn_fusions(compiler_options=opts) == 0

    model = small_model()
    rows = engine_mod.DECODE_WIDE_ROWS
    engine = Engine(model, eos_ids=(2,), max_batch=rows, max_len=128, decode_chunk=4)
    reqs = [
        Request(
            f"w{i}",
            _prompt(5 + 3 * i, 50 + i),
            SamplingParams(temperature=1.0, max_new_tokens=7, seed=i),
        )
        for i in range(rows)
    ]
    engine.generate(reqs)
    assert engine._decode_wide._cache_size() > 0 and engine._decode._cache_size() == 0
    for r in reqs:
        ref = teacher_forced_logprobs(model, r.input_ids + r.output_ids, r.params.temperature)
        np.testing.assert_allclose(r.output_logprobs, ref[len(r.input_ids) :], atol=1e-5, rtol=0)
    narrow = [Request("n", _prompt(9, 1), SamplingParams(temperature=1.0, max_new_tokens=6))]
    engine.generate(narrow)
    assert engine._decode._cache_size() > 0


def test_one_decode_program_per_batch_shape():
    """Every decode chunk of a batch, the first included, takes the same compiled program
    (the first chunk's positions are placed as the later chunks' are)."""
    engine = Engine(small_model(), eos_ids=(2,), max_batch=4, max_len=128, decode_chunk=4)
    reqs = [
        Request(f"c{i}", _prompt(9, 60 + i), SamplingParams(temperature=1.0, max_new_tokens=13))
        for i in range(2)
    ]
    engine.generate(reqs)  # 1 token from prefill, then 3 chunks of 4
    assert all(len(r.output_ids) == 13 for r in reqs)
    assert engine._decode._cache_size() == 1
