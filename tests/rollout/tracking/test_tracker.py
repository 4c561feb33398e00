"""The progress tracker: the log's line format, the trajectory record, and surviving a crash."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollout.tracking.records import EpisodeRecord, Step
from rollout.tracking.tracker import (
    EpisodeTracker,
    RecordError,
    iter_record_files,
    read_record,
)
from rollout.verifiers import Reward

REPO = Path(__file__).resolve().parents[3]
T0 = 1782382995  # 2026-06-25 10:23:15 UTC
LINE = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] (Step \d+: \S.*|→ \S.*)$")
TASK = {"id": "train-qa-000042", "question": "What was US GDP in 2024?", "answer": "$28.5T"}


@pytest.fixture
def utc(monkeypatch):
    """Log times are local; pin the zone so expectations are exact."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def episode(episode_id="ep-1"):
    return EpisodeRecord(
        episode_id, TASK, "api", system_prompt="You are a researcher.", user_prompt=TASK["question"]
    )


def steps():
    return [
        Step(1, "<search>2024 US GDP</search>", "search", {"query": "2024 US GDP"},
             "1. BEA: GDP ...\n2. ...", summary="Got 10 results, top: bea.gov",
             started=T0, ended=T0 + 3),
        Step(2, "<visit>http://127.0.0.1:8900/gdp</visit>", "visit",
             {"url": "http://127.0.0.1:8900/gdp"}, "Gross domestic product\n\nIn 2024 ...",
             url="http://127.0.0.1:8900/gdp", page_text="Gross domestic product. In 2024 ...",
             started=T0 + 5, ended=T0 + 7),
        Step(3, "I will navigate to the BEA site", None, {},
             'Unknown action "navigate".\nAllowed actions: search, visit, answer.',
             error="parse_error", started=T0 + 10, ended=T0 + 10),
        Step(4, "<answer>2024 US GDP was $28.5T</answer>", "answer",
             {"text": "2024 US GDP was $28.5T"}, started=T0 + 21, ended=T0 + 21),
    ]  # fmt: skip


def run_episode(tmp_path, **kwargs):
    tracker = EpisodeTracker(tmp_path, episode(), clock=lambda: T0 + 23, **kwargs)
    for s in steps():
        tracker.log_step(s)
    reward = Reward(1.0, {"type": "qa", "em": 1.0, "verdict": "correct"})
    tracker.finish("ok", answer="2024 US GDP was $28.5T", reward=reward)
    tracker.close()
    return tracker


def test_the_progress_log_has_the_documented_format(tmp_path, utc):
    tracker = run_episode(tmp_path)
    text = tracker.log_path.read_text(encoding="utf-8")
    assert text == (
        '[2026-06-25 10:23:15] Step 1: search("2024 US GDP")\n'
        "[2026-06-25 10:23:18] → Got 10 results, top: bea.gov\n"
        '[2026-06-25 10:23:20] Step 2: visit("http://127.0.0.1:8900/gdp")\n'
        "[2026-06-25 10:23:22] → Gross domestic product In 2024 ...\n"
        '[2026-06-25 10:23:25] Step 3: (unparsed) "I will navigate to the BEA site"\n'
        '[2026-06-25 10:23:25] → Unknown action "navigate". Allowed actions: search, visit, answer.\n'
        '[2026-06-25 10:23:36] Step 4: answer("2024 US GDP was $28.5T")\n'
        "[2026-06-25 10:23:38] → Reward: 1.0 (correct)\n"
    )
    assert all(LINE.match(line) for line in text.splitlines())


def test_every_line_stays_one_line_whatever_the_text(tmp_path):
    tracker = EpisodeTracker(tmp_path, episode())
    nasty = "line\nbreak\r\u2028sep\u2029para\x85next " + "x" * 500
    tracker.log_step(Step(1, nasty, "search", {"query": nasty}, nasty, started=T0, ended=T0))
    tracker.log_step(Step(2, nasty, None, {}, nasty, error="parse_error", started=T0, ended=T0))
    tracker.finish("infra_error", error=nasty)
    lines = tracker.log_path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 6  # 5 lines and the final newline
    assert all(LINE.match(line) for line in lines[:-1])
    assert all(len(line) < 400 for line in lines)  # long arguments are cut


def test_the_trajectory_record_round_trips(tmp_path):
    tracker = run_episode(tmp_path)
    record = read_record(tracker.record_path)
    assert record.steps == steps()
    assert (record.task, record.mode, record.episode_id) == (TASK, "api", "ep-1")
    assert (record.system_prompt, record.user_prompt) == ("You are a researcher.", TASK["question"])
    assert (record.status, record.reward, record.answer) == ("ok", 1.0, "2024 US GDP was $28.5T")
    assert record.breakdown == {"type": "qa", "em": 1.0, "verdict": "correct"}
    assert record.ended == T0 + 23 and record.finished
    events = [json.loads(line) for line in tracker.record_path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "step", "step", "step", "step", "end"]


def test_page_text_can_be_left_out_of_the_record(tmp_path):
    tracker = run_episode(tmp_path, store_page_text=False)
    assert read_record(tracker.record_path).steps[1].page_text is None


@pytest.mark.parametrize(
    ("status", "reward", "error", "line"),
    [
        ("ok", Reward(0.1, {"verdict": "incorrect"}), None, "→ Reward: 0.1 (incorrect)"),
        ("ok", Reward(2 / 3, {"verdict": "partial"}), None, "→ Reward: 0.667 (partial)"),
        ("truncated", Reward(0.0, {"verdict": "no answer"}), None, "→ Reward: 0.0 (truncated)"),
        ("infra_error", None, "browser crashed", "→ Infrastructure error: browser crashed"),
    ],
)
def test_the_last_line_sums_up_the_end(tmp_path, status, reward, error, line):
    tracker = EpisodeTracker(tmp_path, episode())
    tracker.finish(status, reward=reward, error=error)
    assert tracker.log_path.read_text(encoding="utf-8").splitlines()[-1].endswith("] " + line)


