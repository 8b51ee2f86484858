"""The zmq client channel: a DEALER, requests matched to replies by msg_id, a socket monitor
for dead peers."""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
import weakref
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from transport.backends.base import BufferChannel
from transport.backends.zmq.curve import (
    client_curve,
)
from transport.backends.zmq.wire import (
    _DISCARD,
    _MONITOR_EVENTS,
    _SLICE_MS,
    SNDMORE_NOBLOCK,
    ZERO_COPY_THRESHOLD,
    Address,
    Context,
    ReceiveBuffer,
    Sock,
    _common_options,
    _more,
    log,
    parse_url,
)
from transport.codec import Schema
from transport.errors import (
    BadFrameError,
    ConnectError,
    PeerGoneError,
    ReplyTooLargeError,
    TransportError,
    TransportTimeoutError,
    reply_too_large,
)
from transport.protocol import (
    DEFAULT_MAX_BODY,
    HEADER,
    HEADER_SIZE,
    encode_goodbye,
)

_GOODBYE_LINGER_MS = 500
"""How long libzmq may keep sending a closed client's goodbye (in the background; at most this
long at the exit of the process)."""

_REPLY_MAXMSGSIZE = 0xFFFFFFFF
"""libzmq's limit on the client's received messages: the largest body a frame header can say.
With ``max_body`` there, libzmq ended the connection at a larger reply without a word (the
client saw only "closed", and the DEALER never reconnects after that); the client checks
``max_body`` itself instead (``_recv_frame``): the reply is dropped with ``ReplyTooLargeError``
and the connection kept. The server keeps ``max_body`` as its limit on requests."""

_monitor_ids = itertools.count(1)
"""Each channel's socket monitor gets an inproc address of its own: pyzmq's default
(``inproc://monitor.s-<fd>``) can still be bound by a dropped socket whose fd number was reused
(libzmq closes sockets in the background), and the connect then failed "Address already in use"."""

_client_context: Context | None = None
_client_context_pid = 0
_client_context_lock = threading.Lock()


def client_context() -> Context:
    """One ZeroMQ context for every client channel of this process (a fresh one after fork)."""
    global _client_context, _client_context_pid
    with _client_context_lock:
        if _client_context is None or _client_context_pid != os.getpid():
            _client_context = zmq.Context(io_threads=1)
            _client_context_pid = os.getpid()
        return _client_context


def _describe_failure(event: int, value: int) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the server refused this client's CURVE key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "the ZMTP handshake failed (CURVE on one side only, or the wrong server key?)"
    return "the ZMTP handshake failed (wrong server key, or not a ZeroMQ server?)"


class _Farewell:
    """What a channel dropped without ``close()`` does when it is collected (``weakref.finalize``;
    it holds the sockets and the session's state, never the channel): say goodbye, as
    ``Client.close()`` does through ``say_goodbye``, so that the server drops the session (its
    envs) now rather than at its idle timeout, then close the sockets. Never blocks (NOBLOCK,
    linger ``_GOODBYE_LINGER_MS`` only when a goodbye was queued) and never raises."""

    __slots__ = ("hello_type", "live", "monitor", "pid", "sock")

    def __init__(self, sock: Sock, monitor: Sock) -> None:
        self.sock = sock
        self.monitor = monitor
        self.pid = os.getpid()
        self.hello_type: int | None = None  # the session's HELLO_REQ type (its first request)
        self.live = False  # connected, and the connection never went away

    def __call__(self) -> None:
        if os.getpid() != self.pid:  # a forked child's copy: the sockets are the parent's
            return
        linger = 0
        try:
            if self.live and self.hello_type is not None:
                body = encode_goodbye()
                header = HEADER.pack(self.hello_type, 0, len(body))
                try:
                    self.sock.send_multipart([header, body], zmq.NOBLOCK)
                    linger = _GOODBYE_LINGER_MS
                except zmq.ZMQError:
                    pass  # no room or no connection: the server drops the session at its timeout
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(0)
            self.sock.close(linger)
        except Exception:  # a finalizer never raises (late in interpreter shutdown, too)
            pass


