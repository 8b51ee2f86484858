"""The HTTP client channel: one keep-alive connection, one request at a time, buffers reused
(cached request heads, parsed response heads cached by their bytes)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from transport.backends.base import BufferChannel
from transport.backends.http.wire import (
    _CACHE_LIMIT,
    _DIGITS,
    _PEER_GONE,
    _RECV_CHUNK,
    _STATUS_LINE,
    _TOKEN,
    _VALUE,
    MAX_HEAD,
    MAX_HEADERS,
    Address,
    parse_url,
    routes,
)
from transport.backends.sockets import connect_with_retry, send_parts, set_kernel_timeout
from transport.codec import Schema
from transport.errors import (
    BadFrameError,
    ConnectError,
    PeerGoneError,
    ProtocolError,
    ReplyTooLargeError,
    TransportTimeoutError,
    reply_too_large,
)
from transport.protocol import (
    BODY_OFFSET,
    DEFAULT_MAX_BODY,
    ERROR_HEAD,
    MessageIds,
)

_TIMED_OUT = (TimeoutError, BlockingIOError)  # BlockingIOError: SO_RCVTIMEO / SO_SNDTIMEO ran out


class _NotTransport(Exception):
    """A whole HTTP response that no transport server sends: a non-200 status without the
    ERROR contract (``X-Transport-Error`` and an ERROR body), or a 200 without
    ``X-Transport-Msg-Type``. ``HttpChannel.request`` turns it into a typed error."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(status, text)
        self.status = status
        self.text = text


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


_STATUS_START = tuple(
    frozenset(allowed)
    for allowed in (b"H", b"T", b"T", b"P", b"/", b"1", b".", b"01", b" ", b"12345")
    + (b"0123456789",) * 2
    + (b" \r",)
)
"""The bytes each of the first 13 of an HTTP/1.x status line may be (``_STATUS_LINE``)."""


def check_status_start(head: bytearray, have: int) -> None:
    """Raise ``ProtocolError`` unless the first ``have`` bytes of ``head`` (a response whose head
    is not complete yet) can begin an HTTP/1.x status line: a peer that speaks another protocol
    (an SSH banner) is told at once, not waited on until the timeout for a CRLFCRLF."""
    eol = head.find(b"\r\n", 0, have)
    if eol >= 0:
        ok = _STATUS_LINE.fullmatch(head, 0, eol) is not None
    else:
        start = head[: min(have, len(_STATUS_START))]
        ok = all(byte in allowed for byte, allowed in zip(start, _STATUS_START, strict=False))
    if not ok:
        begins = bytes(head[: min(have, 48)])
        raise ProtocolError(
            f"the peer does not speak HTTP/1.x: its answer begins {begins!r}, not an HTTP/1.x "
            "status line"
        )


_HEAD_READ = 4096
"""Bytes a read of a response head asks for: enough for any head this library's servers send
(~200 bytes), small enough that the body bytes read along with it, which are then copied into
the body buffer, stay few (the rest of the body is received in place: issue 24)."""


