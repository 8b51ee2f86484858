"""unix:///path.sock: frames over a Unix domain stream socket.

The socket file is created mode 0600 and removed when the listener closes. A file left by a dead
server is replaced only when nothing accepts connections on it; a live one is never stolen.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from collections.abc import Callable

from transport.codec import Schema
from transport.errors import ConnectError
from transport.listener import SocketListener
from transport.protocol import DEFAULT_MAX_BODY
from transport.server import Session
from transport.stream import FramedSocket, StreamChannel, serve_connection

_RETRYABLE = (FileNotFoundError, ConnectionRefusedError)


def socket_path(url: str) -> str:
    path = url.partition("://")[2]
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
    deadline = time.monotonic() + (timeout if timeout is not None else 10.0)
    delay = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(path)
            break
        except _RETRYABLE as exc:
            sock.close()
            if time.monotonic() + delay > deadline:
                raise ConnectError(
                    f"nothing accepts connections on {path} ({exc.strerror})"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        except OSError as exc:
            sock.close()
            raise ConnectError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
    return StreamChannel(FramedSocket(sock, max_body=max_body, timeout=timeout), timeout)


def _is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class Listener(SocketListener):
    """Accepts connections on a Unix socket; one thread and one Session per connection."""

    def __init__(
        self, url: str, sessions: Callable[[], Session], *, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        super().__init__(sessions, max_body=max_body)
        self.url = url
        self.path = socket_path(url)
        self._inode: int | None = None

    def bind(self) -> socket.socket:
        """Bind and listen; refuses a path a live server holds, replaces a stale one."""
        if os.path.lexists(self.path):
            mode = os.lstat(self.path).st_mode
            if not stat.S_ISSOCK(mode):
                raise ConnectError(f"{self.path} exists and is not a socket; not replacing it")
            if _is_live(self.path):
                raise ConnectError(f"{self.path} is in use by a live server")
            os.unlink(self.path)  # stale: its server is gone
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
        sock.listen(64)
        return sock

    def serve_connection(self, conn: socket.socket, session: Session) -> None:
        serve_connection(FramedSocket(conn, max_body=self.max_body, timeout=None), session)

    def cleanup(self) -> None:
        """Remove the socket file if it is still the one this listener created."""
        try:
            if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
