"""SIP addresses (RFC 3261 section 19 and 25): the URI (``sip:user@host:port;params``) and the name-addr around it in
From, To, Contact, Route and Record-Route (``"Alice" <sip:alice@example.com>;tag=1928``).

Parsing never raises anything but :class:`AddressError` (a ``ValueError``), and what it keeps is bounded by what it
was given: the message it came in is already under ``sip.max_message_bytes``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
TOKEN = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9\-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9\-]*[A-Za-z0-9])?)*\.?")
# Characters a URI's user part may hold unescaped (RFC 3261: unreserved / escaped / user-unreserved).
USER = re.compile(r"([A-Za-z0-9\-_.!~*'()&=+$,;?/]|%[0-9A-Fa-f]{2})+")
PASSWORD = re.compile(r"([A-Za-z0-9\-_.!~*'()&=+$,]|%[0-9A-Fa-f]{2})*")
PARAM_CHARS = re.compile(r"([A-Za-z0-9\-_.!~*'()\[\]/:&+$]|%[0-9A-Fa-f]{2})+")
WHITESPACE = " \t\r\n"


class AddressError(ValueError):
    """A URI or name-addr that does not parse."""


@dataclass(frozen=True)
class SipURI:
    """A ``sip:`` or ``sips:`` URI (other schemes, e.g. ``tel:``, keep only their text in ``rest``)."""

    scheme: str  # lower case
    user: str = ""  # as written (escapes kept)
    host: str = ""  # lower case; an IPv6 address without its brackets
    port: int | None = None
    params: dict[str, str] = field(default_factory=dict)  # names lower case; a flag parameter has ""
    headers: str = ""  # what followed "?", as written
    password: str = ""
    rest: str = ""  # the whole URI after "scheme:" for a scheme we do not read

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")

    @property
    def transport(self) -> str:
        """The transport this URI asks for: its ``transport`` parameter, else tls for ``sips:``, else udp."""
        named = self.params.get("transport", "").lower()
        if named:
            return named
        return "tls" if self.scheme == "sips" else "udp"

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def __str__(self) -> str:
        if not self.is_sip:
            return f"{self.scheme}:{self.rest}"
        user = self.user + (f":{self.password}" if self.password else "") + "@" if self.user else ""
        params = "".join(f";{k}" + (f"={v}" if v else "") for k, v in self.params.items())
        headers = f"?{self.headers}" if self.headers else ""
        return f"{self.scheme}:{user}{self.hostport}{params}{headers}"


def parse_host(text: str) -> str:
    """A host as a SIP URI or a Via writes it: a name, an IPv4 address, or an IPv6 reference in brackets."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise AddressError(f"bad IPv6 reference {text[:80]!r}")
        try:
            return str(ipaddress.IPv6Address(text[1:-1]))
        except ValueError:
            raise AddressError(f"bad IPv6 address {text[:80]!r}") from None
    if not text or len(text) > 255 or not HOSTNAME.fullmatch(text):
        raise AddressError(f"bad host {text[:80]!r}")
    return text.lower()


