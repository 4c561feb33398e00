"""Being a good citizen of the web: per-host rate limits and robots.txt.

One :class:`HostLimiter` and one :class:`RobotsCache` serve every episode of a
process, so the limits hold for the process as a whole, not per agent.

robots.txt follows RFC 9309, with a parser of its own: ``urllib.robotparser``
matches user agents by substring and takes the first matching rule in file order
(no longest match, no ``*`` or ``$`` wildcards), which RFC 9309 replaced.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from rollout.net.resolver import describe_refusal
from rollout.net.urls import DEFAULT_PORTS, UrlRefused, normalise_host

MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309: parse at least the first 500 KiB
_PRODUCT_TOKEN = re.compile(r"[A-Za-z_-]+")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_SAFE = "!#$%&'()*+,/:;=?@[]~"  # ASCII kept as is when percent-encoding a path


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, normalised host, effective port) of an http(s) URL; a bare host is http."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    try:
        host = ipaddress.ip_address(host).compressed if ":" in host else normalise_host(url, host)
    except (UrlRefused, ValueError):
        host = host.rstrip(".").lower()
    return scheme, host, parts.port or DEFAULT_PORTS.get(scheme, 80)


def host_key(url: str) -> str:
    """``host:port`` of a URL (or of a bare ``host[:port]``), the unit of rate limiting."""
    _, host, port = origin_of(url)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ----------------------------------------------------------------------------- rate limits


@dataclass
class _HostState:
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: one caller admitted at a time
    slots: asyncio.Semaphore | None = None  # None: no concurrency cap
    next_start: float = float("-inf")  # clock time before which no request may start
    users: int = 0  # callers waiting or in flight; the state is dropped when idle


class HostLimiter:
    """Per host: at most ``concurrency`` requests in flight, starts ``interval_s`` apart.

    0 disables either limit; with both 0, :meth:`slot` neither locks nor keeps state.
    Callers are admitted first come, first served, across all callers of the host.
    A host's state is dropped once it has no caller and its interval has run out.
    ``clock`` gives monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        concurrency: int = 0,
        interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if concurrency < 0 or interval_s < 0:
            raise ValueError("concurrency and interval_s must be >= 0")
        self.concurrency = concurrency
        self.interval_s = interval_s
        self._clock = clock
        self._hosts: dict[str, _HostState] = {}

    def __len__(self) -> int:
        """How many hosts have state kept (in flight, waiting, or within the interval)."""
        return len(self._hosts)

    @asynccontextmanager
    async def slot(self, url: str) -> AsyncIterator[None]:
        """Wait for a turn at the host of ``url`` (a URL or ``host[:port]``), and hold it."""
        if not self.concurrency and not self.interval_s:
            yield
            return
        key = host_key(url)
        state = self._hosts.get(key)
        if state is None:
            slots = asyncio.Semaphore(self.concurrency) if self.concurrency else None
            state = self._hosts[key] = _HostState(slots=slots)
        state.users += 1
        holding = False
        try:
            async with state.gate:
                if state.slots is not None:
                    await state.slots.acquire()
                    holding = True
                while (delay := state.next_start - self._clock()) > 0:
                    await asyncio.sleep(delay)
                state.next_start = self._clock() + self.interval_s
            yield
        finally:
            if holding:
                state.slots.release()
            state.users -= 1
            if not state.users:
                self._forget_later(key, state)

    def _forget_later(self, key: str, state: _HostState) -> None:
        """Drop an idle host's state once its interval has run out (at once if it has)."""
        delay = state.next_start - self._clock()
        if delay <= 0:
            self._forget(key, state)
        else:
            asyncio.get_running_loop().call_later(delay, self._forget, key, state)

    def _forget(self, key: str, state: _HostState) -> None:
        if not state.users and self._hosts.get(key) is state:
            del self._hosts[key]


# ----------------------------------------------------------------------------- robots.txt


