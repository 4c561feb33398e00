"""The process reward (``rollout.verifiers.process``): the term's bounds, its config, the
evidence and PRM sources, and how it is logged apart from the outcome.

The PRM runs against a real OpenAI-compatible chat-completions server on 127.0.0.1 that
answers from markers in the graded step's text: ``[[good]]`` scores 1, ``[[bad]]`` 0,
``[[half]]`` 0.5, ``[[malformed]]`` replies without a score line, ``[[slow]]`` sleeps past
the client's timeout; any other step scores 0.25. Episodes run through the real
environment (parser, verifier, record) on a scripted backend; the property tests draw
GRPO groups and check that no wrong episode outranks a right one, in reward and in
advantage (``learner.training.batching.advantages``, the learner's own math).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.env.core import Environment, EpisodeLimits
from rollout.env.observation import Observation
from rollout.net.urls import UrlPolicy
from rollout.tracking.records import EpisodeRecord, Step
from rollout.verifiers import (
    FormatConfig,
    JudgeConfig,
    JudgeError,
    ProcessConfig,
    Reward,
    VerifierConfig,
    verifier_config,
    with_process,
)
from rollout.verifiers.config import CAP_MAX, SUCCESS
from rollout.verifiers.process import (
    PRM_RUBRIC,
    evidence_reached,
    parse_score,
    steps_to_score,
    term,
)
from rollout.verifiers.reward import format_tiers
from shared.config import ConfigError, RewardConfig, load
from shared.wire import Trajectory, TrajectoryGroup
from tests.rollout.chat_stub import completion, serve_chat

WEB = "http://127.0.0.1:8900"
PAGE_A, PAGE_B = f"{WEB}/wiki/Alpha", f"{WEB}/wiki/Beta"


def qa_task(**over) -> dict:
    task = {
        "id": "train-qa-1", "type": "qa", "hops": 2, "question": "What links Alpha and Beta?",
        "answer": "Gamma", "start_url": f"{WEB}/",
        "evidence": [{"url": PAGE_A, "quote": "Alpha is"}, {"url": PAGE_B, "quote": "Beta is"}],
    }  # fmt: skip
    task.update(over)
    return task


class PagesBackend:
    """``visit`` lands on the URL asked for; any other action on a search page."""

    def __init__(self):
        self.at: str | None = None

    async def start(self, start_url: str) -> Observation:
        self.at = start_url
        return Observation("Start page.", url=start_url)

    async def act(self, action) -> Observation:
        self.at = action.args().get("url") or f"{WEB}/search"
        return Observation(f"Page at {self.at}.", url=self.at, summary="opened")

    async def recover(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def url(self) -> str | None:
        return self.at


async def play(task: dict, replies: list[str], verifier: VerifierConfig | None) -> Environment:
    """An episode of ``replies`` (the model's texts) on the scripted backend, to its end."""
    env = Environment(
        "api", PagesBackend(), UrlPolicy(), limits=EpisodeLimits(max_steps=len(replies)),
        verifier=verifier,
    )  # fmt: skip
    await env.reset(task)
    for text in replies:
        r = await env.step(text)
        if r.terminated or r.truncated:
            break
    await env.close()
    return env


def evidence(weight: float = 0.1, cap: float = 0.5) -> VerifierConfig:
    return VerifierConfig(process=ProcessConfig("evidence", weight=weight, cap=cap))


# ----------------------------------------------------------------------------- the term


def test_the_term_by_hand():
    cfg = ProcessConfig("evidence", weight=0.2, cap=0.5)
    # right: 0.2 * 0.5 = 0.1, uncapped
    assert term(1.0, 0.5, cfg) == pytest.approx(0.1)
    # wrong, well-formed tier 0.1: min(0.2 * 1, 0.5 * (1 - 0.1) = 0.45) = 0.2 -> total 0.3
    assert term(0.1, 1.0, cfg) == pytest.approx(0.2)
    # wrong, a correct but malformed answer 1 - 0.1 = 0.9: min(0.2, 0.5 * 0.1 = 0.05) = 0.05
    # -> total 0.95, still below the right episode's 1.0 + 0.0
    assert term(0.9, 1.0, cfg) == pytest.approx(0.05)
    assert term(0.0, 1.0, cfg, zeroed=True) == 0.0  # a flagged episode earns no process term
    assert term(1.0, 7.0, cfg) == pytest.approx(0.2)  # r_process is clamped to [0, 1]


async def test_off_changes_nothing():
    outcome = Reward(1.0, {"type": "qa", "verdict": "correct"})
    record = EpisodeRecord("e", qa_task(), "api")
    assert await with_process(qa_task(), record, outcome, None) is outcome
    assert await with_process(qa_task(), record, outcome, VerifierConfig()) is outcome
    env = await play(qa_task(), [f"<visit>{PAGE_A}</visit>", "<answer>Gamma</answer>"], None)
    assert env.record.reward == 1.0 and "process" not in env.record.breakdown


# ----------------------------------------------------------------------------- config


def test_the_reward_section_is_off_by_default_and_builds_the_verifier_config():
    assert RewardConfig().process == "off" and verifier_config(RewardConfig()) == VerifierConfig()
    cfg = load(overrides=["reward.process=evidence", "reward.process_lambda=0.3"])
    v = verifier_config(cfg.reward)
    assert (v.process.source, v.process.weight, v.process.cap) == ("evidence", 0.3, 0.5)
    cfg = load(overrides=["reward.process=prm", "reward.prm_url=http://127.0.0.1:9/v1",
                          "reward.prm_retries=1", "reward.prm_max_steps=3"])  # fmt: skip
    p = verifier_config(cfg.reward).process
    assert p.prm == JudgeConfig("http://127.0.0.1:9/v1", model="prm", retries=1)
    assert p.prm_max_steps == 3


def test_reward_format_weight_sets_the_format_tier():
    assert verifier_config(RewardConfig()).format.weight == 0.1  # Search-R1's tier, as before
    cfg = load(overrides=["reward.format_weight=0"])
    fmt = verifier_config(cfg.reward).format
    assert fmt.weight == 0.0
    # a wrong but well-formed answer earns what no answer earns; a right one stays 1
    assert format_tiers(0.0, True, fmt) == 0.0 == format_tiers(0.0, False, fmt)
    assert format_tiers(1.0, True, fmt) == 1.0
    with pytest.raises(ConfigError, match=r"reward.format_weight = 1.0: expected a value in"):
        load(overrides=["reward.format_weight=1"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["reward.process_cap=0.95"], r"reward.process_cap = 0.95: expected a value in \[0, 0.9\]"),
        (["reward.process_lambda=2"], r"reward.process_lambda = 2.0: expected a value in \[0, 1\]"),
        (["reward.process=prm"], "reward.prm_url is unset"),
        (["reward.process=shaped"], "expected one of 'off', 'evidence', 'prm'"),
    ],
)
def test_configs_that_cannot_keep_the_outcome_primary_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(overrides=overrides)


