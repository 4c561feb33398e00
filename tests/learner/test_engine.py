"""The generation engine in process: logprobs, greedy decoding, stops, prompt scoring."""

import numpy as np
import pytest

from learner.engine import Engine, Request, SamplingParams, bucket
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
