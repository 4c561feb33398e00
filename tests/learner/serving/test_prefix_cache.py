"""The prefix cache: its bookkeeping by hand, and the engine giving the same results with it."""

import numpy as np
import pytest

from learner.serving.engine import Engine, Request, SamplingParams
from learner.serving.prefix_cache import PrefixCache
from tests.learner.helpers import small_model, teacher_forced_logprobs

# ----------------------------------------------------------------------------- bookkeeping


def test_longest_common_prefix_match_and_pins():
    pc = PrefixCache(16)
    start, slots = pc.insert([5, 6, 7, 8])
    assert start == 0 and list(slots) == [0, 1, 2, 3]
    pc.release(slots)  # the writer's pin
    assert list(pc.refs[:4]) == [1, 1, 1, 1]
    # a sibling diverging after 2 tokens matches 2; a longer turn matches all 4
    assert list(pc.acquire([5, 6, 9])) == [0, 1]
    assert list(pc.acquire([5, 6, 7, 8, 9, 10])) == [0, 1, 2, 3]
    assert list(pc.refs[:4]) == [3, 3, 2, 2]  # entry + two pins, entry + one pin
    assert len(pc.acquire([4, 5])) == 0
    pc.release(np.array([0, 1], np.int32))
    pc.release(np.array([0, 1, 2, 3], np.int32))
    assert list(pc.refs[:4]) == [1, 1, 1, 1]


def test_entries_share_their_common_prefix_and_covered_prefixes_are_dropped():
    pc = PrefixCache(16)
    pc.release(pc.insert([1, 2, 3])[1])  # slots 0-2
    # the next turn: 3 shared slots, 2 new ones; the old entry is a prefix of it, so dropped
    start, new = pc.insert([1, 2, 3, 4, 5])
    pc.release(new)
    assert start == 3 and list(new) == [3, 4] and len(pc.entries) == 1
    assert pc.cached_tokens == 5
    # a sibling sharing 2 tokens: 2 shared slots, 1 new; both entries stay
    start, new = pc.insert([1, 2, 9])
    pc.release(new)
    assert start == 2 and list(new) == [5] and len(pc.entries) == 2
    assert list(pc.refs[:6]) == [2, 2, 1, 1, 1, 1]
    assert pc.insert([1, 2, 3, 4]) is None  # already cached (a prefix of an entry)


def test_lru_eviction_frees_only_unreferenced_slots():
    pc = PrefixCache(6)
    pc.release(pc.insert([1, 2, 3])[1])  # slots 0-2 (entry A)
    pc.release(pc.insert([7, 8])[1])  # slots 3-4 (entry B)
    pc.acquire([1, 2, 3, 4])  # A is now the most recently used; slots 0-2 pinned
    # 3 new slots needed, 1 free: evicting B (least recently used) frees 3 and 4
    start, new = pc.insert([20, 21, 22])
    assert start == 0 and sorted(new) == [3, 4, 5]
    assert len(pc.entries) == 2 and list(pc.refs) == [2, 2, 2, 2, 2, 2]  # entry + pin each
    # 4 needed, none free: both entries go, but pinned slots are never handed out
    assert pc.insert([30, 31, 32, 33]) is None
    assert len(pc.entries) == 0 and list(pc.refs) == [1, 1, 1, 1, 1, 1] and not pc.free
    pc.release(new)
    pc.release(np.array([0, 1, 2], np.int32))
    start, new = pc.insert([30, 31, 32, 33])
    assert start == 0 and len(new) == 4 and pc.cached_tokens == 4


# ----------------------------------------------------------------------------- the engine


def _prompt(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(3, 4096, n)]


ENGINE = dict(eos_ids=(2,), max_batch=8, max_len=1024, decode_chunk=4)


@pytest.fixture(scope="module")
def engines():
    model = small_model(seed=3)
    return model, Engine(model, **ENGINE), Engine(model, prefix_cache_tokens=4096, **ENGINE)


def _run(engine, ids, seed, new=12, temperature=1.0):
    r = Request("r", list(ids), SamplingParams(temperature, max_new_tokens=new, seed=seed))
    engine.generate([r])
    return r


def test_a_multi_turn_episode_is_the_same_with_the_cache_and_hits_its_history(engines):
    model, plain, cached = engines
    ids, prev = _prompt(40, 0), 0
    for turn in range(6):
        a, b = _run(plain, ids, seed=turn), _run(cached, ids, seed=turn)
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(b.output_logprobs, a.output_logprobs, atol=1e-5, rtol=0)
        # everything the last turn fed through the model: its input and output less the last
        assert b.cached_tokens == prev, turn
        assert a.cached_tokens == 0
        prev = len(ids) + len(b.output_ids) - 1
        ids = ids + b.output_ids + _prompt(30 + 17 * turn, 100 + turn)  # + an observation
    ref = teacher_forced_logprobs(model, b.input_ids + b.output_ids)
    np.testing.assert_allclose(b.output_logprobs, ref[len(b.input_ids) :], atol=1e-5, rtol=0)


