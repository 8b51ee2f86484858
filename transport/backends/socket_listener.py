"""The accept loop every socket backend's server shares: one thread and one Session per
connection, prompt ``close()`` that drops live connections.

A backend subclasses ``SocketListener`` and supplies ``bind()`` (create the listening socket),
``serve_connection(conn, session)`` (speak its wire format) and optionally ``configure(conn)``
and ``cleanup()`` (e.g. remove a socket file).
"""

from __future__ import annotations

import logging
import socket
import threading

from transport.protocol import DEFAULT_MAX_BODY
from transport.runtime.core import EnvHost
from transport.runtime.session import Session

log = logging.getLogger("transport.backends.socket_listener")


class SocketListener:
    """Accepts connections on a bound socket until ``close()``."""

    url: str

    def __init__(self, host: EnvHost, *, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.host = host
        self.max_body = max_body
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    # -- what a backend provides -------------------------------------------------------------

    def bind(self) -> socket.socket:
        """Create, bind and listen; raise ``ConnectError`` with a clear reason on failure."""
        raise NotImplementedError

    def serve_connection(self, conn: socket.socket, session: Session) -> None:
        """Answer one connection's requests until it ends (runs on its own thread)."""
        raise NotImplementedError

    def configure(self, conn: socket.socket) -> None:
        """Per-connection socket options (blocking mode, TCP_NODELAY, ...)."""
        conn.settimeout(None)

    def cleanup(self) -> None:
        """Remove what ``bind`` created beyond the socket (called once by ``close``)."""

    # -- the shared part ---------------------------------------------------------------------

    def start(self) -> None:
        sock = self.bind()
        sock.settimeout(0.2)  # wake up to notice close()
        self._sock = sock

    def serve_forever(self) -> None:
        sock = self._sock
        assert sock is not None, "call start() first"
        while not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                raise
            self.configure(conn)
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                session = Session(self.host)
            except Exception:
                log.exception("cannot create a session for a new connection on %s", self.url)
                return
            try:
                self.serve_connection(conn, session)
            finally:
                session.close()
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop accepting, drop every connection, then ``cleanup()``."""
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
        self.cleanup()