class ZmqChannel(BufferChannel):
    """The client side: a DEALER whose replies are matched to requests by msg_id.

    ``send_request`` and ``recv_response`` split ``request`` so callers can pipeline (send to
    several servers, then wait); a reply whose msg_id is not the awaited one is discarded.
    """

    speaks_any_schema = True  # frames carry no schema: a discovering connect keeps the channel

    def __init__(
        self,
        address: Address,
        *,
        timeout: float | None,
        max_body: int = DEFAULT_MAX_BODY,
        context: Context | None = None,
        capacity: int = 64 << 10,
    ) -> None:
        super().__init__()
        self.address = address
        self.timeout = timeout
        self.max_body = max_body
        self._receive = ReceiveBuffer(capacity)
        self._header = bytearray(HEADER_SIZE)
        self._next_id = 1
        self._connected = False
        self._lost = False  # a connection we had went away; not reported yet
        self._gone = ""  # a connection was lost and is not back: each call fails at once
        self._failure = ""
        self._tracker: zmq.MessageTracker | None = None
        self._closed = False
        self._linger_ms = 0  # close() drops what is unsent, but a goodbye (say_goodbye)
        curve = client_curve(address)
        ctx = context or client_context()
        sock: Sock = ctx.socket(zmq.DEALER)
        try:
            _common_options(sock, address, max_body)
            sock.setsockopt(zmq.MAXMSGSIZE, _REPLY_MAXMSGSIZE)
            sock.setsockopt(zmq.ROUTING_ID, b"T" + uuid.uuid4().bytes)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue a request for a server not there
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            if curve is not None:
                server_public, client_public, client_secret = curve
                sock.curve_serverkey = server_public
                sock.curve_publickey = client_public
                sock.curve_secretkey = client_secret
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ConnectError(f"cannot connect to {address.endpoint}: {exc}") from exc
        monitor_addr = f"inproc://transport-monitor-{os.getpid()}-{next(_monitor_ids)}"
        try:
            self._monitor: Sock = sock.get_monitor_socket(_MONITOR_EVENTS, monitor_addr)
        except zmq.ZMQError as exc:  # this process's trouble, not the URL's
            sock.close(0)
            raise TransportError(
                f"cannot monitor the ZeroMQ socket for {address.endpoint} ({monitor_addr}): {exc}"
            ) from exc
        try:
            sock.connect(address.endpoint)
        except zmq.ZMQError as exc:
            sock.disable_monitor()
            self._monitor.close(0)
            sock.close(0)
            raise ConnectError(f"cannot connect to {address.endpoint}: {exc}") from exc
        sock.setsockopt(zmq.RCVTIMEO, _SLICE_MS)
        self._sock = sock
        # dropped without close(): the goodbye all the same (the server keeps a session ~65 kB
        # until its idle timeout otherwise), then the sockets closed
        self._farewell = _Farewell(sock, self._monitor)
        self._finalizer = weakref.finalize(self, self._farewell)

    # -- Channel ---------------------------------------------------------------------------------

    @property
    def buffer(self) -> bytearray:
        return self._receive.buffer

    @property
    def generation(self) -> int:
        return self._receive.generation

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        if self._farewell.hello_type is None:
            # a session's first request is its HELLO_REQ (transport.client.handshake): a goodbye
            # is a HELLO_REQ too, so the finalizer's goodbye takes this type
            self._farewell.hello_type = msg_type
        msg_id = self.send_request(msg_type, body, deadline)
        return self.recv_response(msg_id, deadline)

    def say_goodbye(self, msg_type: int, body: bytes) -> None:
        """Queue a last message, without waiting (the server is not told when a DEALER goes):
        ``close`` then lets libzmq send it for up to ``_GOODBYE_LINGER_MS``."""
        if self._closed or not self._connected or self._lost or self._gone:
            return
        HEADER.pack_into(self._header, 0, msg_type, self._next_id, len(body))
        try:
            self._sock.send_multipart([bytes(self._header), body], zmq.NOBLOCK)
        except zmq.ZMQError:
            return  # no room or no connection: the server drops the session at LRU, as before
        self._linger_ms = _GOODBYE_LINGER_MS

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()  # closed here: the goodbye is say_goodbye's (Client.close)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
        self._sock.close(self._linger_ms)

    # -- pipelining ------------------------------------------------------------------------------

    def send_request(self, msg_type: int, body: Any, deadline: float | None = None) -> int:
        """Queue one request; returns its msg_id. Waits for a connection until the deadline."""
        self._drain_monitor()
        self._raise_if_lost()
        msg_id = self._next_id
        self._next_id = (msg_id + 1) & 0xFFFFFFFF or 1
        view = memoryview(body)
        HEADER.pack_into(self._header, 0, msg_type, msg_id, view.nbytes)
        if self._tracker is not None and not self._tracker.done:
            self._wait_tracker(deadline)
        while True:
            try:
                self._sock.send(self._header, SNDMORE_NOBLOCK)
                break
            except zmq.Again:
                self._wait_monitor(deadline, "send")
        if view.nbytes >= ZERO_COPY_THRESHOLD:
            self._tracker = self._sock.send(view, copy=False, track=True)
        else:
            self._sock.send(view)
        return msg_id

    def recv_response(self, msg_id: int, deadline: float | None = None) -> tuple[int, memoryview]:
        """The reply to ``msg_id``: (msg_type, body view valid until the next receive).

        Receives block for at most ``_SLICE_MS`` (no zmq_poll on the hot path); between slices
        the monitor is read (a disconnect is PeerGoneError) and the deadline checked.
        """
        while True:
            try:
                resp_type, resp_id, body_len = self._recv_frame()
            except zmq.Again:
                self._drain_monitor()
                self._raise_if_lost()
            except ReplyTooLargeError as exc:  # dropped whole: the connection goes on
                if exc.msg_id == msg_id:
                    raise
                log.debug("discarded a stale reply over max_body (msg_id %d)", exc.msg_id)
            else:
                if resp_id == msg_id:
                    return resp_type, self._receive.body(body_len)
                log.debug("discarded a stale reply (msg_id %d, awaiting %d)", resp_id, msg_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise TransportTimeoutError(
                    f"no reply from {self.address.endpoint} within {self.timeout:.3g} s"
                )

    # -- internals -------------------------------------------------------------------------------

    def _recv_frame(self) -> tuple[int, int, int]:
        sock = self._sock
        n = sock.recv_into(self._header)
        if n != HEADER_SIZE or not _more(sock):
            self._drain_parts()
            raise BadFrameError(f"reply header part is {n} bytes, or has no body part")
        msg_type, msg_id, body_len = HEADER.unpack_from(self._header, 0)
        if body_len > self.max_body:
            self._drain_parts()
            raise reply_too_large(body_len, self.max_body, msg_id)
        self._receive.ensure_capacity(body_len)
        got = sock.recv_into(self._receive.body(body_len))
        if got != body_len or _more(sock):
            self._drain_parts()
            raise BadFrameError(f"reply body part is {got} bytes, its header says {body_len}")
        return msg_type, msg_id, body_len

    def _drain_parts(self) -> None:
        while _more(self._sock):
            self._sock.recv_into(_DISCARD)

    def _drain_monitor(self) -> None:
        monitor = self._monitor
        while int(monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            event = recv_monitor_message(monitor)
            kind = int(event["event"])
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
                self._failure = ""
                self._gone = ""  # reconnected: the same server goes on with the session
                self._farewell.live = True
            elif kind == zmq.EVENT_DISCONNECTED:
                if self._connected:
                    self._lost = True
                self._connected = False
                self._farewell.live = False
            else:
                self._failure = _describe_failure(kind, int(event["value"]))

    def _raise_if_lost(self) -> None:
        """PeerGoneError once the connection went away, and at once on every call after it
        until the DEALER has reconnected: no call waits for a reconnect (its whole timeout, or
        forever), as over unix and http. A server that comes back new has lost the session (it
        answers HELLO_REQUIRED); the same server after a cut link goes on with it."""
        if self._gone:
            raise PeerGoneError(self._gone)
        if self._lost:
            self._lost = False
            what = f"the connection to {self.address.endpoint} was closed or its heartbeats stopped"
            self._gone = f"{what}, and it is not back: open a new client once the server runs"
            raise PeerGoneError(what)

    def _wait_monitor(self, deadline: float | None, what: str) -> None:
        """Wait for a connection event (or 50 ms); raise when the deadline has passed."""
        self._raise_if_lost()
        if deadline is not None and time.monotonic() >= deadline:
            if self._connected:
                raise TransportTimeoutError(f"could not {what} to {self.address.endpoint} in time")
            detail = f": {self._failure}" if self._failure else ""
            raise PeerGoneError(f"no connection to {self.address.endpoint}{detail}")
        if self._monitor.poll(50):
            self._drain_monitor()

    def _wait_tracker(self, deadline: float | None) -> None:
        tracker = self._tracker
        assert tracker is not None
        while not tracker.done:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TransportTimeoutError("the previous large request is still being sent")
            try:
                tracker.wait(0.05 if remaining is None else min(0.05, remaining))
            except zmq.NotDone:
                pass

    def wait_connected(self, deadline: float) -> None:
        """Block until the ZMTP handshake with the server succeeds (ConnectError otherwise)."""
        while not self._connected:
            self._drain_monitor()
            if self._connected:
                return
            if self._failure:
                # a handshake that failed (a refused key, CURVE on one side only, the wrong
                # server key) fails the same way on every retry: at once, not at the deadline;
                # only "nothing accepts yet" (a server still starting) is waited for
                raise ConnectError(f"{self.address.endpoint}: {self._failure}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectError(
                    f"nothing accepted a ZeroMQ connection on {self.address.endpoint}"
                )
            self._monitor.poll(max(1, int(min(remaining, 0.1) * 1000)))


def open_channel(
    url: str,
    *,
    timeout: float | None,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> ZmqChannel:
    """Connect a DEALER and wait (until the deadline) for the handshake with the server."""
    address = parse_url(url)
    channel = ZmqChannel(address, timeout=timeout, max_body=max_body)
    channel.url = url
    try:
        channel.wait_connected(time.monotonic() + (timeout if timeout is not None else 10.0))
    except BaseException:
        channel.close()
        raise
    return channel
