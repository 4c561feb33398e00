"""The URL allowlist: refused schemes, hosts outside the list, and forms that fool naive parsers."""

import pytest

from rollout.net.urls import UrlPolicy, UrlRefused, check_url, is_allowed, non_public_kind

ENTRIES = ("127.0.0.1:8900", "localhost", "example.org", "*.wiki.test", "[::1]:8900", "bücher.de")
POLICY = UrlPolicy(ENTRIES)
PATTERNS = UrlPolicy((*ENTRIES, "*.example.org"))  # one more pattern
OPEN = UrlPolicy((*ENTRIES, "*.example.org", "public"))  # any public host

# The bypass forms must be refused whatever else the list allows.
every_policy = pytest.mark.parametrize(
    "policy", [POLICY, PATTERNS, OPEN], ids=["list", "pattern", "public"]
)
listed_policies = pytest.mark.parametrize("policy", [POLICY, PATTERNS], ids=["list", "pattern"])


def refused(url: str, base: str | None = None, policy: UrlPolicy = POLICY) -> str:
    with pytest.raises(UrlRefused) as info:
        check_url(url, policy, base)
    return info.value.reason


# ----------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8900/wiki/X", "http://127.0.0.1:8900/wiki/X"),
        ("https://localhost/a?b=1#c", "https://localhost/a?b=1#c"),
        ("http://localhost:1234/", "http://localhost:1234/"),  # a bare host allows any port
        ("http://127.0.0.1:8900", "http://127.0.0.1:8900/"),  # an empty path becomes /
        ("http://localhost?q", "http://localhost/?q"),
        ("http://localhost:/x", "http://localhost/x"),  # an empty port is the default
        ("https://example.org:443/x", "https://example.org/x"),  # default port dropped
        ("http://en.wiki.test/x", "http://en.wiki.test/x"),  # wildcard: any subdomain
        ("http://a.b.wiki.test/", "http://a.b.wiki.test/"),
    ],
)
@every_policy
def test_allowed_urls_come_back_normalised(url, expected, policy):
    assert check_url(url, policy) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTP://127.0.0.1:8900/x", "http://127.0.0.1:8900/x"),  # uppercase scheme is http
        ("HtTpS://LOCALHOST/x", "https://localhost/x"),
        ("  http://localhost/a \n", "http://localhost/a"),  # whitespace at the ends
        ("\x00\x1fhttp://localhost/a\x1f", "http://localhost/a"),  # C0 controls at the ends
        ("http://local\thost/a\nb", "http://localhost/ab"),  # tabs and newlines inside dropped
        ("http://LOCALHOST./a", "http://localhost/a"),  # trailing dot: localhost. == localhost
        ("http://LOCALHOST%2E/", "http://localhost/"),
        ("http://%6c%6fcalhost/", "http://localhost/"),  # percent-encoded host decoded
        ("http://ｌｏｃａｌｈｏｓｔ/", "http://localhost/"),  # fullwidth letters map to ASCII
        ("http://127.1:8900/", "http://127.0.0.1:8900/"),  # browser IPv4 forms
        ("http://0x7f.0.0.1:8900/", "http://127.0.0.1:8900/"),
        ("http://0x7f.1:8900/", "http://127.0.0.1:8900/"),
        ("http://2130706433:8900/", "http://127.0.0.1:8900/"),  # 127*2**24 + 1
        ("http://017700000001:8900/", "http://127.0.0.1:8900/"),  # octal
        ("http://[::1]:8900/", "http://[::1]:8900/"),
        ("http://[0:0:0:0:0:0:0:1]:8900/", "http://[::1]:8900/"),  # IPv6 compressed
        ("http://Bücher.de/", "http://xn--bcher-kva.de/"),  # IDN: compared IDNA-encoded
        ("http://XN--BCHER-KVA.DE/", "http://xn--bcher-kva.de/"),  # punycode, any case
    ],
)
@every_policy
def test_tricky_but_allowed_forms(url, expected, policy):
    assert check_url(url, policy) == expected


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        ("/wiki/Y", "http://127.0.0.1:8900/wiki/X", "http://127.0.0.1:8900/wiki/Y"),
        ("../b", "http://localhost/a/c/d", "http://localhost/a/b"),
        ("./y", "http://localhost/a/b", "http://localhost/a/y"),
        ("?q=1", "http://localhost/a", "http://localhost/a?q=1"),
        ("#x", "http://localhost/a", "http://localhost/a#x"),
    ],
)
def test_relative_urls_resolve_against_the_current_page(url, base, expected):
    assert check_url(url, POLICY, base) == expected


