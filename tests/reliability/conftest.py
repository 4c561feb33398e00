"""The fault suite's table: every case records (fault, expected, observed, passed).

At the end of the session the rows are written to ``$RELIABILITY_OUT`` (default
``runs/reliability``) as ``fault_table.md`` and ``fault_table.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO

ROWS: list[dict] = []


@pytest.fixture
def fault(request):
    """``fault(name, expected)`` starts a row; assign ``row["observed"]`` as the test goes."""
    rows: list[dict] = []

    def start(name: str, expected: str) -> dict:
        row = {"fault": name, "expected": expected, "observed": "", "test": request.node.name}
        rows.append(row)
        return row

    yield start
    report = getattr(request.node, "rep_call", None)
    passed = bool(report and report.passed)
    for row in rows:
        ROWS.append({**row, "passed": passed})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


def pytest_sessionfinish(session, exitstatus):
    if not ROWS:
        return
    out = Path(os.environ.get("RELIABILITY_OUT", REPO / "runs" / "reliability"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault_table.json").write_text(json.dumps(ROWS, indent=2) + "\n")
    lines = ["| fault | expected | observed | |", "| --- | --- | --- | --- |"]
    for r in ROWS:
        observed = r["observed"] or "-"
        observed = observed if len(observed) <= 240 else observed[:237] + "..."
        cells = [r["fault"], r["expected"], observed, "ok" if r["passed"] else "FAIL"]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    (out / "fault_table.md").write_text("\n".join(lines) + "\n")
