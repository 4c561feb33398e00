"""The URL allowlist: refused schemes, hosts outside the list, and forms that fool naive parsers."""

import pytest

from rollout.urls import UrlPolicy, UrlRefused, check_url, is_allowed

POLICY = UrlPolicy(
    ("127.0.0.1:8900", "localhost", "example.org", "*.wiki.test", "[::1]:8900", "bücher.de")
)


def refused(url: str, base: str | None = None) -> str:
    with pytest.raises(UrlRefused) as info:
        check_url(url, POLICY, base)
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
def test_allowed_urls_come_back_normalised(url, expected):
    assert check_url(url, POLICY) == expected


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
def test_tricky_but_allowed_forms(url, expected):
    assert check_url(url, POLICY) == expected


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
def test_every_other_scheme_is_refused(url, scheme):
    reason = refused(url)
    assert f"scheme {scheme!r} is not allowed" in reason
    assert "http://" in reason  # says what to use instead


@pytest.mark.parametrize(
    ("url", "shown"),
    [
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
    ],
)
def test_hosts_outside_the_list_are_refused_by_name(url, shown):
    reason = refused(url)
    assert f"the host {shown} is not allowed" in reason
    assert "localhost" in reason  # the allowed hosts are listed


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
def test_tricky_forms_are_refused_with_a_reason(url, words):
    assert words in refused(url)


def test_relative_urls_inherit_the_checks_of_the_resolved_url():
    assert "evil.com" in refused("/x", base="http://evil.com/")
    assert "cannot be resolved" in refused("/x", base="about:blank")
    assert "no scheme" in refused("//evil.com/x", base="http://localhost/")


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