# ----------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("javascript:alert(1)", "javascript"),
        ("JAVASCRIPT:alert(1)", "javascript"),
        ("JaVaScRiPt:alert(1)", "javascript"),
        (" javascript:alert(1)", "javascript"),
        ("java\nscript:alert(1)", "javascript"),  # browsers drop the newline too
        ("java\tscript:alert(1)", "javascript"),
        ("\x01javascript:alert(1)", "javascript"),
        ("file:///etc/passwd", "file"),
        ("FILE://localhost/etc/passwd", "file"),
        ("data:text/html,<script>alert(1)</script>", "data"),
        ("chrome://settings", "chrome"),
        ("chrome-extension://abc/page.html", "chrome-extension"),
        ("about:blank", "about"),
        ("blob:http://localhost/0f3e", "blob"),
        ("view-source:http://localhost/", "view-source"),
        ("ftp://localhost/file", "ftp"),
        ("ws://localhost/socket", "ws"),
        ("wss://localhost/socket", "wss"),
        ("mailto:someone@localhost", "mailto"),
        ("vbscript:msgbox(1)", "vbscript"),
        ("intent://scan/#Intent;end", "intent"),
        ("localhost:8900/x", "localhost"),  # reads as scheme "localhost"
    ],
)
@every_policy
def test_every_other_scheme_is_refused(url, scheme, policy):
    reason = refused(url, policy=policy)
    assert f"scheme {scheme!r} is not allowed" in reason
    assert "http://" in reason  # says what to use instead


HOSTS_OUTSIDE = [
    ("http://evil.com/", "evil.com"),
    ("http://127.0.0.1:9999/", "127.0.0.1:9999"),  # the entry pins port 8900
    ("http://127.0.0.1/", "127.0.0.1"),  # default port 80 is not 8900
    ("http://127.0.0.2:8900/", "127.0.0.2:8900"),
    ("http://[::1]:9999/", "[::1]:9999"),
    ("http://wiki.test/", "wiki.test"),  # a wildcard does not cover the apex
    ("http://evilwiki.test/", "evilwiki.test"),
    ("http://localhost.evil.com/", "localhost.evil.com"),
    ("http://example.org.evil.com/", "example.org.evil.com"),
    ("http://evil.com#@localhost", "evil.com"),  # the authority ends at #
    ("http://evil.com?@localhost/", "evil.com"),  # ... and at ?
    ("http://evil.com/@localhost", "evil.com"),
    ("http://%65vil.com/", "evil.com"),  # percent-decoded before the check
    ("http://ıocalhost/", "xn--ocalhost-skb"),  # dotless i is not l: IDNA-encoded
    ("http://xn--strae-oqa.de/", "xn--strae-oqa.de"),
]


@pytest.mark.parametrize(("url", "shown"), HOSTS_OUTSIDE)
@listed_policies
def test_hosts_outside_the_list_are_refused_by_name(url, shown, policy):
    reason = refused(url, policy=policy)
    assert f"the host {shown} is not allowed" in reason
    assert "localhost" in reason  # the allowed hosts are listed