def test_the_verifier_config_refuses_what_breaks_the_ordering():
    with pytest.raises(ValueError, match=r"process.cap must be in \[0, 0.9\]"):
        ProcessConfig("evidence", cap=1.0)
    with pytest.raises(ValueError, match=r"needs process\.prm"):
        ProcessConfig("prm")
    with pytest.raises(ValueError, match=r"format\.weight = 1"):
        VerifierConfig(format=FormatConfig(weight=1.0), process=ProcessConfig("evidence"))


# ----------------------------------------------------------------------------- evidence


def step(index: int, action: str | None, url: str | None = None, **kw) -> Step:
    args = {"url": url} if action == "visit" else kw.pop("args", {})
    return Step(index, raw="", action=action, args=args, url=url, **kw)


def test_evidence_is_the_fraction_of_evidence_pages_reached_before_the_answer():
    record = EpisodeRecord("e", qa_task(), "api")
    record.steps = [
        step(1, "search", f"{WEB}/search?q=alpha"),
        step(2, "visit", "HTTP://127.0.0.1:8900/wiki/Alpha/#History"),  # the same page
        step(3, "visit", PAGE_B, error="tool_error"),  # asked for, but it failed
        step(4, None, PAGE_B, error="parse_error"),
    ]
    assert evidence_reached(qa_task(), record) == (
        0.5, {"evidence_pages": 2.0, "evidence_reached": 1.0}
    )  # fmt: skip
    record.steps += [step(5, "answer"), step(6, "visit", PAGE_B)]  # after the answer
    assert evidence_reached(qa_task(), record)[0] == 0.5
    one_hop = qa_task(evidence=[PAGE_B, {"url": PAGE_B + "#x", "quote": "Beta"}])  # bare URLs too
    record.steps = [step(1, "visit", PAGE_B)]
    assert evidence_reached(one_hop, record) == (
        1.0, {"evidence_pages": 1.0, "evidence_reached": 1.0}
    )  # fmt: skip


