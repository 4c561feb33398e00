"""Progress of a long phase, for a person at a terminal and for a log file alike.

On a terminal (the stream is a TTY) a phase is a rich progress bar; anywhere else
(a cluster job's output file, a pipe) it is a log line every ``every_s`` seconds,
and at the start and the end::

    [progress] demos: 96/256 episodes (38%), 2.4/s, 40 s elapsed, eta 67 s

The ``[progress]`` lines have one format, so a parent process reading a child's
output can show the child's phase as its own (:func:`parse_line`).
:meth:`Progress.line` writes a line that belongs in every log (one per GRPO step):
above the bar on a terminal, through ``logging`` elsewhere.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import IO, Any

log = logging.getLogger("progress")

# Seconds between two progress lines when not on a terminal; PROGRESS_EVERY_S overrides.
DEFAULT_EVERY_S = 15.0
_ACTIVE: list[Progress] = []  # the bar on the terminal (rich draws one at a time)
_LINE = re.compile(r"\[progress\] (?P<phase>[^:]+): (?P<done>\d+)/(?P<total>\d+)")


def every_s_default() -> float:
    try:
        return max(0.0, float(os.environ.get("PROGRESS_EVERY_S", DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def format_line(
    phase: str, done: int, total: int, unit: str, elapsed: float, info: str = "",
    rate: float | None = None,
) -> str:  # fmt: skip
    """``[progress] PHASE: DONE/TOTAL UNIT (P%), R/s, E elapsed, eta T[  INFO]``; the rate
    is ``done / elapsed`` unless given (a resumed phase: this run's work only)."""
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    if rate is None:
        rate = done / elapsed if elapsed > 0 else 0.0
    parts = [f"[progress] {phase}: {done}/{total}{' ' + unit if unit else ''}{pct}"]
    if done:
        parts.append(f"{rate:.3g}/s")
    parts.append(f"{_duration(elapsed)} elapsed")
    if 0 < done < total and rate > 0:
        parts.append(f"eta {_duration((total - done) / rate)}")
    text = ", ".join(parts)
    return f"{text}  {info}" if info else text


def parse_line(line: str) -> tuple[str, int, int] | None:
    """(phase, done, total) of a ``[progress]`` line, else None."""
    m = _LINE.search(line)
    return (m["phase"], int(m["done"]), int(m["total"])) if m else None


class Progress:
    """One phase's progress: ``update(done)`` / ``advance(n)``, then ``close()`` (or
    ``with``). ``enabled=False`` keeps the lines but never draws a bar; a phase inside
    another one's bar (an evaluation during GRPO) writes its lines above that bar."""

    def __init__(
        self,
        phase: str,
        total: int,
        unit: str = "",
        *,
        done: int = 0,
        enabled: bool = True,
        every_s: float | None = None,
        stream: IO[str] | None = None,
    ) -> None:
        self.phase, self.total, self.unit = phase, int(total), unit
        self.done, self.info = int(done), ""
        self.every_s = every_s_default() if every_s is None else every_s
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        self.first = int(done)  # the rate counts this run's work, not a resumed run's
        self.last_line = -float("inf")  # when the last line was written
        self.shown_end = self.closed = False
        self.bar: Any = None
        self.outer = _ACTIVE[-1] if _ACTIVE else None  # a bar already on the terminal
        if enabled and _isatty(self.stream) and self.outer is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self.bar = Bar(
                TextColumn(f"[bold]{phase}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream), redirect_stdout=False, redirect_stderr=False,
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task(phase, total=self.total, completed=done, info="")
            _ACTIVE.append(self)
        else:
            self._emit(force=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, info: str | None = None, total: int | None = None) -> None:
        self.done = int(done)
        if info is not None:
            self.info = info
        if total is not None:
            self.total = int(total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, total=self.total, info=self.info)
        else:
            self._emit(force=self.done >= self.total)

    def advance(self, n: int = 1, info: str | None = None) -> None:
        self.update(self.done + n, info)

    def line(self, text: str) -> None:
        """A line for every log: printed above the bar on a terminal, logged elsewhere."""
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)
        else:
            log.info("%s", text)

    def close(self) -> None:
        if self.closed:
            return
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
            _ACTIVE.remove(self)
        else:
            self._emit(force=True)
        self.closed = True

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        at_end = self.done >= self.total
        if self.closed or (at_end and self.shown_end):
            return
        if not force and now - self.last_line < self.every_s:
            return
        self.last_line, self.shown_end = now, at_end
        elapsed = now - self.t0
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        text = format_line(self.phase, self.done, self.total, self.unit, elapsed, self.info, rate)
        if self.outer is not None and self.outer.bar is not None:  # above the outer bar
            self.outer.bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