@dataclass(frozen=True)
class _Rule:
    allow: bool
    pattern: str  # normalised path pattern; "*" any run of characters, a final "$" the end

    def matches(self, path: str) -> bool:
        if self.pattern.endswith("$"):
            return _glob(self.pattern[:-1], path)
        return _glob(self.pattern + "*", path)


@dataclass(frozen=True)
class RobotsRules:
    """The rules of the group(s) that apply to one user agent, after RFC 9309."""

    rules: tuple[_Rule, ...] = ()
    crawl_delay: float | None = None

    def disallows(self, path: str) -> bool:
        """Whether ``path`` (path and query) is disallowed: longest match wins, Allow wins ties."""
        path = _normalise_path(path or "/")
        if path == "/robots.txt":
            return False
        best: _Rule | None = None
        for rule in self.rules:
            longer = best is None or len(rule.pattern) > len(best.pattern)
            tie_allow = best is not None and len(rule.pattern) == len(best.pattern) and rule.allow
            if (longer or tie_allow) and rule.matches(path):
                best = rule
        return best is not None and not best.allow


def parse_robots(text: str, product_token: str) -> RobotsRules:
    """The rules for ``product_token`` (case-insensitive), else those for ``*``, else none.

    Every group naming the token is merged, as are the ``*`` groups; empty
    ``Allow:`` and ``Disallow:`` lines match nothing.
    """
    token = product_token.lower()
    groups: list[tuple[set[str], list[_Rule], list[float]]] = []
    in_agents = False  # whether the previous meaningful line was a user-agent line
    for raw in text.removeprefix("\ufeff").splitlines():
        key, sep, value = raw.split("#", 1)[0].partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "user-agent":
            if not in_agents:
                groups.append((set(), [], []))
            name = _PRODUCT_TOKEN.match(value)
            groups[-1][0].add("*" if value.startswith("*") else name[0].lower() if name else "")
            in_agents = True
        elif key in ("allow", "disallow", "crawl-delay") and groups:  # else: outside any group
            in_agents = False
            if key == "crawl-delay":
                with suppress(ValueError):
                    groups[-1][2].append(float(value))
            elif value:  # an empty rule matches nothing
                groups[-1][1].append(_Rule(key == "allow", _normalise_path(value)))
    for wanted in (token, "*"):
        chosen = [g for g in groups if wanted in g[0]]
        if chosen:
            delays = [d for g in chosen for d in g[2] if d >= 0]
            rules = tuple(r for g in chosen for r in g[1])
            return RobotsRules(rules, delays[0] if delays else None)
    return RobotsRules()


@dataclass(frozen=True)
class _Verdict:
    rules: RobotsRules | None  # None: everything disallowed (robots.txt unreachable)
    failure: str  # why it is unreachable, when rules is None
    expires: float