def test_a_task_without_evidence_pages_scores_zero_and_says_why():
    record = EpisodeRecord("e", qa_task(evidence=[]), "tools")
    record.steps = [step(1, "visit", PAGE_A)]
    value, parts = evidence_reached(qa_task(evidence=[]), record)
    assert value == 0.0 and parts["process_note"] == "the task names no evidence pages"
    assert (parts["evidence_pages"], parts["evidence_reached"]) == (0.0, 0.0)


async def test_the_environment_adds_the_term_and_logs_it_apart():
    cfg = evidence(weight=0.1, cap=0.5)
    right = await play(qa_task(), [f"<visit>{PAGE_A}</visit>", "<answer>Gamma</answer>"], cfg)
    b = right.record.breakdown
    # outcome 1.0 (EM, well-formed); 1 of 2 pages: r_process 0.5, term 0.1 * 0.5 = 0.05
    assert (b["outcome"], b["process"], b["process_term"]) == (1.0, 0.5, pytest.approx(0.05))
    assert b["process_source"] == "evidence" and b["verdict"] == "correct"
    assert right.record.reward == pytest.approx(1.05)
    wrong = await play(
        qa_task(), [f"<visit>{PAGE_A}</visit>", f"<visit>{PAGE_B}</visit>", "<answer>Delta</answer>"],
        cfg,
    )  # fmt: skip
    b = wrong.record.breakdown
    # outcome 0.1 (the well-formed tier); r_process 1; term min(0.1, 0.5 * 0.9) = 0.1
    assert (b["outcome"], b["process"], b["process_term"]) == (0.1, 1.0, pytest.approx(0.1))
    assert wrong.record.reward == pytest.approx(0.2) and wrong.record.reward < right.record.reward
    assert list(Reward(0, b).parts()) == list(Reward(0, right.record.breakdown).parts())


# ----------------------------------------------------------------------------- PRM


@dataclass
class FakePrm:
    requests: list = field(default_factory=list)
    seen: dict = field(default_factory=dict)  # requests per marker
    url: str = ""


STATE = web.AppKey("state", FakePrm)
MARKERS = {"[[good]]": "SCORE: 1", "[[bad]]": "SCORE: 0", "[[half]]": "SCORE: 0.5"}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app[STATE]
    body = await request.json()
    app.requests.append(body)
    messages = body.get("messages")
    if not isinstance(body.get("model"), str) or not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in ("system", "user") and isinstance(m.get("content"), str)
        for m in messages
    ):  # fmt: skip
        return web.json_response({"error": {"message": "invalid request"}}, status=400)
    graded = messages[-1]["content"].split("to grade, the agent's text:", 1)[1]
    graded = graded.split("It became:", 1)[0]
    for marker in ("[[slow]]", "[[malformed]]", *MARKERS):
        if marker in graded:
            app.seen[marker] = app.seen.get(marker, 0) + 1
            break
    else:
        marker = ""
    if marker == "[[slow]]":
        await asyncio.sleep(3)
    if marker == "[[malformed]]":
        return web.json_response(completion(body["model"], "A sensible step, I think."))
    verdict = MARKERS.get(marker, "SCORE: 0.25")
    return web.json_response(completion(body["model"], f"Looks at the step.\n{verdict}\n"))


