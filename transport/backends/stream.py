"""Frames over a connected stream socket (Unix domain, TCP): shared by every stream backend.

``FramedSocket`` owns one receive buffer that it reuses for every frame (``recv_into``, no
per-frame allocation) and places each body at ``BODY_OFFSET`` so NumPy views of it are aligned.
The buffer grows with the bytes that actually arrived (at most doubling), never to a declared
body_len up front: a peer that declares 60 MiB and sends 10 bytes costs nothing.
Sends are one ``sendmsg`` of header + body (scatter/gather, no concatenation copy, a partial
send finished from views: ``send_parts``).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from transport.backends.base import BufferChannel
from transport.backends.socket_listener import ConnectionWatch
from transport.backends.sockets import send_parts, set_kernel_timeout
from transport.errors import (
    BadFrameError,
    PeerGoneError,
    ProtocolError,
    TransportError,
    TransportTimeoutError,
    reply_too_large,
)
from transport.protocol import (
    BODY_OFFSET,
    DEFAULT_MAX_BODY,
    HEADER,
    HEADER_OFFSET,
    HEADER_SIZE,
    MESSAGE_IDS,
    ErrorCode,
)
from transport.runtime.session import Session

_PEER_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_TIMED_OUT = (TimeoutError, BlockingIOError)  # BlockingIOError: SO_RCVTIMEO / SO_SNDTIMEO ran out


class FramedSocket:
    """Send and receive protocol frames on one connected stream socket."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        capacity: int = 64 << 10,
        timeout: float | None = 10.0,
        watch: ConnectionWatch | None = None,
    ) -> None:
        self.sock = sock
        self.max_body = max_body
        self.timeout = timeout
        self.watch = watch  # server side: the listener's sweeper enforces its deadlines
        self.buffer = bytearray(BODY_OFFSET + capacity)
        self.generation = 0  # bumped when the buffer is replaced by a larger one
        self._view = memoryview(self.buffer)
        self._have = 0  # bytes received beyond HEADER_OFFSET that are not yet consumed
        self._header = bytearray(HEADER_SIZE)
        self._pending = b""  # bytes of the next frame(s) that arrived with the previous one
        # the body view of the last frame, returned again (the same object) for the next frame
        # of the same length while the buffer stays: a receiver may cache what it builds over
        # it (the session's actions array), and no view is made per frame
        self._body: memoryview = self._view[BODY_OFFSET:BODY_OFFSET]
        set_kernel_timeout(sock, timeout)

    def ensure_capacity(self, body_len: int) -> None:
        """Grow the receive buffer so a body of ``body_len`` fits (the only allocation)."""
        self._grow_to(BODY_OFFSET + body_len, BODY_OFFSET + body_len)

    def _grow_to(self, needed: int, most: int) -> None:
        """Grow the buffer to at least ``needed`` bytes: double it, but never past ``most``."""
        if needed <= len(self.buffer):
            return
        grown = bytearray(max(needed, min(most, 2 * len(self.buffer))))
        grown[: HEADER_OFFSET + self._have] = self._view[: HEADER_OFFSET + self._have]
        self.buffer = grown
        self._view = memoryview(grown)
        self._body = self._view[BODY_OFFSET:BODY_OFFSET]
        self.generation += 1

    def send_frame(self, msg_type: int, msg_id: int, body: Any = b"") -> None:
        """Send header and body in one system call where the kernel takes it all."""
        body_len = memoryview(body).nbytes
        HEADER.pack_into(self._header, 0, msg_type, msg_id, body_len)
        try:
            send_parts(self.sock, (self._header, body), HEADER_SIZE + body_len)
        except _TIMED_OUT as exc:
            raise TransportTimeoutError(f"send timed out after {self.timeout} s") from exc
        except _PEER_GONE as exc:
            raise PeerGoneError(f"peer closed the connection ({exc.strerror})") from exc

    def send_raw(self, data: Any) -> None:
        """Send pre-built frame bytes (header + body already in ``data``)."""
        try:
            self.sock.sendall(data)
        except _TIMED_OUT as exc:
            raise TransportTimeoutError(f"send timed out after {self.timeout} s") from exc
        except _PEER_GONE as exc:
            raise PeerGoneError(f"peer closed the connection ({exc.strerror})") from exc

    def recv_frame(self, deadline: float | None = None) -> tuple[int, int, memoryview]:
        """The next frame: (msg_type, msg_id, body view valid until the next call).

        Raises ``PeerGoneError`` when the peer closes (between or inside frames),
        ``TransportTimeoutError`` past the deadline and ``BadFrameError`` for a body_len over
        the maximum (the body is then never read).
        """
        self._fill(HEADER_SIZE, deadline, inside_frame=False)
        msg_type, msg_id, body_len = HEADER.unpack_from(self.buffer, HEADER_OFFSET)
        if body_len > self.max_body:
            error = BadFrameError(f"body_len {body_len} exceeds the maximum {self.max_body}")
            error.msg_id = msg_id
            raise error
        frame_len = HEADER_SIZE + body_len
        if self._have < frame_len:  # usually the first read brought the whole frame
            self._fill(frame_len, deadline, inside_frame=True)
        body = self._body
        if body.nbytes != body_len:  # (the buffer, when it grew, reset the view to 0 bytes)
            body = self._body = self._view[BODY_OFFSET : BODY_OFFSET + body_len]
        if self._have == frame_len:  # the common case: nothing pipelined behind the frame
            self._have = 0
            self._pending = b""
        else:
            self._consume(frame_len)
        if self.watch is not None:
            self.watch.busy()
        return msg_type, msg_id, body

    def drop_frame(self, deadline: float | None = None) -> tuple[int, int]:
        """Read and drop the frame whose header ``recv_frame`` refused (its body over
        ``max_body``), through the buffer as it is, so the next frame can be read: (msg_id,
        body_len). The stream is out of step if this raises (a timeout, the peer gone)."""
        _, msg_id, body_len = HEADER.unpack_from(self.buffer, HEADER_OFFSET)
        frame_len = HEADER_SIZE + body_len
        if self._have >= frame_len:  # all of it is here already
            self._consume(frame_len)
            return msg_id, body_len
        left = frame_len - self._have
        self._have, self._pending = 0, b""
        room = self._view[HEADER_OFFSET:]
        while left:
            if deadline is not None and time.monotonic() > deadline:
                raise TransportTimeoutError("the rest of the frame did not arrive in time")
            try:
                n = self.sock.recv_into(room, min(left, len(room)))
            except _TIMED_OUT as exc:
                raise TransportTimeoutError(f"peer sent nothing for {self.timeout:.3g} s") from exc
            except _PEER_GONE as exc:
                raise PeerGoneError(f"peer reset the connection ({exc.strerror})") from exc
            if n == 0:
                raise PeerGoneError("peer closed the connection in the middle of a frame")
            left -= n
        return msg_id, body_len

    def _consume(self, frame_len: int) -> None:
        extra = self._have - frame_len
        if extra > 0:  # pipelined bytes: move them to the header slot (rare; keeps alignment)
            start = HEADER_OFFSET + frame_len
            self._pending = bytes(self._view[start : start + extra])
        else:
            self._pending = b""
        self._have = 0

    def _fill(self, want: int, deadline: float | None, *, inside_frame: bool) -> None:
        if self._pending and self._have == 0:
            n = len(self._pending)
            self.ensure_capacity(n)
            self._view[HEADER_OFFSET : HEADER_OFFSET + n] = self._pending
            self._have = n
            self._pending = b""
        watch = self.watch
        while self._have < want:
            if watch is not None:
                if self._have:
                    watch.reading()
                else:
                    watch.idle()
            room = len(self.buffer) - HEADER_OFFSET - self._have
            if room <= 0:  # grow with what came, up to this frame's size
                self._grow_to(len(self.buffer) + 1, HEADER_OFFSET + want)
            # The socket keeps one timeout (changing it costs system calls on every read); a
            # deadline is checked between reads, so a frame takes at most deadline + timeout.
            timeout = self.timeout
            if deadline is not None and self._have and time.monotonic() > deadline:
                raise TransportTimeoutError("the rest of the frame did not arrive in time")
            try:
                start = HEADER_OFFSET + self._have
                n = self.sock.recv_into(self._view[start:])
            except _TIMED_OUT as exc:
                raise TransportTimeoutError(f"peer sent nothing for {timeout:.3g} s") from exc
            except _PEER_GONE as exc:
                raise PeerGoneError(f"peer reset the connection ({exc.strerror})") from exc
            if n == 0:
                where = "in the middle of a frame" if inside_frame or self._have else ""
                raise PeerGoneError(f"peer closed the connection {where}".strip())
            self._have += n

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class StreamChannel(BufferChannel):
    """The client side of a stream backend: numbered requests, each awaited with a deadline."""

    speaks_any_schema = True  # frames carry no schema: a discovering connect keeps the channel

    def __init__(self, framed: FramedSocket, timeout: float | None) -> None:
        super().__init__()
        self.framed = framed
        self.timeout = timeout
        self._next_id = 1
        # an ERROR with msg_id 0 answers no request: the server refused or closed the
        # connection (max_connections, read_timeout) and says why; the client raises it
        self.error_type = MESSAGE_IDS.ERROR
        self._broken = ""  # why the channel cannot be used any more ("": it can)

    @property
    def buffer(self) -> bytearray:
        return self.framed.buffer

    @property
    def generation(self) -> int:
        return self.framed.generation

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        """Send one frame and return the reply that echoes its msg_id. A reply to an earlier
        request that timed out arrives first, late: it is dropped (resynchronisation), and a
        frame half-read when the timeout struck is finished first (the FramedSocket keeps it).
        """
        if self._broken:
            raise PeerGoneError(self._broken)
        msg_id = self._next_id
        self._next_id = (msg_id + 1) & 0xFFFFFFFF
        try:
            self.framed.send_frame(msg_type, msg_id, body)
        except TransportTimeoutError:
            # part of the frame may be in the socket: the stream cannot be resynchronised
            self._broken = "the connection was closed after a send timed out; reconnect"
            self.framed.close()
            raise
        except (PeerGoneError, ProtocolError):
            raise
        except BaseException as exc:  # Ctrl-C mid-send: the same (http: the same words)
            self._broken = (
                f"this client closed its connection: a call was interrupted "
                f"({type(exc).__name__}) while its request was being sent, so the server may "
                "have received part of it; open a new client"
            )
            self.framed.close()
            raise
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                resp_type, resp_id, resp = self.framed.recv_frame(deadline)
            except BadFrameError as exc:  # a body over max_body: its header read, not its body
                late = 0 < (msg_id - exc.msg_id) & 0xFFFFFFFF < 1 << 31
                if exc.msg_id != msg_id and not late:  # no reply at all: out of step
                    self._broken = f"the connection was closed after a bad frame ({exc})"
                    self.framed.close()
                    raise
                body_len = self._drop_reply(deadline)
                if late:
                    continue  # a late reply to an earlier request: dropped, as any late one
                raise reply_too_large(body_len, self.framed.max_body, msg_id) from None
            if resp_id == msg_id or (resp_id == 0 and resp_type == self.error_type):
                return resp_type, resp  # msg_id 0: the server refused or closed the connection
            if not 0 < (msg_id - resp_id) & 0xFFFFFFFF < 1 << 31:
                raise ProtocolError(f"response msg_id {resp_id} does not echo request {msg_id}")
            # the late reply to a request that timed out: dropped; wait on, to the deadline
            if deadline is not None and time.monotonic() > deadline:
                raise TransportTimeoutError(
                    f"no reply within {self.timeout} s (a late reply to an earlier request "
                    "came and was dropped)"
                )

    def _drop_reply(self, deadline: float | None) -> int:
        """Read past a reply over max_body, keeping the connection (its body_len); one that
        stops halfway leaves the stream out of step: the channel is closed."""
        try:
            return self.framed.drop_frame(deadline)[1]
        except TransportError as exc:
            self._broken = (
                f"the connection was closed: a reply over max_body was being dropped when {exc}"
            )
            self.framed.close()
            raise

    def close(self) -> None:
        self._broken = "the channel is closed"
        self.framed.close()


def serve_connection(framed: FramedSocket, session: Session) -> None:
    """Answer one connection's requests until it closes or must be closed (server side)."""
    watch = framed.watch
    # bound once: the loop runs once per request (issue 24: per-request Python work)
    recv_frame, send_raw = framed.recv_frame, framed.send_raw
    handle, frame = session.handle, session.frame
    try:
        while True:
            try:
                msg_type, msg_id, body = recv_frame()
            except BadFrameError as exc:
                error_type, error_body = session.error(ErrorCode.BODY_TOO_LARGE, str(exc))
                send_raw(frame(error_type, exc.msg_id, error_body))
                return
            resp_type, resp = handle(msg_type, body)
            if watch is not None:
                watch.sending()
            send_raw(frame(resp_type, msg_id, resp))
            if session.closing:
                return
    except (PeerGoneError, TransportTimeoutError, OSError):
        return
    finally:
        framed.close()
