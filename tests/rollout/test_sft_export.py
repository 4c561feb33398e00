"""SFT export: filtering, chat messages, deduplication and the held-out split guard, run as a CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.sft_export import action_sequence, to_messages
from rollout.tracking.records import EpisodeRecord, Step
from rollout.tracking.tracker import EpisodeTracker
from rollout.verifiers import Reward

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "You answer questions by searching the web."


def write_episode(run_dir, episode_id, task_id, actions, status="ok", reward=1.0, finish=True):
    """A record whose steps take ``actions`` [(name, args), ...]; the last is the answer."""
    record = EpisodeRecord(
        episode_id, {"id": task_id, "type": "qa"}, "api", SYSTEM, f"Question of {task_id}?"
    )
    tracker = EpisodeTracker(run_dir, record)
    for i, (name, args) in enumerate(actions, 1):
        raw = f"<think>step {i} of {episode_id}</think><{name}>{next(iter(args.values()))}</{name}>"
        observation = "" if name == "answer" else f"observation {i} for {args}"
        tracker.log_step(Step(i, raw, name, args, observation))
    if finish:
        verdict = {"verdict": "correct" if reward >= 1 else "incorrect"}
        tracker.finish(status, answer="x", reward=Reward(reward, verdict))
    tracker.close()
    return record


SEARCH_ANSWER = [("search", {"query": "capital of France"}), ("answer", {"text": "Paris"})]
SEARCH_VISIT_ANSWER = [
    ("search", {"query": "capital of France"}),
    ("visit", {"url": "http://127.0.0.1:8900/wiki/Paris"}),
    ("answer", {"text": "Paris"}),
]


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    write_episode(run / "g0", "e1", "train-qa-000001", SEARCH_ANSWER)
    write_episode(run / "g0", "e2", "train-qa-000001", SEARCH_ANSWER)  # a duplicate of e1
    write_episode(run / "g0", "e3", "train-qa-000001", SEARCH_VISIT_ANSWER)  # same task, new path
    write_episode(run / "g1", "e4", "train-qa-000002", SEARCH_ANSWER, reward=0.1)
    write_episode(run / "g1", "e5", "train-qa-000003", SEARCH_ANSWER[:1], status="truncated")
    write_episode(run / "g1", "e6", "train-qa-000004", SEARCH_ANSWER, finish=False)
    (run / "g1" / "e7.trajectory.jsonl").write_text("garbage\n{}\n")
    write_episode(run / "g2" / "deep", "e8", "train-citation-000005", SEARCH_ANSWER)
    return run


def export(run, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "rollout.sft_export", str(run), "--out", str(out), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def read_chats(path):
    return [json.loads(line)["messages"] for line in path.read_text().splitlines()]


def test_keeps_successful_trajectories_once_as_chat_messages(run_dir, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = export(run_dir, out)
    assert result.returncode == 0, result.stderr
    assert (
        "scanned 8, kept 3, duplicate 1, below reward 1, not ok 1, unfinished 1, unreadable 1"
        in result.stderr
    )
    assert f"wrote 3 examples of 3 episodes to {out}" in result.stderr
    chats = read_chats(out)
    # e1 (e2 dropped as its duplicate), e3, e8, in path order
    assert [c[1]["content"] for c in chats] == [
        "Question of train-qa-000001?",
        "Question of train-qa-000001?",
        "Question of train-citation-000005?",
    ]
    assert chats[0] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Question of train-qa-000001?"},
        {
            "role": "assistant",
            "content": "<think>step 1 of e1</think><search>capital of France</search>",
        },
        {"role": "tool", "content": "observation 1 for {'query': 'capital of France'}"},
        {"role": "assistant", "content": "<think>step 2 of e1</think><answer>Paris</answer>"},
    ]
    assert [m["role"] for m in chats[1]] == ["system", "user"] + ["assistant", "tool"] * 2 + [
        "assistant"
    ]


def test_min_reward_lowers_the_bar(run_dir, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = export(run_dir, out, "--min-reward", "0.1")
    assert result.returncode == 0, result.stderr
    assert len(read_chats(out)) == 4  # e4 (reward 0.1) joins


def test_refuses_dev_and_test_tasks_and_writes_nothing(run_dir, tmp_path):
    out = tmp_path / "sft.jsonl"
    out.write_text("previous export\n")
    write_episode(run_dir / "g3", "e9", "dev-qa-000009", SEARCH_ANSWER)
    write_episode(run_dir / "g3", "e10", "test-multi_doc-000010", SEARCH_ANSWER)
    result = export(run_dir, out)
    assert result.returncode == 2
    assert "2 kept trajectories are from the dev or test split" in result.stderr
    assert "dev-qa-000009" in result.stderr and "test-multi_doc-000010" in result.stderr
    assert out.read_text() == "previous export\n"
    assert not (tmp_path / "sft.jsonl.tmp").exists()


def test_failed_held_out_episodes_are_not_kept_so_they_do_not_block(run_dir, tmp_path):
    write_episode(run_dir / "g3", "e9", "dev-qa-000009", SEARCH_ANSWER, reward=0.0)
    result = export(run_dir, tmp_path / "sft.jsonl")
    assert result.returncode == 0, result.stderr
    # "developer-qa-1" has split "developer", not "dev": only the exact split name counts
    write_episode(run_dir / "g3", "e11", "developer-qa-000001", SEARCH_ANSWER)
    assert export(run_dir, tmp_path / "sft.jsonl").returncode == 0


def test_a_missing_run_dir_is_an_error(tmp_path):
    result = export(tmp_path / "nope", tmp_path / "sft.jsonl")
    assert result.returncode == 1 and "not a directory" in result.stderr


def test_deduplication_key_is_task_and_action_sequence():
    def rec(task_id, actions, raw="r"):
        steps = [Step(i, raw, name, args) for i, (name, args) in enumerate(actions, 1)]
        return EpisodeRecord("e", {"id": task_id}, "api", steps=steps)

    a = rec("t", SEARCH_ANSWER)
    assert action_sequence(a) == action_sequence(rec("t", SEARCH_ANSWER, raw="other text"))
    assert action_sequence(a) != action_sequence(rec("t", SEARCH_VISIT_ANSWER))
    assert to_messages(rec("t", [])) == [
        {"role": "user", "content": ""}
    ]  # no system prompt recorded: none written
