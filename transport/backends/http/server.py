"""The HTTP server: one thread and one ``Session`` per keep-alive connection; requests are
parsed by hand (no http.server) and answered through the session."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from transport.backends.http.wire import (
    _BARE_LF,
    _CACHE_LIMIT,
    _HEX16,
    _LENGTH_DIGITS,
    _LINGER,
    _REASONS,
    _RECV_CHUNK,
    _REQUEST_LINE,
    _TOKEN,
    _VALUE,
    BARE_LF_TEXT,
    HTTP_VERBS,
    MAX_CONTENT_LENGTH,
    MAX_HEAD,
    MAX_HEADERS,
    METHODS,
    STATUS_OF_ERROR,
    TRANSFER_ENCODING_TEXT,
    Address,
    _is_loopback,
    loads_json_body,
    parse_url,
    routes,
    with_json_hint,
)
from transport.backends.socket_listener import ConnectionWatch, ServerLimits, SocketListener
from transport.backends.sockets import LISTEN_BACKLOG, send_parts
from transport.codec import StructCodec
from transport.errors import (
    CodecError,
    ConnectError,
    PeerGoneError,
)
from transport.protocol import (
    DEFAULT_MAX_BODY,
    ERROR_HEAD,
    FINAL_TAIL_RESPONSES,
    PER_ENV_RESPONSES,
    ErrorCode,
    RecvTail,
    decode_hello,
    encode_error,
    encode_hello,
    hello_from_json,
    read_final_tail,
    split_recv_tail,
)
from transport.runtime.host import EnvHost
from transport.runtime.session import Session

log = logging.getLogger("transport.http")


_INITIAL_BUFFER = 4096
"""A connection's first receive buffer; it doubles as requests need (up to head + body)."""


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


def quoted(data: bytes) -> str:
    """Request bytes as an error text shows them: JSON-quoted text of their latin-1 reading, as
    the Node server's ``JSON.stringify`` of the header string (never a Python ``b'...'``)."""
    return json.dumps(data.decode("latin-1"), ensure_ascii=False)


def parse_request_head(head: bytes) -> _RequestHead:
    """Parse a request line + headers (without the final CRLFCRLF); raises ``_BadRequest``."""
    lines = head.split(b"\r\n")
    if head.count(b"\n") != len(lines) - 1:
        raise _BadRequest(BARE_LF_TEXT)
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise _BadRequest(f"not an HTTP/1.x request line: {quoted(lines[0][:80])}")
    verb, target, minor = match.groups()
    if verb not in HTTP_VERBS:
        raise _BadRequest(f"not an HTTP/1.x request line: unknown method {quoted(verb[:16])}")
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(f"more than {MAX_HEADERS} header lines")
    content_length: int | None = None
    fingerprint: bytes | None = None
    content_type: bytes | None = None
    accept_json = False
    connection: set[bytes] = set()  # the tokens of every Connection line
    expect: set[bytes] = set()  # the elements of every Expect line
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None or _VALUE.fullmatch(value) is None:
            raise _BadRequest(f"malformed header line {quoted(line[:80])}")
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if _LENGTH_DIGITS.fullmatch(value) is None:
                raise _BadRequest(f"bad Content-Length {quoted(value[:40])}")
            if content_length is not None:  # as llhttp (Node): even equal values (RFC 9112 6.3)
                raise _BadRequest("duplicate Content-Length headers")
            content_length = int(value)  # leading zeros are the value's, as llhttp reads them
            if content_length > MAX_CONTENT_LENGTH:
                raise _BadRequest(f"bad Content-Length {quoted(value[:40])}: larger than 2**64 - 1")
        elif name == b"transfer-encoding":
            raise _BadRequest(TRANSFER_ENCODING_TEXT)
        elif name == b"x-transport-fingerprint":  # repeated: joined as Node does (then refused)
            value = value.lower()
            fingerprint = value if fingerprint is None else fingerprint + b", " + value
        elif name == b"accept":  # a list: repeated lines are one list (RFC 9110 5.3)
            accept_json = accept_json or b"application/json" in value.lower()
        elif name == b"content-type":  # one value: the first line counts (as Node reads it)
            content_type = value.lower() if content_type is None else content_type
        elif name == b"connection":
            connection.update(_list_elements(value))
        elif name == b"expect":
            expect.update(_list_elements(value))
    # "close" in any Connection line closes, whatever else they say (RFC 9110 7.6.1)
    close = b"close" in connection or (minor == b"0" and b"keep-alive" not in connection)
    path = target.partition(b"?")[0]
    method = path[4:].decode("ascii") if path.startswith(b"/v1/") else None
    return _RequestHead(
        verb=verb,
        method=method,
        content_length=content_length or 0,
        fingerprint=fingerprint,
        accept_json=accept_json,
        json_body=content_type is not None and content_type.startswith(b"application/json"),
        close=close,
        # an HTTP/1.0 client knows no 100 Continue: its Expect is ignored (RFC 9110 10.1.1)
        expect_continue=minor == b"1" and b"100-continue" in expect,
    )


