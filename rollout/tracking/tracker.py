"""Progress tracker: a human-readable log and a full trajectory record per episode, written as it runs.

For episode ``E`` in directory ``D`` the tracker writes two files:

``D/E.progress.log``, one line per event, local time::

    [2026-06-25 10:23:15] Step 1: search("2024 US GDP")
    [2026-06-25 10:23:18] → Got 10 results, top: bea.gov
    [2026-06-25 10:23:36] Step 4: answer("2024 US GDP was $28.5T")
    [2026-06-25 10:23:38] → Reward: 1.0 (correct)

(a step line at the step's start, a result line at its end; after the answer, the
result line is the reward), and ``D/E.trajectory.jsonl``, one JSON object per
line: a ``start`` event (task, mode, prompts), a ``step`` event per step (the raw
model text, the action, the observation as the model saw it, page text, timings,
errors) and an ``end`` event (status, answer, reward and breakdown). Both files
are flushed and fsynced after every event, so a crash loses at most the step in
flight; :func:`read_record` reads a record back and tolerates a torn last line.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rollout.action_spec import render_call, render_value
from rollout.tracking.records import STATUSES, EpisodeRecord, Step

if TYPE_CHECKING:
    from rollout.verifiers import Reward

SCHEMA = "rollout.trajectory/1"
RECORD_SUFFIX = ".trajectory.jsonl"
LOG_SUFFIX = ".progress.log"
ARG_CHARS = 200  # longest string argument shown in the progress log
SUMMARY_CHARS = 160  # longest result line
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,199}")


class RecordError(ValueError):
    """A trajectory file that cannot be read (beyond a torn last line)."""


def timestamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    """``text`` with all whitespace (line breaks included) collapsed, cut to ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def step_line(step: Step) -> str:
    """``Step k: action(args)``; a reply that did not parse shows its start instead."""
    if step.action is None:
        call = f"(unparsed) {render_value(step.raw, max_chars=60)}"
    else:
        call = render_call(step.action, step.args, max_chars=ARG_CHARS)
    return f"Step {step.index}: {call}"


def result_line(step: Step) -> str:
    """``→ summary``: the step's summary, else the first words of its observation."""
    text = step.summary or step.observation or ("error" if step.error else "done")
    return "→ " + one_line(text)


def reward_line(status: str, reward: Reward | None, error: str | None) -> str:
    if status == "infra_error":
        return "→ Infrastructure error: " + one_line(error or "unknown")
    if reward is None:
        return f"→ Episode {status}: no reward"
    label = str(reward.breakdown.get("verdict", ""))
    if status == "truncated":
        label = "truncated" + (f", {label}" if label and label != "no answer" else "")
    return f"→ Reward: {round(reward.value, 3)}" + (f" ({label})" if label else "")