@pytest_asyncio.fixture
async def prm():
    async with serve_chat(STATE, FakePrm(), chat_completions) as state:
        yield state


def prm_config(server: FakePrm, *, max_steps: int = 8, **over) -> VerifierConfig:
    fields = dict(url=server.url, model="prm-test", timeout_s=5.0, retries=2, backoff_s=0.01)
    fields.update(over)
    process = ProcessConfig("prm", weight=0.2, cap=0.5, prm=JudgeConfig(**fields),
                            prm_max_steps=max_steps)  # fmt: skip
    return VerifierConfig(process=process)


async def test_the_prm_scores_each_step_and_the_mean_is_r_process(prm):
    replies = [
        "I search first. <search>alpha beta [[good]]</search>",
        f"<visit>{PAGE_A}</visit> [[bad]]",
        "<answer>Gamma</answer> [[half]]",
    ]
    env = await play(qa_task(), replies, prm_config(prm))
    b = env.record.breakdown
    # (1 + 0 + 0.5) / 3 = 0.5; right: term 0.2 * 0.5 = 0.1
    assert (b["process"], b["prm_steps"], b["process_term"]) == (0.5, 3.0, pytest.approx(0.1))
    assert env.record.reward == pytest.approx(1.1) and env.record.status == "ok"
    assert len(prm.requests) == 3
    body = next(r for r in prm.requests if "Step 2 to grade" in r["messages"][1]["content"])
    assert body["model"] == "prm-test" and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": PRM_RUBRIC}
    user = body["messages"][1]["content"]
    for part in (
        "Question:\nWhat links Alpha and Beta?",
        'Earlier steps:\n1. search(query="alpha beta [[good]]") -> opened',
        f'It became: visit(url="{PAGE_A}")',
        f"What came back:\n<<<\nURL: {PAGE_A}\n\nPage at {PAGE_A}.",
    ):
        assert part in user


async def test_a_prm_failure_scores_zero_with_the_error_and_the_episode_goes_on(prm):
    replies = ["<search>alpha [[good]]</search>", "<answer>Gamma</answer> [[malformed]]"]
    env = await play(qa_task(), replies, prm_config(prm, retries=1))
    b = env.record.breakdown
    assert (b["process"], b["process_term"], b["prm_steps"]) == (0.0, 0.0, 0.0)
    assert b["process_error"].startswith("step 2: no verdict after 2 attempts")
    assert "malformed score" in b["process_error"] and prm.seen["[[malformed]]"] == 2
    assert env.record.reward == 1.0 and env.record.status == "ok"


async def test_a_slow_or_unreachable_prm_is_a_recorded_zero(prm):
    env = await play(qa_task(), ["<answer>Gamma</answer> [[slow]]"],
                     prm_config(prm, timeout_s=0.2, retries=0))  # fmt: skip
    assert "timed out after 0.2 s" in env.record.breakdown["process_error"]
    gone = FakePrm(url="http://127.0.0.1:9")  # the discard port: nothing listens
    replies = [f"<visit>{PAGE_A}</visit>", "<answer>Gamma</answer>"]
    env = await play(qa_task(), replies, prm_config(gone, retries=0))
    assert "request failed" in env.record.breakdown["process_error"]
    assert env.record.reward == 1.0


async def test_at_most_prm_max_steps_are_scored_evenly_spread(prm):
    replies = [f"<search>q{i}</search>" for i in range(1, 10)] + ["<answer>Gamma</answer>"]
    env = await play(qa_task(), replies, prm_config(prm, max_steps=4))
    assert env.record.breakdown["prm_steps"] == 4.0 and len(prm.requests) == 4
    graded = sorted(
        int(r["messages"][1]["content"].split("Step ", 1)[1].split(" ", 1)[0]) for r in prm.requests
    )
    assert graded == [1, 4, 7, 10]  # round(i * 9 / 3): the first and the last included
    assert [s.index for s in steps_to_score(env.record.steps, 1)] == [10]


