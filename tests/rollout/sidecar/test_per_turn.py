"""``rollout.trajectory = "per_turn"``: one training sequence per turn, under a context policy.

Episodes run through the real environment (parser, verifier, record) on a scripted
backend and a scripted policy; the learner side uses the tiny model and the real
batching, loss and step functions.
"""

from __future__ import annotations

import asyncio
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.model.params import get_params
from learner.training.batching import pack
from learner.training.step import _micro_step, init_state, train_step
from rollout.env.core import Environment, EpisodeLimits
from rollout.env.observation import Observation
from rollout.net.urls import UrlPolicy
from rollout.sidecar.episode import Context, Limits, run_episode, run_episode_turns
from shared.chat import render_chat
from shared.config import ConfigError, LearnerConfig, from_dict
from shared.tokenizer import load_tokenizer
from shared.wire import Trajectory, TrajectoryGroup, WireError, decode_group, encode_group
from tests.learner.helpers import small_model

TOK = load_tokenizer()
FULL = Context()  # the context policy "full"
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 20


class PagesBackend:
    """Every action opens a new page of filler text at a new URL."""

    def __init__(self):
        self.n = 0

    async def start(self, start_url: str) -> Observation:
        return Observation("Start page. Search to begin.", url=start_url)

    async def act(self, action) -> Observation:
        self.n += 1
        url = f"http://127.0.0.1/p/{self.n}"
        return Observation(f"Page {self.n}. {FILLER}", url=url, summary=f"page {self.n}")

    async def recover(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def url(self) -> str | None:
        return None


def _task(i: int = 0) -> dict:
    return {
        "id": f"train-qa-{i}",
        "type": "qa",
        "question": "What is the code word?",
        "answer": "ipsum",
        "start_url": "http://127.0.0.1/",
    }


def _policy(steps: int, answer: str):
    """Searches ``steps - 1`` times, then answers."""
    n = [0]

    def act(_observation: str) -> str:
        n[0] += 1
        return f"<search>q{n[0]}</search>" if n[0] < steps else f"<answer>{answer}</answer>"

    return act


def _env(max_steps: int = 60) -> Environment:
    return Environment(
        "api", PagesBackend(), UrlPolicy(), limits=EpisodeLimits(max_steps=max_steps),
        prompt="compact",
    )  # fmt: skip


def _play(per_turn: bool, steps: int, answer: str, i: int, limits: Limits, context: Context = FULL):
    kw = dict(group_id="g", sample_index=i, limits=limits, scripted=_policy(steps, answer))
    if per_turn:
        run = run_episode_turns(_env(), _task(), TOK, context=context, **kw)
        return asyncio.run(run)
    return [asyncio.run(run_episode(_env(), _task(), TOK, **kw))]


def _with_logprobs(t: Trajectory, seed: int) -> Trajectory:
    """``t`` with made-up rollout logprobs on its generated tokens (as a server's)."""
    rng = np.random.default_rng(seed)
    lp = np.where(t.loss_mask > 0, -rng.random(t.length) * 2, 0.0).astype(np.float32)
    return Trajectory(**{**t.__dict__, "logprobs": lp})


WINDOW = Limits(max_context_tokens=1024, observation_tokens=48, max_new_tokens=16)
EPISODES = [(3, "ipsum"), (4, "wrong"), (2, "ipsum"), (5, "wrong")]  # (steps, answer)


@pytest.fixture(scope="module")
def both():
    """The same four episodes as whole sequences and as per-turn sequences (history full)."""
    seq = [_play(False, n, a, i, WINDOW)[0] for i, (n, a) in enumerate(EPISODES)]
    turns = [_play(True, n, a, i, WINDOW) for i, (n, a) in enumerate(EPISODES)]
    return seq, turns


def test_full_history_turns_are_prefixes_of_the_sequence(both):
    seq, turns = both
    for s, ts in zip(seq, turns, strict=True):
        assert [t.turn for t in ts] == list(range(len(ts))) and s.turn == -1
        assert len(ts) == s.num_steps and {t.reward for t in ts} == {s.reward}
        gen = np.flatnonzero(s.loss_mask)
        seen = []
        for t in ts:
            # turn k = the sequence's prefix up to its generated tokens, trained only on those
            np.testing.assert_array_equal(t.tokens, s.tokens[: t.length])
            mine = np.flatnonzero(t.loss_mask)
            assert mine.size and (np.diff(mine) == 1).all() and mine[-1] == t.length - 1
            seen.extend(mine.tolist())
        assert seen == gen.tolist()  # every generated token is trained on exactly once
    assert [s.reward for s in seq] == [1.0, 0.1, 1.0, 0.1]  # a wrong answer: format 0.1


def test_per_turn_groups_travel_and_old_messages_still_decode(both):
    seq, turns = both
    g = TrajectoryGroup("g", "train-qa-0", [t for ts in turns for t in ts])
    back = decode_group(encode_group(g))
    assert back == g and back.num_episodes == 4 and back.turns.tolist() == g.turns.tolist()
    np.testing.assert_array_equal(back.episode_rewards, [1.0, 0.1, 1.0, 0.1])
    # a version 1 message (no turns): every row a whole episode
    import msgpack

    from tests.shared.test_wire import join, split

    header, data = split(encode_group(TrajectoryGroup("g", "train-qa-0", seq)))
    header["v"] = 1
    del header["groups"][0]["arrays"]["turns"]
    old = decode_group(join(header, data))
    assert old.turns.tolist() == [-1] * 4 and old.num_episodes == 4
    assert msgpack  # the header is plain msgpack
    # an episode's turns must be contiguous and agree on the reward
    a, b = turns[0][0], turns[1][1]
    for rows in ([a, b], [b], [turns[0][1], a]):
        with pytest.raises(WireError, match=r"contiguous|differ in sample index"):
            TrajectoryGroup("g", "train-qa-0", rows)
    other = Trajectory(**{**turns[0][1].__dict__, "reward": 0.5})
    with pytest.raises(WireError, match="differ"):
        TrajectoryGroup("g", "train-qa-0", [a, other])


def _loss_and_grads(groups, agg: str, *, packing: bool, rows: int, slots: int):
    model = small_model()
    cfg = LearnerConfig(loss_agg=agg, tis_cap=2.0, clip_eps_high=0.28)
    p = pack(groups, rows=rows, buckets=(256, 512, 1024), packing=packing, slots=slots,
             pad_id=0, with_old_logp=True)  # fmt: skip
    batch = {k: jnp.asarray(v) for k, v in p.arrays.items()}
    from learner.training.grpo import agg_denominator

    constant = batch["loss_constant_b"][0]
    den = agg_denominator(batch["mask_bt"], agg, constant, batch.get("segment_bt"))
    params = get_params(model)
    step = jax.jit(functools.partial(_micro_step, model=model, cfg=cfg))
    loss, _, grads = step(params, None, batch, den)
    return p, float(loss), grads


@pytest.mark.parametrize("agg", ["token_mean", "constant"])
def test_per_turn_and_sequence_give_the_same_loss_and_gradients(both, agg):
    """Acceptance (1): episodes that fit the window, context policy full: the per-turn
    sequences score the same generated tokens with the same prefixes, so one GRPO
    group has the same loss and gradients either way."""
    seq, turns = both
    seq = [_with_logprobs(t, i) for i, t in enumerate(seq)]
    turns = [
        [
            Trajectory(**{**t.__dict__, "logprobs": s.logprobs[: t.length] * (t.loss_mask > 0)})
            for t in ts
        ]
        for s, ts in zip(seq, turns, strict=True)
    ]  # fmt: skip  (the same rollout logprobs on the same tokens)
    g_seq = TrajectoryGroup("g", "train-qa-0", seq)
    g_turn = TrajectoryGroup("g", "train-qa-0", [t for ts in turns for t in ts])
    n_turns = len(g_turn)
    p1, loss1, grads1 = _loss_and_grads([g_seq], agg, packing=False, rows=4, slots=4)
    p2, loss2, grads2 = _loss_and_grads([g_turn], agg, packing=True, rows=n_turns, slots=4)
    assert p1.stats["loss_tokens"] == p2.stats["loss_tokens"] > 0
    assert p1.stats["trajectories"] == p2.stats["trajectories"] == 4
    assert p2.stats["sequences"] == n_turns == sum(n for n, _ in EPISODES)
    assert p1.shape[1] == p2.shape[1]  # the last turn is the whole episode: the same bucket
    assert abs(loss1) > 1e-4
    np.testing.assert_allclose(loss2, loss1, rtol=1e-5, atol=1e-6)
    flat1, flat2 = jax.tree.leaves(grads1), jax.tree.leaves(grads2)
    assert max(float(jnp.abs(g).max()) for g in flat1) > 1e-5
    for a, b in zip(flat1, flat2, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_the_per_turn_advantage_is_the_episodes():
    """Rewards 1, 0 over two episodes of 3 and 1 turns: advantages +1, -1 (population std
    0.5, (1 - 0.5) / 0.5 = 1), given to every turn; not four samples' (1, 1, 1, 0)."""
    from learner.training.batching import advantages

    def turn(i, k, reward):
        n = 6
        return Trajectory("t", "g", i, np.arange(3, 3 + n, dtype=np.int32),
                          np.array([0, 0, 0, 1, 1, 1], np.uint8), np.zeros(n, np.float32),
                          np.zeros(n, np.int32), reward=reward, num_steps=3, turn=k)  # fmt: skip

    g = TrajectoryGroup(
        "g", "t", [turn(0, 0, 1.0), turn(0, 1, 1.0), turn(0, 2, 1.0), turn(1, 0, 0.0)]
    )
    (adv,), (keep,) = advantages([g], ddof=0)
    np.testing.assert_allclose(adv, [1.0, 1.0, 1.0, -1.0], atol=1e-5)
    assert keep


@pytest.mark.slow
def test_keep_last_fits_a_long_episode_in_the_window_and_trains():
    """Acceptance (2): a 50-step episode with keep_last = 3: every turn's prompt (what the
    policy was given) fits the window and a learner step trains on them; as one
    sequence the same episode overflows (it ends truncated, long before its answer).
    Each older step still costs its action and a ~35-token stub, so the window is 4096."""
    window = Limits(max_context_tokens=4096, observation_tokens=200, max_new_tokens=16)
    prompts = []

    class Recording(Context):
        def prompt(self, head, turns):
            out = super().prompt(head, turns)
            prompts.append(out)
            return out

    good = _play(True, 50, "ipsum", 0, window, Recording("keep_last", 3))
    bad = _play(True, 3, "wrong", 1, window, Context("keep_last", 3))
    assert len(good) == 50 and good[0].status == "ok" and good[0].reward == 1.0
    assert len(bad) == 3 and bad[0].reward < 1.0
    assert max(t.length for t in good + bad) <= window.max_context_tokens
    for t in good:  # each turn's prompt is exactly what the policy was given at that turn
        gen = np.flatnonzero(t.loss_mask)
        assert any(np.array_equal(t.tokens[: gen[0]], p) for p in prompts)
    text = TOK.decode(good[-1].tokens.tolist())
    assert "[observation 1 elided: search(query='q1') -> http://127.0.0.1/p/1]" in text
    assert text.count("Page ") == 3  # the last three observations, verbatim
    # as one sequence, the same episode overflows the window
    whole = _play(False, 50, "ipsum", 0, window)[0]
    assert whole.status == "truncated" and whole.num_steps < 50 and whole.reward < 1.0
    assert sum(t.length for t in good) > 10 * window.max_context_tokens
    # a learner step over the per-turn group runs, with a finite loss
    g = TrajectoryGroup("g", "train-qa-0", [*good, *bad])
    model = small_model(max_position_embeddings=4096)
    cfg = LearnerConfig(loss_agg="token_mean")
    rows = -(-int(g.lengths.sum()) // 4096) + 2
    p = pack([g], rows=rows, buckets=(1024, 2048, 4096), packing=True, slots=2)
    assert p.stats["loss_tokens"] == sum(int(t.loss_mask.sum()) for t in g.trajectories)
    state = init_state(get_params(model), cfg)
    step = jax.jit(functools.partial(train_step, model=model, cfg=cfg))
    _, m = step(state, {k: jnp.asarray(v) for k, v in p.arrays.items()})
    assert np.isfinite(float(m["loss"])) and float(m["grad_norm"]) > 0


def test_window_bounds_every_turn_s_prompt_at_50_actions():
    """env.history = "window", keep_last 2: every turn's prompt is the head plus at most the
    last two turns, whatever the episode's length. The bound, by hand: the head (the
    first prompt), then per kept turn at most max_new_tokens generated ids and an
    observation turn of at most observation_tokens plus its framing (the longest
    observation turn of the full-history run, measured: the same observations)."""
    limits = Limits(max_context_tokens=4096, observation_tokens=200, max_new_tokens=16)
    prompts = []

    class Recording(Context):
        def prompt(self, head, turns):
            out = super().prompt(head, turns)
            prompts.append((len(turns), out))
            return out

    turns = _play(True, 50, "ipsum", 0, limits, Recording("window", 2))
    assert len(turns) == 50 and turns[0].status == "ok" and turns[0].reward == 1.0
    head = prompts[0][1]
    obs_turn = 200 + 16  # an observation is cut to observation_tokens, plus framing
    bound = len(head) + 2 * (limits.max_new_tokens + obs_turn)
    assert max(len(p) for _, p in prompts) <= bound < 1024
    # past the first turns the prompt stops growing: the same length at turns 20 and 49
    # (pages 19-20 and 48-49 in view: as many digits, one token each)
    lengths = {k: len(p) for k, p in prompts}
    assert lengths[20] == lengths[49] and lengths[49] > lengths[0]
    last = TOK.decode(turns[-1].tokens.tolist())
    assert last.count("Page ") == 2 and "Page 48." in last and "Page 49." in last
    assert "elided" not in last and "Page 47." not in last  # older turns are left out
    for t in turns:  # each turn's sequence is the prompt the policy was given, then its action
        gen = np.flatnonzero(t.loss_mask)
        assert any(np.array_equal(t.tokens[: gen[0]], p) for _, p in prompts)
    # the same episode under keep_last (stubs) grows with every turn
    stubs = _play(True, 50, "ipsum", 0, limits, Context("keep_last", 2))
    assert stubs[-1].length > 2 * max(t.length for t in turns)
    with pytest.raises(ValueError, match="window"):
        Context("window", 0)
    with pytest.raises(ConfigError, match="keep_last = 0"):
        from_dict({"rollout": {"trajectory": "per_turn"}, "learner": {"packing": True},
                   "env": {"history": "window", "keep_last": 0}})  # fmt: skip


def test_config_refuses_a_context_policy_on_whole_sequences():
    per_turn = {"trajectory": "per_turn"}
    with pytest.raises(ConfigError, match=r"env\.history"):
        from_dict({"env": {"history": "keep_last"}})
    with pytest.raises(ConfigError, match="seq_mean_token_mean"):
        from_dict(
            {"rollout": per_turn, "learner": {"loss_agg": "seq_mean_token_mean", "packing": True}}
        )
    with pytest.raises(ConfigError, match=r"learner\.packing = false"):
        from_dict({"rollout": per_turn})
    cfg = from_dict(
        {"rollout": per_turn, "env": {"history": "keep_last", "keep_last": 3},
         "learner": {"packing": True}}
    )  # fmt: skip
    assert cfg.env.keep_last == 3 and cfg.rollout.trajectory == "per_turn"


def test_sft_export_per_turn_trains_each_turn_once(tmp_path):
    """``--per-turn``: one example per step, earlier assistant turns weight 0 (mask 0)."""
    from rollout.sft_export import to_messages, to_turn_messages

    env = _env()
    run = run_episode(env, _task(), TOK, group_id="g", sample_index=0, limits=WINDOW,
                      scripted=_policy(3, "ipsum"))  # fmt: skip
    asyncio.run(run)
    rec = env.record
    chats = to_turn_messages(rec, keep_last=1)
    assert len(chats) == 3 and len(to_messages(rec)) == 2 + 2 * 3 - 1
    kw = dict(observation_tokens=48, max_context_tokens=1024)
    trained = [sum(render_chat(TOK, c, **kw)[1]) for c in chats]
    _, full_mask = render_chat(TOK, to_messages(rec), **kw)
    assert sum(trained) == sum(full_mask)  # each assistant turn trained once, in its example
    assert "elided" in chats[2][3]["content"] and "Page 2." in chats[2][5]["content"]


def test_sft_export_window_keeps_only_the_last_turns_as_the_rollout_does():
    """``--history window --keep-last 1``: each step's example is the head, the one turn
    before it (its action, weight 0, and its observation) and the step's action, so the
    warm start learns from prompts shaped as GRPO's under env.history = "window"; and
    the turn's prompt rendered from that chat is the one the rollout gave the policy."""
    from rollout.sft_export import to_turn_messages

    env = _env()
    limits = Limits(max_context_tokens=4096, observation_tokens=48, max_new_tokens=16)
    turns = asyncio.run(
        run_episode_turns(env, _task(), TOK, group_id="g", sample_index=0, limits=limits,
                          scripted=_policy(4, "ipsum"), context=Context("window", 1))
    )  # fmt: skip
    chats = to_turn_messages(env.record, keep_last=1, history="window")
    assert len(chats) == len(turns) == 4
    roles = [[m["role"] for m in c] for c in chats]
    head = roles[0][:-1]  # system?, user
    assert roles[0] == [*head, "assistant"]
    assert all(r == [*head, "assistant", "tool", "assistant"] for r in roles[1:])
    assert chats[3][-3]["content"] == "<search>q3</search>" and chats[3][-3]["weight"] == 0
    assert "Page 3." in chats[3][-2]["content"] and "Page 2." not in str(chats[3])
    for chat, t in zip(chats, turns, strict=True):  # the same prompt tokens as the rollout's
        ids, _ = render_chat(TOK, chat, observation_tokens=48, max_context_tokens=4096)
        gen = np.flatnonzero(t.loss_mask)
        assert ids[: gen[0]] == t.tokens[: gen[0]].tolist()
    with pytest.raises(ValueError, match="history"):
        to_turn_messages(env.record, keep_last=1, history="everything")


def test_evaluation_plays_a_per_turn_run_under_its_context_policy():
    """rollout.eval plays the model as training does: a per-turn run with a bounded
    history finishes a 40-step episode in a window that one sequence overflows (which
    would score every long test episode as truncated)."""
    from rollout.eval import play

    limits = Limits(max_context_tokens=1024, observation_tokens=200, max_new_tokens=16)
    per_turn = from_dict({"rollout": {"trajectory": "per_turn"}, "learner": {"packing": True},
                          "env": {"history": "window", "keep_last": 1}})  # fmt: skip
    t = asyncio.run(play(_env(), _task(), TOK, per_turn, limits, scripted=_policy(40, "ipsum")))
    assert (t.status, t.num_steps, t.reward) == ("ok", 40, 1.0)
    assert t.length <= limits.max_context_tokens
    whole = from_dict({})
    t = asyncio.run(play(_env(), _task(), TOK, whole, limits, scripted=_policy(40, "ipsum")))
    assert t.status == "truncated" and t.num_steps < 40 and t.reward < 1.0
