"""unix:///path.sock: frames over a Unix domain stream socket.

The socket file is created mode 0600 and removed when the listener closes. A file left by a dead
server is replaced only when nothing accepts connections on it; a live one is never stolen.
"""

from __future__ import annotations

import errno
import os
import socket

from transport.backends.socket_listener import ConnectionWatch, ServerLimits, SocketListener
from transport.backends.sockets import LISTEN_BACKLOG, claim_unix_path, connect_with_retry
from transport.backends.stream import FramedSocket, StreamChannel, serve_connection
from transport.backends.url_params import single_params
from transport.codec import Schema
from transport.errors import ConnectError
from transport.protocol import DEFAULT_MAX_BODY, HEADER, MESSAGE_IDS, ErrorCode, encode_error
from transport.runtime.host import EnvHost
from transport.runtime.session import Session


def socket_path(url: str) -> str:
    """The socket file of ``unix:///path``; a unix URL takes no query parameters, so any
    ``?name=value`` is refused (it would otherwise become part of the file name)."""
    path, mark, query = url.partition("://")[2].partition("?")
    if mark:
        given = ", ".join(single_params(url, query)) or "an empty query"
        raise ConnectError(f"{url!r}: unknown parameter(s) {given} (unix:// URLs take none)")
    if not path:
        raise ConnectError(f"{url!r} names no socket path (expected unix:///path/to.sock)")
    if len(os.fsencode(path)) > 107:
        raise ConnectError(f"socket path {path!r} is longer than the 107 bytes Linux allows")
    return path


def open_channel(
    url: str,
    *,
    timeout: float | None,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> StreamChannel:
    """Connect, retrying with backoff while the server is not up yet, until the deadline."""
    path = socket_path(url)

    def attempt(remaining: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(remaining)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock

    sock = connect_with_retry(attempt, path, timeout)
    channel = StreamChannel(FramedSocket(sock, max_body=max_body, timeout=timeout), timeout)
    channel.url = url
    return channel


def fit_send_buffer(conn: socket.socket, largest: int) -> None:
    """Let the kernel queue a whole response of up to ``largest`` bytes: a batch larger than the
    default send buffer (~208 KB) otherwise goes out in several blocking rounds, each a wake-up
    of both sides (the kernel caps the size at net.core.wmem_max; it is never lowered)."""
    try:
        if conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < largest:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, largest)
    except OSError:
        pass  # a smaller buffer only costs wake-ups


SERVER_CAPACITY = 4096
"""The initial receive buffer of a server connection; it grows with the frames that arrive."""


def _error_frame(code: ErrorCode, text: str) -> bytes:
    body = encode_error(code, text)
    return HEADER.pack(MESSAGE_IDS.ERROR, 0, len(body)) + body


class Listener(SocketListener):
    """Accepts connections on a Unix socket; one thread and one Session per connection."""

    def __init__(
        self,
        url: str,
        host: EnvHost,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        limits: ServerLimits | None = None,
    ) -> None:
        super().__init__(host, max_body=max_body, limits=limits)
        self.url = url
        self.path = socket_path(url)
        self._inode: int | None = None

    def bind(self) -> socket.socket:
        """Bind and listen; refuses a path a live server holds, replaces a stale one."""
        claim_unix_path(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise ConnectError(f"{self.path} is in use") from exc
            raise ConnectError(f"cannot bind {self.path}: {exc.strerror}") from exc
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._inode = os.stat(self.path).st_ino
        sock.listen(LISTEN_BACKLOG)
        return sock

    def serve_connection(
        self, conn: socket.socket, session: Session, watch: ConnectionWatch
    ) -> None:
        framed = FramedSocket(
            conn, max_body=self.max_body, capacity=SERVER_CAPACITY, timeout=None, watch=watch
        )
        fit_send_buffer(conn, len(session.buffer))
        serve_connection(framed, session)

    def refusal(self, text: str) -> bytes:
        """An ERROR frame with msg_id 0 (it answers no request): INTERNAL, with why."""
        return _error_frame(ErrorCode.INTERNAL, text)

    def timeout_reply(self, text: str) -> bytes:
        return _error_frame(ErrorCode.BAD_FRAME, text)

    def cleanup(self) -> None:
        """Remove the socket file if it is still the one this listener created."""
        try:
            if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
