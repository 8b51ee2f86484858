"""The batched socket paths' cheaper sends and reads (issue 24 item 3) keep their behaviour:
``send_parts`` with a known total finishes a partial first ``sendmsg`` from the right byte,
and the http client, whose socket is now timed out by the kernel (SO_RCVTIMEO, no poll per
read), still answers a server that stalls inside a response with ``TransportTimeoutError``."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from transport.backends.http import client as http_backend
from transport.backends.sockets import send_parts
from transport.errors import TransportTimeoutError
from transport.protocol import MESSAGE_IDS


class _Trickle:
    """A socket whose ``sendmsg`` takes at most ``step`` bytes per call."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.sent = bytearray()
        self.calls = 0

    def sendmsg(self, parts: Any) -> int:
        self.calls += 1
        data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        taken = data[: self.step]
        self.sent += taken
        return len(taken)


@pytest.mark.parametrize("step", [1, 3, 9, 10, 700, 1 << 20])
def test_a_partial_first_send_is_finished_from_the_right_byte(step: int) -> None:
    head = bytes(range(9))
    body = bytearray(range(256)) * 4
    sock = _Trickle(step)
    send_parts(sock, (head, body), len(head) + len(body))  # type: ignore[arg-type]
    assert bytes(sock.sent) == head + bytes(body)
    assert sock.calls == -(-(len(head) + len(body)) // step)


def test_an_empty_body_is_one_call() -> None:
    sock = _Trickle(1 << 20)
    send_parts(sock, (b"HEAD", b""), 4)  # type: ignore[arg-type]
    assert bytes(sock.sent) == b"HEAD" and sock.calls == 1


def test_the_http_client_times_out_when_a_response_stalls() -> None:
    """The head and part of the body come, then nothing: a TransportTimeoutError (never the
    kernel timeout's BlockingIOError), within the deadline plus one read timeout."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = listening.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nX-Transport-Msg-Type: 10\r\nContent-Length: 100\r\n\r\nab"
            )
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with listening:
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        channel = http_backend.open_channel(url, timeout=0.3)
        started = time.monotonic()
        try:
            with pytest.raises(TransportTimeoutError):
                channel.request(MESSAGE_IDS.HEALTH_REQ, b"")
        finally:
            done.set()
            channel.close()
        assert time.monotonic() - started < 3.0
    thread.join(5)


def test_a_unix_server_socket_fits_a_whole_response() -> None:
    """The send buffer grows to the largest response (as far as net.core.wmem_max lets it), so
    a 256-env batch leaves in one write; it is never lowered."""
    from pathlib import Path

    from transport.backends.unix import fit_send_buffer

    try:
        wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
    except OSError:  # no /proc: the default buffer may be all there is
        wmem_max = 0
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        before = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        largest = 256 * 2557
        fit_send_buffer(a, largest)
        after = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert after >= min(largest, wmem_max) and after >= before
        fit_send_buffer(a, 100)  # a smaller response never shrinks it
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == after
