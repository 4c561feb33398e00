"""Name resolution that enforces the address rule of :class:`~rollout.net.urls.UrlPolicy`.

:func:`~rollout.net.urls.check_url` judges a URL by its host as written; a host name's
addresses are only known once resolved, and ``*.example.org`` or ``public`` must
never lead to a loopback, private or metadata address. :class:`SafeResolver` is
given to ``aiohttp.TCPConnector(resolver=...)``: the connector connects only to
the addresses a resolver returns, so checking them here leaves no gap between the
check and the connection (no second lookup a rebinding DNS server could answer
differently). An IP-literal URL never reaches a resolver (aiohttp connects to it
directly), which is why :func:`~rollout.net.urls.check_url` judges literals itself.

A refusal surfaces as aiohttp's ``ClientConnectorDNSError`` wrapping
:class:`AddressRefused`; :func:`describe_refusal` digs out the reason to show.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Mapping, Sequence

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from rollout.net.urls import UrlPolicy, UrlRefused, normalise_host

_NUMERIC_FLAGS = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class AddressRefused(OSError):
    """A host resolved to an address the policy does not admit; ``reason`` is for the agent."""

    def __init__(self, host: str, address: str, reason: str):
        super().__init__(errno.EACCES, reason)  # strerror: aiohttp shows it in its message
        self.host = host
        self.address = address
        self.reason = reason


class SafeResolver(AbstractResolver):
    """Resolves with ``inner`` and refuses the whole answer if any address is not admitted.

    All-or-nothing: a name answering with a public and a private address is refused,
    since the connector (happy eyeballs, or a retry after the first address fails)
    may use any address of the answer, and a rebinding DNS server would put its
    private address exactly there. ``inner`` defaults to aiohttp's ``DefaultResolver``,
    made on first use (it needs a running loop) and closed by :meth:`close`.
    """

    def __init__(self, policy: UrlPolicy, inner: AbstractResolver | None = None):
        self.policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The inner resolver's answer for ``host``, if the policy admits every address in it.

        ``port`` is the port the connection is for (the policy's entries may pin one).
        Raises :class:`AddressRefused` otherwise, and ``OSError`` if the lookup fails.
        """
        name = _normalised(host)
        if not self.policy.allows_host(name, port):  # no lookup for a host off the list
            off_list = self.policy.admits_address(name, port, "")  # says it is not allowed
            raise AddressRefused(host, "", off_list or "the host is not allowed")
        if _is_ip(name):  # aiohttp never asks for these; direct callers may
            results = [_result(host, name, port)]
        else:
            if self._inner is None:
                self._inner = aiohttp.resolver.DefaultResolver()
            results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = self.policy.admits_address(name, port, result["host"])
            if reason is not None:
                raise AddressRefused(host, result["host"], reason)
        return results

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


class StaticResolver(AbstractResolver):
    """A fixed map from host names to addresses, for tests and for pinning names.

    Names are matched case-insensitively and without a trailing dot; an unknown
    name, or one without an address of the asked family, fails like a lookup does
    (``socket.gaierror``).
    """

    def __init__(self, addresses: Mapping[str, Sequence[str]]):
        self.addresses = {
            _normalised(name): tuple(ipaddress.ip_address(a).compressed for a in found)
            for name, found in addresses.items()
        }
        self.lookups: list[str] = []  # every name asked for, in order

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups.append(host)
        versions = {socket.AF_INET: {4}, socket.AF_INET6: {6}}.get(family, {4, 6})
        found = [
            _result(host, a, port)
            for a in self.addresses.get(_normalised(host), ())
            if ipaddress.ip_address(a).version in versions
        ]
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the static map")
        return found

    async def close(self) -> None:
        pass


def describe_refusal(exc: BaseException) -> str | None:
    """The reason of the :class:`AddressRefused` behind ``exc``, if there is one.

    aiohttp raises ``ClientConnectorDNSError`` for a failing resolver, holding the
    resolver's exception as ``os_error`` and ``__cause__``; both are followed, as is
    ``__context__``, so wrappers of that error are seen through too.
    """
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, AddressRefused):
            return current.reason
        for nxt in (getattr(current, "os_error", None), current.__cause__, current.__context__):
            if isinstance(nxt, BaseException):
                pending.append(nxt)
    return None


def _normalised(host: str) -> str:
    """The host as :func:`~rollout.net.urls.check_url` normalises it (IPv6 without brackets)."""
    literal = host.removeprefix("[").removesuffix("]")
    if _is_ip(literal):
        return ipaddress.ip_address(literal).compressed
    try:
        return normalise_host(host, host.rstrip("."))
    except UrlRefused as e:
        raise AddressRefused(host, "", e.reason) from None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _result(hostname: str, address: str, port: int) -> ResolveResult:
    version = ipaddress.ip_address(address).version
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    return ResolveResult(
        hostname=hostname, host=address, port=port, family=family, proto=0, flags=_NUMERIC_FLAGS
    )
