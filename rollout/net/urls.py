"""Which URLs an agent may open: http(s) on an allowlist of hosts, read the way a browser reads them.

A URL is checked by :func:`check_url`, which either returns the URL in a
normalised form (the form the browser should then be sent to) or raises
:class:`UrlRefused` with a reason the agent can act on. The rules, chosen so
that the host checked here is the host a browser would contact:

- Leading and trailing spaces and control characters are stripped and tabs and
  newlines inside removed, as browsers do (``java\\nscript:`` is ``javascript:``);
  any other control character is refused.
- The scheme is case-insensitive (``HTTP://`` is http) and must be in the
  policy's schemes; everything else (``javascript:``, ``file:``, ``data:``,
  ``chrome:``, ``about:``, ``blob:``, ``view-source:``, ``ftp:``, ...) is refused.
  The scheme must be followed by exactly ``//``.
- Backslashes are refused anywhere: browsers read ``\\`` as ``/`` in http URLs while
  other parsers do not, so ``http://allowed\\@evil`` means different hosts to each.
- Credentials (``user@``) are refused; the message names the host that follows
  the last ``@``, which is the host a browser would contact.
- The authority ends at the first ``/``, ``?`` or ``#``, so in ``http://evil#@allowed``
  the host is ``evil``.
- Host names are percent-decoded, lowercased, stripped of one trailing dot and
  IDNA-encoded (``bücher.de`` is ``xn--bcher-kva.de``); names holding an IDNA
  deviation character (ß, ς, ZWJ, ZWNJ), which browsers and IDNA 2003 encode
  differently, are refused. A host whose last label is numeric is read as an
  IPv4 address in the browser's forms (``127.1``, ``0x7f.0.0.1``); IPv6 addresses
  go in brackets and are compared in their compressed form.
- Scheme-relative URLs (``//host/path``) are refused: the agent writes the scheme.
  Relative URLs starting with ``/``, ``./``, ``../``, ``?`` or ``#`` are resolved
  against the current page passed as ``base`` and the result is checked;
  without a base they are refused. Any other scheme-less text (``example.com``)
  is refused as not a URL.

Allowlist entries are host names or addresses, optionally with a port:
``"localhost"`` allows any port, ``"127.0.0.1:8900"`` only port 8900 (a URL
without a port has its scheme's default, 80 or 443), ``"[::1]:8900"`` or ``"::1"``
for IPv6; ``"*.example.org"`` is a pattern for any subdomain of example.org (not
the apex), and ``"public"`` admits any host, name or address.

Whatever the entries, an address that is not public (see :func:`non_public_kind`:
loopback, private, link-local including the cloud metadata address, unspecified,
carrier-grade NAT, multicast, reserved, documentation and benchmarking ranges, and
the IPv6 forms that embed such an IPv4 address) is only reached when the host as
written in the URL matches an *exact* entry (a name or address listed as such, e.g.
``127.0.0.1:8900`` or ``localhost``); a pattern or ``public`` never admits one.
:func:`check_url` applies this to IP-literal hosts and to ``localhost`` names; a
host name's addresses are only known after resolution, where
:meth:`UrlPolicy.admits_address` applies it (see :mod:`rollout.net.resolver`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin

MAX_URL_CHARS = 4096
DEFAULT_PORTS = {"http": 80, "https": 443}

_EDGE_CHARS = "".join(chr(i) for i in range(0x21))  # C0 controls and space
_REMOVED_INSIDE = str.maketrans("", "", "\t\n\r")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,63}):")
_FORBIDDEN_HOST_CHARS = frozenset(" #%/:<>?@[\\]^|\"'`{}")
_IDNA_DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")
_RELATIVE_STARTS = ("/", "./", "../", "?", "#")
_DECIMAL = re.compile(r"[0-9]+")
_HEX = re.compile(r"0[xX][0-9A-Fa-f]*")
PUBLIC = "public"  # the allowlist entry admitting any host with a public address

# Addresses that are not public, by kind, first match wins. Python 3.11's ``is_global``
# misses several of these (multicast, fec0::/10, 3fff::/20), hence the explicit table;
# an address outside it must also be ``is_global``. IPv6 forms embedding an IPv4 address
# (mapped, compatible, 6to4, NAT64) are judged by the IPv4 address too.
_NON_PUBLIC_RANGES = {
    "a loopback address": ["127.0.0.0/8", "::1/128"],
    "an unspecified address": ["0.0.0.0/8", "::/128"],
    "a link-local address": ["169.254.0.0/16", "fe80::/10"],
    "a private address": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
                          "64:ff9b:1::/48"],  # the last: local-use NAT64 (RFC 8215)
    "a carrier-grade NAT address": ["100.64.0.0/10"],
    "a multicast address": ["224.0.0.0/4", "ff00::/8"],
    "a documentation or benchmarking address": ["192.0.2.0/24", "198.51.100.0/24",
                                                "203.0.113.0/24", "198.18.0.0/15",
                                                "2001:db8::/32", "2001:2::/48", "3fff::/20"],
    "a reserved address": ["240.0.0.0/4", "192.0.0.0/24", "fec0::/10", "100::/64", "2001::/23",
                           "5f00::/16"],
}  # fmt: skip
_NON_PUBLIC = tuple(
    (kind, tuple(ipaddress.ip_network(n) for n in nets))
    for kind, nets in _NON_PUBLIC_RANGES.items()
)
_METADATA = frozenset({"169.254.169.254", "fd00:ec2::254"})  # cloud instance metadata
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


class UrlRefused(ValueError):
    """A URL the agent may not open; ``reason`` says why, in words meant for the agent."""

    def __init__(self, url: str, reason: str):
        super().__init__(reason)
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class _HostRule:
    host: str  # normalised host; for a wildcard, the suffix without "*."; "" for public
    port: int | None  # None: any port
    kind: str  # "exact", "wildcard" or "public"

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.kind == "public":
            return True
        if self.kind == "wildcard":
            return host.endswith("." + self.host)
        return host == self.host


@dataclass(frozen=True)
class UrlPolicy:
    """Where an agent may go: the allowed schemes and hosts (see the module docstring)."""

    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    allowed_schemes: tuple[str, ...] = ("http", "https")
    _rules: tuple[_HostRule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for scheme in self.allowed_schemes:
            if scheme not in DEFAULT_PORTS:
                raise ValueError(f"allowed_schemes: {scheme!r} is not one of http, https")
        rules = tuple(_parse_rule(entry) for entry in self.allowed_hosts)
        object.__setattr__(self, "_rules", rules)

    def allows_host(self, host: str, port: int) -> bool:
        """Whether a normalised host and effective port are on the allowlist (by name only)."""
        return any(rule.matches(host, port) for rule in self._rules)

    def lists_exactly(self, host: str, port: int) -> bool:
        """Whether an exact entry (not a pattern, not ``public``) names this host and port."""
        return any(r.kind == "exact" and r.matches(host, port) for r in self._rules)

    def admits_address(self, host: str, port: int, address: str) -> str | None:
        """None if a connection to ``address`` for the URL host ``host`` is allowed, else why not.

        ``host`` is the normalised host of the URL (as :func:`normalise_host` gives it,
        IPv6 without brackets) and ``port`` its effective port; ``address`` is the
        address the connection would go to (a resolver's answer, or ``host`` itself).
        """
        where = host if ":" not in host else f"[{host}]"
        if not self.allows_host(host, port):
            return f"the host {where}:{port} is not allowed; allowed: {self.hosts_text()}"
        if self.lists_exactly(host, port):
            return None
        try:
            ip = ipaddress.ip_address(address.partition("%")[0])  # drop an IPv6 zone
        except ValueError:
            return f"{where} resolves to {address!r}, which is not an IP address"
        kind = non_public_kind(ip)
        if kind is None:
            return None
        if ip.compressed == host:
            return f"{ip.compressed} is {kind}, which is not allowed"
        return f"{where} resolves to {ip.compressed}, {kind}, which is not allowed"

    def hosts_text(self, limit: int = 10) -> str:
        shown = ", ".join(self.allowed_hosts[:limit])
        more = len(self.allowed_hosts) - limit
        return shown + (f" and {more} more" if more > 0 else "") if shown else "(none)"


def check_url(url: str, policy: UrlPolicy, base: str | None = None) -> str:
    """The normalised URL if ``policy`` allows it, else :class:`UrlRefused` (and nothing else).

    ``base`` is the page the agent is on, against which relative URLs resolve.
    """
    if not isinstance(url, str):
        raise UrlRefused(repr(url), "the URL must be a string")
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused(url[:80], f"the URL is longer than {MAX_URL_CHARS} characters")
    text = url.strip(_EDGE_CHARS).translate(_REMOVED_INSIDE)
    if not text:
        raise UrlRefused(url, "the URL is empty")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        raise UrlRefused(url, "the URL contains a control character")
    if "\\" in text:
        raise UrlRefused(url, "the URL contains a backslash; write / instead")
    match = _SCHEME.match(text)
    if match is None:
        return _resolve_relative(url, text, policy, base)
    scheme = match.group(1).lower()
    if scheme not in policy.allowed_schemes:
        allowed = " or ".join(f"{s}://" for s in policy.allowed_schemes)
        raise UrlRefused(url, f"the scheme {scheme!r} is not allowed; use {allowed}")
    rest = text[match.end() :]
    if not rest.startswith("//") or rest.startswith("///"):
        raise UrlRefused(url, f"expected {scheme}://host/path after the scheme")
    authority, tail = _split_authority(rest[2:])
    host, display, port = _parse_authority(url, authority, scheme)
    effective = port if port is not None else DEFAULT_PORTS[scheme]
    if not policy.allows_host(host, effective):
        where = display if port is None else f"{display}:{port}"
        raise UrlRefused(url, f"the host {where} is not allowed; allowed: {policy.hosts_text()}")
    _check_known_address(url, policy, host, effective)
    port_text = "" if port is None or port == DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{display}{port_text}{tail if tail.startswith('/') else '/' + tail}"


def is_allowed(url: str, policy: UrlPolicy, base: str | None = None) -> bool:
    """Whether :func:`check_url` accepts ``url``."""
    try:
        check_url(url, policy, base)
    except UrlRefused:
        return False
    return True


def non_public_kind(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What kind of non-public address this is ("a loopback address", ...), or None if public.

    Public means globally reachable: outside every range in ``_NON_PUBLIC`` and
    ``is_global``; an IPv6 address embedding an IPv4 one (``::ffff:10.0.0.1``,
    ``::a00:1``, ``64:ff9b::a00:1``, ``2002:a00:1::``) must pass for both.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    for kind, networks in _NON_PUBLIC:
        if any(ip in net for net in networks if net.version == ip.version):
            if ip.compressed in _METADATA:
                return f"{kind} (the cloud metadata address)"
            return kind
    embedded = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if embedded is not None:
        kind = non_public_kind(embedded)
        if kind is not None:
            return f"{kind} in IPv6 form"
    elif not ip.is_global:
        return "not a public address"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, -compatible, 6to4 or NAT64 IPv6 address."""
    if ip in _SIX_TO_FOUR:
        return ip.sixtofour
    if ip in _MAPPED or ip in _COMPATIBLE or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _check_known_address(url: str, policy: UrlPolicy, host: str, port: int) -> None:
    """Refuse an IP-literal host, or a ``localhost`` name, that is not public nor listed exactly."""
    if policy.lists_exactly(host, port):
        return
    if host == "localhost" or host.endswith(".localhost"):  # loopback by definition (RFC 6761)
        raise UrlRefused(url, f"{host} is a loopback name, which is not allowed")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return  # a name: judged by its addresses once resolved
    reason = policy.admits_address(host, port, host)
    if reason is not None:
        raise UrlRefused(url, reason)


def _resolve_relative(url: str, text: str, policy: UrlPolicy, base: str | None) -> str:
    if text.startswith("//"):
        raise UrlRefused(url, "a URL starting with // has no scheme; write http:// or https://")
    if not text.startswith(_RELATIVE_STARTS):
        raise UrlRefused(
            url,
            "this is not a URL; write a full http:// or https:// URL, or a path starting with /",
        )
    if base is None or _SCHEME.match(base.strip(_EDGE_CHARS)) is None:
        raise UrlRefused(
            url, "a relative URL needs a current page to resolve against; write the full URL"
        )
    try:
        resolved = urljoin(base.strip(_EDGE_CHARS), text)
    except ValueError as e:
        raise UrlRefused(url, f"the URL cannot be resolved against the current page: {e}") from None
    if _SCHEME.match(resolved) is None:
        raise UrlRefused(url, "the URL cannot be resolved against the current page")
    return check_url(resolved, policy, base=None)


def _split_authority(rest: str) -> tuple[str, str]:
    """(authority, path-query-fragment): the authority ends at the first / ? or #."""
    for i, c in enumerate(rest):
        if c in "/?#":
            return rest[:i], rest[i:]
    return rest, ""


def _parse_authority(url: str, authority: str, scheme: str) -> tuple[str, str, int | None]:
    """(normalised host, host as written in a URL, explicit port or None)."""
    if "@" in authority:
        real = authority.rpartition("@")[2] or "(empty)"
        raise UrlRefused(
            url, f"credentials before '@' are not allowed (the host here would be {real!r})"
        )
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise UrlRefused(url, "the IPv6 address has no closing ]")
        host = _ipv6(url, authority[1:end])
        after = authority[end + 1 :]
        if after and not after.startswith(":"):
            raise UrlRefused(url, "unexpected text after the IPv6 address")
        return host, f"[{host}]", _port(url, after[1:] if after else None)
    if authority.count(":") > 1:
        raise UrlRefused(url, "an IPv6 address must be written in brackets, e.g. http://[::1]/")
    name, colon, port_text = authority.partition(":")
    host = normalise_host(url, name)
    return host, host, _port(url, port_text if colon else None)


def _ipv6(url: str, literal: str) -> str:
    if "%" in literal:
        raise UrlRefused(url, "IPv6 zone identifiers are not allowed")
    try:
        return ipaddress.IPv6Address(literal).compressed
    except ValueError:
        raise UrlRefused(url, f"{literal!r} is not a valid IPv6 address") from None


def _port(url: str, text: str | None) -> int | None:
    if not text:  # no port, or "host:" with an empty port: the scheme's default
        return None
    if not _DECIMAL.fullmatch(text) or len(text) > 5 or int(text) > 65535:
        raise UrlRefused(url, f"{text!r} is not a valid port")
    return int(text)


def normalise_host(url: str, name: str) -> str:
    """Percent-decoded, lowercase, IDNA-encoded host without a trailing dot; IPv4 canonical."""
    if "%" in name:
        name = unquote(name)
        if "\ufffd" in name:
            raise UrlRefused(url, "the host's percent-encoding is not valid UTF-8")
    if not name:
        raise UrlRefused(url, "the URL has no host")
    bad = sorted({c for c in name if c in _FORBIDDEN_HOST_CHARS or ord(c) < 0x20 or c.isspace()})
    if bad:
        raise UrlRefused(
            url, f"the host contains a character not allowed in host names: {bad[0]!r}"
        )
    if any(c in _IDNA_DEVIATIONS for c in name):
        raise UrlRefused(url, "the host contains a character browsers encode ambiguously")
    name = name.removesuffix(".")
    labels = name.split(".")
    if not name or any(not label for label in labels):
        raise UrlRefused(url, "the host has an empty label")
    if _DECIMAL.fullmatch(labels[-1]) or _HEX.fullmatch(labels[-1]):
        return _ipv4(url, labels)
    try:
        encoded = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise UrlRefused(url, f"{name[:80]!r} is not a valid host name") from None
    if any(c in _FORBIDDEN_HOST_CHARS for c in encoded):
        raise UrlRefused(url, "the host contains a character not allowed in host names")
    return encoded


def _ipv4(url: str, labels: list[str]) -> str:
    """A browser's IPv4 reading: 1-4 parts, each decimal, 0x-hex or 0-octal; the last fills."""
    if len(labels) > 4:
        raise UrlRefused(url, "the host is not a valid IPv4 address (more than four parts)")
    numbers = [_ipv4_part(url, label) for label in labels]
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise UrlRefused(url, "the host is not a valid IPv4 address (a part is out of range)")
    value = numbers[-1] + sum(n << (8 * (3 - i)) for i, n in enumerate(numbers[:-1]))
    return str(ipaddress.IPv4Address(value))


def _ipv4_part(url: str, label: str) -> int:
    try:
        if len(label) > 32:
            raise ValueError
        if label[:2] in ("0x", "0X"):
            return int(label[2:] or "0", 16)
        if len(label) > 1 and label.startswith("0"):
            return int(label[1:], 8)
        return int(label, 10)
    except ValueError:
        raise UrlRefused(url, f"the host is not a valid IPv4 address ({label!r})") from None


def _parse_rule(entry: str) -> _HostRule:
    """An entry: ``host``, ``host:port``, ``[v6]:port``, ``v6``, ``*.domain[:port]``, ``public``."""
    if not isinstance(entry, str) or not entry.strip():
        raise ValueError(f"allowed_hosts: {entry!r} is not a host name")
    text = entry.strip().lower()
    if text == PUBLIC:
        return _HostRule("", None, "public")
    wildcard = text.startswith("*.")
    if wildcard:
        text = text[2:]
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"
    try:
        host, _, port = _parse_authority(entry, text, "http")
    except UrlRefused as e:
        raise ValueError(f"allowed_hosts: {entry!r}: {e.reason}") from None
    return _HostRule(host, port, "wildcard" if wildcard else "exact")
