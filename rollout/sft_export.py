"""Export successful trajectories as SFT data: ``python -m rollout.sft_export RUN_DIR --out sft.jsonl``.

Reads every trajectory record under RUN_DIR (recursively, ``*.trajectory.jsonl``),
keeps the finished ones with status ``ok`` and reward >= ``--min-reward`` (default
1.0), and writes one chat per line in the ``messages`` format TRL and other SFT
trainers read::

    {"messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...},
                  {"role": "assistant", "content": <raw model text>},
                  {"role": "tool", "content": <observation>}, ...]}

Assistant turns are the model's raw text and tool turns the observations exactly
as the model saw them. With ``--per-turn`` (for policies trained with
``rollout.trajectory = "per_turn"``) each step is an example of its own: the chat
up to that step's assistant turn, earlier assistant turns marked ``"weight": 0``
(context, not targets: ``shared.chat.render_chat`` masks them), and with
``--keep-last K`` observations older than the last K replaced by the same
one-line stub the rollout's ``env.history = "keep_last"`` shows (``--history window``:
the turns older than the last K left out, as ``env.history = "window"`` does).
Trajectories with the same task id and action sequence
are written once (the first in path order). Training on evaluation tasks would
leak them, so if any kept trajectory's task is from the dev or test split (the
id's part before the first "-"), nothing is written and the exit status is 2.
Counts go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rollout.tracking.records import EpisodeRecord, task_split
from rollout.tracking.tracker import RecordError, iter_record_files, read_record
from shared.chat import stub_text

HELD_OUT_SPLITS = ("dev", "test")
PROGRESS_EVERY = 1000  # records between progress lines


class HeldOutSplitError(ValueError):
    """Kept trajectories include dev or test tasks; nothing was written."""


@dataclass
class ExportSummary:
    counts: Counter = field(default_factory=Counter)  # scanned, kept, duplicate, ...
    held_out: list[str] = field(default_factory=list)  # task ids from dev/test among the kept

    def line(self) -> str:
        order = (
            "scanned",
            "kept",
            "duplicate",
            "below_reward",
            "not_ok",
            "unfinished",
            "unreadable",
        )
        return ", ".join(f"{key.replace('_', ' ')} {self.counts[key]}" for key in order)


def to_messages(record: EpisodeRecord) -> list[dict[str, str]]:
    """The episode as a chat: system, user, then assistant text and tool observation per step."""
    messages = []
    if record.system_prompt:
        messages.append({"role": "system", "content": record.system_prompt})
    messages.append({"role": "user", "content": record.user_prompt})
    for step in record.steps:
        messages.append({"role": "assistant", "content": step.raw})
        if step.observation:
            messages.append({"role": "tool", "content": step.observation})
    return messages


def to_turn_messages(
    record: EpisodeRecord, keep_last: int | None = None, history: str = "keep_last"
) -> list[list[dict]]:
    """One chat per step: the context that step's prompt held, then its assistant turn
    (the only one trained on). ``keep_last``: observations older than the last K are stubs,
    or with ``history = "window"`` the turns older than the last K are left out, as the
    rollout's ``env.history`` of the same name builds each turn's prompt."""
    if history not in ("keep_last", "window"):
        raise ValueError(f"history must be 'keep_last' or 'window', not {history!r}")
    full = to_messages(record)
    head = 2 if record.system_prompt else 1
    chats = []
    for k, step in enumerate(record.steps):
        chat = [dict(m) for m in full[:head]]
        keep_from = k - keep_last if keep_last is not None else 0
        for j, prev in enumerate(record.steps[:k]):
            if j < keep_from and history == "window":
                continue
            chat.append({"role": "assistant", "content": prev.raw, "weight": 0})
            obs = prev.observation
            if j < keep_from:
                obs = stub_text(prev.index, prev.action, prev.args, prev.url)
            chat.append({"role": "tool", "content": obs})
        chat.append({"role": "assistant", "content": step.raw})
        chats.append(chat)
    return chats


def action_sequence(record: EpisodeRecord) -> tuple[tuple[str, str], ...]:
    """The actions taken, with their arguments, as a hashable key for deduplication."""
    return tuple(
        (step.action or "", json.dumps(step.args, sort_keys=True, ensure_ascii=False))
        for step in record.steps
    )


def select(
    paths: Iterable[Path], min_reward: float, log: IO[str] | None = None
) -> tuple[list[EpisodeRecord], ExportSummary]:
    """The records to export, deduplicated, and the counts of what was skipped and why."""
    summary, seen, kept = ExportSummary(), set(), []
    for path in paths:
        summary.counts["scanned"] += 1
        if log is not None and summary.counts["scanned"] % PROGRESS_EVERY == 0:
            print(f"sft_export: {summary.line()}", file=log, flush=True)
        reason = None
        try:
            record = read_record(path)
        except RecordError as e:
            reason = "unreadable"
            if log is not None:
                print(f"sft_export: skipping {e}", file=log)
        else:
            reason = _skip_reason(record, min_reward, seen)
        if reason is not None:
            summary.counts[reason] += 1
            continue
        summary.counts["kept"] += 1
        kept.append(record)
        if task_split(record.task_id) in HELD_OUT_SPLITS:
            summary.held_out.append(record.task_id)
    return kept, summary


def _skip_reason(record: EpisodeRecord, min_reward: float, seen: set) -> str | None:
    if not record.finished:
        return "unfinished"
    if record.status != "ok":
        return "not_ok"
    if record.reward is None or record.reward < min_reward:
        return "below_reward"
    key = (record.task_id, action_sequence(record))
    if key in seen:
        return "duplicate"
    seen.add(key)
    return None


def export(
    run_dir: str | Path,
    out: str | Path,
    min_reward: float = 1.0,
    log: IO[str] | None = None,
    *,
    per_turn: bool = False,
    keep_last: int | None = None,
    history: str = "keep_last",
) -> ExportSummary:
    """Write the SFT file; :class:`HeldOutSplitError` (and no file) on dev/test tasks."""
    records, summary = select(iter_record_files(run_dir), min_reward, log)
    if summary.held_out:
        examples = ", ".join(sorted(set(summary.held_out))[:5])
        raise HeldOutSplitError(
            f"{len(summary.held_out)} kept trajectories are from the dev or test split "
            f"(e.g. {examples}); exporting them would train on held-out tasks. Nothing written."
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for record in records:
            chats = (
                to_turn_messages(record, keep_last, history) if per_turn else [to_messages(record)]
            )
            for chat in chats:
                line: dict[str, Any] = {"messages": chat}
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
                summary.counts["examples"] += 1
    os.replace(tmp, out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollout.sft_export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="directory holding trajectory records")
    parser.add_argument("--out", required=True, help="the SFT JSONL file to write")
    parser.add_argument(
        "--min-reward", type=float, default=1.0, help="least reward kept (default 1.0)"
    )
    parser.add_argument(
        "--per-turn", action="store_true", help="one example per step (rollout.trajectory per_turn)"
    )
    parser.add_argument(
        "--keep-last", type=int, default=None, help="with --per-turn: observations kept verbatim"
    )
    parser.add_argument(
        "--history", choices=("keep_last", "window"), default="keep_last",
        help="with --keep-last: older observations as stubs (keep_last), or older turns left "
        "out (window), as the rollout's env.history",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        print(f"sft_export: {args.run_dir}: not a directory", file=sys.stderr)
        return 1
    try:
        summary = export(
            args.run_dir, args.out, args.min_reward, log=sys.stderr,
            per_turn=args.per_turn, keep_last=args.keep_last, history=args.history,
        )  # fmt: skip
    except HeldOutSplitError as e:
        print(f"sft_export: refused: {e}", file=sys.stderr)
        return 2
    print(
        f"sft_export: {summary.line()}; wrote {summary.counts['examples']} examples of "
        f"{summary.counts['kept']} episodes to {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