def test_an_exception_inside_the_tracker_block_ends_the_episode_as_infra_error(tmp_path):
    with pytest.raises(RuntimeError), EpisodeTracker(tmp_path, episode()) as tracker:
        tracker.log_step(steps()[0])
        raise RuntimeError("browser crashed")
    record = read_record(tracker.record_path)
    assert record.status == "infra_error" and record.error == "RuntimeError: browser crashed"
    assert len(record.steps) == 1


def test_the_tracker_refuses_misuse(tmp_path):
    with pytest.raises(ValueError, match="episode id"):
        EpisodeTracker(tmp_path, episode("../escape"))
    tracker = EpisodeTracker(tmp_path, episode())
    with pytest.raises(FileExistsError):  # never overwrites an episode
        EpisodeTracker(tmp_path, episode())
    with pytest.raises(ValueError, match="status"):
        tracker.finish("done")
    tracker.finish("ok")
    with pytest.raises(RuntimeError, match="already finished"):
        tracker.finish("ok")


# ----------------------------------------------------------------------------- reading back


def test_a_torn_last_line_is_dropped(tmp_path):
    tracker = run_episode(tmp_path)
    path = tracker.record_path
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:3]) + b"\n" + lines[3][:25])  # crash inside step 3
    record = read_record(path)
    assert [s.index for s in record.steps] == [1, 2] and record.status is None
    path.write_bytes(b"\n".join(lines[:3]) + b"\n" + '{"é'.encode()[:-1])  # cut inside a char
    assert len(read_record(path).steps) == 2


@pytest.mark.parametrize(
    "content",
    [b"", b"not json\n", b'{"event": "step"}\n', b'[1, 2]\n{"event": "start"}\n'],
)
def test_files_that_are_not_records_raise(tmp_path, content):
    path = tmp_path / "x.trajectory.jsonl"
    path.write_bytes(content)
    with pytest.raises(RecordError):
        read_record(path)


def test_a_corrupt_line_before_the_last_raises(tmp_path):
    tracker = run_episode(tmp_path)
    lines = tracker.record_path.read_text().splitlines()
    lines[2] = lines[2][:10]
    tracker.record_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match="line 3"):
        read_record(tracker.record_path)


def test_record_files_are_found_recursively(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "e1.trajectory.jsonl").write_text("")
    (tmp_path / "e0.trajectory.jsonl").write_text("")
    (tmp_path / "sft.jsonl").write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in iter_record_files(tmp_path)]
    assert found == ["a/b/e1.trajectory.jsonl", "e0.trajectory.jsonl"]


# ----------------------------------------------------------------------------- crash

CHILD = textwrap.dedent(
    """
    import sys, time
    from rollout.tracking.records import EpisodeRecord, Step
    from rollout.tracking.tracker import EpisodeTracker

    record = EpisodeRecord("crash-1", {"id": "train-qa-1"}, "api", user_prompt="q")
    tracker = EpisodeTracker(sys.argv[1], record)
    for i in range(1, 4):
        now = time.time()
        tracker.log_step(
            Step(i, f"<search>q{i}</search>", "search", {"query": f"q{i}"}, f"results {i}",
                 started=now, ended=now)
        )
    # the next step is being written when the process dies
    with open(tracker.record_path, "a") as fh:
        fh.write('{"event": "step", "index": 4, "raw": "<sea')
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.multiprocess
def test_a_crash_mid_episode_leaves_a_readable_log_and_record(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=10)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    record = read_record(tmp_path / "crash-1.trajectory.jsonl")
    assert [s.args["query"] for s in record.steps] == ["q1", "q2", "q3"]
    assert record.status is None and not record.finished
    log = (tmp_path / "crash-1.progress.log").read_text(encoding="utf-8").splitlines()
    assert len(log) == 6 and all(LINE.match(line) for line in log)
    assert log[-2].endswith('Step 3: search("q3")') and log[-1].endswith("→ results 3")


def test_a_fifty_step_episode_stays_one_line_per_event(tmp_path, utc):
    """A long som episode (49 clicks with long observations, then the answer): the log
    keeps one short line per event, in order, and the record reads back every step."""
    rec = EpisodeRecord("ep-long", TASK, "som")
    long_view = 'Results\n[1] link "Item"\n' + "filler text " * 2000
    with EpisodeTracker(tmp_path, rec, clock=lambda: T0 + 200) as tracker:
        for i in range(1, 50):
            tracker.log_step(
                Step(i, f"click({i})", "click", {"n": i}, long_view,
                     summary=f"Opened {long_view}", started=T0 + 2 * i, ended=T0 + 2 * i + 1)
            )  # fmt: skip
        tracker.log_step(Step(50, 'answer("x")', "answer", {"text": "x"}, started=T0 + 150))
        tracker.finish("ok", answer="x", reward=Reward(1.0, {"verdict": "correct"}))
    lines = tracker.log_path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 49 * 2 + 1 + 1
    assert all(LINE.match(line) for line in lines[:-1]), lines[:4]
    assert max(len(line) for line in lines) < 250
    assert [int(m.group(1)) for m in map(re.compile(r".*Step (\d+):").match, lines) if m] == (
        list(range(1, 51))
    )
    back = read_record(tracker.record_path)
    assert [s.index for s in back.steps] == list(range(1, 51))
    assert back.steps[10].observation == long_view and back.reward == 1.0