@pytest.mark.parametrize(
    "content, score",
    [
        ("Good.\nSCORE: 1", 1.0), ("SCORE: 0.75\n\n", 0.75), ("SCORE:0", 0.0), ("SCORE: .5", 0.5),
        ("SCORE: 1.5", None), ("SCORE: -0.1", None), ("score: 1", None), ("SCORE: 1 maybe", None),
        ("SCORE: 1\nmore text", None), ("", None),
    ],
)  # fmt: skip
def test_parse_score_is_strict(content, score):
    if score is None:
        with pytest.raises(JudgeError, match="malformed score"):
            parse_score(content)
    else:
        assert parse_score(content) == score


# ----------------------------------------------------------------------------- the ordering

# The verifier's outcomes: a task score s (a ratio of small counts: EM, F1, coverage,
# citation support), through the format tiers, zeroed when an anti-cheat detector fires.
scores = st.one_of(
    st.sampled_from([0.0, 1.0]),
    st.tuples(st.integers(1, 200), st.integers(0, 200)).map(lambda t: min(t) / max(t)),
)
format_weights = st.integers(0, 99).map(lambda n: n / 100)  # FormatConfig.weight < 1
episodes = st.tuples(scores, st.booleans(), st.booleans(), st.floats(0.0, 1.0))  # s, ok, zero, p
groups = st.lists(episodes, min_size=2, max_size=16)
weights = st.floats(0.0, 1.0)
caps = st.floats(0.0, CAP_MAX)


def totals(group, weight, cap, fmt_weight) -> tuple[list[float], list[bool], list[dict]]:
    """Each episode's total reward, whether it is right, and its reward parts."""
    cfg = ProcessConfig("evidence", weight=weight, cap=cap)
    out, right, parts = [], [], []
    for s, well_formed, zeroed, p in group:
        outcome = 0.0 if zeroed else format_tiers(s, well_formed, FormatConfig(fmt_weight))
        added = term(outcome, p, cfg, zeroed=zeroed)
        out.append(outcome + added)
        right.append(outcome >= SUCCESS)
        parts.append({"outcome": outcome, "process": p, "process_term": added})
    return out, right, parts


@settings(max_examples=400, deadline=None)
@given(groups, weights, caps, format_weights)
def test_no_wrong_episode_outranks_a_right_one(group, weight, cap, fmt_weight):
    total, right, _ = totals(group, weight, cap, fmt_weight)
    wins = [t for t, r in zip(total, right, strict=True) if r]
    losses = [t for t, r in zip(total, right, strict=True) if not r]
    if wins and losses:
        assert min(wins) > max(losses)
    assert all(t >= SUCCESS for t in wins) and all(t < SUCCESS for t in losses)


def traj(i: int, reward: float, parts: dict) -> Trajectory:
    """A two-token trajectory (a prompt token, a generated one) with this reward."""
    ids, mask = np.array([5, 6], np.int32), np.array([0, 1], np.uint8)
    logp, versions = np.zeros(2, np.float32), np.array([-1, 0], np.int32)
    return Trajectory("t", "g", i, ids, mask, logp, versions, reward=reward, reward_parts=parts)


@settings(max_examples=150, deadline=None)
@given(groups, weights, caps, format_weights, st.booleans(), st.sampled_from([0, 1]))
def test_grpo_advantages_keep_the_order(group, weight, cap, fmt_weight, scale, ddof):
    batching = pytest.importorskip("learner.training.batching")  # the learner's side (JAX)
    total, right, parts = totals(group, weight, cap, fmt_weight)
    trajs = [traj(i, r, ps) for i, (r, ps) in enumerate(zip(total, parts, strict=True))]
    group = TrajectoryGroup("g", "t", trajs)
    (adv,), (keep,) = batching.advantages([group], scale=scale, ddof=ddof)
    wins = [a for a, r in zip(adv, right, strict=True) if r]
    losses = [a for a, r in zip(adv, right, strict=True) if not r]
    if wins and losses:
        assert keep and min(wins) > max(losses)