class HttpChannel(BufferChannel):
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
        super().__init__()
        self.sock: socket.socket | None = sock
        self.timeout = timeout
        self.max_body = max_body
        self._netloc = address.netloc
        self._pin(schema)
        self._buffer = bytearray(BODY_OFFSET + (64 << 10))
        self._view = memoryview(self._buffer)
        self._generation = 0
        self._head = bytearray(MAX_HEAD + _RECV_CHUNK)
        self._head_view = memoryview(self._head)
        self._gone = ""
        self._responses: dict[bytes, _ResponseHead] = {}
        # (head bytes, body start, body bytes end, body stop) of the response being read
        self._progress = (0, -1, -1, -1)
        self._owed = 0  # responses still due to requests that timed out (dropped when they come)
        self._carry = b""  # bytes already received of the first of them
        # the kernel times reads and writes out (no poll before each call); the deadline of a
        # whole response is checked between reads, so it takes at most deadline + timeout
        set_kernel_timeout(sock, timeout)

    def _pin(self, schema: Schema) -> None:
        """Every request's head, with ``schema``'s fingerprint (HELLO's carries it in its body)."""
        self.schema = schema
        self.ids = MessageIds.from_schema(schema.ir)
        fingerprint = f"{schema.fingerprint:016x}"
        self._prefixes: dict[int, bytes] = {}
        for method, msg_type in routes(schema.ir.messages).items():
            # hello carries the fingerprint in its body (and asks to discover the schema there)
            header = (
                ""
                if msg_type == self.ids.HELLO_REQ
                else f"X-Transport-Fingerprint: {fingerprint}\r\n"
            )
            self._prefixes[msg_type] = (
                f"POST /v1/{method} HTTP/1.1\r\n"
                f"Host: {self._netloc}\r\n"
                f"{header}"
                "Content-Type: application/octet-stream\r\n"
                "Content-Length: "
            ).encode("ascii")
        self._requests: dict[int, dict[int, bytes]] = {t: {} for t in self._prefixes}

    def adopt(self, schema: Schema) -> None:
        """Speak ``schema`` from now on, on this connection: the schema a discovering HELLO
        found (its session is this connection's; reconnecting would make the server build a
        second session and its envs)."""
        self._pin(schema)

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
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        if self._owed:
            self._drain(sock, deadline)
        try:
            send_parts(sock, (head, body), len(head) + length)
        except _TIMED_OUT as exc:
            self._abandon("a send timed out")
            raise TransportTimeoutError(f"send timed out after {self.timeout} s") from exc
        except _PEER_GONE as exc:
            self._abandon("the server closed the connection")
            raise PeerGoneError(f"the server closed the connection ({exc.strerror})") from exc
        except OSError as exc:
            self._abandon("the connection failed")
            raise PeerGoneError(f"the connection failed: {exc}") from exc
        except BaseException as exc:
            # a KeyboardInterrupt (or a signal handler's exception) in the middle of
            # sending: how much of the request went is unknown, the server may hold half of
            # it, and the stream cannot be put back in step: the next call is told to
            # connect again
            self._abandon(
                f"this client closed its connection: a call was interrupted "
                f"({type(exc).__name__}) while its request was being sent, so the server "
                "may have received part of it"
            )
            raise
        try:
            return self._receive(sock, deadline)
        except (TransportTimeoutError, ReplyTooLargeError):
            raise  # the connection stays: a late response is dropped before the next one
        except (PeerGoneError, ProtocolError) as exc:
            self._abandon(f"the connection was abandoned after: {exc}")
            raise
        except _NotTransport as exc:
            raise self._not_transport(msg_type, exc) from None

    def _url(self) -> str:
        return getattr(self, "url", "") or f"http://{self._netloc}"

    def _not_transport(self, msg_type: int, exc: _NotTransport) -> ConnectError | ProtocolError:
        """The typed error for a response no transport server sends (``_NotTransport``): at the
        handshake a ``ConnectError`` (the URL is not a transport server's), later a
        ``ProtocolError``; the connection is closed either way (its peer is not one)."""
        url = self._url()
        what = (
            "no X-Transport-Msg-Type header"
            if exc.status == 200
            else "no X-Transport-Error header and ERROR body"
        )
        text = (
            f"the peer at {url} answered HTTP {exc.status} with {what}: it is not a transport "
            f"server (its body begins: {exc.text!r})"
        )
        self._abandon(f"the connection was abandoned after: {text}")
        if msg_type == self.ids.HELLO_REQ:
            return ConnectError(text)
        return ProtocolError(text)

    def _drain(self, sock: socket.socket, deadline: float | None) -> None:
        """Read and drop the responses still due to requests that timed out (HTTP/1.1 answers
        a connection's requests in order), starting with the bytes kept of the first one; a
        timeout here keeps what came and raises. The rare path: it allocates."""
        data = bytearray(self._carry)
        try:
            while self._owed:
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    if data:
                        check_status_start(data, len(data))
                    if len(data) > MAX_HEAD:
                        raise ProtocolError(f"response head is larger than {MAX_HEAD} bytes")
                    data += self._recv_more(sock, deadline)
                    continue
                head = parse_response_head(bytes(data[:end]))
                stop = end + 4 + head.content_length
                while len(data) < stop:
                    data += self._recv_more(sock, deadline)
                if head.close:
                    raise PeerGoneError("the server closed the connection (Connection: close)")
                if head.status >= 200:
                    self._owed -= 1
                del data[:stop]
        except TransportTimeoutError:
            self._carry = bytes(data)
            raise TransportTimeoutError(
                f"the late response to an earlier request did not come within {self.timeout} s"
            ) from None
        except (PeerGoneError, ProtocolError) as exc:
            self._abandon(f"the connection was abandoned after: {exc}")
            raise
        except BaseException:
            self._carry = bytes(data)  # interrupted (Ctrl-C): what came is kept, as on a timeout
            raise
        if data:
            self._abandon("the connection was abandoned: the server sent an unasked response")
            raise ProtocolError("the server sent a response nobody asked for")
        self._carry = b""

    def _recv_more(self, sock: socket.socket, deadline: float | None) -> bytes:
        chunk = bytearray(_RECV_CHUNK)
        n = self._recv_into(sock, memoryview(chunk), deadline, False)
        return bytes(chunk[:n])

    def _recv_into(
        self, sock: socket.socket, view: memoryview, deadline: float | None, first: bool
    ) -> int:
        if not first and deadline is not None and time.monotonic() > deadline:
            raise TransportTimeoutError(f"no complete response within {self.timeout} s")
        try:
            n = sock.recv_into(view)
        except _TIMED_OUT as exc:
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
        """The response to the request just sent. On a timeout or an interrupt (Ctrl-C: a
        ``KeyboardInterrupt`` out of a blocked recv), the bytes of it that came are kept and it
        is owed: ``_drain`` drops it before the next request (resynchronisation), so the next
        call never returns the interrupted call's response."""
        self._progress = (0, -1, -1, -1)
        try:
            return self._read_response(sock, deadline)
        except (PeerGoneError, ProtocolError, _NotTransport):
            raise  # ``request`` closes the connection
        except BaseException:
            have, start, pos, stop = self._progress
            if start >= 0 and pos >= stop:
                raise  # the whole response was read: nothing is owed (its body is dropped)
            if start < 0:  # inside the head
                self._carry = bytes(self._head_view[:have])
            else:
                self._carry = bytes(self._head_view[:start]) + bytes(self._view[BODY_OFFSET:pos])
            self._owed += 1
            raise

    def _read_response(self, sock: socket.socket, deadline: float | None) -> tuple[int, memoryview]:
        view = self._head_view
        have = 0
        first = True
        while True:  # skips interim 1xx responses
            scanned = 0
            line_ok = False  # this response's status line was seen whole and is one
            while True:
                end = self._head.find(b"\r\n\r\n", max(0, scanned - 3), have)
                if end >= 0:
                    break
                if have >= MAX_HEAD:
                    raise ProtocolError(f"response head is larger than {MAX_HEAD} bytes")
                if have and not line_ok:  # the slow path only: a head that came in one read
                    check_status_start(self._head, have)  # is checked by its parse
                    line_ok = self._head.find(b"\r\n", 0, have) >= 0
                scanned = have
                # a small window: the body that comes with the head is copied into place, so
                # read little of it here; the rest is received straight into the body buffer
                have += self._recv_into(sock, view[have : have + _HEAD_READ], deadline, first)
                self._progress = (have, -1, -1, -1)
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
            self._progress = (have, -1, -1, -1)
        length = head.content_length
        got = have - start
        if got > length:
            raise ProtocolError("the server sent bytes beyond the response body")
        if length > self.max_body:
            self._progress = (have, start, 0, 0)  # nothing is owed: the drop ends or closes
            self._drop_body(sock, length - got, deadline, head.close)
            raise reply_too_large(length, self.max_body)
        if BODY_OFFSET + length > len(self._buffer):
            self._buffer = bytearray(max(BODY_OFFSET + length, 2 * len(self._buffer)))
            self._view = memoryview(self._buffer)
            self._generation += 1
        target = self._view
        target[BODY_OFFSET : BODY_OFFSET + got] = view[start:have]
        stop = BODY_OFFSET + length
        pos = BODY_OFFSET + got
        self._progress = (have, start, pos, stop)
        while pos < stop:
            pos += self._recv_into(sock, target[pos:stop], deadline, False)
            self._progress = (have, start, pos, stop)
        body = target[BODY_OFFSET:stop]
        if head.close:
            self._abandon("the server closed the connection (Connection: close)")
        if head.status == 200:
            if head.msg_type is None:
                raise _NotTransport(200, bytes(body[:120]).decode("utf-8", "replace"))
            return head.msg_type, body
        if head.error is not None and _is_error_body(body):
            return self.ids.ERROR, body
        raise _NotTransport(head.status, bytes(body[:120]).decode("utf-8", "replace"))

    def _drop_body(
        self, sock: socket.socket, left: int, deadline: float | None, close: bool
    ) -> None:
        """Read and drop the rest (``left`` bytes) of a response over ``max_body``, in small
        reads, so the keep-alive connection stays in step (the unix client does the same). A
        drop that stops halfway (a timeout, Ctrl-C, the server gone) closes the connection."""
        chunk = memoryview(bytearray(min(left, 1 << 16)))
        try:
            while left:
                left -= self._recv_into(sock, chunk[: min(left, len(chunk))], deadline, False)
        except BaseException as exc:
            self._abandon(
                "the connection was closed: a reply over max_body was being dropped when "
                f"{exc or type(exc).__name__}"
            )
            raise
        if close:
            self._abandon("the server closed the connection (Connection: close)")

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
    channel = HttpChannel(sock, address, schema, timeout=timeout, max_body=max_body)
    channel.url = url
    return channel
