"""http://host:port: each request is one ``POST /v1/<method>`` on a keep-alive HTTP/1.1 connection.

The mapping is docs/protocol.md "HTTP mapping". Both ends are small hand-written HTTP/1.1 over
plain TCP sockets (``TCP_NODELAY``), not ``http.server``/``http.client``: those allocate and parse
much more per request than a step is worth.

Server (``Listener``): one thread and one ``Session`` per TCP connection (the session holds that
connection's envs, as on ``unix://``). Every request must carry ``X-Transport-Fingerprint: <16
hex>`` except ``hello``, whose body carries the fingerprint: a missing header is ``400`` with
ERROR HELLO_REQUIRED (5), a malformed one ``400`` BAD_FRAME (1), a different one ``409``
FINGERPRINT_MISMATCH (7, text naming both) and the connection is closed. A request with the right
header on a connection that has not said ``hello`` yet is served as if it had (so ``curl`` works
with one request); an empty ``hello`` body with the right header stands for our own ``Hello``.
Statuses: 200 success (``X-Transport-Msg-Type: <decimal>``), 400 malformed request / bad body,
404 unknown method, 405 not POST, 409 fingerprint or version, 413 body over
``max_body`` (refused from Content-Length, the body is never read), 422 invalid or masked action,
bad batch, not reset, 500 env error / internal. Refusals carry the ERROR body (ErrorHead + text)
and ``X-Transport-Error: <code>``. ``Accept: application/json`` renders any response as JSON and
``Content-Type: application/json`` request bodies are encoded with the schema's codecs (``curl``).
Garbage that is not HTTP gets a 400 and the connection is closed; other connections go on.
Env state lives in the connection's session: served from a factory, each new connection gets
fresh envs, so give ``curl`` several URLs in one command (it reuses the connection), e.g.
``curl -X POST -H 'X-Transport-Fingerprint: ..' -H 'Accept: application/json' URL/v1/reset
URL/v1/spaces``.

Client (``open_channel``): one persistent socket; each request is one ``sendmsg`` of a cached
header block and the body; the response head is read into a reused buffer (parsed heads are
cached by their bytes, so a steady-state step parses nothing) and the body is received into
``channel.buffer`` at ``BODY_OFFSET``. Refusals come back as ``(ERROR, body)``. The server closing
the connection (``Connection: close``, EOF, reset) is ``PeerGoneError``; there is no silent
reconnect.

Binds loopback only unless ``allow_remote=True`` (or ``?allow_remote=1`` in the URL).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from transport.codec import Schema
from transport.errors import (
    BadFrameError,
    CodecError,
    ConnectError,
    PeerGoneError,
    ProtocolError,
    TransportTimeoutError,
)
from transport.listener import SocketListener
from transport.protocol import (
    BODY_OFFSET,
    DEFAULT_MAX_BODY,
    ERROR_HEAD,
    ErrorCode,
    MessageIds,
    decode_hello,
    encode_error,
    encode_hello,
)
from transport.server import Session
from transport.sockets import connect_with_retry

log = logging.getLogger("transport.http")

MAX_HEAD = 16 << 10
"""Largest request or response head (request/status line + headers) either side accepts."""
MAX_HEADERS = 64
_RECV_CHUNK = 64 << 10
_CACHE_LIMIT = 64
_LINGER = 1.0  # seconds a refused connection is drained before close (so the peer reads the 4xx)

METHODS: dict[str, str] = {
    "hello": "HELLO_REQ",
    "reset": "RESET_REQ",
    "reset_seed": "RESET_SEED_REQ",
    "step": "STEP_REQ",
    "step_multi": "STEP_MULTI_REQ",
    "step_batch": "STEP_BATCH_REQ",
    "health": "HEALTH_REQ",
    "spaces": "SPACES_REQ",
}
"""``/v1/<method>`` -> the request message it carries."""

STATUS_OF_ERROR: dict[int, int] = {
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.UNKNOWN_MESSAGE: 404,
    ErrorCode.BAD_BODY_SIZE: 400,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.HELLO_REQUIRED: 400,
    ErrorCode.VERSION_MISMATCH: 409,
    ErrorCode.FINGERPRINT_MISMATCH: 409,
    ErrorCode.INVALID_ACTION: 422,
    ErrorCode.MASKED_ACTION: 422,
    ErrorCode.ENV_ERROR: 500,
    ErrorCode.BAD_BATCH: 422,
    ErrorCode.NOT_RESET: 422,
    ErrorCode.INTERNAL: 500,
}
"""HTTP status of each ERROR code (a 405 for a non-POST request carries UNKNOWN_MESSAGE)."""

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
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (/[\x21-\x7e]*) HTTP/1\.([01])")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_HEX16 = re.compile(rb"[0-9a-fA-F]{16}")
_DIGITS = re.compile(rb"[0-9]{1,19}")


# -- URLs ----------------------------------------------------------------------------------------


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
    if parts.path not in ("", "/") or parts.fragment:
        raise ConnectError(f"{url!r}: an http:// endpoint URL takes no path (use http://host:port)")
    if port is None:
        raise ConnectError(f"{url!r} names no port (expected http://host:port)")
    if port == 0 and not listener:
        raise ConnectError(f"{url!r}: cannot connect to port 0")
    allow_remote = False
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
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


# -- server --------------------------------------------------------------------------------------


class _BadRequest(Exception):
    """A request head that cannot be parsed: 400 and close."""


@dataclass(frozen=True)
class _RequestHead:
    verb: bytes
    method: str | None  # the <method> of /v1/<method>, None for any other path
    content_length: int
    fingerprint: bytes | None  # the X-Transport-Fingerprint value, lowercased
    accept_json: bool
    json_body: bool
    close: bool
    expect_continue: bool


def parse_request_head(head: bytes) -> _RequestHead:
    """Parse a request line + headers (without the final CRLFCRLF); raises ``_BadRequest``."""
    lines = head.split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise _BadRequest(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    verb, target, minor = match.groups()
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(f"more than {MAX_HEADERS} header lines")
    content_length: int | None = None
    fingerprint: bytes | None = None
    accept_json = json_body = expect_continue = False
    connection = b""
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise _BadRequest(f"malformed header line {line[:80]!r}")
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if _DIGITS.fullmatch(value) is None:
                raise _BadRequest(f"bad Content-Length {value[:40]!r}")
            if content_length is not None and content_length != int(value):
                raise _BadRequest("conflicting Content-Length headers")
            content_length = int(value)
        elif name == b"transfer-encoding":
            raise _BadRequest("Transfer-Encoding is not supported: send Content-Length")
        elif name == b"x-transport-fingerprint":
            fingerprint = value.lower()
        elif name == b"accept":
            accept_json = b"application/json" in value.lower()
        elif name == b"content-type":
            json_body = value.lower().startswith(b"application/json")
        elif name == b"connection":
            connection = value.lower()
        elif name == b"expect":
            expect_continue = value.lower() == b"100-continue"
    tokens = {t.strip() for t in connection.split(b",")}
    close = b"close" in tokens or (minor == b"0" and b"keep-alive" not in tokens)
    path = target.partition(b"?")[0]
    method = path[4:].decode("ascii") if path.startswith(b"/v1/") else None
    return _RequestHead(
        verb=verb,
        method=method,
        content_length=content_length or 0,
        fingerprint=fingerprint,
        accept_json=accept_json,
        json_body=json_body,
        close=close,
        expect_continue=expect_continue,
    )


def _response_head(status: int, fields: list[tuple[str, str]], length: int, close: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    lines.extend(f"{name}: {value}" for name, value in fields)
    lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf" / "-inf": strict JSON has no such numbers
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


class _Connection:
    """One accepted connection: parse requests, answer through the session, until closed."""

    def __init__(self, sock: socket.socket, session: Session, max_body: int) -> None:
        self.sock = sock
        self.session = session
        self.max_body = max_body
        self.schema = session.schema
        ids = session.ids
        self.ids = ids
        self.msg_types = {method: getattr(ids, name) for method, name in METHODS.items()}
        self.names = {msg.id: name for name, msg in self.schema.ir.messages.items()}
        self.fingerprint = f"{self.schema.fingerprint:016x}".encode("ascii")
        self.hello_body = encode_hello(self.schema.fingerprint)
        self.buffer = bytearray(_RECV_CHUNK)
        self.view = memoryview(self.buffer)
        self.have = 0
        self.heads: dict[bytes, _RequestHead] = {}
        self.replies: dict[tuple[int, int, bool], bytes] = {}

    # -- receiving -------------------------------------------------------------------------------

    def _recv(self) -> int:
        if self.have == len(self.buffer):
            self._grow(2 * len(self.buffer))
        n = self.sock.recv_into(self.view[self.have :])
        if n == 0:
            raise PeerGoneError("client closed the connection")
        self.have += n
        return n

    def _grow(self, size: int) -> None:
        grown = bytearray(size)
        grown[: self.have] = self.view[: self.have]
        self.buffer = grown
        self.view = memoryview(grown)

    def _read_head(self) -> tuple[_RequestHead, int]:
        """The next request head and the offset of its body in the buffer."""
        scanned = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n", max(0, scanned - 3), self.have)
            if end >= 0:
                break
            scanned = self.have
            if self.have >= MAX_HEAD:
                raise _BadRequest(f"request head is larger than {MAX_HEAD} bytes")
            self._check_start()
            self._recv()
        if end > MAX_HEAD:
            raise _BadRequest(f"request head is larger than {MAX_HEAD} bytes")
        raw = bytes(self.view[:end])
        head = self.heads.get(raw)
        if head is None:
            head = parse_request_head(raw)
            if len(self.heads) >= _CACHE_LIMIT:
                self.heads.clear()
            self.heads[raw] = head
        return head, end + 4

    def _check_start(self) -> None:
        """Refuse bytes that cannot start an HTTP request without waiting for a whole head."""
        if not self.have:
            return
        line_end = self.buffer.find(b"\r\n", 0, self.have)
        if line_end >= 0:
            if _REQUEST_LINE.fullmatch(bytes(self.view[:line_end])) is None:
                raise _BadRequest(f"not an HTTP/1.x request line: {bytes(self.view[:80])!r}")
            return
        start = bytes(self.view[: min(self.have, 18)])
        verb = start.partition(b" ")[0]
        if not re.fullmatch(rb"[A-Z]{0,16}", verb) or (b" " not in start and len(verb) >= 17):
            raise _BadRequest(f"not an HTTP request: {start!r}")

    # -- serving ---------------------------------------------------------------------------------

    def serve(self) -> None:
        try:
            while True:
                try:
                    head, body_start = self._read_head()
                except _BadRequest as exc:
                    self._refuse(400, ErrorCode.BAD_FRAME, str(exc), close=True)
                    return
                length = head.content_length
                if length > self.max_body:
                    text = f"Content-Length {length} exceeds the maximum {self.max_body}"
                    self._refuse(413, ErrorCode.BODY_TOO_LARGE, text, close=True, json=head)
                    return
                end = body_start + length
                if end > len(self.buffer):
                    self._grow(max(end, 2 * len(self.buffer)))
                if self.have < end and head.expect_continue:
                    self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                while self.have < end:
                    self._recv()
                keep = self._answer(head, self.view[body_start:end])
                rest = self.have - end
                if rest:  # pipelined bytes of the next request (rare)
                    self.buffer[:rest] = bytes(self.view[end : self.have])
                self.have = rest
                if not keep:
                    self._linger()
                    return
        except (PeerGoneError, OSError):
            return
        except Exception:
            log.exception("http connection failed")
            return

    def _answer(self, head: _RequestHead, body: memoryview) -> bool:
        """Answer one request; False when the connection must be closed afterwards."""
        if head.verb != b"POST":
            text = f"method {head.verb.decode()} is not allowed: use POST /v1/<method>"
            return self._refuse(
                405,
                ErrorCode.UNKNOWN_MESSAGE,
                text,
                close=head.close,
                json=head,
                extra=[("Allow", "POST")],
            )
        msg_type = self.msg_types.get(head.method) if head.method is not None else None
        if msg_type is None:
            text = f"no such endpoint; methods: {', '.join('/v1/' + m for m in METHODS)}"
            return self._refuse(404, ErrorCode.UNKNOWN_MESSAGE, text, close=head.close, json=head)
        is_hello = msg_type == self.ids.HELLO_REQ
        fingerprint = head.fingerprint
        if fingerprint is None:
            if not is_hello:
                text = "X-Transport-Fingerprint: <16 hex digits> is required on every request"
                return self._refuse(
                    400, ErrorCode.HELLO_REQUIRED, text, close=head.close, json=head
                )
        elif _HEX16.fullmatch(fingerprint) is None:
            text = f"X-Transport-Fingerprint {fingerprint[:40]!r} is not 16 hex digits"
            return self._refuse(400, ErrorCode.BAD_FRAME, text, close=head.close, json=head)
        elif fingerprint != self.fingerprint:
            text = (
                f"schema fingerprint mismatch: client has {fingerprint.decode()}, "
                f"this side has {self.fingerprint.decode()}"
            )
            return self._refuse(409, ErrorCode.FINGERPRINT_MISMATCH, text, close=True, json=head)
        if head.json_body:
            try:
                body = memoryview(self._encode_json_body(head.method or "", body))
            except (ValueError, TypeError, KeyError, CodecError) as exc:
                text = f"JSON body for /v1/{head.method}: {exc}"
                return self._refuse(400, ErrorCode.BAD_BODY_SIZE, text, close=head.close, json=head)
        session = self.session
        if is_hello and fingerprint is not None and not body.nbytes:  # curl: the header says it
            body = memoryview(self.hello_body)
        if not is_hello and not session.hello_done:  # the header stands for the HELLO
            resp_type, resp = session.handle(self.ids.HELLO_REQ, memoryview(self.hello_body))
            if resp_type == self.ids.ERROR:
                return self._reply_error(resp, head)
        resp_type, resp = session.handle(msg_type, body)
        if resp_type == self.ids.ERROR:
            return self._reply_error(resp, head)
        close = head.close or session.closing
        if head.accept_json:
            data = self._render_json(resp_type, resp)
            fields = [
                ("Content-Type", "application/json"),
                ("X-Transport-Msg-Type", str(resp_type)),
            ]
            self._send(_response_head(200, fields, len(data), close), data)
            return not close
        length = resp.nbytes
        key = (resp_type, length, close)
        reply = self.replies.get(key)
        if reply is None:
            fields = [
                ("Content-Type", "application/octet-stream"),
                ("X-Transport-Msg-Type", str(resp_type)),
            ]
            reply = _response_head(200, fields, length, close)
            if len(self.replies) >= _CACHE_LIMIT:
                self.replies.clear()
            self.replies[key] = reply
        self._send(reply, resp)
        return not close

    def _reply_error(self, body: memoryview, head: _RequestHead) -> bool:
        code = ERROR_HEAD.unpack_from(body, 0)[0] if body.nbytes >= ERROR_HEAD.size else 13
        close = head.close or self.session.closing
        self._send_error(STATUS_OF_ERROR.get(code, 500), code, bytes(body), close, head, [])
        return not close

    def _refuse(
        self,
        status: int,
        code: ErrorCode,
        text: str,
        *,
        close: bool,
        json: _RequestHead | None = None,
        extra: list[tuple[str, str]] | None = None,
    ) -> bool:
        self._send_error(status, int(code), encode_error(code, text), close, json, extra or [])
        return not close

    def _send_error(
        self,
        status: int,
        code: int,
        body: bytes,
        close: bool,
        head: _RequestHead | None,
        extra: list[tuple[str, str]],
    ) -> None:
        fields = [*extra, ("X-Transport-Error", str(code))]
        if head is not None and head.accept_json:
            body = self._render_json(self.ids.ERROR, memoryview(body))
            fields.insert(0, ("Content-Type", "application/json"))
        else:
            fields.insert(0, ("Content-Type", "application/octet-stream"))
        self._send(_response_head(status, fields, len(body), close), body)

    def _send(self, head: bytes, body: Any) -> None:
        size = len(head) + memoryview(body).nbytes
        sent = self.sock.sendmsg([head, body])
        if sent < size:  # a full socket buffer: finish the rest
            self.sock.sendall((head + bytes(body))[sent:])

    def _linger(self) -> None:
        """Half-close and drain briefly, so the client reads our answer instead of a reset."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(_LINGER)
            deadline = time.monotonic() + _LINGER
            scratch = bytearray(_RECV_CHUNK)
            while time.monotonic() < deadline and self.sock.recv_into(scratch):
                pass
        except OSError:
            pass

    # -- JSON (curl) -----------------------------------------------------------------------------

    def _encode_json_body(self, method: str, body: memoryview) -> bytes:
        text = bytes(body).strip()
        if not text:
            return b""  # no body is no body, whatever its declared type
        value = json.loads(text)
        message = self.schema.ir.messages[METHODS[method]]
        if message.body is None:
            if value not in (None, {}, []):
                raise ValueError(f"/v1/{method} takes no body")
            return b""
        codec = self.schema[message.body]
        items: list[Any] = value if isinstance(value, list) else [value]
        records: list[dict[str, Any]] = [item for item in items if isinstance(item, dict)]
        if len(records) != len(items):
            raise ValueError(f"expected a JSON object (or a list of them) of {codec.name} fields")
        return b"".join(codec.encode(record) for record in records)

    def _render_json(self, resp_type: int, body: memoryview) -> bytes:
        name = self.names.get(resp_type, f"0x{resp_type:02X}")
        out: dict[str, Any] = {"message": name, "msg_type": resp_type}
        if resp_type == self.ids.ERROR:
            code, text_len = ERROR_HEAD.unpack_from(body, 0)
            text = bytes(body[ERROR_HEAD.size : ERROR_HEAD.size + text_len]).decode(
                "utf-8", "replace"
            )
            try:
                code_name = ErrorCode(code).name
            except ValueError:
                code_name = "UNKNOWN"
            out = {"error": code, "name": code_name, "text": text}
        elif resp_type == self.ids.HELLO_RESP:
            hello = decode_hello(body)
            out["protocol_version"] = f"{hello.version >> 8}.{hello.version & 255}"
            out["fingerprint"] = f"{hello.fingerprint:016x}"
            out["info"] = hello.info
        else:
            message = self.schema.ir.messages.get(name)
            if message is not None and message.body is not None:
                codec = self.schema[message.body]
                count = body.nbytes // codec.size if codec.size else 0
                records = [codec.decode(body, i * codec.size, strict=False) for i in range(count)]
                if count == 1:
                    out["result"] = records[0]
                else:
                    out["results"] = records
        return (json.dumps(_jsonable(out)) + "\n").encode("utf-8")