def test_the_learner_logs_the_outcome_and_process_means_apart():
    batching = pytest.importorskip("learner.training.batching")
    parts = [
        {"outcome": 1.0, "process": 0.5, "process_term": 0.05},
        {"outcome": 0.1, "process": 1.0, "process_term": 0.1},
    ]
    trajs = [traj(i, p["outcome"] + p["process_term"], p) for i, p in enumerate(parts)]
    stats = batching.pack([TrajectoryGroup("g", "t", trajs)], rows=2, buckets=(4,)).stats
    # (1.0 + 0.1) / 2 = 0.55; (0.5 + 1.0) / 2 = 0.75; (0.05 + 0.1) / 2 = 0.075
    assert stats["reward_outcome"] == pytest.approx(0.55)
    assert stats["reward_process"] == pytest.approx(0.75)
    assert stats["reward_process_term"] == pytest.approx(0.075)
    assert stats["reward"] == pytest.approx(0.625) and stats["success"] == 0.5
    off = TrajectoryGroup("g", "t", [traj(i, t.reward, {}) for i, t in enumerate(trajs)])
    assert "reward_outcome" not in batching.pack([off], rows=2, buckets=(4,)).stats


# ----------------------------------------------------------------------------- metrics


async def test_the_sidecar_counts_and_shows_the_parts_apart():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rollout.sidecar.engine import EngineStats, RolloutEngine
    from rollout.sidecar.server import metrics_registry

    stats = EngineStats()
    cfg = evidence(weight=0.1, cap=0.5)
    for replies in ([f"<visit>{PAGE_A}</visit>", "<answer>Gamma</answer>"],
                    [f"<visit>{PAGE_B}</visit>", "<answer>Delta</answer>"]):  # fmt: skip
        env = await play(qa_task(), replies, cfg)
        parts = Reward(env.record.reward, env.record.breakdown).parts()
        traj = SimpleNamespace(reward=env.record.reward, status="ok", turn=-1, length=9,
                               reward_parts=parts, timings={})  # fmt: skip
        env.backend.last_screenshot = None
        RolloutEngine._remember(SimpleNamespace(stats=stats), qa_task(), env, [traj])
    # right: 1.0 + 0.1 * 0.5; wrong: 0.1 + min(0.1 * 0.5, 0.5 * 0.9) = 0.15
    assert (stats.outcome_sum, stats.process_sum) == (pytest.approx(1.1), pytest.approx(1.0))
    assert stats.process_term_sum == pytest.approx(0.1) and stats.scored == 2
    assert stats.recent[-1]["breakdown"]["process_term"] == pytest.approx(0.05)
    engine = SimpleNamespace(stats=stats, buffer=SimpleNamespace(depth=0, counts={"dropped": 0}),
                             pool=None, version=0)  # fmt: skip
    text = generate_latest(metrics_registry(engine)).decode()
    samples = {
        (s.name, s.labels.get("part")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("rollout_episodes_scored_total", None)] == 2
    assert samples[("rollout_reward_parts_total", "total")] == pytest.approx(1.2)
    assert samples[("rollout_reward_parts_total", "outcome")] == pytest.approx(1.1)
    assert samples[("rollout_reward_mean", "process")] == pytest.approx(0.5)
    assert samples[("rollout_reward_mean", "process_term")] == pytest.approx(0.05)


async def test_the_wire_carries_the_parts_of_every_episode_of_a_group(prm):
    from rollout.sidecar.episode import Limits, run_episode
    from shared.tokenizer import load_tokenizer

    tok = load_tokenizer()
    cfg = prm_config(prm, retries=0)
    scripts = [
        [f"<visit>{PAGE_A}</visit> [[good]]", "<answer>Gamma</answer>"],  # 1 and 0.25: 0.625
        [f"<visit>{PAGE_B}</visit>", "<answer>Gamma</answer> [[malformed]]"],  # the PRM fails
        ["<search>beta [[bad]]</search>", "<answer>Delta</answer> [[good]]"],  # wrong: 0.5
    ]
    trajs = []
    for i, script in enumerate(scripts):
        replies = iter(script)
        env = Environment("api", PagesBackend(), UrlPolicy(), verifier=cfg)
        trajs.append(await run_episode(
            env, qa_task(), tok, group_id="g", sample_index=i, scripted=lambda _, r=replies: next(r),
            limits=Limits(max_context_tokens=2048, observation_tokens=64, max_new_tokens=64),
        ))  # fmt: skip
    group = TrajectoryGroup("g", "train-qa-1", trajs)  # one set of part names, in one order
    p = dict(zip(group.part_names, group.floats[:, 1:].T, strict=False))
    assert p["outcome"].tolist() == [1.0, 1.0, 0.1]
    assert p["process"].tolist() == [0.625, 0.0, 0.5]
    assert p["prm_steps"].tolist() == [2.0, 0.0, 2.0]
    # 1 + 0.2 * 0.625; 1 + 0; 0.1 + min(0.2 * 0.5, 0.5 * 0.9)
    assert group.rewards.tolist() == pytest.approx([1.125, 1.0, 0.2])


@pytest.mark.browser
async def test_the_dashboard_shows_outcome_and_process_apart(browser, tmp_path):
    import aiohttp
    from aiohttp.test_utils import TestServer

    from rollout.sidecar.buffer import TrajectoryBuffer
    from rollout.sidecar.engine import RolloutEngine
    from rollout.sidecar.server import make_app
    from shared.tokenizer import load_tokenizer

    cfg = load(overrides=["rollout.policy=oracle", "reward.process=evidence"])
    buffer = TrajectoryBuffer(tmp_path / "buffer", 4)
    async with aiohttp.ClientSession() as session:
        engine = RolloutEngine(cfg, WEB, iter(()), load_tokenizer(), buffer, session)
        assert engine.verifier.process.source == "evidence"  # [reward] reaches the episodes
        env = await play(qa_task(), [f"<visit>{PAGE_A}</visit>", "<answer>Gamma</answer>"],
                         engine.verifier)  # fmt: skip
        parts = Reward(env.record.reward, env.record.breakdown).parts()
        traj = SimpleNamespace(reward=env.record.reward, status="ok", turn=-1, length=9,
                               reward_parts=parts, timings={})  # fmt: skip
        engine._remember(qa_task(), env, [traj])
        server = TestServer(make_app(engine, cfg))
        await server.start_server()
        ctx = await browser.new_context()
        try:
            page = await ctx.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(str(server.make_url("/")))
            cell = page.locator("#episodes tbody tr td.reward").first
            await cell.wait_for()
            assert "(1.00 + 0.05)" in await cell.inner_text()
            assert await cell.get_attribute("title") == (
                "outcome 1.000 + process 0.050 (r_process 0.500)"
            )
            await page.goto(str(server.make_url(f"/episode/{env.record.episode_id}")))
            await page.wait_for_selector("#reward .reward-split")
            split = await page.inner_text("#reward .reward-split")
            assert split == "outcome 1.000 + process 0.050 (r_process 0.500 from evidence)"
            assert await page.locator("#breakdown td", has_text="process_term").count() == 1
            assert not errors
        finally:
            await ctx.close()
            await server.close()
            buffer.close()


def test_rollout_eval_scores_with_the_runs_reward_section(monkeypatch):
    """rollout.eval builds each episode's environment with the verifier config of the
    run's [reward] section (before: the defaults, whatever the run trained on)."""
    import contextlib

    import rollout.eval as ev

    seen: dict = {}

    class Built(Exception):
        pass

    def make_env(*args, **kwargs):
        seen.update(kwargs)
        raise Built

    @contextlib.asynccontextmanager
    async def lease(pool, name):
        yield None

    monkeypatch.setattr(ev, "make_env", make_env)
    monkeypatch.setattr(ev, "episode_lease", lease)
    cfg = load(overrides=["reward.format_weight=0", "reward.process=evidence"])
    with pytest.raises(Built):
        asyncio.run(
            ev.run_episode({"id": "t"}, "api", "http://127.0.0.1:9", cfg, None, None, None, 0)
        )
    assert seen["verifier"] == verifier_config(cfg.reward)
    assert seen["verifier"].format.weight == 0.0 and seen["verifier"].process.source == "evidence"