class EpisodeTracker:
    """Writes one episode's progress log and trajectory record, one event at a time."""

    def __init__(
        self,
        directory: str | Path,
        record: EpisodeRecord,
        *,
        store_page_text: bool = True,
        clock: Callable[[], float] = time.time,
    ):
        if not _SAFE_ID.fullmatch(record.episode_id):
            raise ValueError(f"episode id {record.episode_id!r}: use letters, digits, . _ -")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.record = record
        self.store_page_text = store_page_text
        self.clock = clock  # when the episode starts and ends; steps carry their own times
        self.log_path = directory / f"{record.episode_id}{LOG_SUFFIX}"
        self.record_path = directory / f"{record.episode_id}{RECORD_SUFFIX}"
        self._log: IO[str] = open(self.log_path, "x", encoding="utf-8")  # noqa: SIM115
        self._jsonl: IO[str] = open(self.record_path, "x", encoding="utf-8")  # noqa: SIM115
        if not record.started:
            record.started = clock()
        start = {
            "event": "start",
            "schema": SCHEMA,
            "episode_id": record.episode_id,
            "task": record.task,
            "mode": record.mode,
            "system": record.system_prompt,
            "user": record.user_prompt,
            "time": record.started,
        }
        self._write(self._jsonl, json.dumps(start, ensure_ascii=False))

    def __enter__(self) -> EpisodeTracker:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self.record.finished and exc is not None:
            self.finish("infra_error", error=f"{type(exc).__name__}: {exc}")
        self.close()

    def log_step(self, step: Step) -> None:
        """Record a finished step: its two log lines (one for an answer) and its event."""
        self.record.steps.append(step)
        lines = [f"[{timestamp(step.started)}] {step_line(step)}"]
        if step.action != "answer":
            lines.append(f"[{timestamp(step.ended)}] {result_line(step)}")
        self._write(self._log, "\n".join(lines))
        event = {"event": "step", **step.to_json()}
        if not self.store_page_text:
            event["page_text"] = None
        self._write(self._jsonl, json.dumps(event, ensure_ascii=False))

    def finish(
        self,
        status: str,
        *,
        answer: str | None = None,
        reward: Reward | None = None,
        error: str | None = None,
    ) -> None:
        """End the episode: the reward line and the ``end`` event."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r}: expected one of {STATUSES}")
        if self.record.finished:
            raise RuntimeError(f"episode {self.record.episode_id} already finished")
        rec = self.record
        rec.status, rec.answer, rec.error, rec.ended = status, answer, error, self.clock()
        rec.reward = reward.value if reward is not None else None
        rec.breakdown = dict(reward.breakdown) if reward is not None else {}
        self._write(self._log, f"[{timestamp(rec.ended)}] {reward_line(status, reward, error)}")
        end = {
            "event": "end",
            "status": status,
            "answer": answer,
            "reward": rec.reward,
            "breakdown": rec.breakdown,
            "error": error,
            "time": rec.ended,
        }
        self._write(self._jsonl, json.dumps(end, ensure_ascii=False))

    def close(self) -> None:
        for fh in (self._log, self._jsonl):
            if not fh.closed:
                fh.close()

    @staticmethod
    def _write(fh: IO[str], text: str) -> None:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# ----------------------------------------------------------------------------- reading


def read_record(path: str | Path) -> EpisodeRecord:
    """The record in a trajectory file. A torn last line (a crash mid-write) is dropped;
    a record without an ``end`` event has ``status`` None. Raises :class:`RecordError`."""
    events = _read_events(Path(path))
    if not events or events[0].get("event") != "start" or events[0].get("schema") != SCHEMA:
        raise RecordError(f"{path}: not a trajectory record (no start event)")
    start = events[0]
    record = EpisodeRecord(
        episode_id=str(start.get("episode_id", "")),
        task=dict(start.get("task") or {}),
        mode=str(start.get("mode", "")),
        system_prompt=str(start.get("system", "")),
        user_prompt=str(start.get("user", "")),
        started=float(start.get("time") or 0.0),
    )
    for event in events[1:]:
        kind = event.get("event")
        try:
            if kind == "step":
                record.steps.append(
                    Step.from_json({k: v for k, v in event.items() if k != "event"})
                )
            elif kind == "end":
                _apply_end(record, event)
        except (TypeError, ValueError) as e:
            raise RecordError(f"{path}: bad {kind} event: {e}") from None
    return record


def _apply_end(record: EpisodeRecord, event: dict[str, Any]) -> None:
    record.status = str(event["status"]) if event.get("status") in STATUSES else None
    record.answer = event.get("answer")
    record.reward = None if event.get("reward") is None else float(event["reward"])
    record.breakdown = dict(event.get("breakdown") or {})
    record.error = event.get("error")
    record.ended = event.get("time")


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RecordError(f"{path}: {e}") from None
    lines = data.split(b"\n")
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        last = i == len(lines) - 1  # no newline after it: the write may have been cut
        try:
            event = json.loads(line)
        except ValueError:
            if last:
                break
            raise RecordError(f"{path}: line {i + 1} is not JSON") from None
        if not isinstance(event, dict):
            raise RecordError(f"{path}: line {i + 1} is not a JSON object")
        events.append(event)
    return events


def iter_record_files(run_dir: str | Path) -> Iterator[Path]:
    """Every trajectory file under ``run_dir``, recursively, in sorted order."""
    yield from sorted(Path(run_dir).rglob(f"*{RECORD_SUFFIX}"))