def test_grpo_siblings_hit_the_shared_prompt_in_one_batch(engines):
    _, plain, cached = engines
    prompt = _prompt(70, 1)
    _run(cached, prompt, seed=0, new=1)  # the prompt is cached
    sibs = [
        Request(f"s{i}", prompt, SamplingParams(1.0, max_new_tokens=9, seed=i)) for i in range(4)
    ]
    refs = [
        Request(f"s{i}", prompt, SamplingParams(1.0, max_new_tokens=9, seed=i)) for i in range(4)
    ]
    cached.generate(sibs)
    plain.generate(refs)
    for s, r in zip(sibs, refs, strict=True):
        assert s.cached_tokens == 69 and s.output_ids == r.output_ids
        np.testing.assert_allclose(s.output_logprobs, r.output_logprobs, atol=1e-5, rtol=0)
    # each sibling's next turn hits its own history (prompt stored once, outputs apart)
    nxt = [Request(f"n{i}", prompt + s.output_ids + [7, 8], SamplingParams(0.0, max_new_tokens=3))
           for i, s in enumerate(sibs)]  # fmt: skip
    cached.generate(nxt)
    assert [n.cached_tokens for n in nxt] == [70 + 9 - 1] * 4


def test_greedy_is_the_same_and_new_weights_drop_the_cache(engines):
    model, plain, cached = engines
    ids = _prompt(90, 5)
    first = _run(cached, ids, seed=0, temperature=0.0)
    again = _run(cached, ids + first.output_ids, seed=0, temperature=0.0)
    ref = _run(plain, ids + first.output_ids, seed=0, temperature=0.0)
    assert again.cached_tokens == 90 + 12 - 1 and again.output_ids == ref.output_ids
    cached.set_model(model)  # same architecture, "new" weights: nothing kept survives
    assert _run(cached, ids + first.output_ids, seed=0).cached_tokens == 0


def test_a_full_cache_evicts_the_least_recent_episode_and_stays_exact(engines):
    """Room for two episodes' histories (111 tokens each: a 100-token prompt and 11 of its
    12 new tokens) in 256 slots: the third episode evicts the first, the second and third
    are still hit, and every output is the uncached engine's."""
    model, plain, _ = engines
    small = Engine(model, prefix_cache_tokens=256, **ENGINE)

    def both(ids, seed):
        a, b = _run(plain, ids, seed), _run(small, ids, seed)
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(b.output_logprobs, a.output_logprobs, atol=1e-5, rtol=0)
        assert small.prefix.cached_tokens <= 256
        return b

    first = [both(_prompt(100, 20 + e), seed=e) for e in range(3)]
    kept = [len(r.input_ids) + len(r.output_ids) - 1 for r in first]  # 111 each, or fewer
    assert [r.cached_tokens for r in first] == [0, 0, 0]
    assert len(small.prefix.entries) == 2 and small.prefix.cached_tokens == kept[1] + kept[2]
    for e in (2, 1):  # the next turns of the two kept episodes hit their histories
        nxt = both(first[e].input_ids + first[e].output_ids + _prompt(5, 60 + e), seed=e)
        assert nxt.cached_tokens == kept[e], e
    gone = both(first[0].input_ids + first[0].output_ids + _prompt(5, 60), seed=0)
    assert gone.cached_tokens == 0  # evicted to make room for the third episode


def test_the_extend_path_compiles_per_bucket_not_per_length(engines):
    _, _, cached = engines
    cached.flush_cache()
    ids = _prompt(20, 9)
    _run(cached, ids, seed=0, new=4)
    before = cached._extend._cache_size()
    for k in range(8):  # suffixes of 2..9 tokens: one bucket; contexts 24..70: 64 / 128
        ids = ids + _prompt(k + 2, 50 + k)
        r = _run(cached, ids, seed=k, new=4)
        assert r.cached_tokens > 0
    assert cached._extend._cache_size() - before <= 2


def test_prompt_scoring_bypasses_the_cache(engines):
    model, _, cached = engines
    ids = _prompt(30, 11)
    _run(cached, ids, seed=0, new=2)
    r = Request("p", [*ids, 5], SamplingParams(1.0, max_new_tokens=1, seed=0), logprob_start_len=0)
    cached.generate([r])
    assert r.cached_tokens == 0 and len(r.input_logprobs) == 31
    ref = teacher_forced_logprobs(model, [*ids, 5])
    np.testing.assert_allclose(r.input_logprobs[1:], ref[1:], atol=1e-5, rtol=0)


def test_blocked_cache_attention_equals_the_dense_masked_one():
    """The extend/decode attention loops over key tiles up to the furthest query only;
    it computes what a dense masked softmax over the whole cache does."""
    import jax
    import jax.numpy as jnp

    from learner.model.attention import attend_masked
    from learner.serving.extend import attend_cache

    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(ks[0], (2, 4, 5, 8))
    k, v = (jax.random.normal(x, (3, 2, 2, 64, 8)) for x in ks[1:])  # (L, B, Hkv, C, D)
    pos = jnp.array([[3, 4, 5, 6, 7], [20, 21, 22, 23, 24]])
    dense = attend_masked(q, k[1], v[1], jnp.arange(64)[None, None] <= pos[:, :, None])
    for block in (8, 16, 64):
        blocked = attend_cache(q, k, v, jnp.int32(1), pos, block)
        np.testing.assert_allclose(blocked, dense, atol=1e-5, rtol=0)