class Listener(SocketListener):
    """Accepts TCP connections; one thread and one Session per connection."""

    def __init__(
        self,
        url: str,
        sessions: Callable[[], Session],
        *,
        max_body: int = DEFAULT_MAX_BODY,
        allow_remote: bool = False,
    ) -> None:
        super().__init__(sessions, max_body=max_body)
        address = parse_url(url, listener=True)
        if not (allow_remote or address.allow_remote) and not _is_loopback(address.host):
            raise ConnectError(
                f"refusing to bind {address.host or 'all interfaces'}: http:// binds loopback "
                "only by default (the protocol has no authentication); pass allow_remote=True "
                "or add ?allow_remote=1 to the URL to serve other machines"
            )
        self.address = address
        self.url = f"http://{address.netloc}"

    def bind(self) -> socket.socket:
        """Bind and listen; with port 0, ``url`` becomes the real port."""
        host = self.address.host or None
        try:
            infos = socket.getaddrinfo(
                host, self.address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            raise ConnectError(f"cannot resolve {self.address.host!r}: {exc}") from exc
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise ConnectError(f"cannot bind {self.url}: {exc.strerror or exc}") from exc
        port = sock.getsockname()[1]
        self.address = Address(self.address.host, port, self.address.allow_remote)
        self.url = f"http://{self.address.netloc}"
        return sock

    def configure(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def serve_connection(self, conn: socket.socket, session: Session) -> None:
        _Connection(conn, session, self.max_body).serve()


# -- client --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ResponseHead:
    status: int
    msg_type: int | None
    error: int | None
    content_length: int
    close: bool


def parse_response_head(head: bytes) -> _ResponseHead:
    """Strict parse of a status line + headers; raises ``ProtocolError``."""
    lines = head.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    minor, status = match.groups()
    if len(lines) - 1 > MAX_HEADERS:
        raise ProtocolError(f"response has more than {MAX_HEADERS} header lines")
    content_length: int | None = None
    msg_type: int | None = None
    error: int | None = None
    connection = b""
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise ProtocolError(f"malformed response header line {line[:80]!r}")
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if _DIGITS.fullmatch(value) is None:
                raise ProtocolError(f"bad Content-Length {value[:40]!r} in the response")
            if content_length is not None and content_length != int(value):
                raise ProtocolError("conflicting Content-Length headers in the response")
            content_length = int(value)
        elif name == b"transfer-encoding":
            raise ProtocolError("the server sent Transfer-Encoding; only Content-Length is read")
        elif name == b"x-transport-msg-type":
            if _DIGITS.fullmatch(value) is None or int(value) > 255:
                raise ProtocolError(f"bad X-Transport-Msg-Type {value[:40]!r}")
            msg_type = int(value)
        elif name == b"x-transport-error":
            if _DIGITS.fullmatch(value) is not None and int(value) <= 0xFFFF:
                error = int(value)
        elif name == b"connection":
            connection = value.lower()
    code = int(status)
    if content_length is None:
        if code < 200 or code in (204, 304):
            content_length = 0
        else:
            raise ProtocolError(f"HTTP {code} response without Content-Length")
    tokens = {t.strip() for t in connection.split(b",")}
    close = b"close" in tokens or (minor == b"0" and b"keep-alive" not in tokens)
    return _ResponseHead(code, msg_type, error, content_length, close)


class HttpChannel:
    """The client side: one keep-alive connection, one request at a time, buffers reused."""

    def __init__(
        self,
        sock: socket.socket,
        address: Address,
        schema: Schema,
        *,
        timeout: float | None,
        max_body: int,
    ) -> None:
        self.info: dict[str, Any] = {}
        self.sock: socket.socket | None = sock
        self.timeout = timeout
        self.max_body = max_body
        self.ids = MessageIds.from_schema(schema.ir)
        self._buffer = bytearray(BODY_OFFSET + (64 << 10))
        self._view = memoryview(self._buffer)
        self._generation = 0
        self._head = bytearray(MAX_HEAD + _RECV_CHUNK)
        self._head_view = memoryview(self._head)
        self._gone = ""
        fingerprint = f"{schema.fingerprint:016x}"
        self._prefixes: dict[int, bytes] = {}
        for method, name in METHODS.items():
            self._prefixes[getattr(self.ids, name)] = (
                f"POST /v1/{method} HTTP/1.1\r\n"
                f"Host: {address.netloc}\r\n"
                f"X-Transport-Fingerprint: {fingerprint}\r\n"
                "Content-Type: application/octet-stream\r\n"
                "Content-Length: "
            ).encode("ascii")
        self._requests: dict[int, dict[int, bytes]] = {t: {} for t in self._prefixes}
        self._responses: dict[bytes, _ResponseHead] = {}
        self._timeout_dirty = False
        sock.settimeout(timeout)

    @property
    def buffer(self) -> bytearray:
        return self._buffer

    @property
    def generation(self) -> int:
        return self._generation

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        sock = self.sock
        if sock is None:
            raise PeerGoneError(self._gone or "the channel is closed")
        heads = self._requests.get(msg_type)
        if heads is None:
            raise BadFrameError(f"msg_type 0x{msg_type:02X} has no HTTP method")
        length = memoryview(body).nbytes
        head = heads.get(length)
        if head is None:
            head = self._prefixes[msg_type] + b"%d\r\n\r\n" % length
            if len(heads) < _CACHE_LIMIT:
                heads[length] = head
        if self._timeout_dirty:
            sock.settimeout(self.timeout)
            self._timeout_dirty = False
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            sent = sock.sendmsg([head, body] if length else [head])
            if sent < len(head) + length:  # a full socket buffer: finish with sendall
                sock.sendall((head + bytes(body))[sent:])
        except TimeoutError as exc:
            self._abandon("a send timed out")
            raise TransportTimeoutError(f"send timed out after {self.timeout} s") from exc
        except _PEER_GONE as exc:
            self._abandon("the server closed the connection")
            raise PeerGoneError(f"the server closed the connection ({exc.strerror})") from exc
        except OSError as exc:
            self._abandon("the connection failed")
            raise PeerGoneError(f"the connection failed: {exc}") from exc
        try:
            return self._receive(sock, deadline)
        except (TransportTimeoutError, PeerGoneError, ProtocolError) as exc:
            self._abandon(f"the connection was abandoned after: {exc}")
            raise

    def _recv_into(
        self, sock: socket.socket, view: memoryview, deadline: float | None, first: bool
    ) -> int:
        if not first and deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportTimeoutError(f"no complete response within {self.timeout} s")
            sock.settimeout(remaining)
            self._timeout_dirty = True
        try:
            n = sock.recv_into(view)
        except TimeoutError as exc:
            raise TransportTimeoutError(f"no complete response within {self.timeout} s") from exc
        except _PEER_GONE as exc:
            raise PeerGoneError(f"the server reset the connection ({exc.strerror})") from exc
        except OSError as exc:
            raise PeerGoneError(f"the connection failed: {exc}") from exc
        if n == 0:
            where = "in the middle of a response" if not first else "before answering"
            raise PeerGoneError(f"the server closed the connection {where}")
        return n

    def _receive(self, sock: socket.socket, deadline: float | None) -> tuple[int, memoryview]:
        view = self._head_view
        have = 0
        first = True
        while True:  # skips interim 1xx responses
            scanned = 0
            while True:
                end = self._head.find(b"\r\n\r\n", max(0, scanned - 3), have)
                if end >= 0:
                    break
                if have >= MAX_HEAD:
                    raise ProtocolError(f"response head is larger than {MAX_HEAD} bytes")
                scanned = have
                have += self._recv_into(sock, view[have:], deadline, first)
                first = False
            if end > MAX_HEAD:
                raise ProtocolError(f"response head is larger than {MAX_HEAD} bytes")
            raw = bytes(view[:end])
            head = self._responses.get(raw)
            if head is None:
                head = parse_response_head(raw)
                if len(self._responses) >= _CACHE_LIMIT:
                    self._responses.clear()
                self._responses[raw] = head
            start = end + 4
            if head.status >= 200:
                break
            rest = have - start
            self._head[:rest] = bytes(view[start:have])
            have = rest
        length = head.content_length
        if length > self.max_body:
            raise BadFrameError(f"response Content-Length {length} exceeds {self.max_body}")
        got = have - start
        if got > length:
            raise ProtocolError("the server sent bytes beyond the response body")
        if BODY_OFFSET + length > len(self._buffer):
            self._buffer = bytearray(max(BODY_OFFSET + length, 2 * len(self._buffer)))
            self._view = memoryview(self._buffer)
            self._generation += 1
        target = self._view
        target[BODY_OFFSET : BODY_OFFSET + got] = view[start:have]
        stop = BODY_OFFSET + length
        pos = BODY_OFFSET + got
        while pos < stop:
            pos += self._recv_into(sock, target[pos:stop], deadline, False)
        body = target[BODY_OFFSET:stop]
        if head.close:
            self._abandon("the server closed the connection (Connection: close)")
        if head.status == 200:
            if head.msg_type is None:
                raise ProtocolError("HTTP 200 response without X-Transport-Msg-Type")
            return head.msg_type, body
        if head.error is not None and _is_error_body(body):
            return self.ids.ERROR, body
        text = bytes(body[:200]).decode("utf-8", "replace")
        return self.ids.ERROR, memoryview(
            encode_error(ErrorCode.INTERNAL, f"HTTP {head.status} without an ERROR body: {text}")
        )

    def _abandon(self, reason: str) -> None:
        if self.sock is not None:
            self._gone = f"{reason}; open a new client"
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def close(self) -> None:
        if self.sock is not None:
            self._abandon("the channel is closed")
        self._gone = "the channel is closed"


def _is_error_body(body: memoryview) -> bool:
    if body.nbytes < ERROR_HEAD.size:
        return False
    _, text_len = ERROR_HEAD.unpack_from(body, 0)
    return bool(body.nbytes == ERROR_HEAD.size + text_len)


def open_channel(
    url: str,
    *,
    timeout: float | None,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> HttpChannel:
    """Connect, retrying with backoff while the server is not up yet, until the deadline."""
    address = parse_url(url)
    if schema is None:
        from transport.client import default_schema

        schema = default_schema()
    sock = connect_with_retry(
        lambda remaining: socket.create_connection((address.host, address.port), remaining),
        address.netloc,
        timeout,
    )
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return HttpChannel(sock, address, schema, timeout=timeout, max_body=max_body)
