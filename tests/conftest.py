import os
from pathlib import Path

from hypothesis import HealthCheck, settings

# XLA's compiled programs are kept on disk and shared by every process of the suite (the
# test process, its xdist siblings and the learner.train, learner.serve and rollout.eval
# children it starts, which inherit the variables): the tiny model's steps and decode
# loops compile once per suite, not once per process. Set before anything imports JAX.
REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# CI runs the same examples every time; locally, hypothesis explores.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# ----------------------------------------------------------------------------- shared fixtures

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import pytest_asyncio  # noqa: E402


def load_bench(name: str):
    """``bench/<name>.py`` imported as a module (the benches are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WEB_CACHE = REPO / ".cache" / "web"  # shared with `python -m rollout.web`: built once
CHROMIUM = "/usr/bin/chromium-headless-shell"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def start_server(args: list[str], ready_prefix: str, timeout: float = 180.0, log=None):
    """Start ``python -m ...`` and wait for the line announcing its URL; (process, url)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log if log is not None else subprocess.DEVNULL,
        text=True,
    )
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(ready_prefix):
                found.append(line.split()[-1])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        proc.kill()
        raise RuntimeError(f"{' '.join(args)} did not start within {timeout} s")
    return proc, found[0]


def run_until(proc: subprocess.Popen, done, timeout: float = 120.0) -> None:
    """Let the server ``proc`` run until ``done()`` is true, at most ``timeout`` seconds
    (however slow the machine); it must not stop meanwhile."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        assert proc.poll() is None, "the server stopped before it was killed"
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()  # its reader thread ends with the process


@pytest.fixture(scope="session")
def web_url(tmp_path_factory):
    """Base URL of a real local-web server (a child process on a free loopback port)."""
    log = (tmp_path_factory.mktemp("web") / "web.log").open("w")
    proc, url = start_server(
        ["rollout.web", "--port", "0", "--set", f"web.cache_dir={WEB_CACHE}"],
        "serving on",
        log=log,
    )
    yield url
    stop_server(proc)
    log.close()


@pytest.fixture(scope="session")
def local_web(web_url):
    """The built local web, in process, loaded from the cache the server built."""
    from rollout.web.build import load

    return load(WEB_CACHE)


@pytest_asyncio.fixture(scope="session")
async def browser():
    """A real headless Chromium, shared by the session's browser tests."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        await b.close()


# ----------------------------------------------------------------------------- the fault table
# Every fault-injection case (marker ``reliability``) records (fault, expected, observed,
# passed); at the end of the session the rows go to ``$RELIABILITY_OUT`` (default
# ``runs/reliability``) as ``fault_table.md`` and ``fault_table.json``.

ROWS: list[dict] = []


@pytest.fixture
def fault(request):
    """``fault(name, expected)`` starts a row; assign ``row["observed"]`` as the test goes."""
    rows: list[dict] = []

    def start(name: str, expected: str) -> dict:
        row = {
            "fault": name, "expected": expected, "observed": "",
            "test": request.node.name, "nodeid": request.node.nodeid,
        }  # fmt: skip
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


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's rows, sent in its ``workeroutput``."""
    ROWS.extend(json.loads(getattr(node, "workeroutput", {}).get("fault_rows", "[]")))


def pytest_sessionfinish(session, exitstatus):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller writes the table
        workeroutput["fault_rows"] = json.dumps(ROWS)
        return
    if not ROWS:
        return
    ROWS.sort(key=lambda r: r["nodeid"])  # one order, however the workers were given the tests
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
