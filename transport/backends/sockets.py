"""Socket chores every socket backend shares: claiming a Unix socket path safely, connecting
with backoff until a deadline while the server is still starting, and sending parts with one
scatter/gather call (``send_parts``)."""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from transport.errors import ConnectError

# The listen backlog of every socket server, the same as Node's default (net.Server: 511); the
# kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 511

# Transient: nothing listens yet (no socket file, refused), or the server is up but its listen
# backlog is full (a Unix socket answers EAGAIN at once) or the attempt was interrupted.
_RETRYABLE = (FileNotFoundError, ConnectionRefusedError, BlockingIOError, InterruptedError)
_RETRYABLE_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.ECONNABORTED, errno.ECONNRESET})


def unix_path_is_live(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket ``path`` right now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def claim_unix_path(path: str) -> None:
    """Make ``path`` free to bind: remove a dead server's socket file, never a live one's."""
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise ConnectError(f"{path} exists and is not a socket; not replacing it")
    if unix_path_is_live(path):
        raise ConnectError(f"{path} is in use by a live server")
    os.unlink(path)  # stale: its server is gone


def connect_with_retry(
    connect: Callable[[float], socket.socket], where: str, timeout: float | None
) -> socket.socket:
    """Call ``connect(remaining_seconds)`` until it succeeds, retrying with backoff while
    nothing listens yet (refused, no socket file) or the server's listen backlog is full
    (EAGAIN), until the deadline (``timeout``; None: 10 s, a server that never comes is an
    error all the same): then ``ConnectError``, never a transient error at once."""
    limit = timeout if timeout is not None else 10.0
    deadline = time.monotonic() + limit
    delay = 0.005
    while True:
        try:
            return connect(max(0.001, deadline - time.monotonic()))
        except TimeoutError as exc:
            raise ConnectError(f"connecting to {where} timed out") from exc
        except OSError as exc:
            if not isinstance(exc, _RETRYABLE) and exc.errno not in _RETRYABLE_ERRNOS:
                raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}") from exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                busy = exc.errno == errno.EAGAIN
                what = (
                    "accepts no new connection (listen backlog full)"
                    if busy
                    else ("has nothing accepting connections")
                )
                raise ConnectError(
                    f"{where} {what} within {limit:g} s ({exc.strerror or exc})"
                ) from exc
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.2)


def set_kernel_timeout(sock: socket.socket, timeout: float | None) -> None:
    """Make ``sock`` blocking with its reads and writes timed out by the kernel (SO_RCVTIMEO,
    SO_SNDTIMEO; None: never). Python's own socket timeout polls before every call: one more
    system call and one more wake-up per read (measured: ~7 us of a 50 us round trip here).
    A read or write that times out raises ``BlockingIOError`` (EAGAIN), not ``TimeoutError``."""
    sock.settimeout(None)
    total = 0 if timeout is None or timeout <= 0 else max(1, round(timeout * 1e6))
    seconds, micros = divmod(total, 1_000_000)  # 0, 0: no timeout
    value = struct.pack("@ll", seconds, micros)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def send_parts(sock: socket.socket, parts: Sequence[Any], total: int = -1) -> None:
    """Send ``parts`` (bytes-like: a head and a body) in order with ``sendmsg`` (scatter/gather:
    the parts are never joined). A partial send (a full socket buffer, a signal) is finished
    with views of what is left: no part is copied, whatever its size (issue 24). ``total``
    (their bytes, when the caller knows it) lets the common case, the kernel takes it all, be
    one call with no view made. Raises what ``sendmsg`` raises (timeouts, peer gone)."""
    sent = 0
    if total >= 0:
        sent = sock.sendmsg(parts)
        if sent >= total:
            return
    views = [memoryview(part).cast("B") for part in parts]
    views = [view for view in views if view.nbytes]
    while views and sent:  # what the first call took
        if sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        else:
            views[0] = views[0][sent:]
            sent = 0
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]