class RobotsCache:
    """robots.txt per origin, fetched once and cached, answering whether a URL may be fetched.

    ``fetch(url)`` returns ``(status, body)`` after following redirects; it may raise
    on network errors. Per RFC 9309: 2xx is parsed; 4xx (except 429) means no
    robots.txt, so everything is allowed, as does a redirect ``fetch`` did not follow;
    5xx, 429, a network error or ``fetch_timeout_s`` passing means everything is
    disallowed for ``failure_ttl_s`` (a refused address gives the refusal as reason).
    Concurrent first requests for an origin share one fetch.
    """

    def __init__(
        self,
        user_agent: str,
        fetch: Callable[[str], Awaitable[tuple[int, bytes]]],
        *,
        ttl_s: float = 3600.0,
        max_hosts: int = 10000,
        failure_ttl_s: float = 60.0,
        fetch_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        token = _PRODUCT_TOKEN.match(user_agent)
        if token is None:
            raise ValueError(f"user_agent {user_agent!r} does not start with a product token")
        self.product_token = token[0]
        self._fetch = fetch
        self.ttl_s = ttl_s
        self.failure_ttl_s = failure_ttl_s
        self.fetch_timeout_s = fetch_timeout_s
        self.max_hosts = max_hosts
        self._clock = clock
        self._cache: OrderedDict[str, _Verdict] = OrderedDict()
        self._pending: dict[str, asyncio.Task[_Verdict]] = {}

    async def allowed(self, url: str) -> bool:
        """Whether robots.txt lets this agent fetch ``url``."""
        return await self.check(url) is None

    async def check(self, url: str) -> str | None:
        """None if robots.txt allows ``url``, else why not, in words for the agent."""
        origin = _origin(url)
        verdict = await self._verdict(origin)
        if verdict.rules is None:
            return verdict.failure
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if verdict.rules.disallows(path):
            return (
                f"robots.txt of {origin.split('://')[1]} disallows {path} for {self.product_token}"
            )
        return None

    async def crawl_delay(self, url: str) -> float | None:
        """The Crawl-delay (seconds) robots.txt asks of this agent at ``url``'s origin, if any."""
        verdict = await self._verdict(_origin(url))
        return verdict.rules.crawl_delay if verdict.rules is not None else None

    async def _verdict(self, origin: str) -> _Verdict:
        cached = self._cache.get(origin)
        if cached is not None and cached.expires > self._clock():
            self._cache.move_to_end(origin)
            return cached
        task = self._pending.get(origin)
        if task is None:
            task = asyncio.ensure_future(self._load(origin))
            self._pending[origin] = task
            task.add_done_callback(lambda _: self._pending.pop(origin, None))
        return await asyncio.shield(task)  # a cancelled caller leaves the fetch to the others

    async def _load(self, origin: str) -> _Verdict:
        url = f"{origin}/robots.txt"
        shown = origin.split("://", 1)[1]
        try:
            status, body = await asyncio.wait_for(self._fetch(url), self.fetch_timeout_s)
        except Exception as e:  # the refusal of a non-public address says more than its type
            refused = describe_refusal(e)
            reason = refused or f"robots.txt of {shown} could not be fetched ({type(e).__name__})"
            verdict = _Verdict(None, reason, self._clock() + self.failure_ttl_s)
        else:
            if 200 <= status < 300:
                text = body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace")
                rules = parse_robots(text, self.product_token)
                verdict = _Verdict(rules, "", self._clock() + self.ttl_s)
            elif 300 <= status < 500 and status != 429:  # no robots.txt (or too many redirects)
                verdict = _Verdict(RobotsRules(), "", self._clock() + self.ttl_s)
            else:
                reason = f"robots.txt of {shown} could not be fetched (HTTP {status})"
                verdict = _Verdict(None, reason, self._clock() + self.failure_ttl_s)
        self._cache[origin] = verdict
        self._cache.move_to_end(origin)
        while len(self._cache) > self.max_hosts:
            self._cache.popitem(last=False)
        return verdict


def _origin(url: str) -> str:
    """``scheme://host[:port]``, the port shown only when not the scheme's default."""
    scheme, host, port = origin_of(url)
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" + ("" if port == DEFAULT_PORTS.get(scheme) else f":{port}")


def _normalise_path(path: str) -> str:
    """RFC 9309 2.2.2: unreserved characters decoded, everything else percent-encoded (UTF-8)."""

    def decode(m: re.Match[str]) -> str:
        char = chr(int(m[1], 16))
        return char if char in _UNRESERVED else f"%{m[1].upper()}"

    return quote(re.sub(r"%([0-9A-Fa-f]{2})", decode, path), safe=_PATH_SAFE)


def _glob(pattern: str, text: str) -> bool:
    """Whether ``pattern`` (``*`` for any run) matches all of ``text``; O(len * len), no regex."""
    p = t = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(pattern) and pattern[p] != "*" and pattern[p] == text[t]:
            p, t = p + 1, t + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark, p = p, t, p + 1
        elif star >= 0:
            p, mark = star + 1, mark + 1
            t = mark
        else:
            return False
    return all(c == "*" for c in pattern[p:])