@pytest.mark.parametrize(("url", "shown"), HOSTS_OUTSIDE)
def test_with_public_the_host_contacted_is_the_host_checked(url, shown):
    """``public`` admits these names, but only as the host shown; loopback ones stay refused."""
    try:
        normalised = check_url(url, OPEN)
    except UrlRefused as e:
        assert "loopback address, which is not allowed" in e.reason
        return
    assert normalised.split("/")[2] == shown


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://localhost@evil.com/", "would be 'evil.com'"),  # userinfo: the host is evil
        ("http://127.0.0.1:8900@evil.com/", "would be 'evil.com'"),
        ("http://evil.com%2F@localhost/", "credentials"),
        ("http://localhost\\@evil.com", "backslash"),  # browsers read \ as /
        ("http://localhost\\evil.com/", "backslash"),
        ("//localhost/x", "no scheme"),  # scheme-relative forms are refused
        ("//evil.com/x", "no scheme"),
        ("localhost/x", "not a URL"),
        ("example.org", "not a URL"),
        ("/x", "needs a current page"),  # relative without a base
        ("http:/localhost/", "expected http://host"),
        ("http:localhost/", "expected http://host"),
        ("http:///localhost/", "expected http://host"),
        ("http://[::1/", "no closing ]"),
        ("http://[fe80::1%25eth0]:8900/", "zone"),
        ("http://[::g]:8900/", "not a valid IPv6"),
        ("http://::1/", "in brackets"),
        ("http://local host/", "not allowed in host names"),
        ("http://local%20host/", "not allowed in host names"),
        ("http://loc%00alhost/", "not allowed in host names"),
        ("http://%zz/", "not allowed in host names"),
        ("http://%ff/", "not valid UTF-8"),
        ("http://localhost:99999/", "not a valid port"),
        ("http://localhost:-1/", "not a valid port"),
        ("http://localhost:80a/", "not a valid port"),
        ("http://1.2.3.4.5/", "more than four parts"),
        ("http://256.0.0.1/", "out of range"),
        ("http://0x100000000/", "out of range"),
        ("http://08.0.0.1/", "not a valid IPv4"),  # 08 is not octal
        ("http://a..b/", "empty label"),
        ("http://straße.de/", "ambiguously"),  # IDNA deviation character
        ("http://127.0.0.1:8900\x01/", "control character"),
        ("http://", "no host"),
        ("", "empty"),
        ("   ", "empty"),
        ("http://localhost/" + "a" * 5000, "longer than"),
    ],
)
@every_policy
def test_tricky_forms_are_refused_with_a_reason(url, words, policy):
    assert words in refused(url, policy=policy)


@listed_policies
def test_relative_urls_inherit_the_checks_of_the_resolved_url(policy):
    assert "evil.com" in refused("/x", base="http://evil.com/", policy=policy)
    assert "cannot be resolved" in refused("/x", base="about:blank", policy=policy)
    assert "no scheme" in refused("//evil.com/x", base="http://localhost/", policy=policy)
    assert "loopback" in refused("/x", base="http://127.0.0.2/", policy=OPEN)


def test_is_allowed_mirrors_check_url():
    assert is_allowed("http://localhost/", POLICY)
    assert not is_allowed("javascript:alert(1)", POLICY)
    assert not is_allowed(None, POLICY)  # type: ignore[arg-type]  # not a string


# ----------------------------------------------------------------------------- the policy


def test_default_policy_is_the_local_web():
    policy = UrlPolicy()
    assert check_url("http://127.0.0.1:8900/", policy) == "http://127.0.0.1:8900/"
    assert check_url("http://localhost:5/", policy) == "http://localhost:5/"
    assert not is_allowed("https://example.org/", policy)


def test_https_only_policy_refuses_http():
    policy = UrlPolicy(("localhost",), allowed_schemes=("https",))
    with pytest.raises(UrlRefused, match="scheme 'http' is not allowed; use https://"):
        check_url("http://localhost/", policy)
    assert check_url("https://localhost/", policy) == "https://localhost/"


@pytest.mark.parametrize("entry", ["http://x", "", "a b", "*.", "[::1", "host:port"])
def test_bad_allowlist_entries_fail_at_construction(entry):
    with pytest.raises(ValueError, match="allowed_hosts"):
        UrlPolicy((entry,))


def test_bad_schemes_fail_at_construction():
    with pytest.raises(ValueError, match="allowed_schemes"):
        UrlPolicy(allowed_schemes=("ftp",))


def test_allowlist_entries_are_normalised_like_urls():
    policy = UrlPolicy(("LOCALHOST.", "::1", "Bücher.DE:8080"))
    assert is_allowed("http://localhost/", policy)
    assert is_allowed("http://[::1]:7/", policy)  # a bare IPv6 entry allows any port
    assert is_allowed("http://xn--bcher-kva.de:8080/", policy)
    assert not is_allowed("http://xn--bcher-kva.de/", policy)  # port 80 is not 8080


