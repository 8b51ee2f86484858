"""Socket chores every socket backend shares: claiming a Unix socket path safely, and connecting
with backoff until a deadline while the server is still starting."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable

from transport.errors import ConnectError

_RETRYABLE = (FileNotFoundError, ConnectionRefusedError)


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
    nothing listens yet (refused, no socket file), until the deadline: then ``ConnectError``."""
    deadline = time.monotonic() + (timeout if timeout is not None else 10.0)
    delay = 0.005
    while True:
        try:
            return connect(max(0.001, deadline - time.monotonic()))
        except _RETRYABLE as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectError(
                    f"nothing accepts connections on {where} ({exc.strerror})"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        except TimeoutError as exc:
            raise ConnectError(f"connecting to {where} timed out") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}") from exc