def _list_elements(value: bytes) -> list[bytes]:
    """The lowercased elements of a comma-separated header value."""
    return [item.strip(b" \t") for item in value.lower().split(b",")]


def _response_head(status: int, fields: list[tuple[str, str]], length: int, close: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    lines.extend(f"{name}: {value}" for name, value in fields)
    lines.append(f"Content-Length: {length}")
    lines.append("Connection: close" if close else "Connection: keep-alive")  # as Node's
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
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # "nan" / "inf" / "-inf": strict JSON has no such numbers
        if value.is_integer() and abs(value) < 1e21:
            return int(value)  # 0.0 as 0: the number JSON.stringify writes (the Node server)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


class _Connection:
    """One accepted connection: parse requests, answer through the session, until closed."""

    def __init__(
        self,
        sock: socket.socket,
        session: Session,
        max_body: int,
        watch: ConnectionWatch | None = None,
    ) -> None:
        self.sock = sock
        self.session = session
        self.max_body = max_body
        self.watch = watch  # the listener's sweeper enforces its deadlines
        self.schema = session.schema
        ids = session.ids
        self.ids = ids
        self.msg_types = routes(self.schema.ir.messages)
        self.names = {msg.id: name for name, msg in self.schema.ir.messages.items()}
        self.fingerprint = f"{self.schema.fingerprint:016x}".encode("ascii")
        self.hello_body = encode_hello(self.schema.fingerprint)
        self.buffer = bytearray(_INITIAL_BUFFER)
        self.view = memoryview(self.buffer)
        self._body = self.view[:0]  # ``_body_view``'s last view, and where it starts
        self._body_at = 0
        self.have = 0
        self.heads: dict[bytes, _RequestHead] = {}
        self.replies: dict[tuple[int, int, bool], bytes] = {}

    # -- receiving -------------------------------------------------------------------------------

    def _recv(self) -> int:
        """Receive what came into the buffer, doubling it when full (it grows with the bytes
        that arrived, never to a declared Content-Length up front)."""
        if self.have == len(self.buffer):
            self._grow(2 * len(self.buffer))
        watch = self.watch
        if watch is not None:
            if self.have:
                watch.reading()
            else:
                watch.idle()
        n = self.sock.recv_into(self.view[self.have :])
        if n == 0:
            raise PeerGoneError("client closed the connection")
        self.have += n
        return n

    def _body_view(self, start: int, end: int) -> memoryview:
        """The buffer's bytes start..end: the same view object as last time when the body is
        where it was (a keep-alive client's heads are alike), so the session reuses what it
        built over it (its STEP_BATCH actions array) and no view is made per request."""
        body = self._body
        if start != self._body_at or body.nbytes != end - start or body.obj is not self.buffer:
            body = self._body = self.view[start:end]
            self._body_at = start
        return body

    def _grow(self, size: int) -> None:
        grown = bytearray(size)
        grown[: self.have] = self.view[: self.have]
        self.buffer = grown
        self.view = memoryview(grown)

    def _read_head(self) -> tuple[_RequestHead, int]:
        """The next request head and the offset of its body in the buffer; a bare LF in it is
        refused as soon as it arrives (``BARE_LF_TEXT``), not waited on until the read timeout."""
        scanned = 0
        while True:
            if self.have:  # nothing yet (between requests): straight to the read
                skip = self._blank_prefix()
                start = max(skip, scanned - 3)
                end = self.buffer.find(b"\r\n\r\n", start, self.have)
                if end >= 0:
                    break  # a whole head: parse_request_head refuses a bare LF in it
                if _BARE_LF.search(self.buffer, start, self.have):
                    raise _BadRequest(BARE_LF_TEXT)
                scanned = self.have
                if self.have >= MAX_HEAD:
                    raise _BadRequest(f"request head is larger than {MAX_HEAD} bytes")
                self._check_start()
            self._recv()
        if end > MAX_HEAD:
            raise _BadRequest(f"request head is larger than {MAX_HEAD} bytes")
        raw = bytes(self.view[skip:end])
        head = self.heads.get(raw)
        if head is None:
            head = parse_request_head(raw)
            if len(self.heads) >= _CACHE_LIMIT:
                self.heads.clear()
            self.heads[raw] = head
        return head, end + 4

    def _blank_prefix(self) -> int:
        """CR and LF bytes before the request line: ignored (RFC 9112 2.2, as llhttp does)."""
        skip = 0
        while skip < self.have and self.buffer[skip] in (13, 10):
            skip += 1
        return skip

    def _check_start(self) -> None:
        """Refuse bytes that cannot start an HTTP request without waiting for a whole head."""
        skip = self._blank_prefix()
        if skip == self.have:
            return
        line_end = self.buffer.find(b"\r\n", skip, self.have)
        if line_end >= 0:
            line = bytes(self.view[skip:line_end])
            if _REQUEST_LINE.fullmatch(line) is None:  # the text parse_request_head gives it
                raise _BadRequest(f"not an HTTP/1.x request line: {quoted(line[:80])}")
            return
        start = bytes(self.view[skip : min(self.have, skip + 18)])
        verb = start.partition(b" ")[0]
        if not re.fullmatch(rb"[A-Z-]{0,16}", verb) or (b" " not in start and len(verb) >= 17):
            raise _BadRequest(f"not an HTTP request: {quoted(start)}")

    # -- serving ---------------------------------------------------------------------------------

    def serve(self) -> None:
        try:
            while True:
                try:
                    head, body_start = self._read_head()
                except _BadRequest as exc:
                    self._refuse(400, ErrorCode.BAD_FRAME, str(exc), close=True)
                    self._linger()  # the client reads the 400, not a reset, whatever it sends
                    return
                length = head.content_length
                if length > self.max_body:
                    text = f"Content-Length {length} exceeds the maximum {self.max_body}"
                    self._refuse(413, ErrorCode.BODY_TOO_LARGE, text, close=True, json=head)
                    self._linger()  # the body it is still sending is drained, not reset
                    return
                end = body_start + length
                if self.have < end and head.expect_continue:
                    self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                while self.have < end:
                    if self.have == len(self.buffer):  # grow with what came, up to the body
                        self._grow(min(end, 2 * len(self.buffer)))
                    self._recv()
                if self.watch is not None:
                    self.watch.busy()
                keep = self._answer(head, self._body_view(body_start, end))
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
        elif fingerprint == self.fingerprint:
            pass  # every request after the first: one comparison, no pattern match
        elif _HEX16.fullmatch(fingerprint) is None:
            text = f"X-Transport-Fingerprint {quoted(fingerprint[:40])} is not 16 hex digits"
            return self._refuse(400, ErrorCode.BAD_FRAME, text, close=head.close, json=head)
        else:
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
            if not head.json_body:  # a JSON body sent as form data (curl -d): say so
                resp = with_json_hint(resp, body)
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
        if head is not None and head.verb == b"HEAD":  # the head says the length, no body follows
            self._send(_response_head(status, fields, len(body), close), b"")
            return
        self._send(_response_head(status, fields, len(body), close), body)

    def _send(self, head: bytes, body: Any) -> None:
        if self.watch is not None:
            self.watch.sending()
        # scatter/gather; a partial send copies nothing
        send_parts(self.sock, (head, body), len(head) + memoryview(body).nbytes)

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
        value = loads_json_body(text)
        if METHODS[method] == "HELLO_REQ":  # the shape of the JSON HELLO_RESP (protocol.md)
            return hello_from_json(value)
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
            out["flags"] = hello.flags
            out["fingerprint"] = f"{hello.fingerprint:016x}"
            out["info"] = hello.info
        else:
            message = self.schema.ir.messages.get(name)
            if message is not None and message.body is not None:
                out.update(
                    self._render_records(name, message.batch, self.schema[message.body], body)
                )
        # compact, UTF-8 as is: the bytes the Node server writes (JSON.stringify)
        text = json.dumps(_jsonable(out), separators=(",", ":"), ensure_ascii=False)
        return (text + "\n").encode("utf-8")

    def _render_records(
        self, name: str, batch: bool, codec: StructCodec, body: memoryview
    ) -> dict[str, Any]:
        """A response's records and what its tail carries, as JSON fields (docs/protocol.md,
        "JSON answers"): ``result`` (one record) or ``results``, then ``env_ids`` and ``finals``
        (RECV_RESP), ``finals`` (a step response's final tail) or ``infos`` (OBSERVE_RESP). Only
        whole records before the tail are results: a tail is never read as more of them."""
        size = codec.size
        whole = body.nbytes // size if size else 0
        result = self.session.result  # the env's result struct: what final tails carry
        recv: RecvTail | None = None
        if name == "RECV_RESP":
            recv = split_recv_tail(body, size, self.session.num_envs)
            count = recv.count
        elif name in PER_ENV_RESPONSES:
            count = min(self.session.num_envs, whole)
        else:
            count = whole if batch else min(1, whole)
        records = [codec.decode(body, i * size, strict=False) for i in range(count)]
        out: dict[str, Any] = {"result": records[0]} if count == 1 else {"results": records}
        tail = body[count * size :]
        if recv is not None:
            out["env_ids"] = recv.env_ids
            out["finals"] = _finals_json(result, recv.final_rows(result.size))
        elif name == "OBSERVE_RESP":
            out["infos"] = msgpack.unpackb(tail, strict_map_key=False) if tail.nbytes else []
        elif name in FINAL_TAIL_RESPONSES and tail.nbytes:
            ends = read_final_tail(tail, 0, result.size, self.session.num_envs)
            rows = [(index, tail[at : at + result.size]) for index, at in ends]
            out["finals"] = _finals_json(result, rows)
        return out


def _finals_json(codec: StructCodec, finals: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    return [
        {"env_id": int(index), "result": codec.decode(data, 0, strict=False)}
        for index, data in finals
    ]


class Listener(SocketListener):
    """Accepts TCP connections; one thread and one Session per connection."""

    def __init__(
        self,
        url: str,
        host: EnvHost,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        allow_remote: bool = False,
        limits: ServerLimits | None = None,
    ) -> None:
        super().__init__(host, max_body=max_body, limits=limits)
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
            sock.listen(LISTEN_BACKLOG)
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

    def serve_connection(
        self, conn: socket.socket, session: Session, watch: ConnectionWatch
    ) -> None:
        _Connection(conn, session, self.max_body, watch).serve()

    def refusal(self, text: str) -> bytes:
        """503 with the ERROR contract body (INTERNAL, "server busy"), Connection: close."""
        return _error_response(503, ErrorCode.INTERNAL, text, [("Retry-After", "1")])

    def timeout_reply(self, text: str) -> bytes:
        """408 with the ERROR contract body (BAD_FRAME), Connection: close."""
        return _error_response(408, ErrorCode.BAD_FRAME, text, [])


def _error_response(status: int, code: ErrorCode, text: str, extra: list[tuple[str, str]]) -> bytes:
    body = encode_error(code, text)
    fields = [
        ("Content-Type", "application/octet-stream"),
        *extra,
        ("X-Transport-Error", str(int(code))),
    ]
    head = _response_head(status, fields, len(body), True)
    reason = _LIMIT_REASONS[status]
    return head.replace(b" Error\r\n", f" {reason}\r\n".encode("ascii"), 1) + body


_LIMIT_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}
