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
for IPv6, and ``"*.example.org"`` any subdomain of example.org (not the apex).
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


class UrlRefused(ValueError):
    """A URL the agent may not open; ``reason`` says why, in words meant for the agent."""

    def __init__(self, url: str, reason: str):
        super().__init__(reason)
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class _HostRule:
    host: str  # normalised host; for a wildcard, the suffix without "*."
    port: int | None  # None: any port
    wildcard: bool

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
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
        """Whether a normalised host and effective port are on the allowlist."""
        return any(rule.matches(host, port) for rule in self._rules)

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
    port_text = "" if port is None or port == DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{display}{port_text}{tail if tail.startswith('/') else '/' + tail}"


def is_allowed(url: str, policy: UrlPolicy, base: str | None = None) -> bool:
    """Whether :func:`check_url` accepts ``url``."""
    try:
        check_url(url, policy, base)
    except UrlRefused:
        return False
    return True


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
    """An allowlist entry: ``host``, ``host:port``, ``[v6]:port``, ``v6``, ``*.domain[:port]``."""
    if not isinstance(entry, str) or not entry.strip():
        raise ValueError(f"allowed_hosts: {entry!r} is not a host name")
    text = entry.strip().lower()
    wildcard = text.startswith("*.")
    if wildcard:
        text = text[2:]
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"
    try:
        host, _, port = _parse_authority(entry, text, "http")
    except UrlRefused as e:
        raise ValueError(f"allowed_hosts: {entry!r}: {e.reason}") from None
    return _HostRule(host, port, wildcard)
