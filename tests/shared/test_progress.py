"""Progress of long phases: lines off a terminal, a bar on one, and the line format a
parent process reads back from a child."""

from __future__ import annotations

import io
import logging
import os
import time

from shared.progress import Progress, format_line, parse_line


def lines(buf: io.StringIO) -> list[str]:
    return [x for x in buf.getvalue().splitlines() if x]


def test_off_a_terminal_a_line_at_start_periodically_and_at_the_end():
    buf = io.StringIO()
    with Progress("demos", 10, "episodes", stream=buf, every_s=3600) as p:
        for i in range(1, 10):
            p.update(i)
        assert len(lines(buf)) == 1  # the start; the interval has not passed
        p.update(10, "success 7")
    out = lines(buf)
    assert len(out) == 2, out  # the end once, not again at close
    assert out[0].startswith("[progress] demos: 0/10 episodes (0%)")
    assert out[1].startswith("[progress] demos: 10/10 episodes (100%)")
    assert out[1].endswith("success 7") and "/s" in out[1] and "elapsed" in out[1]


def test_every_update_is_a_line_when_the_interval_has_passed():
    buf = io.StringIO()
    p = Progress("sft", 4, "steps", stream=buf, every_s=0)
    p.update(1)
    p.update(2, "loss 0.5")
    p.close()
    out = lines(buf)
    assert [parse_line(x) for x in out] == [("sft", d, 4) for d in (0, 1, 2, 2)]
    assert "eta" in out[1] and "loss 0.5" in out[2]


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PROGRESS_EVERY_S", "0.05")
    buf = io.StringIO()
    p = Progress("x", 100, stream=buf)
    p.update(1)
    time.sleep(0.08)
    p.update(2)
    p.close()
    assert [parse_line(x)[1] for x in lines(buf)] == [0, 2, 2]


def test_a_resumed_phase_reports_this_runs_rate():
    assert "1/s" in format_line("GRPO", 60, 100, "steps", 10.0, rate=1.0)
    assert "6/s" in format_line("GRPO", 60, 100, "steps", 10.0)


def test_parse_line_ignores_other_lines():
    assert parse_line("2026-12-01 INFO something 3/4 done") is None
    assert parse_line("[progress] eval test-before-t1: 12/200 episodes (6%)") == (
        "eval test-before-t1",
        12,
        200,
    )


def test_line_goes_to_the_log_off_a_terminal(caplog):
    buf = io.StringIO()
    with caplog.at_level(logging.INFO, logger="progress"), Progress("GRPO", 2, stream=buf) as p:
        p.line("grpo step 1/2  reward 0.5")
    assert "grpo step 1/2  reward 0.5" in caplog.text


def test_on_a_terminal_a_bar_with_lines_above_it_and_an_inner_phase_without_a_bar():
    master, slave = os.openpty()
    with open(slave, "w", buffering=1) as tty:
        assert tty.isatty()
        outer = Progress("GRPO", 3, "steps", stream=tty)
        assert outer.bar is not None
        outer.line("grpo step 1/3  reward 0.250")
        inner = Progress("eval dev", 2, "episodes", stream=tty, every_s=0)
        assert inner.bar is None  # one bar at a time: its lines go above GRPO's
        inner.update(2)
        inner.close()
        outer.update(3)
        outer.close()
        tty.flush()
        out = b""
        os.set_blocking(master, False)
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            out += chunk
    os.close(master)
    text = out.decode(errors="replace")
    assert "grpo step 1/3  reward 0.250" in text
    assert "[progress] eval dev: 2/2 episodes" in text
    assert "GRPO" in text and "3/3" in text


def test_disabled_never_draws_a_bar_on_a_terminal():
    master, slave = os.openpty()
    with open(slave, "w") as tty:
        p = Progress("x", 1, stream=tty, enabled=False, every_s=0)
        assert p.bar is None
        p.close()
    os.close(master)