def split_hostport(text: str) -> tuple[str, int | None]:
    """``host[:port]`` → (host, port or None)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise AddressError(f"bad IPv6 reference {text[:80]!r}")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
    port = None
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit() or len(rest) > 6:
            raise AddressError(f"bad port in {text[:80]!r}")
        port = int(rest[1:])
        if not 0 < port < 65_536:
            raise AddressError(f"port out of range in {text[:80]!r}")
    return parse_host(host), port


def parse_params(text: str, pattern: re.Pattern[str] = PARAM_CHARS) -> dict[str, str]:
    """``;name=value;flag`` (the leading ``;`` included) → {name (lower case): value}; quoted values keep quotes
    stripped."""
    params: dict[str, str] = {}
    if not text:
        return params
    if not text.startswith(";"):
        raise AddressError(f"parameters must start with ';' (got {text[:80]!r})")
    for part in split_outside_quotes(text[1:], ";"):
        name, eq, value = part.partition("=")
        name, value = name.strip(WHITESPACE), value.strip(WHITESPACE)
        if not TOKEN.fullmatch(name):
            raise AddressError(f"bad parameter name {name[:80]!r}")
        if eq:
            if value.startswith('"'):
                value = unquote(value)
            elif not value or not (TOKEN.fullmatch(value) or pattern.fullmatch(value)):
                raise AddressError(f"bad value for parameter {name[:40]!r}")
        params[name.lower()] = value
    return params


def parse_uri(text: str) -> SipURI:
    """A URI as written in a request line or between ``<`` and ``>``."""
    if not text or any(c in text for c in " \t\r\n<>\"") or len(text) > 4096:
        raise AddressError(f"bad URI {text[:80]!r}")
    scheme, colon, rest = text.partition(":")
    if not colon or not SCHEME.fullmatch(scheme) or not rest:
        raise AddressError(f"not an absolute URI: {text[:80]!r}")
    scheme = scheme.lower()
    if scheme not in ("sip", "sips"):
        return SipURI(scheme, rest=rest)
    user = password = ""
    if "@" in rest:  # no other part may hold an unescaped @: the first one ends the user part, which may hold ; and ?
        userinfo, _, rest = rest.partition("@")
        user, _, password = userinfo.partition(":")
        if not USER.fullmatch(user) or not PASSWORD.fullmatch(password) or "@" in rest:
            raise AddressError(f"bad user part in {text[:80]!r}")
    rest, _, headers = rest.partition("?")
    hostport, semi, params = rest.partition(";")
    host, port = split_hostport(hostport)
    return SipURI(scheme, user, host, port, parse_params(semi + params), headers, password)


def unquote(text: str) -> str:
    """A quoted-string's content (``\\`` escapes one character); AddressError if it does not close at its end."""
    if len(text) < 2 or not text.startswith('"'):
        raise AddressError(f"not a quoted string: {text[:80]!r}")
    out: list[str] = []
    i = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text):
                break
            out.append(text[i + 1])
            i += 2
            continue
        if c == '"':
            if i != len(text) - 1:
                raise AddressError(f"text after a quoted string: {text[:80]!r}")
            return "".join(out)
        out.append(c)
        i += 1
    raise AddressError(f"unterminated quoted string: {text[:80]!r}")


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def split_outside_quotes(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` where it is not inside a quoted string or ``<…>``."""
    parts: list[str] = []
    start, quoted, angle, i = 0, False, False, 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "<":
            angle = True
        elif c == ">":
            angle = False
        elif c == sep and not angle:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quoted:
        raise AddressError("unterminated quoted string")
    parts.append(text[start:])
    return parts


@dataclass(frozen=True)
class NameAddress:
    """A From, To, Contact, Route or Record-Route value: the display name, the URI, the header's parameters."""

    uri: SipURI
    display: str = ""
    params: dict[str, str] = field(default_factory=dict)
    wildcard: bool = False  # ``Contact: *`` (REGISTER)

    @property
    def tag(self) -> str:
        return self.params.get("tag", "")

    def with_tag(self, tag: str) -> NameAddress:
        return NameAddress(self.uri, self.display, {**self.params, "tag": tag})

    def __str__(self) -> str:
        if self.wildcard:
            return "*"
        display = f"{quote(self.display)} " if self.display else ""
        params = "".join(f";{k}" + (f"={v}" if v else "") for k, v in self.params.items())
        return f"{display}<{self.uri}>{params}"


def parse_name_addr(text: str) -> NameAddress:
    """``"Name" <uri>;params``, ``Name <uri>;params`` or ``uri;params`` (RFC 3261 20.10, 20.20, 20.39)."""
    text = text.strip(WHITESPACE)
    if text == "*":
        return NameAddress(SipURI("sip"), wildcard=True)
    display = ""
    if text.startswith('"'):
        end = _quoted_end(text)
        display = unquote(text[: end + 1])
        text = text[end + 1 :].lstrip(WHITESPACE)
        if not text.startswith("<"):
            raise AddressError("a display name must be followed by <uri>")
    lt = text.find("<")
    if lt >= 0:
        before = text[:lt].strip(WHITESPACE)
        if before:
            if display or not all(TOKEN.fullmatch(w) for w in before.split()):
                raise AddressError(f"bad display name {before[:80]!r}")
            display = " ".join(before.split())
        gt = text.find(">", lt)
        if gt < 0:
            raise AddressError("unclosed <")
        uri = parse_uri(text[lt + 1 : gt])
        rest = text[gt + 1 :].strip(WHITESPACE)
    else:
        uri_text, semi, rest = text.partition(";")
        uri = parse_uri(uri_text.strip(WHITESPACE))
        rest = semi + rest
    return NameAddress(uri, display, parse_params(rest) if rest else {})


def _quoted_end(text: str) -> int:
    """Index of the quote that closes the quoted string ``text`` starts with."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    raise AddressError("unterminated quoted string")