# ----------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("172.31.255.255", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fc00::1", "a private address"),
        ("fd12::1", "a private address"),
        ("64:ff9b:1::1", "a private address"),  # local-use NAT64
        ("169.254.1.1", "a link-local address"),
        ("169.254.169.254", "a link-local address (the cloud metadata address)"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "an unspecified address"),
        ("0.1.2.3", "an unspecified address"),  # 0/8, "this network"
        ("::", "an unspecified address"),
        ("100.64.0.1", "a carrier-grade NAT address"),
        ("224.0.0.1", "a multicast address"),  # 3.11's is_global calls this global
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("fec0::1", "a reserved address"),  # 3.11's is_global calls this global
        ("192.0.2.1", "a documentation or benchmarking address"),
        ("198.18.0.1", "a documentation or benchmarking address"),
        ("2001:db8::1", "a documentation or benchmarking address"),
        ("3fff::1", "a documentation or benchmarking address"),  # 3.11's is_global misses it
        ("::ffff:127.0.0.1", "a loopback address in IPv6 form"),  # IPv4-mapped
        ("::ffff:10.0.0.1", "a private address in IPv6 form"),
        ("::a00:1", "a private address in IPv6 form"),  # IPv4-compatible (deprecated)
        ("64:ff9b::a00:1", "a private address in IPv6 form"),  # NAT64
        ("64:ff9b::a9fe:a9fe", "a link-local address (the cloud metadata address) in IPv6 form"),
        ("2002:a00:1::", "a private address in IPv6 form"),  # 6to4 of 10.0.0.1
        ("2002:7f00:1::", "a loopback address in IPv6 form"),
    ],
)
def test_non_public_addresses_are_named_by_kind(address, kind):
    assert non_public_kind(address) == kind


@pytest.mark.parametrize(
    "address",
    ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808",
     "2002:808:808::"],
)  # fmt: skip
def test_public_addresses_have_no_kind(address):
    assert non_public_kind(address) is None


def test_admits_address_lets_exact_entries_reach_any_address():
    policy = UrlPolicy(("127.0.0.1:8900", "intranet.test", "*.example.org", "public"))
    assert policy.admits_address("127.0.0.1", 8900, "127.0.0.1") is None
    assert policy.admits_address("intranet.test", 80, "10.0.0.7") is None  # listed by name
    assert policy.admits_address("a.example.org", 80, "93.184.215.14") is None
    assert policy.admits_address("evil.test", 443, "8.8.8.8") is None  # public
    assert policy.admits_address("127.0.0.1", 9999, "127.0.0.1") == (
        "127.0.0.1 is a loopback address, which is not allowed"  # another port: not exact
    )
    assert policy.admits_address("a.example.org", 80, "10.0.0.7") == (
        "a.example.org resolves to 10.0.0.7, a private address, which is not allowed"
    )
    assert "fe80::1, a link-local" in policy.admits_address("x.test", 80, "fe80::1%eth0")
    assert "not an IP address" in policy.admits_address("x.test", 80, "bogus")


def test_admits_address_refuses_hosts_off_the_list():
    reason = UrlPolicy(("*.example.org",)).admits_address("evil.test", 80, "93.184.215.14")
    assert reason is not None and "the host evil.test:80 is not allowed" in reason


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/", "127.0.0.1 is a loopback address, which is not allowed"),
        ("http://127.0.0.1:9999/", "127.0.0.1 is a loopback address"),  # the entry pins 8900
        ("http://127.1/", "127.0.0.1 is a loopback address"),  # browser forms normalised first
        ("http://0x7f000001/", "127.0.0.1 is a loopback address"),
        ("http://0/", "0.0.0.0 is an unspecified address"),
        ("http://[::ffff:7f00:1]/", "::ffff:7f00:1 is a loopback address in IPv6 form"),
        ("http://169.254.169.254/latest/", "the cloud metadata address"),
        ("http://a.localhost/", "a.localhost is a loopback name"),
        ("http://localhost.:8900/", None),  # listed exactly: allowed
        ("http://127.0.0.1:8900/", None),
        ("http://[::1]:8900/", None),
        ("http://8.8.8.8/", None),  # public
    ],
)
def test_public_never_admits_a_non_public_literal(url, reason):
    if reason is None:
        assert is_allowed(url, OPEN)
    else:
        assert reason in refused(url, policy=OPEN)


def test_default_policy_keeps_loopback():
    assert UrlPolicy().admits_address("127.0.0.1", 8900, "127.0.0.1") is None
    assert UrlPolicy().admits_address("localhost", 80, "::1") is None
