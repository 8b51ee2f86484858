"""The HTTP mapping both ends share: routes (``/v1/<method>``), status codes, header grammar,
URLs (docs/protocol.md "HTTP mapping")."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from transport.backends.url_params import single_params
from transport.errors import ConnectError
from transport.protocol import ERROR_HEAD, HTTP_ROUTES, HTTP_STATUS, ErrorCode, encode_error
from transport.schema.ir import MessageIR

MAX_HEAD = 16 << 10
"""Largest request or response head (request/status line + headers) either side accepts."""
MAX_HEADERS = 64
_RECV_CHUNK = 64 << 10
_CACHE_LIMIT = 64
_LINGER = 1.0  # seconds a refused connection is drained before close (so the peer reads the 4xx)

METHODS: dict[str, str] = HTTP_ROUTES
"""``/v1/<method>`` -> the request message it carries (declared in schema/protocol.toml; routes
of messages a schema lacks are not served)."""


def routes(messages: Mapping[str, MessageIR]) -> dict[str, int]:
    """``method`` -> msg_type of each route whose message the schema declares."""
    return {method: messages[name].id for method, name in METHODS.items() if name in messages}


STATUS_OF_ERROR: dict[int, int] = HTTP_STATUS
"""HTTP status of each ERROR code (schema/protocol.toml; a 405 for a non-POST request carries
UNKNOWN_MESSAGE)."""

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    500: "Internal Server Error",
}

_PEER_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_REQUEST_LINE = re.compile(rb"([A-Z][A-Z-]{0,15}) +(/[\x21-\x7e]*) +HTTP/1\.([01])")
"""Method, origin-form target, HTTP/1.x: separated by one or more spaces, as llhttp (Node) and
RFC 9112 3 allow."""
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_HEX16 = re.compile(rb"[0-9a-fA-F]{16}")
_DIGITS = re.compile(rb"[0-9]{1,19}")
"""A status or port number (the client's reading of a response)."""
_LENGTH_DIGITS = re.compile(rb"[0-9]+")
"""A request's Content-Length: any number of digits, leading zeros included, as llhttp (Node)
reads it; over ``MAX_CONTENT_LENGTH`` it is a 400 on both servers."""
MAX_CONTENT_LENGTH = 2**64 - 1
_BARE_LF = re.compile(rb"(?<!\r)\n")
BARE_LF_TEXT = "a bare LF ends a line of the request head: end every line with CRLF (RFC 9112 2.2)"
"""The 400 BAD_FRAME text both servers give a request head with a LF not preceded by CR: refused
as soon as it arrives, as llhttp (Node) refuses it, not waited on for a CRLFCRLF."""

HTTP_VERBS = frozenset(
    b"ACL BIND CHECKOUT COPY DELETE GET HEAD LINK LOCK M-SEARCH MERGE MKACTIVITY MKCALENDAR MKCOL "
    b"MOVE NOTIFY OPTIONS PATCH POST PROPFIND PROPPATCH PURGE PUT QUERY REBIND REPORT SEARCH "
    b"SOURCE SUBSCRIBE TRACE UNBIND UNLINK UNLOCK UNSUBSCRIBE".split()
)
"""The request methods a server parses (then answers 405 unless POST): Node's llhttp list without
CONNECT; any other token is not an HTTP/1.x request line (400 BAD_FRAME) on both servers."""

TRANSFER_ENCODING_TEXT = "Transfer-Encoding is not supported: send Content-Length"
"""The 400 BAD_FRAME text both servers give a request with Transfer-Encoding (chunked or not,
with or without a Content-Length)."""

JSON_MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a JSON request body may have (the outer value is
level 1); deeper is a 400 on both servers (docs/protocol.md), never a dropped connection."""


def json_too_deep() -> str:
    """The one text both servers give a JSON body nested deeper than ``JSON_MAX_DEPTH``."""
    return f"nests deeper than {JSON_MAX_DEPTH} arrays and objects"


JSON_TYPE_HINT = "a JSON body needs Content-Type: application/json"
"""Appended to a BAD_BODY_SIZE text when the refused body looks like JSON but was not declared
as JSON (``curl -d`` sends form data): the size alone does not say what went wrong."""


def with_json_hint(error: memoryview, body: memoryview) -> memoryview:
    """The session's ERROR body, with ``JSON_TYPE_HINT`` when it refused the size of a body that
    starts with ``{`` or ``[`` (only called on a refusal of a body not declared as JSON)."""
    if not body.nbytes or body[0] not in b"{[" or error.nbytes < ERROR_HEAD.size:
        return error
    code, size = ERROR_HEAD.unpack_from(error, 0)
    if code != ErrorCode.BAD_BODY_SIZE:
        return error
    text = bytes(error[ERROR_HEAD.size : ERROR_HEAD.size + size]).decode("utf-8", "replace")
    return memoryview(encode_error(code, f"{text}; {JSON_TYPE_HINT}"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (strict JSON has no NaN or Infinity)")


def loads_json_body(text: bytes) -> Any:
    """A JSON request body (integers exact at any size); ``ValueError`` when it is not JSON or
    nests deeper than ``JSON_MAX_DEPTH`` (the stdlib parser would raise RecursionError)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(json_too_deep()) from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > JSON_MAX_DEPTH:
                raise ValueError(json_too_deep())
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return value


# -- URLs ----------------------------------------------------------------------------------------


USERINFO_TEXT = (
    "an http:// URL takes no user info (user@host): the protocol has no authentication "
    "(use http://host:port)"
)
"""Why a URL with user info is refused, on both sides and in both languages: it was dropped
silently before (Python) or read as part of the host (Node)."""


@dataclass(frozen=True)
class Address:
    host: str  # as written in the URL (no brackets)
    port: int
    allow_remote: bool

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_url(url: str, *, listener: bool = False) -> Address:
    """``http://host:port`` (a listener may ask for port 0 and ``?allow_remote=1``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConnectError(f"{url!r} is not a valid http URL: {exc}") from exc
    if parts.scheme.lower() != "http":
        raise ConnectError(f"{url!r} is not an http:// URL")
    if "@" in parts.netloc:
        shown = url.replace(parts.netloc, "***@" + parts.netloc.rpartition("@")[2], 1)
        raise ConnectError(f"{shown!r}: {USERINFO_TEXT}")  # never echo a password
    if parts.path not in ("", "/") or parts.fragment:
        raise ConnectError(f"{url!r}: an http:// endpoint URL takes no path (use http://host:port)")
    if port is None:
        raise ConnectError(f"{url!r} names no port (expected http://host:port)")
    if port == 0 and not listener:
        raise ConnectError(f"{url!r}: cannot connect to port 0")
    allow_remote = False
    for key, value in single_params(url, parts.query).items():
        if key == "allow_remote" and listener:
            allow_remote = value.lower() in ("1", "true", "yes", "")
        else:
            raise ConnectError(f"{url!r}: unknown URL parameter {key!r}")
    return Address(parts.hostname or "", port, allow_remote)


def _is_loopback(host: str) -> bool:
    if not host:
        return False  # "all interfaces"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )
