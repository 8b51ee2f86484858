"""The accept loop every socket backend's server shares: one thread and one Session per
connection, prompt ``close()`` that drops live connections, and the server limits
(``ServerLimits``): a cap on open connections and timeouts for idle and trickling ones.

A backend subclasses ``SocketListener`` and supplies ``bind()`` (create the listening socket),
``serve_connection(conn, session, watch)`` (speak its wire format, keeping ``watch`` up to date)
and optionally ``configure(conn)``, ``refusal(text)`` / ``timeout_reply(text)`` (its wire
format's busy and timed-out answers) and ``cleanup()`` (e.g. remove a socket file).

The accept loop wakes at least every ``SWEEP_INTERVAL`` seconds and then closes every connection
whose ``ConnectionWatch`` deadline has passed (a blocked read returns at once after
``shutdown``): the serving threads themselves never poll, so the hot path pays two clock reads
per request and no system call.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

from transport.protocol import DEFAULT_MAX_BODY
from transport.runtime.host import EnvHost
from transport.runtime.session import Session, cannot_make_envs

log = logging.getLogger("transport.backends.socket_listener")

SWEEP_INTERVAL = 0.2
"""Seconds between two looks at the connections' deadlines (a timeout fires up to this late)."""
REFUSED_LINGER = 0.5
"""Seconds a refused connection is kept half-closed, so its client reads the refusal."""
TURNED_AWAY_WAIT = 5.0
"""Seconds a connection whose envs cannot be made waits for its request and its close (on
its own thread), so its client reads why."""
MAX_LINGERING = 256
"""Refused connections kept half-closed at once; beyond that the oldest is closed at once."""
CLOSE_WAIT = 10.0
"""Seconds ``close`` waits, in all, for the connections' threads to close their sessions (their
envs: an AsyncVectorEnv joins its processes), so envs are closed when ``close`` returns."""


