"""Every search backend against a real loopback server answering in the provider's
documented format: the request it sends, retries, refusals, bad answers, the shared
rate limit, and the ``python -m rollout.search`` CLI. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict

from rollout.net.search_client import (
    BACKENDS,
    MAX_RESPONSE_BYTES,
    HostedClient,
    SearchClient,
    SearchError,
    SearchHit,
    make_search_client,
)
from shared.config import ConfigError, SearchConfig
from tests.conftest import REPO

KEY = "tk-0123456789abcdef-secret"
QUERY = "capital of France"
K = 2  # top_k of the tests; every answer holds three results

# What a provider sends (with markup where Brave and SearXNG put it) and what a hit holds.
RAW = [
    ("https://example.org/paris", "Paris &ndash; <strong>capital</strong>",
     "The capital of <strong>France</strong>\n   is Paris &amp; more."),
    ("https://example.org/lyon", "Lyon", "A city on the <em>Rhône</em>."),
    ("https://example.org/nice", "Nice", None),
]  # fmt: skip
HITS = [
    SearchHit(
        "https://example.org/paris", "Paris – capital", "The capital of France is Paris & more."
    ),
    SearchHit("https://example.org/lyon", "Lyon", "A city on the Rhône."),
    SearchHit("https://example.org/nice", "Nice", ""),
]


@dataclass(frozen=True)
class Provider:
    """One backend's documented wire format, as its fake server speaks it."""

    backend: str
    method: str
    path: str  # the documented path; the client's url points at it
    auth: dict[str, str]  # headers that must carry the key
    fields: tuple[str, str, str]  # url, title and snippet keys of one result
    list_path: tuple[str, ...]  # where the result list lies in the answer
    envelope: dict[str, Any]  # the answer's other keys
    params: Callable[[str], dict[str, str]]  # the query string it expects
    body: Callable[[str], dict[str, Any] | None]  # the JSON body it expects
    markup: bool = True  # titles and snippets carry HTML

    def answer(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        data = json.loads(json.dumps(self.envelope))
        node = data
        for key in self.list_path[:-1]:
            node = node.setdefault(key, {})
        node[self.list_path[-1]] = items
        return data

    def items(self) -> list[dict[str, Any]]:
        if not self.markup:
            return [dict(zip(self.fields, (h.url, h.title, h.snippet), strict=True)) for h in HITS]
        return [dict(zip(self.fields, row, strict=True)) for row in RAW]


PROVIDERS = {
    "local": Provider(
        "local", "GET", "/api/search", {}, ("url", "title", "snippet"), ("results",), {},
        params=lambda q: {"q": q, "k": str(K)}, body=lambda q: None, markup=False,
    ),
    "searxng": Provider(
        "searxng", "GET", "/search", {}, ("url", "title", "content"), ("results",),
        {"query": QUERY, "number_of_results": 3, "answers": [], "infoboxes": []},
        params=lambda q: {"q": q, "format": "json"}, body=lambda q: None,
    ),
    "serper": Provider(
        "serper", "POST", "/search", {"X-API-KEY": KEY}, ("link", "title", "snippet"),
        ("organic",), {"searchParameters": {"q": QUERY, "type": "search", "engine": "google"}},
        params=lambda q: {}, body=lambda q: {"q": q, "num": K},
    ),
    "brave": Provider(
        "brave", "GET", "/res/v1/web/search",
        {"X-Subscription-Token": KEY, "Accept": "application/json"},
        ("url", "title", "description"), ("web", "results"),
        {"type": "search", "query": {"original": QUERY}, "web": {"type": "search"}},
        params=lambda q: {"q": q, "count": str(K)}, body=lambda q: None,
    ),
    "tavily": Provider(
        "tavily", "POST", "/search", {"Authorization": f"Bearer {KEY}"},
        ("url", "title", "content"), ("results",),
        {"query": QUERY, "answer": None, "images": [], "response_time": 0.42},
        params=lambda q: {}, body=lambda q: {"query": q, "max_results": K},
    ),
}  # fmt: skip
HOSTED = ["brave", "serper", "tavily"]
KEY_ENV = {"serper": "SERPER_API_KEY", "brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # None: the provider's answer with three results; str: sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    params: dict[str, str]
    headers: CIMultiDict[str]
    body: Any
    t: float


class FakeProvider:
    """A loopback server for one provider: answers from a script of replies, records requests."""

    def __init__(self, provider: Provider):
        self.provider = provider
        self.replies: list[Reply] = []
        self.seen: list[Seen] = []
        self.base = ""

    @property
    def url(self) -> str:
        """What search.url is set to: SearXNG's base URL, the others' endpoint."""
        return self.base if self.provider.backend == "searxng" else self.base + self.provider.path

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append(
            Seen(
                request.method, request.path, dict(request.query), CIMultiDict(request.headers),
                json.loads(raw) if raw else None, time.monotonic(),
            )
        )  # fmt: skip
        reply = self.replies.pop(0) if self.replies else Reply()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        body = reply.body
        if body is None:
            body = self.provider.answer(self.provider.items())
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(
            status=reply.status, text=text, content_type="application/json", headers=reply.headers
        )


@pytest_asyncio.fixture(scope="module", params=sorted(PROVIDERS))
async def fake(request):
    server = FakeProvider(PROVIDERS[request.param])
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield server
    await runner.cleanup()


@pytest.fixture
def server(fake, monkeypatch):
    """The module's server for this backend, its script and record cleared, its key set."""
    fake.replies.clear()
    fake.seen.clear()
    for var in KEY_ENV.values():
        monkeypatch.setenv(var, KEY)
    return fake


@pytest_asyncio.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def client(server: FakeProvider, session, **over) -> SearchClient:
    fields = dict(backend=server.provider.backend, url=server.url, top_k=K, timeout_s=2.0)
    return make_search_client(SearchConfig(**{**fields, **over}), "", session)


# ----------------------------------------------------------------------------- success, empty


async def test_success_sends_the_documented_request(server, session):
    p = server.provider
    assert await client(server, session).search(QUERY) == HITS[:K]
    [seen] = server.seen
    assert (seen.method, seen.path) == (p.method, p.path)
    assert seen.params == p.params(QUERY) and seen.body == p.body(QUERY)
    for name, value in p.auth.items():
        assert seen.headers[name] == value
    if seen.body is not None:
        assert seen.headers["Content-Type"] == "application/json"
    assert KEY not in json.dumps(seen.params) and KEY not in json.dumps(seen.body)


async def test_empty_results_are_an_empty_list(server, session):
    p = server.provider
    server.replies = [Reply(body=p.answer([]))]
    if p.backend in ("brave", "serper"):  # documented as absent when nothing matched
        server.replies.append(Reply(body={k: v for k, v in p.envelope.items() if k != "web"}))
    c = client(server, session)
    for _ in range(len(server.replies)):
        assert await c.search(QUERY) == []
    assert not server.replies


@pytest.mark.parametrize("fake", ["local"], indirect=True)
async def test_the_local_backend_defaults_to_the_webs_endpoint(server, session):
    c = make_search_client(SearchConfig(top_k=K), server.base + "/", session)
    assert c.endpoint == f"{server.base}/api/search"
    assert await c.search(QUERY) == HITS[:K]
    assert server.seen[0].path == "/api/search"


# ----------------------------------------------------------------------------- refusals


async def test_a_refused_key_fails_at_once(server, session):
    server.replies = [Reply(401, {"message": f"Unauthorized: {KEY} is not a valid key"})]
    with pytest.raises(SearchError) as e:
        await client(server, session).search(QUERY)
    b = server.provider.backend
    who = f"the {b} API refused the key" if b in HOSTED else "refused the request"
    assert f"{who} (HTTP 401)" in str(e.value) and KEY not in str(e.value)
    assert len(server.seen) == 1


async def test_a_bad_request_is_not_retried_and_the_key_never_shows(server, session):
    server.replies = [Reply(400, f"<p>invalid query for key <b>{KEY}</b></p>")]
    with pytest.raises(SearchError, match=r"rejected the request \(HTTP 400\): invalid") as e:
        await client(server, session).search(QUERY)
    assert len(server.seen) == 1
    if server.provider.backend in HOSTED:  # the others hold no key to hide
        assert KEY not in str(e.value) and "invalid query for key [key]" in str(e.value)


# ----------------------------------------------------------------------------- retries


async def test_429_then_success_honours_retry_after(server, session):
    server.replies = [Reply(429, "slow down", {"Retry-After": "1"})]
    assert await client(server, session).search(QUERY) == HITS[:K]
    first, second = server.seen
    assert second.t - first.t >= 0.95  # waited the server's second, not the 0.1 s backoff


async def test_a_long_retry_after_is_capped(server, session):
    server.replies = [Reply(429, "slow down", {"Retry-After": "3600"})]
    cls = BACKENDS[server.provider.backend]
    key = {"api_key": KEY} if issubclass(cls, HostedClient) else {}
    endpoint = client(server, session).endpoint
    c = cls(endpoint, session, top_k=K, max_retry_after_s=0.2, **key)
    t0 = time.monotonic()
    assert await c.search(QUERY) == HITS[:K]
    assert 0.15 <= time.monotonic() - t0 < 3.0


async def test_429_forever_gives_up_after_the_retries(server, session):
    server.replies = [Reply(429, "slow down") for _ in range(3)]
    with pytest.raises(SearchError, match=r"failed after 3 tries: HTTP 429"):
        await client(server, session, retries=2).search(QUERY)
    assert len(server.seen) == 3


async def test_5xx_then_success(server, session):
    server.replies = [Reply(500, "oops"), Reply(503, "busy")]
    assert await client(server, session).search(QUERY) == HITS[:K]
    assert len(server.seen) == 3


async def test_a_timeout_is_retried(server, session):
    server.replies = [Reply(delay_s=1.5)]
    assert await client(server, session, timeout_s=0.3).search(QUERY) == HITS[:K]
    assert len(server.seen) == 2


async def test_connection_errors_are_retried_then_fail(session):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    c = SearchClient(f"http://127.0.0.1:{port}/api/search", session, retries=1)
    with pytest.raises(SearchError, match=r"failed after 2 tries: ClientConnectorError"):
        await c.search(QUERY)


# ----------------------------------------------------------------------------- bad answers


async def test_malformed_json_is_a_search_error(server, session):
    server.replies = [Reply(body='{"results": [')]
    with pytest.raises(SearchError, match="not JSON"):
        await client(server, session).search(QUERY)
    assert len(server.seen) == 1


@pytest.mark.parametrize("shape", ["top-level list", "list is a string", "result without url"])
async def test_a_wrong_shape_is_a_search_error(server, session, shape):
    p = server.provider
    items = p.items()
    del items[1][p.fields[0]]
    body = {
        "top-level list": [p.answer(p.items())],
        "list is a string": p.answer("three results"),  # type: ignore[arg-type]
        "result without url": p.answer(items),
    }[shape]
    server.replies = [Reply(body=body)]
    with pytest.raises(SearchError, match="unexpected answer from"):
        await client(server, session, top_k=3).search(QUERY)


async def test_an_oversized_answer_is_refused(server, session):
    server.replies = [Reply(body=" " * (MAX_RESPONSE_BYTES + 10) + "{}")]
    with pytest.raises(SearchError, match="more than 2 MB"):
        await client(server, session).search(QUERY)


# ----------------------------------------------------------------------------- rate limit


async def test_the_rate_limit_holds_across_clients(server, session):
    a, b = (client(server, session, rate_limit_per_s=10.0) for _ in range(2))
    assert a.limiter is b.limiter
    t0 = time.monotonic()
    results = await asyncio.gather(*(c.search(QUERY) for c in (a, b, a, b, a)))
    elapsed = time.monotonic() - t0
    assert all(r == HITS[:K] for r in results)
    # Five starts 0.1 s apart: the last one 0.4 s after the first.
    assert 0.38 <= elapsed < 5.0
    assert server.seen[-1].t - server.seen[0].t >= 0.35


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("backend", HOSTED)
def test_a_missing_key_names_its_variable(backend, monkeypatch):
    monkeypatch.delenv(KEY_ENV[backend], raising=False)
    monkeypatch.delenv("RH_TEST_UNSET_KEY", raising=False)
    monkeypatch.setenv("RH_TEST_BLANK_KEY", "  ")
    with pytest.raises(ConfigError, match=KEY_ENV[backend]):
        make_search_client(SearchConfig(backend=backend), "", None)  # type: ignore[arg-type]
    for var in ("RH_TEST_UNSET_KEY", "RH_TEST_BLANK_KEY"):
        with pytest.raises(ConfigError, match=var):
            make_search_client(SearchConfig(backend=backend, api_key_env=var), "", None)  # type: ignore[arg-type]


DOCUMENTED = {
    "serper": "https://google.serper.dev/search",
    "brave": "https://api.search.brave.com/res/v1/web/search",
    "tavily": "https://api.tavily.com/search",
}


@pytest.mark.parametrize("backend", HOSTED)
def test_hosted_backends_default_to_their_documented_endpoints(backend, monkeypatch):
    monkeypatch.setenv(KEY_ENV[backend], KEY)
    c = make_search_client(SearchConfig(backend=backend), "", None)  # type: ignore[arg-type]
    assert c.endpoint == DOCUMENTED[backend]
    assert type(c) is BACKENDS[backend]


def test_searxng_takes_a_base_url_and_both_need_an_endpoint():
    for url in ("http://sx:8080", "http://sx:8080/", "http://sx:8080/search"):
        c = make_search_client(SearchConfig(backend="searxng", url=url), "", None)  # type: ignore[arg-type]
        assert c.endpoint == "http://sx:8080/search"
    with pytest.raises(ConfigError, match=r"search\.url is required"):
        make_search_client(SearchConfig(backend="searxng"), "http://web", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"needs search\.url or a running local web"):
        make_search_client(SearchConfig(), "", None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- CLI


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollout.search", *args, cwd=REPO, env=env or dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.multiprocess
async def test_cli_prints_numbered_hits_and_json(server, monkeypatch):
    b = server.provider.backend
    args = ["--backend", b, "--url", server.url, "-k", str(K)]
    if b in HOSTED:  # the key from a variable of our choosing
        monkeypatch.delenv(KEY_ENV[b])
        monkeypatch.setenv("RH_TEST_SEARCH_KEY", KEY)
        args += ["--key-env", "RH_TEST_SEARCH_KEY"]
    rc, out, _ = await cli(*args, QUERY)
    assert rc == 0
    assert out.splitlines() == [
        "1. Paris – capital", "   https://example.org/paris", f"   {HITS[0].snippet}",
        "2. Lyon", "   https://example.org/lyon", f"   {HITS[1].snippet}",
    ]  # fmt: skip
    rc, out, _ = await cli(*args, "--json", QUERY)
    assert rc == 0
    assert json.loads(out) == {
        "backend": b, "query": QUERY, "results": [vars(h) for h in HITS[:K]],
    }  # fmt: skip
    for name, value in server.provider.auth.items():
        assert all(s.headers[name] == value for s in server.seen)


@pytest.mark.multiprocess
async def test_cli_reports_errors_with_exit_status_1(server):
    b = server.provider.backend
    server.replies = [Reply(401, f"bad key {KEY}"), Reply(401, f"bad key {KEY}")]
    args = ["--backend", b, "--url", server.url]
    rc, out, err = await cli(*args, QUERY)
    assert rc == 1 and out == "" and err.startswith("search error:") and "HTTP 401" in err
    assert KEY not in err
    rc, out, _ = await cli(*args, "--json", QUERY)
    assert rc == 1 and "HTTP 401" in json.loads(out)["error"] and KEY not in out


@pytest.mark.multiprocess
async def test_cli_local_without_a_web_says_so():
    rc, _, err = await cli("--backend", "local", QUERY)
    assert rc == 1 and "the local backend needs a running web" in err
