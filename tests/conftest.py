import os

from hypothesis import HealthCheck, settings

# CI runs the same examples every time; locally, hypothesis explores.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# ----------------------------------------------------------------------------- shared fixtures

import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import pytest_asyncio  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
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


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
