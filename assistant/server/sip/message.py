"""SIP messages (RFC 3261 section 7, 20 and 25): parse bytes from the network into a request or a response, and
write ours.

What comes in is hostile until parsed: :func:`parse_message` takes at most what the transport already capped
(``sip.max_message_bytes``), raises only :class:`SipParseError` (a ``ValueError`` carrying the status a reply
would have: 400, 505), and checks what every later step reads (the start line, Via, From, To, Call-ID, CSeq,
Content-Length) once, so nothing past it meets a malformed header. The RFC 4475 torture messages are its tests
(``tests/data/sip_torture/``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from assistant.server.sip.uri import (
    TOKEN,
    WHITESPACE,
    AddressError,
    NameAddress,
    SipURI,
    parse_name_addr,
    parse_params,
    parse_uri,
    split_hostport,
    split_outside_quotes,
)

SIP_VERSION = "SIP/2.0"
MAGIC_COOKIE = "z9hG4bK"  # an RFC 3261 branch starts with it (section 8.1.1.7)
MAX_HEADERS = 128  # header values in one message (a long Via chain is some tens)
MAX_CSEQ = 2**31 - 1  # RFC 3261 8.1.1.5: the sequence number is less than 2**31
METHOD = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+")
STATUS_LINE = re.compile(r"SIP/2\.0 ([1-6][0-9][0-9])(?: (.*))?", re.IGNORECASE)

COMPACT = {"i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length", "c": "Content-Type",
           "f": "From", "s": "Subject", "k": "Supported", "t": "To", "v": "Via", "o": "Event", "r": "Refer-To",
           "b": "Referred-By", "u": "Allow-Events", "x": "Session-Expires"}
_NAMES = ("Accept", "Accept-Language", "Allow", "Allow-Events", "Authorization", "Call-ID", "Contact",
          "Content-Disposition", "Content-Encoding", "Content-Length", "Content-Type", "CSeq", "Date", "Event",
          "Expires", "From", "Max-Forwards", "Min-Expires", "Min-SE", "Proxy-Authenticate", "Proxy-Authorization",
          "Proxy-Require", "Reason", "Record-Route", "Require", "Retry-After", "Route", "Server", "Session-Expires",
          "Subject", "Supported", "Timestamp", "To", "Unsupported", "User-Agent", "Via", "Warning",
          "WWW-Authenticate")
CANONICAL = {name.lower(): name for name in _NAMES}
# Headers whose values are comma-separated lists (RFC 3261 7.3.1): stored one value each.
LISTS = frozenset({"via", "route", "record-route", "contact", "allow", "supported", "require", "proxy-require",
                   "unsupported", "accept", "accept-language", "allow-events"})
# Headers that appear once: a message with two is malformed (RFC 4475 3.1.2.x).
SINGLE = frozenset({"call-id", "cseq", "from", "to", "content-length", "content-type", "max-forwards"})
REASONS = {100: "Trying", 180: "Ringing", 183: "Session Progress", 200: "OK", 400: "Bad Request",
           401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           413: "Request Entity Too Large", 415: "Unsupported Media Type", 416: "Unsupported URI Scheme",
           420: "Bad Extension", 422: "Session Interval Too Small", 423: "Interval Too Brief",
           480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist", 482: "Loop Detected",
           483: "Too Many Hops", 486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here",
           491: "Request Pending", 500: "Server Internal Error", 501: "Not Implemented", 503: "Service Unavailable",
           505: "Version Not Supported", 603: "Decline"}


class SipParseError(ValueError):
    """Bytes that are not a SIP message we take; ``status`` is what a reply to it says (400, 505...)."""

    def __init__(self, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.status = status


def canonical(name: str) -> str:
    """A header name as we write it (compact forms expanded, known names in their usual case)."""
    name = COMPACT.get(name.lower(), name) if len(name) == 1 else name
    return CANONICAL.get(name.lower(), name)


class Headers:
    """A message's headers in order, one value per entry (lists split at their commas); names compare without case."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items:
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        self._items.append((canonical(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every value of ``name`` with this one (at the place of the first, else at the end)."""
        name = canonical(name)
        key = name.lower()
        at = next((i for i, (n, _) in enumerate(self._items) if n.lower() == key), len(self._items))
        self.remove(name)
        self._items.insert(min(at, len(self._items)), (name, value))

    def remove(self, name: str) -> None:
        key = name.lower() if len(name) > 1 else canonical(name).lower()
        self._items = [(n, v) for n, v in self._items if n.lower() != key]

    def get(self, name: str, default: str | None = None) -> str | None:
        key = canonical(name).lower()
        return next((v for n, v in self._items if n.lower() == key), default)

    def get_all(self, name: str) -> list[str]:
        key = canonical(name).lower()
        return [v for n, v in self._items if n.lower() == key]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def copy(self) -> Headers:
        out = Headers()
        out._items = list(self._items)
        return out


@dataclass(frozen=True)
class Via:
    """One Via value: ``SIP/2.0/UDP host:port;branch=...;rport``."""

    transport: str  # upper case: UDP, TCP, TLS...
    host: str
    port: int | None = None
    params: dict[str, str] = field(default_factory=dict)

    @property
    def branch(self) -> str:
        return self.params.get("branch", "")

    @property
    def sent_by(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def __str__(self) -> str:
        params = "".join(f";{k}" + (f"={v}" if v else "") for k, v in self.params.items())
        return f"SIP/2.0/{self.transport} {self.sent_by}{params}"


def parse_via(value: str) -> Via:
    protocol, _, rest = value.strip(WHITESPACE).partition("/")
    version, _, rest = rest.partition("/")
    rest = rest.lstrip(WHITESPACE)
    parts = rest.split(None, 1)
    if len(parts) != 2 or protocol.strip().upper() != "SIP" or version.strip() != "2.0":
        raise SipParseError(f"bad Via {value[:80]!r}")
    transport, sent = parts[0].upper(), parts[1]
    if not TOKEN.fullmatch(transport):
        raise SipParseError(f"bad Via transport {transport[:20]!r}")
    hostport, semi, params = sent.partition(";")
    try:
        host, port = split_hostport(hostport.strip(WHITESPACE).replace(" ", ""))
        parsed = parse_params(semi + params)
    except AddressError as exc:
        raise SipParseError(f"bad Via: {exc}") from None
    return Via(transport, host, port, parsed)


@dataclass(frozen=True)
class CSeq:
    number: int
    method: str

    def __str__(self) -> str:
        return f"{self.number} {self.method}"


def parse_cseq(value: str) -> CSeq:
    parts = value.split()
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[0]) > 10 or not METHOD.fullmatch(parts[1]):
        raise SipParseError(f"bad CSeq {value[:80]!r}")
    number = int(parts[0])
    if number > MAX_CSEQ:
        raise SipParseError("CSeq number over 2**31")
    return CSeq(number, parts[1])


class SipMessage:
    """What requests and responses share: the headers, the body, and the headers every transaction reads (checked
    once by :func:`parse_message`, or set by whoever builds the message)."""

    def __init__(self, headers: Headers | None = None, body: bytes = b"") -> None:
        self.headers = headers if headers is not None else Headers()
        self.body = body

    @property
    def vias(self) -> list[Via]:
        return [parse_via(v) for v in self.headers.get_all("Via")]

    @property
    def top_via(self) -> Via:
        value = self.headers.get("Via")
        if value is None:
            raise SipParseError("no Via")
        return parse_via(value)

    @property
    def from_(self) -> NameAddress:
        return _address(self.headers.get("From"), "From")

    @property
    def to(self) -> NameAddress:
        return _address(self.headers.get("To"), "To")

    @property
    def call_id(self) -> str:
        return self.headers.get("Call-ID") or ""

    @property
    def cseq(self) -> CSeq:
        return parse_cseq(self.headers.get("CSeq") or "")

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    @property
    def contact(self) -> NameAddress | None:
        value = self.headers.get("Contact")
        return None if value is None else _address(value, "Contact")

    def values(self, name: str) -> set[str]:
        """A list header's values, lower case (``Supported``, ``Require``, ``Allow``)."""
        return {v.strip().lower() for v in self.headers.get_all(name) if v.strip()}

    def _start_line(self) -> str:
        raise NotImplementedError

    def encode(self) -> bytes:
        """The message on the wire; Content-Length is the body's."""
        lines = [self._start_line()]
        lines += [f"{name}: {value}" for name, value in self.headers if name.lower() != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


class SipRequest(SipMessage):
    def __init__(self, method: str, uri: SipURI | str, headers: Headers | None = None, body: bytes = b"") -> None:
        super().__init__(headers, body)
        self.method = method
        self.uri = uri if isinstance(uri, SipURI) else parse_uri(uri)

    def _start_line(self) -> str:
        return f"{self.method} {self.uri} {SIP_VERSION}"

    def __repr__(self) -> str:
        return f"SipRequest({self.method} {self.uri})"


class SipResponse(SipMessage):
    def __init__(self, status: int, reason: str = "", headers: Headers | None = None, body: bytes = b"") -> None:
        super().__init__(headers, body)
        self.status = status
        self.reason = reason or REASONS.get(status, "Unknown")

    def _start_line(self) -> str:
        return f"{SIP_VERSION} {self.status} {self.reason}"

    def __repr__(self) -> str:
        return f"SipResponse({self.status} {self.reason})"


def _address(value: str | None, name: str) -> NameAddress:
    if value is None:
        raise SipParseError(f"no {name}")
    try:
        return parse_name_addr(value)
    except AddressError as exc:
        raise SipParseError(f"bad {name}: {exc}") from None


# --- parsing ---------------------------------------------------------------------------------------------------------
def split_head(data: bytes) -> tuple[bytes, bytes] | None:
    """The head (start line and headers) and what follows the blank line; None if the head is not complete."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if sep:
        return head, rest
    head, sep, rest = data.partition(b"\n\n")  # bare LF line ends: tolerated, as most stacks do
    return (head, rest) if sep else None


def content_length(head: bytes) -> int | None:
    """The Content-Length a head declares (None: none), for framing a stream; SipParseError if malformed."""
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() in (b"content-length", b"l"):
            text = value.strip()
            if not text.isdigit() or len(text) > 9:
                raise SipParseError("bad Content-Length")
            return int(text)
    return None


def parse_message(data: bytes, stream: bool = False) -> SipRequest | SipResponse:
    """One SIP message from ``data`` (a whole datagram, or one message a stream framed). ``stream``: the body is
    exactly what Content-Length said (the transport framed it)."""
    parts = split_head(data)
    if parts is None:
        raise SipParseError("no blank line after the headers")
    head, body = parts
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("the headers are not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start, headers = lines[0], _headers(lines[1:])
    length = headers.get("Content-Length")
    if length is not None:
        declared = length.strip()
        if not declared.isdigit() or len(declared) > 9:
            raise SipParseError("bad Content-Length")
        n = int(declared)
        if n > len(body):
            raise SipParseError("Content-Length larger than the message")
        body = body[:n]
    message: SipRequest | SipResponse
    if start.upper().startswith("SIP/"):
        message = _response(start, headers, body)
    else:
        message = _request(start, headers, body)
    _check(message)
    return message


def _headers(lines: list[str]) -> Headers:
    headers = Headers()
    unfolded: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            if not unfolded:
                raise SipParseError("a continuation line before any header")
            unfolded[-1] += " " + line.strip(WHITESPACE)
        elif line:
            unfolded.append(line)
    count = 0
    for line in unfolded:
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not TOKEN.fullmatch(name):
            raise SipParseError(f"bad header line {line[:60]!r}")
        value = value.strip(WHITESPACE)
        key = canonical(name).lower()
        if key in LISTS and not value:  # an empty list is allowed (Supported:, as baresip sends it): no values
            continue
        if key in LISTS:
            try:
                values = [v.strip(WHITESPACE) for v in split_outside_quotes(value, ",")]
            except AddressError as exc:
                raise SipParseError(f"bad {name}: {exc}") from None
            if any(not v for v in values):
                raise SipParseError(f"an empty value in {name}")
        else:
            values = [value]
        for v in values:
            count += 1
            if count > MAX_HEADERS:
                raise SipParseError(f"more than {MAX_HEADERS} header values")
            headers.add(name, v)
    return headers


def _request(start: str, headers: Headers, body: bytes) -> SipRequest:
    parts = start.split(" ")
    if len(parts) != 3 or not all(parts):
        raise SipParseError(f"bad request line {start[:80]!r}")
    method, uri_text, version = parts
    if not METHOD.fullmatch(method):
        raise SipParseError(f"bad method {method[:40]!r}")
    if version.upper() != SIP_VERSION:
        raise SipParseError(f"SIP version {version[:20]!r}", 505)
    try:
        uri = parse_uri(uri_text)
    except AddressError as exc:
        raise SipParseError(f"bad Request-URI: {exc}") from None
    return SipRequest(method, uri, headers, body)


def _response(start: str, headers: Headers, body: bytes) -> SipResponse:
    match = STATUS_LINE.fullmatch(start)
    if match is None:
        raise SipParseError(f"bad status line {start[:80]!r}", 505 if not start.upper().startswith("SIP/2.0 ")
                            else 400)
    return SipResponse(int(match.group(1)), match.group(2) or "", headers, body)


def _check(message: SipRequest | SipResponse) -> None:
    """What every later step reads, read once here: a malformed one is this message's fault, found now."""
    h = message.headers
    for key in SINGLE:
        if len(h.get_all(key)) > 1:
            raise SipParseError(f"{canonical(key)} appears more than once")
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        if h.get(name) is None:
            raise SipParseError(f"no {name} header")
    if not message.call_id or any(c.isspace() for c in message.call_id):
        raise SipParseError("bad Call-ID")
    for via in h.get_all("Via"):
        parse_via(via)
    message.from_  # noqa: B018 - parsed here so that later reads cannot fail
    message.to  # noqa: B018
    cseq = message.cseq
    if isinstance(message, SipRequest) and cseq.method != message.method:
        raise SipParseError(f"CSeq method {cseq.method[:20]!r} is not the request's {message.method[:20]!r}")
    max_forwards = h.get("Max-Forwards")
    if max_forwards is not None and (not max_forwards.isdigit() or int(max_forwards) > 255):
        raise SipParseError("bad Max-Forwards")
    for value in h.get_all("Contact"):
        _address(value, "Contact")
    for name in ("Route", "Record-Route"):
        for value in h.get_all(name):
            _address(value, name)


# --- building ------------------------------------------------------------------------------------------------------
def new_tag() -> str:
    return secrets.token_hex(8)


def new_branch() -> str:
    return MAGIC_COOKIE + secrets.token_hex(10)


def new_call_id(host: str) -> str:
    return f"{secrets.token_hex(12)}@{host}"


def response(request: SipRequest, status: int, reason: str = "", *, to_tag: str = "",
             headers: Iterable[tuple[str, str]] = (), body: bytes = b"", content_type: str = "") -> SipResponse:
    """A response to ``request`` (RFC 3261 8.2.6): its Vias, From, Call-ID and CSeq; its To with ``to_tag`` added
    when it has none (never on a 100)."""
    out = Headers()
    for via in request.headers.get_all("Via"):
        out.add("Via", via)
    out.add("From", request.headers.get("From") or "")
    to = request.headers.get("To") or ""
    if to_tag and status > 100 and not request.to.tag:
        to = f"{to};tag={to_tag}"
    out.add("To", to)
    out.add("Call-ID", request.call_id)
    out.add("CSeq", request.headers.get("CSeq") or "")
    if status == 100 and (stamp := request.headers.get("Timestamp")) is not None:
        out.add("Timestamp", stamp)
    for name, value in headers:
        out.add(name, value)
    if body:
        out.add("Content-Type", content_type or "application/sdp")
    return SipResponse(status, reason, out, body)
