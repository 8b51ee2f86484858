"""Issue 17 item 2: connect() under load. With a real server's listen backlog full (the server
process is SIGSTOPped, so it accepts nothing), the Python client keeps retrying until its
timeout: it succeeds once the server accepts again, or raises ConnectError at the deadline;
never EAGAIN at once."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import transport.api as api
from transport.backends.sockets import LISTEN_BACKLOG
from transport.client import Client
from transport.errors import ConnectError

from .servers import LANGS, ServerProcess, stop_process, unique_unix_url


def fill_backlog(path: str, limit: int = 8 * LISTEN_BACKLOG) -> list[socket.socket]:
    """Connect non-blocking sockets to ``path`` until the kernel answers EAGAIN (backlog full)."""
    fillers: list[socket.socket] = []
    while len(fillers) < limit:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except BlockingIOError:
            sock.close()
            return fillers
        fillers.append(sock)
    for sock in fillers:
        sock.close()
    raise AssertionError(f"the backlog of {path} did not fill with {limit} connections")


@pytest.fixture(params=LANGS)
def stopped_server(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, int]]:
    server = ServerProcess(unique_unix_url(), lang=request.param)
    fillers: list[socket.socket] = []
    try:
        stop_process(server.proc.pid)
        fillers = fill_backlog(server.url.partition("://")[2])
        yield server, len(fillers)
    finally:
        for sock in fillers:
            sock.close()
        os.kill(server.proc.pid, signal.SIGCONT)
        server.__exit__(None, None, None)


def test_server_listens_with_the_node_backlog(
    stopped_server: tuple[ServerProcess, int],
) -> None:
    _, queued = stopped_server
    assert queued >= LISTEN_BACKLOG  # 64 before: the Python server queued 65 connections


def test_connect_waits_for_a_full_backlog_then_succeeds(
    stopped_server: tuple[ServerProcess, int],
) -> None:
    server, _ = stopped_server
    outcome: list[Client | BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(api.connect(server.url, timeout=30.0))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), f"connect() gave up with the backlog full: {outcome}"
    os.kill(server.proc.pid, signal.SIGCONT)
    thread.join(30.0)
    assert not thread.is_alive()
    client = outcome[0]
    assert isinstance(client, Client), client
    try:
        client.reset(seed=1)
    finally:
        client.close()


def test_connect_raises_connect_error_at_the_deadline(
    stopped_server: tuple[ServerProcess, int],
) -> None:
    server, _ = stopped_server
    timeout = 0.6
    start = time.monotonic()
    with pytest.raises(ConnectError, match="backlog full"):
        api.connect(server.url, timeout=timeout)
    assert time.monotonic() - start >= timeout * 0.9  # kept trying: not EAGAIN at once
