"""The address rule at connection time: a real aiohttp client, a static DNS, a real local server.

No test opens a socket to anything but 127.0.0.1: names mapped to other addresses
are refused before any connection, and public answers are checked on the resolver.
"""

import socket

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from rollout.net.resolver import AddressRefused, SafeResolver, StaticResolver, describe_refusal
from rollout.net.urls import UrlPolicy, UrlRefused, check_url

PUBLIC_ADDRESS = "93.184.215.14"

# (address, words in the reason) for every kind of address a pattern or `public` must not reach
NON_PUBLIC = [
    ("127.0.0.1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("172.16.0.1", "a private address"),
    ("172.31.255.255", "a private address"),
    ("192.168.1.1", "a private address"),
    ("169.254.169.254", "the cloud metadata address"),
    ("100.64.0.1", "a carrier-grade NAT address"),
    ("0.0.0.0", "an unspecified address"),
    ("::1", "a loopback address"),
    ("fc00::1", "a private address"),
    ("fd12::1", "a private address"),
    ("fe80::1", "a link-local address"),
    ("::ffff:127.0.0.1", "a loopback address in IPv6 form"),
    ("::ffff:10.0.0.1", "a private address in IPv6 form"),
    ("64:ff9b::a9fe:a9fe", "the cloud metadata address) in IPv6 form"),
    ("224.0.0.1", "a multicast address"),
]


@pytest_asyncio.fixture(scope="module")
async def server():
    """A local server recording the Host header of every request; (port, hosts seen)."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.host)
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner.addresses[0][1], seen
    await runner.cleanup()


async def fetch(url: str, policy: UrlPolicy, inner: StaticResolver, **connector) -> str:
    """GET ``url`` the way the harness does: check_url first, then a SafeResolver connector."""
    url = check_url(url, policy)
    resolver = SafeResolver(policy, inner)
    conn = aiohttp.TCPConnector(resolver=resolver, **connector)
    try:
        async with aiohttp.ClientSession(connector=conn) as session, session.get(url) as resp:
            return await resp.text()
    finally:
        await resolver.close()


async def refusal(url: str, policy: UrlPolicy, inner: StaticResolver, **connector) -> str:
    """The reason a fetch of ``url`` is refused at resolution, checked to be an AddressRefused."""
    with pytest.raises(aiohttp.ClientConnectorDNSError) as info:
        await fetch(url, policy, inner, **connector)
    assert isinstance(info.value.os_error, AddressRefused)
    reason = describe_refusal(info.value)
    assert reason is not None
    return reason


# ----------------------------------------------------------------------------- through aiohttp


async def test_a_name_listed_exactly_reaches_loopback(server):
    port, seen = server
    inner = StaticResolver({"local.test": ["127.0.0.1"]})
    policy = UrlPolicy(("local.test", "*.example.test", "public"))
    assert await fetch(f"http://local.test:{port}/x", policy, inner) == "hello"
    assert seen[-1] == f"local.test:{port}"
    assert inner.lookups == ["local.test"]  # one lookup, made through the SafeResolver


@pytest.mark.parametrize("name", ["api.example.test", "anything.test"], ids=["pattern", "public"])
@pytest.mark.parametrize(("address", "words"), NON_PUBLIC, ids=[a for a, _ in NON_PUBLIC])
async def test_a_pattern_or_public_never_reaches_a_non_public_address(server, name, address, words):
    port, seen = server
    before = len(seen)
    policy = UrlPolicy(("*.example.test", "public", "127.0.0.1", "localhost"))
    reason = await refusal(f"http://{name}:{port}/", policy, StaticResolver({name: [address]}))
    assert reason.startswith(f"{name} resolves to ")
    assert words in reason and reason.endswith("which is not allowed")
    assert len(seen) == before  # nothing reached the server


async def test_one_private_address_in_the_answer_refuses_the_name(server):
    port, seen = server
    before = len(seen)
    inner = StaticResolver({"mixed.example.test": [PUBLIC_ADDRESS, "127.0.0.1"]})
    policy = UrlPolicy(("*.example.test",))
    reason = await refusal(f"http://mixed.example.test:{port}/", policy, inner)
    assert "resolves to 127.0.0.1, a loopback address" in reason
    assert len(seen) == before


async def test_the_checked_answer_is_the_one_connected_to(server):
    """A rebinding DNS answers a public address to a pre-check, then loopback to the connector.

    A check that resolved on its own would pass; the SafeResolver checks the very
    answer the connector uses, so the second one is refused.
    """
    port, seen = server
    before = len(seen)
    answers = iter([[PUBLIC_ADDRESS], ["127.0.0.1"]])

    class Rebinding(StaticResolver):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            self.addresses = {"rebind.example.test": tuple(next(answers))}
            return await super().resolve(host, port, family)

    inner = Rebinding({})
    policy = UrlPolicy(("*.example.test",))
    precheck = await SafeResolver(policy, inner).resolve("rebind.example.test", port, 0)
    assert [r["host"] for r in precheck] == [PUBLIC_ADDRESS]
    reason = await refusal(f"http://rebind.example.test:{port}/", policy, inner)
    assert "127.0.0.1, a loopback address" in reason
    assert len(seen) == before
    assert inner.lookups == ["rebind.example.test"] * 2


async def test_ip_literals_skip_the_resolver_so_check_url_judges_them(server):
    port, _ = server
    inner = StaticResolver({})
    assert await fetch(f"http://127.0.0.1:{port}/", UrlPolicy(("127.0.0.1",)), inner) == "hello"
    assert inner.lookups == []  # aiohttp connected without asking the resolver
    with pytest.raises(UrlRefused, match="loopback address"):
        await fetch(f"http://127.0.0.1:{port}/", UrlPolicy(("public",)), inner)


async def test_other_connection_errors_have_no_refusal(server):
    port, _ = server
    policy = UrlPolicy(("*.example.test",))
    with pytest.raises(aiohttp.ClientConnectorDNSError) as info:
        await fetch(f"http://unknown.example.test:{port}/", policy, StaticResolver({}))
    assert describe_refusal(info.value) is None  # a failed lookup, not a refusal
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free_port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(aiohttp.ClientConnectorError) as info:
        await fetch(f"http://127.0.0.1:{free_port}/", UrlPolicy(), StaticResolver({}))
    assert describe_refusal(info.value) is None


# ----------------------------------------------------------------------------- the resolver


async def test_a_public_answer_is_admitted():
    inner = StaticResolver({"www.example.test": [PUBLIC_ADDRESS, "2606:4700::1111"]})
    resolver = SafeResolver(UrlPolicy(("*.example.test",)), inner)
    both = await resolver.resolve("WWW.Example.Test.", 443, socket.AF_UNSPEC)
    assert [(r["host"], r["family"], r["port"]) for r in both] == [
        (PUBLIC_ADDRESS, socket.AF_INET, 443),
        ("2606:4700::1111", socket.AF_INET6, 443),
    ]
    v4 = await resolver.resolve("www.example.test", 443, socket.AF_INET)
    assert [r["host"] for r in v4] == [PUBLIC_ADDRESS]


async def test_the_policy_port_and_host_apply_at_resolution():
    inner = StaticResolver({"local.test": ["127.0.0.1"], "evil.test": [PUBLIC_ADDRESS]})
    resolver = SafeResolver(UrlPolicy(("local.test:8900", "*.example.test")), inner)
    assert await resolver.resolve("local.test", 8900)
    with pytest.raises(AddressRefused) as info:
        await resolver.resolve("local.test", 9999)  # not the listed port
    assert info.value.host == "local.test" and info.value.address == ""
    assert "not allowed" in info.value.reason
    with pytest.raises(AddressRefused, match=r"evil\.test:80 is not allowed"):
        await resolver.resolve("evil.test", 80)


async def test_refusal_carries_host_address_and_reason():
    resolver = SafeResolver(UrlPolicy(("public",)), StaticResolver({"a.test": ["10.0.0.1"]}))
    with pytest.raises(AddressRefused) as info:
        await resolver.resolve("a.test", 80)
    err = info.value
    assert (err.host, err.address) == ("a.test", "10.0.0.1")
    assert err.reason == "a.test resolves to 10.0.0.1, a private address, which is not allowed"
    assert str(err) == f"[Errno {err.errno}] {err.reason}"


async def test_the_default_inner_resolver_is_the_system_one():
    resolver = SafeResolver(UrlPolicy(("public",)))
    with pytest.raises(AddressRefused, match=r"localhost resolves to .* loopback"):
        await resolver.resolve("localhost", 80, socket.AF_INET)
    await resolver.close()
    resolver = SafeResolver(UrlPolicy(("localhost",)))
    assert [r["host"] for r in await resolver.resolve("localhost", 80, socket.AF_INET)] == [
        "127.0.0.1"
    ]
    await resolver.close()


async def test_static_resolver_fails_like_a_lookup():
    inner = StaticResolver({"v6.test": ["::1"]})
    with pytest.raises(socket.gaierror):
        await inner.resolve("unknown.test")
    with pytest.raises(socket.gaierror):
        await inner.resolve("v6.test", 80, socket.AF_INET)  # no IPv4 address
    assert [r["host"] for r in await inner.resolve("V6.TEST.", 80, socket.AF_INET6)] == ["::1"]


# ----------------------------------------------------------------------------- IP literals


def literal_url(address: str) -> str:
    return f"http://[{address}]/" if ":" in address else f"http://{address}/"


@pytest.mark.parametrize(("address", "words"), NON_PUBLIC, ids=[a for a, _ in NON_PUBLIC])
def test_check_url_refuses_non_public_literals_under_public(address, words):
    with pytest.raises(UrlRefused) as info:
        check_url(literal_url(address), UrlPolicy(("*.example.test", "public")))
    assert words in info.value.reason and info.value.reason.endswith("which is not allowed")


@pytest.mark.parametrize(("address", "words"), NON_PUBLIC, ids=[a for a, _ in NON_PUBLIC])
def test_check_url_allows_non_public_literals_listed_exactly(address, words):
    assert check_url(literal_url(address), UrlPolicy((address, "public")))