@dataclass(frozen=True)
class ServerLimits:
    """What one socket server accepts from its clients (the Node server has the same defaults).

    ``max_connections``: connections served at once; one more is answered with a clear refusal
    (ERROR frame on unix, HTTP 503 on http) and closed. ``idle_timeout``: seconds a connection
    may wait between requests. ``read_timeout``: seconds a started request (frame or HTTP
    request, head and body) has to arrive completely, and a response to be taken by the client.
    """

    max_connections: int = 1024
    idle_timeout: float = 600.0
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_connections must be a positive integer, not {count!r}")
        for name in ("idle_timeout", "read_timeout"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")


IDLE, READING, BUSY, SENDING = 0, 1, 2, 3
"""The states of a ``ConnectionWatch``: what the connection's thread is waiting for."""


class ConnectionWatch:
    """When one connection's current wait must end (``time.monotonic`` seconds), kept by its
    serving thread and read by the listener's sweeper: idle between requests, reading a started
    request, busy in the env (no deadline) or sending a response."""

    __slots__ = ("deadline", "idle_timeout", "read_timeout", "state")

    def __init__(self, limits: ServerLimits) -> None:
        self.idle_timeout = limits.idle_timeout
        self.read_timeout = limits.read_timeout
        self.state = IDLE
        self.deadline = time.monotonic() + limits.idle_timeout

    def idle(self) -> None:
        """Waiting for the first byte of the next request."""
        self.state = IDLE
        self.deadline = time.monotonic() + self.idle_timeout

    def reading(self) -> None:
        """A request has started: the rest must come within read_timeout of now (called once
        per request, when its first bytes are in)."""
        if self.state != READING:
            self.state = READING
            self.deadline = time.monotonic() + self.read_timeout

    def busy(self) -> None:
        """The request is complete and being answered: no deadline (envs take their time)."""
        self.state = BUSY
        self.deadline = math.inf

    def sending(self) -> None:
        """A response is being written: the client must take it within read_timeout."""
        self.state = SENDING
        self.deadline = time.monotonic() + self.read_timeout


class SocketListener:
    """Accepts connections on a bound socket until ``close()``."""

    url: str

    def __init__(
        self,
        host: EnvHost,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        limits: ServerLimits | None = None,
    ) -> None:
        self.host = host
        self.max_body = max_body
        self.limits = limits or ServerLimits()
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._conns: dict[socket.socket, ConnectionWatch] = {}
        self._threads: set[threading.Thread] = set()  # serving a connection (or turning it away)
        self._lingering: deque[tuple[socket.socket, float]] = deque()
        self._lock = threading.Lock()
        self.refused = 0  # connections refused because max_connections were open
        self.timed_out = 0  # connections closed by the idle or read timeout

    # -- what a backend provides -------------------------------------------------------------

    def bind(self) -> socket.socket:
        """Create, bind and listen; raise ``ConnectError`` with a clear reason on failure."""
        raise NotImplementedError

    def serve_connection(
        self, conn: socket.socket, session: Session, watch: ConnectionWatch
    ) -> None:
        """Answer one connection's requests until it ends (runs on its own thread), calling
        ``watch.idle/reading/busy/sending`` as it goes."""
        raise NotImplementedError

    def configure(self, conn: socket.socket) -> None:
        """Per-connection socket options (blocking mode, TCP_NODELAY, ...)."""
        conn.settimeout(None)

    def refusal(self, text: str) -> bytes:
        """The bytes that tell a client it is refused, then closed: over max_connections, or
        the server cannot make its envs (``text`` says which)."""
        return b""

    def timeout_reply(self, text: str) -> bytes:
        """The bytes that tell a client its request did not arrive within read_timeout."""
        return b""

    def cleanup(self) -> None:
        """Remove what ``bind`` created beyond the socket (called once by ``close``)."""

    # -- the shared part ---------------------------------------------------------------------

    def start(self) -> None:
        sock = self.bind()
        sock.settimeout(SWEEP_INTERVAL)  # wake up to notice close() and expired connections
        self._sock = sock

    def serve_forever(self) -> None:
        sock = self._sock
        assert sock is not None, "call start() first"
        try:
            self._accept_loop(sock)
        finally:
            while self._lingering:
                self._lingering.popleft()[0].close()

    def _accept_loop(self, sock: socket.socket) -> None:
        next_sweep = time.monotonic() + SWEEP_INTERVAL
        while not self._closed.is_set():
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + SWEEP_INTERVAL
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                raise
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                full = len(self._conns) >= self.limits.max_connections
                if not full:
                    watch = ConnectionWatch(self.limits)
                    self._conns[conn] = watch
            if full:
                self._refuse(conn)
                continue
            try:
                self.configure(conn)
            except OSError:  # the peer is already gone
                with self._lock:
                    self._conns.pop(conn, None)
                conn.close()
                continue
            thread = threading.Thread(target=self._serve, args=(conn, watch), daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _refuse(self, conn: socket.socket) -> None:
        """Answer a connection over max_connections with the backend's refusal, half-close it
        and keep it a moment (so the client reads the refusal, not a reset), never a thread."""
        self.refused += 1
        text = (
            f"server busy: {self.limits.max_connections} connections are open, the server's "
            "max_connections; retry later"
        )
        try:
            conn.send(self.refusal(text), socket.MSG_DONTWAIT)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        if len(self._lingering) >= MAX_LINGERING:
            oldest, _ = self._lingering.popleft()
            oldest.close()
        self._lingering.append((conn, time.monotonic() + REFUSED_LINGER))

    def _turn_away(self, conn: socket.socket, text: str) -> None:
        """Tell a connection the server cannot serve it (the backend's refusal, with why), on
        its own thread: half-close, let the client's request arrive and read it (a close with
        unread bytes would reset before the client reads the reason), then close."""
        try:
            conn.sendall(self.refusal(text))
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(TURNED_AWAY_WAIT)
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def _sweep(self, now: float) -> None:
        """Close the connections whose deadline passed, and the refused ones that lingered."""
        while self._lingering and (self._lingering[0][1] <= now or self._closed.is_set()):
            refused, _ = self._lingering.popleft()
            _drain(refused)
            refused.close()
        for conn, _ in self._lingering:
            _drain(conn)
        with self._lock:
            expired = [(c, w) for c, w in self._conns.items() if w.deadline <= now]
        for conn, watch in expired:
            state = watch.state
            watch.busy()  # once
            self.timed_out += 1
            if state == READING:
                text = (
                    f"the request did not arrive completely within read_timeout "
                    f"{self.limits.read_timeout:g} s; closing the connection"
                )
                try:
                    conn.send(self.timeout_reply(text), socket.MSG_DONTWAIT)
                except OSError:
                    pass
            try:
                conn.shutdown(socket.SHUT_RDWR)  # the serving thread's read returns: it ends
            except OSError:
                pass

    def _serve(self, conn: socket.socket, watch: ConnectionWatch) -> None:
        try:
            try:
                session = Session(self.host)
            except Exception as exc:
                log.exception("cannot create a session for a new connection on %s", self.url)
                self._turn_away(conn, cannot_make_envs(exc))
                return
            try:
                self.serve_connection(conn, session, watch)
            finally:
                session.close()
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                self._threads.discard(threading.current_thread())
            conn.close()

    @property
    def open_connections(self) -> int:
        """Connections being served right now."""
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        """Stop accepting, drop every connection, ``cleanup()``, then wait (``CLOSE_WAIT``) for
        the connections' sessions to close their envs."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.cleanup()  # the socket file goes at once
        # each connection's thread now ends and closes its session's envs: wait for them (a
        # caller that closes what it gave the server, or counts its processes, comes next)
        deadline = time.monotonic() + CLOSE_WAIT
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            # one registered but not started yet serves a connection shut down above: it ends
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


def _drain(conn: socket.socket) -> None:
    """Read and drop what a refused client sent (a close with unread bytes would reset)."""
    try:
        for _ in range(16):
            if not conn.recv(65536, socket.MSG_DONTWAIT):
                return
    except OSError:
        return
